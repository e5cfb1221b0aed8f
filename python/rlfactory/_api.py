"""`train`, `enjoy`, `eval` and `export`: the binary's commands with its flags as keyword arguments."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from rlfactory._process import ConfigError, run

EnvArg = Union[str, Callable[..., Any]]

DEFAULT_TRAIN_DIR = "train_dir"
DEFAULT_EXPERIMENT = "default_experiment"


class Summary(dict):
    """What a training run reports at its end (the binary's `--summary_json`), as a dict whose keys are also
    attributes: `summary.env_frames`, `summary.fps`, `summary.mean_return`, ..."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _flag_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return ",".join(f"{k}={_flag_value(name, v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(_flag_value(name, v) for v in value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def flag_args(flags: Dict[str, Any]) -> List[str]:
    """`--name value` for each keyword argument (None: left out; True/False: true/false; a list: comma-separated; a
    dict, such as `env_kwargs`: `key=value` pairs)."""
    args: List[str] = []
    for name, value in flags.items():
        if value is None:
            continue
        args += [f"--{name}", _flag_value(name, value)]
    return args


def _is_pettingzoo(env: Any) -> bool:
    return hasattr(env, "possible_agents")


def env_id(env: EnvArg, train_dir: Union[str, os.PathLike], env_kwargs: Optional[Dict[str, Any]] = None) -> str:
    """The binary's `--env` for `env`: an id as it is, or a callable pickled (with cloudpickle, by value when it is
    defined in `__main__`) into `<train_dir>/.env_factories/<digest>.pkl`, which every worker process unpickles
    and calls. The callable is called once here to learn whether it makes a Gymnasium or a PettingZoo env."""
    if isinstance(env, str):
        return env
    if not callable(env):
        raise ConfigError(f"env must be an env id or a callable that returns an env, not {type(env).__name__}")
    import cloudpickle

    made = env(**(env_kwargs or {}))
    try:
        prefix = "pz:" if _is_pettingzoo(made) else "gym:"
    finally:
        close = getattr(made, "close", None)
        if callable(close):
            close()
    data = cloudpickle.dumps(env)
    folder = Path(train_dir).resolve() / ".env_factories"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:20]}.pkl"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(data)
        partial.replace(path)
    return prefix + str(path)


def train(env: EnvArg, **flags: Any) -> Summary:
    """Trains a policy on `env` as `rlfactory train --env ... --<flag> <value> ...` does, and returns its summary.

    `env` is an env id (`"CartPole-v1"`, `"gym:LunarLander-v3"`, `"pz:pettingzoo.mpe.simple_spread_v3"`), or a
    callable (a class or a function, defined anywhere, `__main__` included) that returns a Gymnasium env or a
    PettingZoo env, called with `env_kwargs`. Every other keyword argument is one of the flags below: `True` and
    `False` are written true/false, lists comma-separated, and a dict (`env_kwargs={"size": 5}`) as key=value
    pairs. A flag the binary refuses raises `ConfigError` with its one-line message; a run that fails raises
    `RlfactoryError`. A KeyboardInterrupt stops the run as Ctrl-C does (its checkpoint saved) and is raised again.
    """
    train_dir = flags.get("train_dir", DEFAULT_TRAIN_DIR)
    env_kwargs = flags.get("env_kwargs")
    args = ["train", "--env", env_id(env, train_dir, env_kwargs if isinstance(env_kwargs, dict) else None)]
    with tempfile.TemporaryDirectory(prefix="rlfactory-") as tmp:
        summary_json = flags.pop("summary_json", None) or os.path.join(tmp, "summary.json")
        code = run(args + flag_args(flags) + ["--summary_json", os.fspath(summary_json)])
        try:
            with open(summary_json) as f:
                summary = Summary(json.load(f))
        except FileNotFoundError:
            raise ConfigError(f"rlfactory train exited with code {code} and wrote no summary") from None
    return summary


def _experiment_env(flags: Dict[str, Any]) -> str:
    """The env id an experiment was trained on (its `config.json`)."""
    folder = Path(flags.get("train_dir", DEFAULT_TRAIN_DIR)) / flags.get("experiment", DEFAULT_EXPERIMENT)
    config = folder / "config.json"
    try:
        with open(config) as f:
            return json.load(f)["env"]
    except FileNotFoundError:
        raise ConfigError(f"{config}: no such file (is {folder} an experiment folder?)") from None


def _play(command: str, env: Optional[EnvArg], flags: Dict[str, Any]) -> int:
    if env is None:
        env = _experiment_env(flags)
    return run([command, "--env", env_id(env, flags.get("train_dir", DEFAULT_TRAIN_DIR))] + flag_args(flags))


def enjoy(env: Optional[EnvArg] = None, **flags: Any) -> None:
    """Plays episodes with a trained policy and prints their returns, as `rlfactory enjoy` does (`experiment=`,
    `train_dir=`, `max_num_episodes=`, `eval_deterministic=`, ...). `env` defaults to the experiment's."""
    _play("enjoy", env, flags)


def eval(env: Optional[EnvArg] = None, **flags: Any) -> None:  # noqa: A001 (Sample Factory's name)
    """Plays episodes on many envs at once, as `rlfactory eval` does (`csv=` writes one line per episode)."""
    _play("eval", env, flags)


def export(out: Union[str, os.PathLike], env: Optional[EnvArg] = None, **flags: Any) -> None:
    """Writes a trained policy's weights as a PyTorch state dict (safetensors), as `rlfactory export` does."""
    _play("export", env, dict(flags, out=out))
