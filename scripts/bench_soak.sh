#!/usr/bin/env bash
# Memory over a long run: trains at full speed for SECONDS (default 900) and every 10 s samples, summed over every
# process of the run, the resident set size (RSS: shared pages counted in every process that maps them), the
# proportional set size (PSS: shared memory counted once, split between the processes that map it), its private part
# (heap, stacks), and the KiB allocated to the run's segments in /dev/shm. Prints the samples, then the growth of each
# from the sample at 60 s to the last one. The target: under 2%.
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

# The sum of `field` (Rss: resident pages, shared ones in every process; Pss: shared memory counted once, split between
# the processes that map it; Pss_Anon: its private part, heap and stacks) over every process of the session `sid`, in
# KiB.
session_sum() {
    local total=0 pid kib
    for pid in $(ps -o pid= -s "$1"); do
        kib=$(awk -v f="$2:" '$1 == f {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || true)
        total=$((total + ${kib:-0}))
    done
    echo "$total"
}

# KiB allocated in /dev/shm to the segments of the process `pid` (the run's main process creates them all).
shm_used() {
    local blocks
    blocks=$(find /dev/shm -maxdepth 1 -name "rlf.$1.*" -printf '%b\n' 2>/dev/null | awk '{s += $1} END {print s + 0}')
    echo $((blocks / 2))
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
    setsid "$bin" train "${flags[@]}" --benchmark --train_for_seconds "$seconds" --train_for_env_steps 100000000000 \
        --report_interval_sec 60 2>"$out/$run.log" &
    sid=$!
    echo "== $run: ${flags[*]}, ${seconds} s (pid $sid)"
    echo "   t(s)  processes  RSS(KiB)  PSS(KiB)  private(KiB)  /dev/shm(KiB)"
    samples="$out/$run.samples"
    : >"$samples"
    start=$SECONDS
    while kill -0 "$sid" 2>/dev/null; do
        t=$((SECONDS - start))
        line="$t $(ps -o pid= -s "$sid" | wc -l) $(session_sum "$sid" Rss) $(session_sum "$sid" Pss) $(session_sum "$sid" Pss_Anon) $(shm_used "$sid")"
        echo "$line" >>"$samples"
        printf '   %4d  %9d  %8d  %8d  %12d  %13d\n' $line
        # The run ends the wait early; the sampler has nothing else to do.
        timeout 10 tail --pid="$sid" -f /dev/null || true
    done
    wait "$sid" || { tail -5 "$out/$run.log"; exit 1; }
    awk -v run="$run" '
        $1 >= 60 && !base { rss = $3; base = $4; anon = $5; shm = $6; processes = $2 }
        # The last sample of the whole run (not one taken while its processes exit).
        base && $2 == processes { last_rss = $3; last = $4; last_anon = $5; last_shm = $6 }
        END {
            if (!base) { print run ": too short to measure (no sample at 60 s)"; exit }
            printf "%s: from 60 s to the end, RSS %d -> %d KiB (%+.2f%%), PSS %d -> %d KiB (%+.2f%%), private %d -> %d KiB (%+.2f%%), /dev/shm %d -> %d KiB (%+.2f%%)\n", \
                run, rss, last_rss, 100 * (last_rss - rss) / rss, base, last, 100 * (last - base) / base, \
                anon, last_anon, 100 * (last_anon - anon) / anon, shm, last_shm, 100 * (last_shm - shm) / (shm ? shm : 1)
        }' "$samples"
    grep -E 'benchmark: ' "$out/$run.log" | tail -1
done
