#!/usr/bin/env bash
# Atari Pong throughput, rlfactory against Sample Factory 2.1.1 on the same machine, worker and env counts and
# network (docs/benchmarks.md): interleaved runs (rlfactory, Sample Factory, rlfactory, ...), each training for
# a fixed wall time from scratch; prints one markdown row per run.
#
# Usage: bash scripts/bench_atari.sh [PAIRS] [SECONDS] [RLFACTORY FLAGS...]   (default 2 pairs of 90 s)
#
# rlfactory runs `atari_pong` with its shipped config (configs/atari.toml: 2 workers x 4 envs, its network, 4
# epochs of its minibatches over 128-step trajectories), the flags given after SECONDS (for example
# `--batch_size 256 --num_batches_per_epoch 4`) and `--benchmark`; Sample Factory gets the same network and
# minibatches: the `--encoder_conv_architecture`, `--batch_size` and `--num_batches_per_epoch` among those flags,
# else atari.toml's; its FPS is the steady-state rate
# (after the first weight update) in agent steps. Sample Factory runs `sf_examples.atari.train_atari` on the CPU with
# its Atari defaults and the same counts, network and minibatches, on ale-py 0.9.0 (whose import registers the
# `PongNoFrameskip-v4` that Sample Factory makes). Sample Factory counts
# emulator frames (its FPS is multiplied by `--env_frameskip` 4): the table gives both, and compares agent steps.
# Sample Factory lives in its own venv (.venv-sf: sample-factory, torch from PyPI, gymnasium 0.29.1, ale-py 0.9.0),
# made on the first run (a few GB, several minutes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pairs="${1:-2}"
secs="${2:-90}"
shift "$(($# < 2 ? $# : 2))"

source scripts/setup_python.sh >/dev/null
eval "$(bash scripts/setup_libtorch.sh)"
cargo build -q --release -p rlfactory --features python

sf=.venv-sf
if ! "$sf/bin/python" -c "import sample_factory, sf_examples.atari.train_atari, ale_py" 2>/dev/null; then
    echo "bench_atari: installing Sample Factory 2.1.1 into $sf" >&2
    python3 -m venv "$sf"
    "$sf/bin/pip" install -q "sample-factory==2.1.1" "gymnasium==0.29.1" "ale-py==0.9.0" "numpy==1.26.4"
fi

# The settings both frameworks share, each the flags' (`--name=value` or `--name value`, last one wins), else
# atari.toml's: the network and the minibatches.
setting() {
    local name="$1" value prev="" flag
    value="$(sed -n "s/^$name = \"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" crates/rlfactory/configs/atari.toml)"
    for flag in "${@:2}"; do
        case "$flag" in
        "--$name="*) value="${flag#*=}" ;;
        *) [[ "$prev" == "--$name" ]] && value="$flag" ;;
        esac
        prev="$flag"
    done
    [[ -n "$value" ]] || { echo "bench_atari: no $name in configs/atari.toml or the flags" >&2; return 1; }
    echo "$value"
}
arch="$(setting encoder_conv_architecture "$@")"
batch_size="$(setting batch_size "$@")"
batches="$(setting num_batches_per_epoch "$@")"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cat > "$out/sf_atari.py" <<'PY'
import sys

# Importing ale_py registers its ids with Gymnasium, Sample Factory's PongNoFrameskip-v4 among them (Sample Factory
# itself only calls gym.make).
import ale_py  # noqa: F401
from sf_examples.atari.train_atari import main

# Sample Factory starts its workers by spawning: the entry point must be guarded.
if __name__ == "__main__":
    sys.exit(main())
PY

echo "| run | framework | agent steps/s | Sample Factory's FPS (emulator frames) | wall s | CPU s: learner / inference / rollout workers |"
echo "|---|---|---|---|---|---|"
for pair in $(seq 1 "$pairs"); do
    json="$out/rlf-$pair.json"
    target/release/rlfactory train --env=atari_pong "$@" --benchmark --train_for_seconds="$secs" \
        --summary_json="$json" >"$out/rlf-$pair.log" 2>&1
    python3 - "$json" "$pair" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
cpu = s["cpu_seconds"]
rollout = sum(v for k, v in cpu.items() if k.startswith("rollout_worker_"))
inference = sum(v for k, v in cpu.items() if k.startswith("inference_worker_"))
print(f"| {sys.argv[2]} | rlfactory | {s['fps']:,.0f} | — | {s['wall_seconds']:.0f} "
      f"| {cpu.get('learner', 0):.1f} / {inference:.1f} / {rollout:.1f} |")
PY
    log="$out/sf-$pair.log"
    timeout --kill-after=30 "$((secs + 120))" "$sf/bin/python" "$out/sf_atari.py" --env=atari_pong \
        --experiment="sf-$pair" --train_dir="$out/sf" --device=cpu --num_workers=2 --num_envs_per_worker=4 \
        --worker_num_splits=1 --encoder_conv_architecture="$arch" --batch_size="$batch_size" \
        --num_batches_per_epoch="$batches" --with_wandb=False \
        --train_for_seconds="$secs" >"$log" 2>&1 || true
    # The 60-second average of the last progress line (Sample Factory prints "Fps is (10 sec: a, 60 sec: b, ...)").
    python3 - "$log" "$pair" "$secs" <<'PY'
import re, sys
fps = re.findall(r"Fps is \(10 sec: [0-9.nan]+, 60 sec: ([0-9.]+)", open(sys.argv[1]).read())
if not fps:
    tail = "".join(open(sys.argv[1]).readlines()[-20:])
    sys.exit(f"bench_atari: Sample Factory printed no FPS; its log ends with:\n{tail}")
f = float(fps[-1])
print(f"| {sys.argv[2]} | Sample Factory 2.1.1 | {f / 4:,.0f} | {f:,.0f} | {sys.argv[3]} | — |")
PY
done
