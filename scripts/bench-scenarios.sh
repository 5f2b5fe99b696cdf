#!/usr/bin/env bash
# Times `tenon simulate` on the scenarios at fleet scale, from outside the process: wall and CPU time, peak
# resident memory, and what the run decided (cost, peak nodes), so that a change in speed is never bought
# with a change in the result.
#
#   scripts/bench-scenarios.sh                           gpu-fleet-large and large-web, once each
#   scripts/bench-scenarios.sh fleet-scale               one scenario (fleet-scale takes minutes)
#   RUNS=3 scripts/bench-scenarios.sh gpu-fleet-large    best of three
#   BASELINE=/path/to/tenon scripts/bench-scenarios.sh   each run back to back with another binary (a
#                                                        previous release), which a busy machine's drift
#                                                        cannot favour; both must decide the same (the
#                                                        script fails when they do not)
#
# Builds the release binary first.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-1}"
TARGET="${CARGO_TARGET_DIR:-target}"
OUT="$TARGET/bench-scenarios"
mkdir -p "$OUT"

cargo build --quiet --release --bin tenon
TENON="$TARGET/release/tenon"
BASELINE="${BASELINE:-}"

if [ "$#" -eq 0 ]; then
  set -- gpu-fleet-large large-web
fi

# One run: prints "wall cpu peak_mb" and leaves the JSON report in $3.
run() {
  local bin="$1" scenario="$2" json="$3"
  /usr/bin/time -f '%e %U %M' -o "$json.time" "$bin" simulate "$scenario" --output json >"$json"
  read -r wall cpu kb <"$json.time"
  echo "$wall $cpu $((kb / 1024))"
}

# What a report decided: cost and peak node count.
decided() {
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
peak = max((sum(t["nodes"].values()) for t in r["timeline"]), default=0)
cost = r["totalCost"]
print(f"${cost:,.2f}, peak {peak} nodes")
' "$1"
}

best() {
  # best "a b c" "x y z" -> the line with the smaller CPU time
  if [ -z "$1" ]; then echo "$2"; return; fi
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); print (y[2] < x[2] ? b : a) }'
}

printf '| scenario | binary | wall | CPU | peak memory | result |\n|---|---|---:|---:|---:|---|\n'
differed=0
for name in "$@"; do
  scenario="examples/scenarios/$name.yaml"
  if [ ! -f "$scenario" ]; then
    echo "bench-scenarios: no scenario $scenario" >&2
    exit 2
  fi
  this="" base=""
  for _ in $(seq 1 "$RUNS"); do
    this="$(best "$this" "$(run "$TENON" "$scenario" "$OUT/$name.json")")"
    if [ -n "$BASELINE" ]; then
      base="$(best "$base" "$(run "$BASELINE" "$scenario" "$OUT/$name.baseline.json")")"
    fi
  done
  read -r wall cpu mb <<<"$this"
  printf '| %s | this build | %s s | %s s | %s MB | %s |\n' "$name" "$wall" "$cpu" "$mb" "$(decided "$OUT/$name.json")"
  if [ -n "$BASELINE" ]; then
    read -r wall cpu mb <<<"$base"
    printf '| %s | baseline | %s s | %s s | %s MB | %s |\n' "$name" "$wall" "$cpu" "$mb" \
      "$(decided "$OUT/$name.baseline.json")"
    if ! cmp -s "$OUT/$name.json" "$OUT/$name.baseline.json"; then
      echo "bench-scenarios: $name: the two binaries decided differently (see $OUT/$name.json and $OUT/$name.baseline.json)" >&2
      differed=1
    fi
  fi
done
# A faster run that decides otherwise is not a speed-up: say so in the exit status too.
exit "$differed"
