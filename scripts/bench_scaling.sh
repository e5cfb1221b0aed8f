#!/usr/bin/env bash
# A scaling table: CartPole-v1 with the default config and --benchmark, over
# --num_workers {1,2,4} x --worker_num_splits {1,2} x --num_envs_per_worker {8,32,128}; prints one
# markdown row per run: steady-state FPS and the CPU seconds of each component over the run.
# Usage: bash scripts/bench_scaling.sh [SECONDS]   (default 8 per run; about 3 minutes)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/setup_libtorch.sh)"
cargo build -q --release -p rlfactory
secs="${1:-8}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "| workers | splits | envs/worker | FPS (steady) | rollout workers CPU s | inference CPU s | learner CPU s | runner CPU s | wall s |"
echo "|---|---|---|---|---|---|---|---|---|"
for workers in 1 2 4; do
    for splits in 1 2; do
        for envs in 8 32 128; do
            json="$out/$workers-$splits-$envs.json"
            target/release/rlfactory train --env=CartPole-v1 --benchmark --train_for_seconds="$secs" \
                --num_workers="$workers" --worker_num_splits="$splits" --num_envs_per_worker="$envs" \
                --summary_json="$json" >/dev/null 2>&1
            python3 - "$json" "$workers" "$splits" "$envs" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
cpu = s["cpu_seconds"]
rollout = sum(v for k, v in cpu.items() if k.startswith("rollout_worker_"))
inference = sum(v for k, v in cpu.items() if k.startswith("inference_worker_"))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {s['fps']:,.0f} | {rollout:.2f} | {inference:.2f} "
      f"| {cpu.get('learner', 0):.2f} | {cpu.get('main', 0):.2f} | {s['wall_seconds']:.1f} |")
PY
        done
    done
done
