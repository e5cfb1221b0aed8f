"""rlfactory: high-throughput asynchronous reinforcement learning (Sample Factory's architecture, in Rust).

    import rlfactory
    summary = rlfactory.train(env="CartPole-v1", experiment="cartpole", train_for_env_steps=500_000)
    rlfactory.enjoy(experiment="cartpole", max_num_episodes=3)
    policy = rlfactory.load_policy("cartpole")          # a torch.nn.Module

`env` may also be a callable (a class or function of your own script) that returns a Gymnasium or PettingZoo env.
Training runs in the `rlfactory` binary installed with this module, in a process of its own; `help(rlfactory.train)`
lists its flags.
"""

from __future__ import annotations

import subprocess

from rlfactory._api import Summary, enjoy, eval, export, train
from rlfactory._process import ConfigError, RlfactoryError, binary, child_environment
from rlfactory.policy import load_policy

__all__ = ["train", "enjoy", "eval", "export", "load_policy", "Summary", "ConfigError", "RlfactoryError"]


def _flags_help() -> str:
    """`rlfactory train --help`: the flags `train` takes (read from the binary once, when the module loads)."""
    try:
        out = subprocess.run(
            [binary(), "train", "--help"], env=child_environment(), capture_output=True, text=True, timeout=60
        )
    except (OSError, RlfactoryError, subprocess.TimeoutExpired) as e:
        return f"(the flags could not be read from the binary: {e})"
    return out.stdout if out.returncode == 0 else f"(the binary could not list its flags: {out.stderr.strip()})"


train.__doc__ = f"{train.__doc__}\n    Flags (`rlfactory train --help`):\n\n{_flags_help()}"
