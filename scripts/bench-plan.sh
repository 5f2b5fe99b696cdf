#!/usr/bin/env bash
# Times `tenon plan` end to end (read and check the snapshot, schedule, decide, print JSON) on generated
# snapshots at fleet scale, from outside the process: wall time and peak resident memory, best of RUNS.
#
#   scripts/bench-plan.sh                  both snapshots, 3 runs each
#   RUNS=5 scripts/bench-plan.sh pending   one snapshot
#
# The snapshots (core/examples/bench_snapshot.rs, written to target/bench-plan/):
#   pending  20,000 pending pods of 2,000 applications (10 pods each, the scheduling benchmark's five
#            constraint kinds spread over the apps) and one NodePool over 400 instance types
#   fleet    5,000 nodes running 50,000 pods (the disruption benchmark's fleet): a disruption pass
# Builds the release binary and the generator first.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-3}"
TARGET="${CARGO_TARGET_DIR:-target}"
OUT="$TARGET/bench-plan"
mkdir -p "$OUT"

cargo build --quiet --release --bin tenon
cargo build --quiet --release -p tenon-core --example bench_snapshot
TENON="$TARGET/release/tenon"
GEN="$TARGET/release/examples/bench_snapshot"

snapshot() {
  case "$1" in
    pending) "$GEN" pending 20000 2000 400 ;;
    fleet) "$GEN" fleet 5000 10 ;;
    *)
      echo "bench-plan: unknown snapshot $1 (pending or fleet)" >&2
      exit 2
      ;;
  esac
}

if [ "$#" -eq 0 ]; then
  set -- pending fleet
fi

printf '| snapshot | size | best wall time | peak memory |\n|---|---:|---:|---:|\n'
for name in "$@"; do
  file="$OUT/$name.yaml"
  snapshot "$name" >"$file.tmp"
  mv "$file.tmp" "$file"
  best_s=""
  best_kb=""
  for _ in $(seq 1 "$RUNS"); do
    /usr/bin/time -f '%e %M' -o "$OUT/$name.time" "$TENON" plan "$file" --output json >"$OUT/$name.json"
    read -r secs kb <"$OUT/$name.time"
    if [ -z "$best_s" ] || awk -v a="$secs" -v b="$best_s" 'BEGIN { exit !(a < b) }'; then
      best_s="$secs"
    fi
    if [ -z "$best_kb" ] || [ "$kb" -lt "$best_kb" ]; then
      best_kb="$kb"
    fi
  done
  size="$(du -m "$file" | cut -f1) MB"
  printf '| %s | %s | %s s | %s MB |\n' "$name" "$size" "$best_s" "$((best_kb / 1024))"
done
