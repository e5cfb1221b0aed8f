#!/usr/bin/env bash
# CartPole-v1 throughput of one process against the MPI async workflow with 1 learner rank + 1 actor rank on the
# same cores, in interleaved pairs (A B A B ...), with each MPI run's traffic: bytes per env frame and per weight
# update, messages per second, and the learner rank's time waiting for data.
#   bash scripts/bench_mpi.sh [PAIRS] [extra train flags...]
# Needs a build with the `mpi` feature: cargo build --release -p rlfactory --features mpi
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/setup_libtorch.sh 2>/dev/null)"
pairs=${1:-6}
shift || true
bin=target/release/rlfactory
mpirun=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
fps() { sed -n 's/.*benchmark: steady-state fps \([0-9]*\).*/\1/p'; }
single=() ; multi=()
for i in $(seq "$pairs"); do
  a=$("$bin" train --env CartPole-v1 --benchmark "$@" 2>&1 | fps)
  log=$("${mpirun[@]}" -n 2 "$bin" train --env CartPole-v1 --benchmark --mpi "$@" 2>&1)
  b=$(echo "$log" | fps)
  single+=("$a"); multi+=("$b")
  frames=$(echo "$log" | sed -n 's/.*steady-state fps [0-9]* (\([0-9]*\) env frames.*/\1/p')
  echo "$log" | grep "^\[rlfactory\] rank 0 " | sed 's/^\[rlfactory\] //' | while read -r line; do
    sent=$(echo "$line" | sed -n 's/.*sent \([0-9]*\) messages (\([0-9]*\) bytes).*/\1 \2/p')
    recv=$(echo "$line" | sed -n 's/.*received \([0-9]*\) messages (\([0-9]*\) bytes) in \([0-9.]*\) s; waited \([0-9.]*\) s.*/\1 \2 \3 \4/p')
    read -r sm sb <<<"$sent"; read -r rm rb secs waited <<<"$recv"
    awk -v a="$a" -v b="$b" -v f="$frames" -v sm="$sm" -v sb="$sb" -v rm="$rm" -v rb="$rb" -v s="$secs" -v w="$waited" -v i="$i" 'BEGIN {
      printf "pair %d: single %d fps, mpi 1+1 %d fps (%.1f%%); to learner %.1f B/frame, %.0f msg/s; weights %.0f B/update (%d updates); learner receiver waited %.0f%% of %.1f s\n",
        i, a, b, 100*b/a, rb/f, rm/s, sb/sm, sm, 100*w/s, s }'
  done
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ms=$(median "${single[@]}"); mm=$(median "${multi[@]}")
awk -v a="$ms" -v b="$mm" -v n="$pairs" 'BEGIN { printf "median of %d pairs: single %d fps, mpi 1+1 %d fps: %.1f%%\n", n, a, b, 100*b/a }'
