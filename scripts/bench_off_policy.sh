#!/usr/bin/env bash
# Off-policy learning over 5 seeds with the shipped configs: each run trains for its config's budget, then its
# deterministic (greedy) policy plays 20 episodes. One line per run, then the median per config.
# Usage: bash scripts/bench_off_policy.sh [CONFIG ...]   CONFIG = ENV:ALGO (default: every shipped off-policy config
# of a classic-control env); SEEDS="1 2 3 4 5" by default; FLAGS="--flag value ..." adds training flags to every run.
# About 30-150 s per run on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/setup_libtorch.sh)"
cargo build -q --release -p rlfactory
bin=target/release/rlfactory
seeds="${SEEDS:-1 2 3 4 5}"
read -r -a flags <<<"${FLAGS:-}"
configs=("$@")
if [ ${#configs[@]} -eq 0 ]; then
    configs=(CartPole-v1:dqn Acrobot-v1:dqn MountainCar-v0:dqn Pendulum-v1:sac)
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

for config in "${configs[@]}"; do
    env="${config%%:*}"
    algo="${config##*:}"
    returns=()
    for seed in $seeds; do
        start=$EPOCHREALTIME
        "$bin" train --env "$env" --algo "$algo" --seed "$seed" --train_dir "$out" --experiment "$env-$algo-$seed" \
            --report_interval_sec 0 --summary_json "$out/summary.json" ${flags[@]+"${flags[@]}"} >/dev/null 2>"$out/train.log" ||
            { tail -5 "$out/train.log"; exit 1; }
        wall=$(awk "BEGIN {print $EPOCHREALTIME - $start}")
        ret=$("$bin" eval --env "$env" --train_dir "$out" --experiment "$env-$algo-$seed" --max_num_episodes 20 \
            --eval_deterministic 2>/dev/null | awk '/^mean return/ {print $3}')
        frames=$(python3 -c "import json; print(json.load(open('$out/summary.json'))['env_frames'])")
        printf '%s %s seed %s: %s env steps, greedy mean return %s over 20 episodes, %.0f s\n' \
            "$env" "$algo" "$seed" "$frames" "$ret" "$wall"
        returns+=("$ret")
    done
    median=$(printf '%s\n' "${returns[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "$env $algo: median greedy return $median (seeds $seeds)"
done
