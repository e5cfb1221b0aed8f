#!/usr/bin/env bash
# Learner overhead over raw libtorch in instructions, which the machine's load does not move:
# each of raw libtorch, rlfactory with 1 epoch per dataset and with 10 runs under callgrind with
# 0 and STEPS timed SGD steps; the difference divided by STEPS is the instructions of one step.
# Usage: bash scripts/bench_learner.sh [STEPS]   (default 40; about 10 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/setup_libtorch.sh)"
cargo build -q --release -p rlfactory --example learner_bench
bin=target/release/examples/learner_bench
steps="${1:-40}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

instructions() { # what steps
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1.$2" "$bin" --only "$1" --steps "$2" >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$out/cg.$1.$2"
}

per_step() { # what
    local zero many
    zero="$(instructions "$1" 0)"
    many="$(instructions "$1" "$steps")"
    echo $(( (many - zero) / steps ))
}

raw="$(per_step raw)"
echo "raw libtorch PPO step: $raw instructions"
for epochs in 1 10; do
    ours="$(per_step "$epochs")"
    awk -v o="$ours" -v r="$raw" -v e="$epochs" \
        'BEGIN { printf "rlfactory Appo::train, %d epoch(s) per dataset: %d instructions per SGD step (%+.1f%% vs raw)\n", e, o, (o / r - 1) * 100 }'
done
