"""A trained actor-critic as a `torch.nn.Module`, from the state dict `rlfactory export` writes.

The module mirrors the Rust network variable for variable (the names and layouts the binary's `export` documents):
observations are normalised with the running statistics (`--normalize_input`, clipped to ±10), divided by
`--obs_scale`, and go through the actor's and the critic's MLP encoders (one shared with
`--actor_critic_share_weights`), each hidden layer followed by `--nonlinearity`; the action head gives the logits or
the Gaussian mean, the value head the value. `load_state_dict(..., strict=True)` fills it, so a name or a shape that
differs is an error, not a silent mismatch.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from rlfactory._api import DEFAULT_EXPERIMENT, DEFAULT_TRAIN_DIR, export
from rlfactory._process import ConfigError

TORCH_VERSION = "2.13"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            f"load_policy needs torch {TORCH_VERSION} in this environment (pip install torch=={TORCH_VERSION}.*)"
        ) from None
    if not torch.__version__.startswith(TORCH_VERSION + "."):
        raise ConfigError(f"rlfactory is built for torch {TORCH_VERSION}, this environment has {torch.__version__}")
    return torch


_DTYPES = {"F32": "float32", "F64": "float64", "I64": "int64", "I32": "int32", "BF16": "bfloat16", "F16": "float16"}


def read_safetensors(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The tensors of a safetensors file (an 8-byte little-endian header length, a JSON header naming each tensor's
    dtype, shape and byte range, then the bytes)."""
    torch = _torch()
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        dtype = getattr(torch, _DTYPES[entry["dtype"]])
        flat = torch.frombuffer(bytearray(body[start:end]), dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"])
    return tensors


def _mlp_sizes(state: Dict[str, Any], prefix: str) -> list:
    sizes = []
    i = 0
    while f"{prefix}.fc{i}.weight" in state:
        out_features, in_features = state[f"{prefix}.fc{i}.weight"].shape
        if not sizes:
            sizes.append(in_features)
        sizes.append(out_features)
        i += 1
    return sizes


def _build(state: Dict[str, Any], config: Dict[str, Any]) -> Any:
    torch = _torch()
    nn = torch.nn
    activations = {"tanh": torch.tanh, "relu": torch.relu, "elu": torch.nn.functional.elu}

    class Mlp(nn.Module):
        def __init__(self, sizes: list, nonlinearity: str):
            super().__init__()
            for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
                setattr(self, f"fc{i}", nn.Linear(a, b))
            self.n = len(sizes) - 1
            self.activation = activations[nonlinearity]

        def forward(self, x: Any) -> Any:
            for i in range(self.n):
                x = self.activation(getattr(self, f"fc{i}")(x))
            return x

    class RunningMeanStd(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.register_buffer("mean", torch.zeros(dim))
            self.register_buffer("var", torch.ones(dim))
            self.register_buffer("count", torch.zeros(()))

    class ActorCritic(nn.Module):
        """The trained actor-critic: `forward(obs)` gives (logits or Gaussian mean, value); `act(obs)` the greedy
        action (the most likely class, or the mean, before the env's action space maps it)."""

        def __init__(self) -> None:
            super().__init__()
            nonlinearity = config["nonlinearity"]
            self.obs_scale = float(config.get("obs_scale", 1.0))
            self.actor_encoder = Mlp(_mlp_sizes(state, "actor_encoder"), nonlinearity)
            if "critic_encoder.fc0.weight" in state:
                self.critic_encoder = Mlp(_mlp_sizes(state, "critic_encoder"), nonlinearity)
            else:
                self.critic_encoder = None
            out, hidden = state["action_head.weight"].shape
            self.action_head = nn.Linear(hidden, out)
            self.value_head = nn.Linear(state["value_head.weight"].shape[1], 1)
            # A Gaussian head has a learned log-std, or (`--adaptive_stddev`, which only Box actions use) outputs
            # the mean and the log-std.
            self.gaussian = "log_std" in state or bool(config.get("adaptive_stddev"))
            if "log_std" in state:
                self.log_std = nn.Parameter(torch.zeros(state["log_std"].shape))
            self.adaptive_std = "log_std" not in state and self.gaussian
            if "obs_normalizer.mean" in state:
                self.obs_normalizer = RunningMeanStd(state["obs_normalizer.mean"].shape[0])
            if "returns_normalizer.mean" in state:
                self.returns_normalizer = RunningMeanStd(1)

        def forward(self, obs: Any) -> Tuple[Any, Any]:
            x = obs.to(torch.float32)
            if hasattr(self, "obs_normalizer"):
                rms = self.obs_normalizer
                x = ((x - rms.mean) / torch.sqrt(rms.var + 1e-5)).clamp(-10.0, 10.0)
            x = x / self.obs_scale
            actor = self.actor_encoder(x)
            critic = actor if self.critic_encoder is None else self.critic_encoder(x)
            out = self.action_head(actor)
            if self.adaptive_std:
                out = out[..., : out.shape[-1] // 2]
            value = self.value_head(critic).squeeze(-1)
            if hasattr(self, "returns_normalizer"):
                rms = self.returns_normalizer
                value = value * torch.sqrt(rms.var + 1e-5) + rms.mean
            return out, value

        @torch.no_grad()
        def act(self, obs: Any) -> Any:
            out, _ = self.forward(obs)
            return out if self.gaussian else out.argmax(-1)

    model = ActorCritic()
    model.load_state_dict(state, strict=True)
    model.eval()
    return model


def load_policy(
    experiment: str = DEFAULT_EXPERIMENT,
    train_dir: Union[str, os.PathLike] = DEFAULT_TRAIN_DIR,
    policy_index: int = 0,
    load_checkpoint_kind: str = "latest",
    env: Optional[Any] = None,
) -> Any:
    """The trained policy of `<train_dir>/<experiment>` as a `torch.nn.Module` (in eval mode): `model(obs)` gives
    (logits or Gaussian mean, value) for a batch of flat float32 observations, `model.act(obs)` the greedy actions,
    which are `rlfactory enjoy --eval_deterministic`'s on the same observations. MLP encoders (the default network
    of vector observations); convolutional, recurrent and custom encoders raise ConfigError."""
    folder = Path(train_dir) / experiment
    try:
        with open(folder / "config.json") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{folder / 'config.json'}: no such file (is {folder} an experiment folder?)") from None
    unsupported = [
        flag
        for flag, plain in [
            ("use_rnn", False),
            ("encoder_custom", ""),
            ("encoder_conv_layers", ""),
            ("encoder_conv_architecture", "none"),
        ]
        if config.get(flag, plain) != plain
    ]
    if config.get("algo", "appo") != "appo" or unsupported:
        what = f"--algo {config.get('algo')}" if config.get("algo", "appo") != "appo" else f"--{unsupported[0]}"
        raise ConfigError(f"load_policy builds APPO's MLP actor-critic; {folder} was trained with {what}")
    with tempfile.TemporaryDirectory(prefix="rlfactory-") as tmp:
        out = os.path.join(tmp, "policy.safetensors")
        export(
            out,
            env=env,
            experiment=experiment,
            train_dir=train_dir,
            policy_index=policy_index,
            load_checkpoint_kind=load_checkpoint_kind,
        )
        state = read_safetensors(out)
    return _build(state, config)
