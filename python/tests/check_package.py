"""The Python package as a user meets it (run by `scripts/test_package` in a venv where `pip install .` put it).

An env class defined in this script trains in parallel mode through `rlfactory.train` to a return threshold; the
policy loaded with `rlfactory.load_policy` takes, on every observation `rlfactory.enjoy --eval_deterministic` saw,
the action enjoy took (the env records both), and so do convolutional policies of a Dict with an image; a bad flag
is a `ConfigError` with the binary's one-line message; an interrupted run stops cleanly; `help(rlfactory.train)`
lists the flags; a PettingZoo env class trains. Each check prints a line as cargo's tests do, and the last line the
totals; the exit code is 1 if one failed.
"""

import glob
import json
import os
import pydoc
import select
import signal
import subprocess
import sys
import tempfile
import threading

import gymnasium as gym
import numpy as np
import torch

import rlfactory

THRESHOLD = 18.0


class SignEnv(gym.Env):
    """Four values in [-1, 1]; the right action is 1 when the first two sum above 0. A reward of 1 for each right
    action, 20 steps an episode: a random policy scores 10, a perfect one 20. With `SIGN_ENV_RECORD` set, each step
    appends the observation and the action taken to that file (one JSON list per line)."""

    def __init__(self, length=20):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length = length
        self.record = os.environ.get("SIGN_ENV_RECORD")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.obs = self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32)
        return self.obs, {}

    def step(self, action):
        right = int(self.obs[0] + self.obs[1] > 0)
        if self.record:
            with open(self.record, "a") as f:
                f.write(json.dumps([self.obs.tolist(), int(action)]) + "\n")
        self.t += 1
        self.obs = self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32)
        return self.obs, float(int(action) == right), False, self.t >= self.length, {}


class SignBox(SignEnv):
    """SignEnv with one continuous action in [-1, 1]: the reward is 1 minus the distance to the sign of the first two
    values' sum. With `SIGN_ENV_RECORD` set, each step appends the observation and the action taken."""

    def __init__(self, length=20):
        super().__init__(length)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action):
        value = float(np.asarray(action).ravel()[0])
        if self.record:
            with open(self.record, "a") as f:
                f.write(json.dumps([self.obs.tolist(), value]) + "\n")
        target = 1.0 if self.obs[0] + self.obs[1] > 0 else -1.0
        self.t += 1
        self.obs = self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32)
        return self.obs, 1.0 - abs(value - target), False, self.t >= self.length, {}


class PixelSign(gym.Env):
    """A Dict observation: a 36x36 RGB picture of noise whose left or right half is lit, and two values; the right
    action is the lit side. With `PIXEL_ENV_RECORD` set, each step appends the observation (flat, as the bridge
    flattens it: the parts in the space's key order) and the action taken to that file."""

    def __init__(self, length=20):
        self.observation_space = gym.spaces.Dict({
            "pixels": gym.spaces.Box(0, 255, (36, 36, 3), np.uint8),
            "position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        })
        self.action_space = gym.spaces.Discrete(2)
        self.length = length
        self.record = os.environ.get("PIXEL_ENV_RECORD")

    def _observe(self):
        pixels = self.np_random.integers(0, 64, (36, 36, 3), dtype=np.uint8)
        self.side = int(self.np_random.integers(2))
        pixels[:, 18 * self.side : 18 * (self.side + 1), :] += 128
        self.obs = {"pixels": pixels, "position": self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)}
        return self.obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        if self.record:
            flat = np.concatenate([self.obs[k].astype(np.float32).ravel() for k in self.observation_space.spaces])
            with open(self.record, "a") as f:
                f.write(json.dumps([flat.tolist(), int(action)]) + "\n")
        right = self.side
        self.t += 1
        return self._observe(), float(int(action) == right), False, self.t >= self.length, {}


class SignGame:
    """SignEnv for two agents at once (a PettingZoo Parallel env): each sees its own four values."""

    metadata = {"name": "sign_game_v0"}

    def __init__(self, length=10):
        self.possible_agents = ["a_0", "a_1"]
        self.length = length
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (4,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def _observe(self):
        self.obs = {a: self.rng.uniform(-1.0, 1.0, 4).astype(np.float32) for a in self.agents}
        return dict(self.obs)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        rewards = {a: float(int(actions[a]) == int(self.obs[a][0] + self.obs[a][1] > 0)) for a in self.agents}
        self.t += 1
        done = self.t >= self.length
        obs = self._observe()
        flags = {a: False for a in self.agents}
        truncated = {a: done for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, flags, truncated, {a: {} for a in rewards}

    def close(self):
        pass


RESULTS = []


def check(condition, what):
    """One check, reported as cargo reports a test (scripts/test counts them)."""
    print(f"test python_package: {what} ... {'ok' if condition else 'FAILED'}", flush=True)
    RESULTS.append(bool(condition))
    return condition


def wandb_records(path):
    """The records of a W&B run file (`run-<id>.wandb` of an offline run): a 7-byte header, then blocks of 32 KiB of
    records, each a 7-byte header (checksum, little-endian length, kind: whole, first, middle or last part) and a
    serialised `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    pos, block, parts = 7, 32768, []
    while data[:4] == b":W&B" and pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        parts = [chunk] if kind in (1, 2) else parts + [chunk]
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            yield record


def check_wandb(train_dir):
    """`with_wandb` offline: the run file in the experiment folder holds the config, the return scalar at each
    summary and the learning curve's image."""
    os.environ["WANDB_MODE"] = "offline"
    try:
        summary = rlfactory.train(env="CartPole-v1", experiment="wandb", train_dir=train_dir, with_wandb=True,
                                  wandb_project="rlfactory-tests", train_for_env_steps=60_000)
    finally:
        del os.environ["WANDB_MODE"]
    runs = glob.glob(os.path.join(train_dir, "wandb", "wandb", "offline-run-*", "run-*.wandb"))
    rows, config = [], {}
    for record in wandb_records(runs[0]) if runs else []:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    returns = [(r["env_frames"], r["reward/reward"]) for r in rows if "reward/reward" in r]
    image = any(r.get("learning_curve/_type") == "image-file" for r in rows)
    env = config.get("env", {}).get("value") if isinstance(config.get("env"), dict) else config.get("env")
    check(len(runs) == 1 and len(returns) >= 3 and returns[-1][0] == summary.env_frames and env == "CartPole-v1"
          and image,
          f"with_wandb offline: the run file holds {len(returns)} returns (the last {returns[-1:]}, the summary's "
          f"{summary.env_frames} frames, {summary.mean_return}), the config's env {env!r}, the curve (image: {image})")


def check_orphan_stops(train_dir):
    """A Python process that dies (SIGKILL) takes its run with it: the binary gets SIGTERM, saves its checkpoint,
    exits, and leaves no shared-memory segment of its own behind."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = (
        f"import sys; sys.path.insert(0, {here!r}); import rlfactory; from check_package import SignEnv; "
        f"rlfactory.train(env=SignEnv, experiment='orphan', train_dir={train_dir!r}, train_for_env_steps=10**9)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in parent.stdout:
        if b"| fps " in line and b"frames 0 of" not in line:
            break
    with open(f"/proc/{parent.pid}/task/{parent.pid}/children") as f:
        runner = int(f.read().split()[0])
    pidfd = os.pidfd_open(runner)
    parent.kill()
    parent.wait()
    exited = bool(select.select([pidfd], [], [], 60.0)[0])
    os.close(pidfd)
    folder = os.path.join(train_dir, "orphan", "checkpoint_p0")
    saved = [d for d in os.listdir(folder) if d.endswith(".safetensors")] if os.path.isdir(folder) else []
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"rlf.{runner}.")]
    check(exited and saved and not left,
          f"a run whose Python process is killed stops within 60 s (exited: {exited}), with its checkpoint "
          f"({saved}) and no shared memory of its own left ({left})")


def enjoy_steps(experiment, train_dir, variable):
    """Runs enjoy --eval_deterministic (5 episodes of 20 steps) with the env recording each observation and action in
    the file named by `variable`; the recorded (observation, action) pairs."""
    record = os.path.join(train_dir, f"{experiment}_steps.jsonl")
    os.environ[variable] = record
    try:
        rlfactory.enjoy(experiment=experiment, train_dir=train_dir, max_num_episodes=5, eval_deterministic=True)
    finally:
        del os.environ[variable]
    with open(record) as f:
        return [json.loads(line) for line in f]


def check_actions_against_enjoy(policy, experiment, train_dir, variable):
    """How many steps enjoy took (`enjoy_steps`), on how many of them `policy.act` takes enjoy's action, and how many
    different actions enjoy took (a policy of one action would agree with anything)."""
    steps = enjoy_steps(experiment, train_dir, variable)
    obs = torch.tensor([s[0] for s in steps], dtype=torch.float32)
    taken = torch.tensor([s[1] for s in steps])
    greedy = policy.act(obs)
    return len(steps), int((greedy == taken).sum()), len(set(taken.tolist()))


def check_sac_actor(train_dir):
    """load_policy of SAC's actor: its greedy actions, tanh of the mean, are those enjoy took (the env's bounds are
    [-1, 1], so unscaled), to float32 rounding (1e-5), and they vary with the observation a hundred times more than
    that (a short run: the actor has not learned yet, but a wrong layout or squash would show)."""
    rlfactory.train(env=SignBox, experiment="sign_sac", train_dir=train_dir, algo="sac", serial_mode=True,
                    train_for_env_steps=3000, learning_starts=500, seed=1)
    actor = rlfactory.load_policy("sign_sac", train_dir=train_dir)
    steps = enjoy_steps("sign_sac", train_dir, "SIGN_ENV_RECORD")
    obs = torch.tensor([s[0] for s in steps], dtype=torch.float32)
    taken = torch.tensor([s[1] for s in steps])
    greedy = actor.act(obs).squeeze(-1)
    gap = float((greedy - taken).abs().max())
    spread = float(taken.std())
    check(len(steps) == 100 and gap < 1e-5 and spread > 1e-3,
          f"load_policy of SAC's actor takes enjoy's greedy actions on its {len(steps)} observations (largest "
          f"difference {gap:.2e}, the actions' spread {spread:.3f})")


def check_recurrent_policies(train_dir):
    """load_policy of APPO with a recurrent core: a GRU shared by actor and critic, and separate two-layer LSTMs; the
    state goes from step to step as enjoy's does, from zeros at each episode's start (SignEnv's are 20 steps)."""
    for experiment, flags in [
        ("sign_gru", dict(rnn_type="gru", actor_critic_share_weights=True)),
        ("sign_lstm", dict(rnn_type="lstm", rnn_num_layers=2, rnn_size=32)),
    ]:
        rlfactory.train(env=SignEnv, experiment=experiment, train_dir=train_dir, serial_mode=True, use_rnn=True,
                        train_for_env_steps=4000, seed=1, **flags)
        policy = rlfactory.load_policy(experiment, train_dir=train_dir)
        steps = enjoy_steps(experiment, train_dir, "SIGN_ENV_RECORD")
        agree, state = 0, None
        for t, (obs, taken) in enumerate(steps):
            if t % 20 == 0:
                state = policy.initial_state(1)
            action, state = policy.act(torch.tensor([obs], dtype=torch.float32), state)
            agree += int(action.item() == taken)
        kinds = len({taken for _, taken in steps})
        check(len(steps) == 100 and agree == len(steps) and kinds == 2,
              f"load_policy of a --use_rnn --rnn_type {flags['rnn_type']} policy, stepped with its state, takes "
              f"enjoy's greedy actions on its {len(steps)} observations ({agree} agree)")


def check_convolutional_policies(train_dir):
    """load_policy of the two convolutional encoders over a Dict of an image and a vector: a named network per part
    (`--encoder_conv_architecture`) and convolutions over the image then an MLP (`--encoder_conv_layers`)."""
    for experiment, flags in [
        ("pixels_named", dict(encoder_conv_architecture="convnet_simple", encoder_conv_mlp_layers="64",
                              obs_scale=255.0)),
        ("pixels_layers", dict(encoder_conv_layers="8x3s2,8x3", normalize_input=True)),
    ]:
        rlfactory.train(env=PixelSign, experiment=experiment, train_dir=train_dir, serial_mode=True,
                        train_for_env_steps=4000, seed=1, **flags)
        policy = rlfactory.load_policy(experiment, train_dir=train_dir)
        n, agree, kinds = check_actions_against_enjoy(policy, experiment, train_dir, "PIXEL_ENV_RECORD")
        flag = next(iter(flags))
        check(n == 100 and agree == n and kinds == 2,
              f"load_policy of a --{flag} policy over a Dict with an image takes enjoy's greedy actions on its {n} "
              f"observations ({agree} agree)")


def run_checks(train_dir):
    """Every check of this script, its runs written under `train_dir`; returns the number that failed."""
    import ale_py
    import pettingzoo

    print(f"numpy {np.__version__}, gymnasium {gym.__version__}, pettingzoo {pettingzoo.__version__}, "
          f"ale-py {ale_py.__version__}, torch {torch.__version__}", flush=True)

    summary = rlfactory.train(
        env=SignEnv,
        experiment="sign",
        train_dir=train_dir,
        num_workers=2,
        num_envs_per_worker=16,
        train_for_env_steps=2_000_000,
        stop_at_reward=THRESHOLD,
        seed=1,
    )
    check(summary.mean_return is not None and summary.mean_return >= THRESHOLD,
          f"trained a class of this script in parallel mode: mean return {summary.mean_return} >= {THRESHOLD} "
          f"after {summary.env_frames} frames")

    policy = rlfactory.load_policy("sign", train_dir=train_dir)
    check(isinstance(policy, torch.nn.Module), "load_policy gives a torch.nn.Module")

    n, agree, kinds = check_actions_against_enjoy(policy, "sign", train_dir, "SIGN_ENV_RECORD")
    check(n == 100 and agree == n and kinds == 2,
          f"load_policy's greedy actions equal enjoy --eval_deterministic's on its {n} observations ({agree} agree)")
    check_convolutional_policies(train_dir)
    check_recurrent_policies(train_dir)
    check_sac_actor(train_dir)
    rlfactory.train(env=SignEnv, experiment="sign_dqn", train_dir=train_dir, algo="dqn", serial_mode=True,
                    train_for_env_steps=6000, seed=1)
    q_network = rlfactory.load_policy("sign_dqn", train_dir=train_dir)
    n, agree, kinds = check_actions_against_enjoy(q_network, "sign_dqn", train_dir, "SIGN_ENV_RECORD")
    check(n == 100 and agree == n and kinds == 2,
          f"load_policy of a DQN Q-network takes enjoy's greedy actions on its {n} observations ({agree} agree)")

    try:
        rlfactory.train(env=SignEnv, train_dir=train_dir, experiment="bad", num_workers=0)
        check(False, "a bad flag raises ConfigError")
    except rlfactory.ConfigError as e:
        check("num_workers" in str(e) and "\n" not in str(e), f"a bad flag raises ConfigError: {e}")

    # Ctrl-C in a notebook or a terminal: a KeyboardInterrupt in this process stops the run cleanly, with its
    # checkpoint, and is raised again.
    timer = threading.Timer(6.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        rlfactory.train(env=SignEnv, experiment="interrupted", train_dir=train_dir, train_for_env_steps=10**9)
        check(False, "a KeyboardInterrupt stops the run")
    except KeyboardInterrupt:
        folder = os.path.join(train_dir, "interrupted")
        saved = [d for d in os.listdir(os.path.join(folder, "checkpoint_p0")) if d.startswith("checkpoint_")]
        check(bool(saved), f"a KeyboardInterrupt stops the run with a checkpoint ({saved})")
    finally:
        timer.cancel()

    doc = pydoc.render_doc(rlfactory.train)
    check("--num_workers" in doc and "--train_for_env_steps" in doc, "help(rlfactory.train) lists the flags")

    check_orphan_stops(train_dir)
    check_wandb(train_dir)

    # The bridges with this environment's versions (registered ids; the suite's golden-file tests pin older ones).
    for env, flags in [
        ("gym:Acrobot-v1", {}),
        ("pz:pettingzoo.classic.connect_four_v3", {}),
        ("atari_pong", dict(num_workers=1, num_envs_per_worker=2)),
    ]:
        run = rlfactory.train(env=env, train_dir=train_dir, experiment=env.replace(":", "_"),
                              train_for_env_steps=4000, save_experiment=False, **flags)
        check(run.env_frames >= 4000 and run.episodes > 0,
              f"{env} trains with this environment's packages ({run.env_frames} frames, {run.episodes} episodes)")

    game = rlfactory.train(env=SignGame, experiment="game", train_dir=train_dir, train_for_env_steps=40_000)
    check(game.env_frames >= 40_000 and len(game.agents) == 2,
          f"a PettingZoo env class of this script trains ({game.env_frames} frames, {len(game.agents)} agents)")

    passed, failed = RESULTS.count(True), RESULTS.count(False)
    print(f"test result: {'FAILED' if failed else 'ok'}. {passed} passed; {failed} failed", flush=True)
    return failed


def main():
    with tempfile.TemporaryDirectory(prefix="rlfactory-package-", ignore_cleanup_errors=True) as train_dir:
        failed = run_checks(train_dir)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
