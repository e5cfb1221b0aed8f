"""A trained policy (APPO's actor-critic, DQN's Q-network, SAC's actor) as a `torch.nn.Module`, from the state
dict that `rlfactory export` writes.

The module mirrors the Rust network variable for variable (the names and layouts the binary's `export` documents):
observations are normalised with the running statistics (`--normalize_input`, clipped to ±10), divided by
`--obs_scale`, and go through the actor's and the critic's encoders (one shared with `--actor_critic_share_weights`):
an MLP, each hidden layer followed by `--nonlinearity`; convolutions (`--encoder_conv_layers`) over the image part
of the observation, each followed by a ReLU, then the MLP over their output and the other parts; or one network per
part of the observation (`--encoder_conv_architecture`: a named convolutional network and its MLP for an image, an
MLP for each other part). The action head gives the logits (illegal ones masked out by a Dict's `action_mask`) or
the Gaussian mean, the value head the value. Where each part of the observation lies in the flat vector comes from
the file's metadata (`observation_layout`). `load_state_dict(..., strict=True)` fills it, so a name or a shape that
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
    return _read_safetensors(path)[0]


def _read_safetensors(path: Union[str, os.PathLike]) -> Tuple[Dict[str, Any], Dict[str, str]]:
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
    return tensors, header.get("__metadata__", {})


# `--encoder_conv_architecture`'s convolutions but IMPALA's residual network: (channels, kernel, stride).
_ARCHITECTURES = {
    "convnet_simple": [(32, 8, 4), (64, 4, 2), (128, 3, 2)],
    "convnet_impala": [(16, 8, 4), (32, 4, 2)],
    "convnet_atari": [(32, 8, 4), (64, 4, 2), (64, 3, 1)],
}


def _conv_layers(spec: str) -> list:
    """`--encoder_conv_layers` as (channels, kernel, stride): `32x8s4,64x3` (stride 1 when not written)."""
    layers = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        channels, rest = part.split("x")
        kernel, _, stride = rest.partition("s")
        layers.append((int(channels), int(kernel), int(stride or 1)))
    return layers


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


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


def _build(state: Dict[str, Any], config: Dict[str, Any], layout: list) -> Any:
    torch = _torch()
    nn = torch.nn
    functional = torch.nn.functional
    activations = {"tanh": torch.tanh, "relu": torch.relu, "elu": functional.elu}
    activation = activations[config["nonlinearity"]]

    def linear_layers(module: Any, inputs: int, sizes: list) -> int:
        for i, size in enumerate(sizes):
            module.add_module(f"fc{i}", nn.Linear(inputs, size))
            inputs = size
        return inputs

    def through_linear(module: Any, x: Any, n: int) -> Any:
        for i in range(n):
            x = activation(getattr(module, f"fc{i}")(x))
        return x

    class ImageNet(nn.Module):
        """`--encoder_conv_architecture` over one image part (`[H, W, C]`, or `[C, H, W]` when the first dimension
        is the smallest), then `--encoder_conv_mlp_layers`."""

        def __init__(self, dims: list):
            super().__init__()
            self.channels_first = dims[0] < min(dims[1], dims[2])
            h, w, c = (dims[1], dims[2], dims[0]) if self.channels_first else dims
            self.shape = (h, w, c)
            self.ops: list = []
            architecture = config["encoder_conv_architecture"]
            if architecture == "resnet_impala":
                for i, channels in enumerate([16, 32, 32]):
                    self.add_module(f"conv{i}", nn.Conv2d(c, channels, 3, 1, 1))
                    self.ops.append(("pool", f"conv{i}"))
                    h, w, c = _out_size(h, 3, 2, 1), _out_size(w, 3, 2, 1), channels
                    for b in range(2):
                        block = nn.Module()
                        block.add_module("conv0", nn.Conv2d(c, c, 3, 1, 1))
                        block.add_module("conv1", nn.Conv2d(c, c, 3, 1, 1))
                        self.add_module(f"res{i}_{b}", block)
                        self.ops.append(("residual", f"res{i}_{b}"))
                self.ops.append(("act", ""))
            else:
                for i, (channels, kernel, stride) in enumerate(_ARCHITECTURES[architecture]):
                    self.add_module(f"conv{i}", nn.Conv2d(c, channels, kernel, stride))
                    self.ops.append(("conv", f"conv{i}"))
                    h, w, c = _out_size(h, kernel, stride, 0), _out_size(w, kernel, stride, 0), channels
            self.n = len(config["encoder_conv_mlp_layers"])
            self.size = linear_layers(self, h * w * c, config["encoder_conv_mlp_layers"])

        def forward(self, x: Any) -> Any:
            h, w, c = self.shape
            y = x.reshape(-1, c, h, w) if self.channels_first else x.reshape(-1, h, w, c).permute(0, 3, 1, 2)
            for kind, name in self.ops:
                if kind == "conv":
                    y = activation(getattr(self, name)(y))
                elif kind == "pool":
                    y = functional.max_pool2d(getattr(self, name)(y), 3, 2, 1)
                elif kind == "residual":
                    block = getattr(self, name)
                    y = block.conv1(activation(block.conv0(activation(y)))) + y
                else:
                    y = activation(y)
            return through_linear(self, y.flatten(1), self.n)

    class VectorNet(nn.Module):
        """A part that is not an image, under `--encoder_conv_architecture`: `--encoder_mlp_layers`."""

        def __init__(self, inputs: int):
            super().__init__()
            self.n = len(config["encoder_mlp_layers"])
            self.size = linear_layers(self, inputs, config["encoder_mlp_layers"])

        def forward(self, x: Any) -> Any:
            return through_linear(self, x, self.n)

    class Encoder(nn.Module):
        """The encoder `config` asks for, over the whole flat observation, with the Rust network's state-dict names:
        `fc<i>` (an MLP); `conv<i>` then `fc<i>` (`--encoder_conv_layers` over the one image part, each followed by
        a ReLU and padded to keep the size at stride 1, their flat output and the other parts into the MLP); or
        `<part>.…` (`--encoder_conv_architecture`: one network per non-empty part, outputs concatenated)."""

        def __init__(self) -> None:
            super().__init__()
            obs_dim = sum(p["length"] for p in layout)
            self._parts: list = []
            self._convs = 0
            if config["encoder_conv_architecture"] != "none":
                self._size = 0
                for part in layout:
                    if part["length"] == 0:
                        continue
                    shape = part.get("shape")
                    net = ImageNet(shape) if shape is not None and len(shape) == 3 else VectorNet(part["length"])
                    self.add_module(part["name"], net)
                    self._parts.append((part["offset"], part["length"], part["name"]))
                    self._size += net.size
                return
            inputs = obs_dim
            if config["encoder_conv_layers"]:
                images = [p for p in layout if len(p.get("shape") or []) == 3]
                if len(images) != 1:
                    raise ConfigError(
                        f"--encoder_conv_layers needs one image in the observation; it has {len(images)}"
                    )
                image = images[0]
                h, w, c = image["shape"]
                self._image = (image["offset"], (h, w, c))
                self._rest = [(p["offset"], p["length"]) for p in layout if p is not image and p["length"] > 0]
                for i, (channels, kernel, stride) in enumerate(_conv_layers(config["encoder_conv_layers"])):
                    padding = kernel // 2 if stride == 1 else 0
                    self.add_module(f"conv{i}", nn.Conv2d(c, channels, kernel, stride, padding))
                    h, w, c = _out_size(h, kernel, stride, padding), _out_size(w, kernel, stride, padding), channels
                    self._convs += 1
                inputs = h * w * c + sum(n for _, n in self._rest)
            self._n = len(config["encoder_mlp_layers"])
            self._size = linear_layers(self, inputs, config["encoder_mlp_layers"])

        def forward(self, x: Any) -> Any:
            if self._parts:
                return torch.cat([getattr(self, name)(x[..., at : at + n]) for at, n, name in self._parts], -1)
            if self._convs:
                at, (h, w, c) = self._image
                y = x[..., at : at + h * w * c].reshape(-1, h, w, c).permute(0, 3, 1, 2)
                for i in range(self._convs):
                    y = torch.relu(getattr(self, f"conv{i}")(y))
                x = torch.cat([y.flatten(1)] + [x[..., o : o + n] for o, n in self._rest], -1)
            return through_linear(self, x, self._n)

    def action_mask() -> Optional[Tuple[int, int]]:
        """Where a Dict observation's `action_mask` lies (1 for a legal action), if it has one."""
        masks = [p for p in layout if p["name"] == "action_mask"] if len(layout) > 1 else []
        return (masks[0]["offset"], masks[0]["length"]) if masks else None

    class RunningMeanStd(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.register_buffer("mean", torch.zeros(dim))
            self.register_buffer("var", torch.ones(dim))
            self.register_buffer("count", torch.zeros(()))

    class ActorCritic(nn.Module):
        """The trained actor-critic: `forward(obs)` gives (logits or Gaussian mean, value); `act(obs)` the greedy
        action (the most likely legal class, or the mean, before the env's action space maps it). With a recurrent
        core (`--use_rnn`), both take the state too and give the next one: `forward(obs, state)` gives (out, value,
        next state), `act(obs, state)` (actions, next state); `initial_state(n)` is an episode's first state (zeros)
        and `state_dim` its width (the actor core's hidden states, and cell states for an LSTM, then the critic
        core's)."""

        def __init__(self) -> None:
            super().__init__()
            self.obs_scale = float(config.get("obs_scale", 1.0))
            self.actor_encoder = Encoder()
            self.critic_encoder = None if config.get("actor_critic_share_weights") else Encoder()
            self.recurrent = bool(config.get("use_rnn"))
            if self.recurrent:
                core = nn.LSTM if config["rnn_type"] == "lstm" else nn.GRU
                self.layers, self.size = config["rnn_num_layers"], config["rnn_size"]
                self.lstm = config["rnn_type"] == "lstm"
                self.actor_core = core(self.actor_encoder._size, self.size, self.layers, batch_first=True)
                self.critic_core = (
                    None
                    if self.critic_encoder is None
                    else core(self.critic_encoder._size, self.size, self.layers, batch_first=True)
                )
                per_core = (2 if self.lstm else 1) * self.layers * self.size
                self.state_dim = per_core * (1 if self.critic_core is None else 2)
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
            self.action_mask = action_mask()

        def initial_state(self, n: int) -> Any:
            return torch.zeros(n, self.state_dim)

        def _step(self, core: Any, x: Any, state: Any) -> Tuple[Any, Any]:
            """One step of `core` from `state` `[B, layers * size]` (then as many cell values for an LSTM)."""
            b, part = x.shape[0], self.layers * self.size

            def layered(t: Any) -> Any:
                return t.reshape(b, self.layers, self.size).transpose(0, 1).contiguous()

            def flat(t: Any) -> Any:
                return t.transpose(0, 1).reshape(b, part)

            if self.lstm:
                out, (h, c) = core(x.unsqueeze(1), (layered(state[:, :part]), layered(state[:, part:])))
                return out.squeeze(1), torch.cat([flat(h), flat(c)], 1)
            out, h = core(x.unsqueeze(1), layered(state))
            return out.squeeze(1), flat(h)

        def forward(self, obs: Any, state: Optional[Any] = None) -> Tuple[Any, ...]:
            raw = obs.to(torch.float32)
            x = raw
            if hasattr(self, "obs_normalizer"):
                rms = self.obs_normalizer
                x = ((x - rms.mean) / torch.sqrt(rms.var + 1e-5)).clamp(-10.0, 10.0)
            if self.obs_scale != 1.0:
                x = x / self.obs_scale
            actor = self.actor_encoder(x)
            critic = actor if self.critic_encoder is None else self.critic_encoder(x)
            if self.recurrent:
                state = self.initial_state(x.shape[0]) if state is None else state.to(torch.float32)
                if self.critic_core is None:
                    actor, next_state = self._step(self.actor_core, actor, state)
                    critic = actor
                else:
                    d = self.state_dim // 2
                    actor, next_actor = self._step(self.actor_core, actor, state[:, :d])
                    critic, next_critic = self._step(self.critic_core, critic, state[:, d:])
                    next_state = torch.cat([next_actor, next_critic], 1)
            out = self.action_head(actor)
            if self.adaptive_std:
                out = out[..., : out.shape[-1] // 2]
            if self.action_mask is not None:
                at, n = self.action_mask
                out = out.masked_fill(raw[..., at : at + n] < 0.5, float("-inf"))
            value = self.value_head(critic).squeeze(-1)
            if hasattr(self, "returns_normalizer"):
                rms = self.returns_normalizer
                value = value * torch.sqrt(rms.var + 1e-5) + rms.mean
            return (out, value, next_state) if self.recurrent else (out, value)

        @torch.no_grad()
        def act(self, obs: Any, state: Optional[Any] = None) -> Any:
            out, _, *rest = self.forward(obs, state)
            greedy = out if self.gaussian else out.argmax(-1)
            return (greedy, rest[0]) if self.recurrent else greedy

    class QNetwork(nn.Module):
        """DQN's trained network: `forward(obs)` gives the Q-values (`q_head`, or the dueling head's
        `V + A - mean(A)`), `act(obs)` the greedy action (the largest legal Q-value)."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = Encoder()
            if "q_head.weight" in state:
                self.q_head = nn.Linear(self.encoder._size, state["q_head.weight"].shape[0])
            else:
                self.value_head = nn.Linear(self.encoder._size, 1)
                self.advantage_head = nn.Linear(self.encoder._size, state["advantage_head.weight"].shape[0])
            self.obs_scale = float(config.get("obs_scale", 1.0))
            self.action_mask = action_mask()

        def forward(self, obs: Any) -> Any:
            raw = obs.to(torch.float32)
            h = self.encoder(raw / self.obs_scale if self.obs_scale != 1.0 else raw)
            if hasattr(self, "q_head"):
                return self.q_head(h)
            a = self.advantage_head(h)
            return self.value_head(h) + a - a.mean(-1, keepdim=True)

        @torch.no_grad()
        def act(self, obs: Any) -> Any:
            q = self.forward(obs)
            if self.action_mask is not None:
                at, n = self.action_mask
                q = q.masked_fill(obs.to(torch.float32)[..., at : at + n] < 0.5, float("-inf"))
            return q.argmax(-1)

    class SacActorNet(nn.Module):
        """`actor.…`: the encoder, then the Gaussian's mean and log standard deviation heads."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = Encoder()
            action_dim = state["actor.mean.weight"].shape[0]
            self.mean = nn.Linear(self.encoder._size, action_dim)
            self.log_std = nn.Linear(self.encoder._size, action_dim)

    class SacActor(nn.Module):
        """SAC's trained actor: `forward(obs)` gives the Gaussian's mean and log standard deviation (clamped to
        [-20, 2]) before the tanh squash; `act(obs)` the greedy action `tanh(mean)` in [-1, 1] (the env's bounds are
        reached by scaling, `low + (a + 1) / 2 * (high - low)`)."""

        def __init__(self) -> None:
            super().__init__()
            self.obs_scale = float(config.get("obs_scale", 1.0))
            self.actor = SacActorNet()

        def forward(self, obs: Any) -> Tuple[Any, Any]:
            x = obs.to(torch.float32)
            h = self.actor.encoder(x / self.obs_scale if self.obs_scale != 1.0 else x)
            return self.actor.mean(h), self.actor.log_std(h).clamp(-20.0, 2.0)

        @torch.no_grad()
        def act(self, obs: Any) -> Any:
            return torch.tanh(self.forward(obs)[0])

    algo = config.get("algo", "appo")
    model = QNetwork() if algo == "dqn" else SacActor() if algo == "sac" else ActorCritic()
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
    (logits or Gaussian mean, value) for a batch of flat float32 observations (a Dict's parts flattened and
    concatenated in its key order, as the env bridges do), `model.act(obs)` the greedy actions, which are
    `rlfactory enjoy --eval_deterministic`'s on the same observations. APPO's actor-critic and DQN's Q-network
    (`model(obs)` gives the Q-values), with MLP and convolutional encoders (`--encoder_conv_layers`,
    `--encoder_conv_architecture`) and APPO's GRU or LSTM core (`--use_rnn`: `act(obs, state)` gives the actions
    and the next state; `initial_state(n)` starts an episode), and SAC's actor (`act(obs)` gives `tanh(mean)`, in
    [-1, 1] before the env's bounds scale it); custom encoders (the user's own Rust network) raise ConfigError."""
    folder = Path(train_dir) / experiment
    try:
        with open(folder / "config.json") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{folder / 'config.json'}: no such file (is {folder} an experiment folder?)") from None
    unsupported = [flag for flag, plain in [("encoder_custom", "")] if config.get(flag, plain) != plain]
    if config.get("algo", "appo") != "appo" and config.get("use_rnn"):
        unsupported.append("use_rnn")
    if config.get("algo", "appo") not in ("appo", "dqn", "sac") or unsupported:
        what = f"--{unsupported[0]}" if unsupported else f"--algo {config.get('algo')}"
        raise ConfigError(
            f"load_policy builds APPO's actor-critic, DQN's Q-network and SAC's actor; {folder} was trained with {what}"
        )
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
        state, metadata = _read_safetensors(out)
    return _build(state, config, json.loads(metadata["observation_layout"]))
