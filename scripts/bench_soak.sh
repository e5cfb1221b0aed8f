#!/usr/bin/env bash
# Memory over a long run (issue 32): trains at full speed for SECONDS (default 900) and every 10 s samples the
# proportional set size (PSS: shared memory counted once, split between the processes that map it) of every process
# of the run and the bytes in use in /dev/shm. Prints the samples, then the growth from the sample at 60 s to the
# last one. The target: under 2%.
# Usage: bash scripts/bench_soak.sh [cartpole|treasurehunt ...]   (default: both)
#   cartpole      CartPole-v1, APPO, the default config (parallel)
#   treasurehunt  Treasurehunt, 5 DQN learners (configs/treasurehunt-iqn-like.toml, parallel)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(bash scripts/setup_libtorch.sh)"
cargo build -q --release -p rlfactory
bin=target/release/rlfactory
seconds="${SECONDS_PER_RUN:-900}"
runs=("$@")
if ((${#runs[@]} == 0)); then
    runs=(cartpole treasurehunt)
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# The PSS of every process of the session `sid`, in KiB.
session_pss() {
    local total=0 pid pss
    for pid in $(ps -o pid= -s "$1"); do
        pss=$(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || true)
        total=$((total + ${pss:-0}))
    done
    echo "$total"
}

# KiB in use in /dev/shm.
shm_used() {
    df -k --output=used /dev/shm | tail -1 | tr -d ' '
}

for run in "${runs[@]}"; do
    case "$run" in
    cartpole) flags=(--env CartPole-v1) ;;
    treasurehunt) flags=(--env treasurehunt --algo dqn --config crates/rlfactory/configs/treasurehunt-iqn-like.toml) ;;
    *)
        echo "bench_soak: unknown run '$run' (cartpole, treasurehunt)" >&2
        exit 2
        ;;
    esac
    shm_before=$(shm_used)
    setsid "$bin" train "${flags[@]}" --benchmark --train_for_seconds "$seconds" --train_for_env_steps 100000000000 \
        --report_interval_sec 60 2>"$out/$run.log" &
    sid=$!
    echo "== $run: ${flags[*]}, ${seconds} s (pid $sid); /dev/shm had ${shm_before} KiB in use before"
    echo "   t(s)  processes  PSS(KiB)  /dev/shm(KiB)"
    samples="$out/$run.samples"
    : >"$samples"
    start=$SECONDS
    while kill -0 "$sid" 2>/dev/null; do
        t=$((SECONDS - start))
        line="$t $(ps -o pid= -s "$sid" | wc -l) $(session_pss "$sid") $(($(shm_used) - shm_before))"
        echo "$line" >>"$samples"
        printf '   %4d  %9d  %8d  %13d\n' $line
        # The run ends the wait early; the sampler has nothing else to do.
        timeout 10 tail --pid="$sid" -f /dev/null || true
    done
    wait "$sid" || { tail -5 "$out/$run.log"; exit 1; }
    awk -v run="$run" '
        $1 >= 60 && !base { base = $3; shm = $4; processes = $2 }
        # The last sample of the whole run (not one taken while its processes exit).
        base && $2 == processes { last = $3; last_shm = $4 }
        END {
            if (!base) { print run ": too short to measure (no sample at 60 s)"; exit }
            printf "%s: PSS %d KiB at 60 s, %d KiB at the end: %+.2f%%; /dev/shm %d -> %d KiB\n", \
                run, base, last, 100 * (last - base) / base, shm, last_shm
        }' "$samples"
    grep -E 'benchmark: ' "$out/$run.log" | tail -1
done
