#!/usr/bin/env bash
# Karpenter's scheduling benchmark and tenon's, run on this machine and printed side by side.
#
#   scripts/bench-vs-karpenter.sh [--karpenter-only | --tenon-only] [--sizes 1000,5000,20000] [--count N]
#
# Karpenter's side is BenchmarkScheduling1000, 5000 and 20000 of sigs.k8s.io/karpenter's package
# pkg/controllers/provisioning/scheduling (file scheduling_benchmark_test.go, build tag test_performance:
# 400 fake instance types, pods in five groups, seed 42, a fake controller-runtime client). Its test binary
# is compiled with `go test -c` from the Go module proxy through the wrapper module scripts/karpenter-bench
# (its go.mod names the Karpenter release) into
#   ${TENON_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tenon-peers}/karpenter-bench-VERSION-HASH/
# where HASH covers the wrapper module, the build flags and the Go version; a binary missing there is built
# (under nice, output in that directory's build.log; the first build takes minutes), one present is reused.
# Go's module and build caches stay where Go keeps them. Each size runs COUNT times (default 3), one pass
# each (-test.benchtime=1x, which is what Karpenter's default benchtime amounts to for passes of a second or
# more), and the median pass is reported with the nodes it bought.
#
# tenon's side is `cargo bench -p tenon-core --bench scheduling` (core/benches/scheduling.rs, the same
# workload): built with --no-run under nice, then its executable run as cargo would run it, restricted to
# the ids scheduling/N_pods of the chosen sizes. Its time is criterion's median estimate from
# target/criterion/scheduling/N_pods/new/estimates.json; its nodes come from the bench's own
# `scheduling/N: ... pods on M nodes` line.
#
# The builds come first, then the measurements, one side after the other. The benchmarks' own output and the
# progress go to stderr; stdout gets a Markdown table (pods, each side's time per pass, pods/s = pods / time
# per pass and nodes bought, and the ratio of Karpenter's time to tenon's) and a line naming the machine,
# the date, its load before and after the measurements, and the versions. Exits non-zero, with the end of the
# build log, if Karpenter's benchmark cannot be built, and non-zero if a requested figure is missing.
#
# Environment: TENON_BENCH_SIZES (sizes, comma or space separated; --sizes wins), TENON_BENCH_COUNT
# (Karpenter's passes per size; --count wins), TENON_PEER_CACHE (see above).
set -euo pipefail
cd "$(dirname "$0")/.."

KARPENTER_MODULE=scripts/karpenter-bench
KARPENTER_PACKAGE=sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling
GO_BUILD_FLAGS=(-mod=readonly -trimpath -tags=test_performance)
# The sizes of Karpenter's BenchmarkSchedulingN.
KARPENTER_SIZES="1, 50, 100, 500, 1000, 2000, 5000, 10000, 20000"

usage() {
  echo "usage: $0 [--karpenter-only | --tenon-only] [--sizes N,N,...] [--count N]" >&2
  exit 2
}

run_karpenter=1
run_tenon=1
sizes="${TENON_BENCH_SIZES:-1000 5000 20000}"
count="${TENON_BENCH_COUNT:-3}"
while [ $# -gt 0 ]; do
  case "$1" in
  --karpenter-only) run_tenon=0 ;;
  --tenon-only) run_karpenter=0 ;;
  --sizes)
    [ $# -ge 2 ] || usage
    sizes="$2"
    shift
    ;;
  --sizes=*) sizes="${1#--sizes=}" ;;
  --count)
    [ $# -ge 2 ] || usage
    count="$2"
    shift
    ;;
  --count=*) count="${1#--count=}" ;;
  -h | --help) usage ;;
  *)
    echo "bench: unknown argument $1" >&2
    usage
    ;;
  esac
  shift
done
if [ "$run_karpenter$run_tenon" = 00 ]; then
  echo "bench: --karpenter-only and --tenon-only together leave nothing to run" >&2
  exit 2
fi
read -r -a sizes <<<"${sizes//,/ }"
if [ "${#sizes[@]}" -eq 0 ]; then
  echo "bench: no sizes given" >&2
  exit 2
fi
for n in "${sizes[@]}" "$count"; do
  if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
    echo "bench: $n is not a positive whole number" >&2
    exit 2
  fi
done
sizes_re="$(
  IFS='|'
  echo "${sizes[*]}"
)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# median FILE: the median of the numbers in FILE, one a line (the lower middle one of an even count).
median() {
  sort -g "$1" | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}

# fmt_time NS: a duration for the table (812 µs, 16.2 ms, 4.31 s).
fmt_time() {
  awk -v t="$1" 'BEGIN {
    if (t >= 1e9) printf "%.2f s", t / 1e9
    else if (t >= 1e7) printf "%.0f ms", t / 1e6
    else if (t >= 1e6) printf "%.1f ms", t / 1e6
    else printf "%.0f µs", t / 1e3
  }'
}

# fmt_rate PODS NS: pods per second, with thousands separated by commas.
fmt_rate() {
  awk -v n="$1" -v t="$2" 'BEGIN {
    s = sprintf("%.0f", n / (t / 1e9)); out = ""
    while (length(s) > 3) { out = "," substr(s, length(s) - 2) out; s = substr(s, 1, length(s) - 3) }
    print s out
  }'
}

# fmt_count N: N with thousands separated by commas.
fmt_count() {
  fmt_rate "$1" 1e9
}

# fmt_nodes N: N with thousands separated by commas, or ? when the benchmark did not say.
fmt_nodes() {
  if [ -n "$1" ]; then fmt_count "$1"; else echo "?"; fi
}

# fmt_ratio A B: A / B, as 250× (or 2.50× below ten).
fmt_ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { r = a / b; printf (r >= 10 ? "%.0f×" : "%.2f×"), r }'
}

# --- Karpenter: build ---------------------------------------------------------------------------------

if [ "$run_karpenter" = 1 ]; then
  if ! command -v go >/dev/null; then
    echo "bench: building Karpenter's benchmark needs Go (see $KARPENTER_MODULE/go.mod); go is not on PATH" >&2
    exit 1
  fi
  karpenter_version="$(awk '$1 == "sigs.k8s.io/karpenter" && $2 ~ /^v/ { print $2; exit }' \
    "$KARPENTER_MODULE/go.mod")"
  go_version="$(GOWORK=off GOTOOLCHAIN=local go env GOVERSION)"
  build_key="$(cat "$KARPENTER_MODULE"/go.mod "$KARPENTER_MODULE"/go.sum "$KARPENTER_MODULE"/*.go \
    <(echo "${GO_BUILD_FLAGS[*]} $go_version") | sha256sum | cut -c1-12)"
  cache="${TENON_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tenon-peers}"
  bin="$cache/karpenter-bench-$karpenter_version-$build_key"
  karpenter_test="$bin/scheduling.test"
  log="$bin/build.log"
  mkdir -p "$bin"
  # One build at a time per cache directory, however many runs start at once.
  exec 9>"$bin/.lock"
  flock 9
  if [ ! -x "$karpenter_test" ]; then
    started="$SECONDS"
    echo "bench: building Karpenter $karpenter_version's scheduling benchmark with $go_version (log: $log)" >&2
    echo "== $(date -u +%FT%TZ) go test -c ${GO_BUILD_FLAGS[*]} $KARPENTER_PACKAGE ($go_version)" >>"$log"
    if ! (cd "$KARPENTER_MODULE" &&
      CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local nice -n 19 \
        go test -c "${GO_BUILD_FLAGS[@]}" -o "$karpenter_test.partial" "$KARPENTER_PACKAGE") \
      >>"$log" 2>&1; then
      echo "bench: building Karpenter's scheduling benchmark failed; the end of $log:" >&2
      tail -n 40 "$log" >&2
      exit 1
    fi
    mv "$karpenter_test.partial" "$karpenter_test"
    echo "bench: built Karpenter's scheduling benchmark in $((SECONDS - started)) s" >&2
  fi
  exec 9>&-
fi

# --- tenon: build -------------------------------------------------------------------------------------

if [ "$run_tenon" = 1 ]; then
  echo "bench: building tenon's scheduling bench" >&2
  tenon_bench="$(nice -n 19 cargo bench -p tenon-core --bench scheduling --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "scheduling" and m.get("executable"):
        print(m["executable"])
')"
  if [ -z "$tenon_bench" ]; then
    echo "bench: cargo built no executable for tenon-core's scheduling bench" >&2
    exit 1
  fi
  target_dir="$(cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
  criterion_dir="${CRITERION_HOME:-$target_dir/criterion}"
fi

# --- measurements -------------------------------------------------------------------------------------

load_start="$(cut -d' ' -f1 /proc/loadavg)"
started_at="$(date -u '+%Y-%m-%d %H:%M UTC')"

declare -A k_ns k_nodes t_ns t_nodes

if [ "$run_karpenter" = 1 ]; then
  echo "bench: Karpenter $karpenter_version, sizes ${sizes[*]}, runs of one pass per size: $count" >&2
  # The binary runs in a scratch directory: nothing of the benchmarks reads or writes files there.
  if ! (cd "$work" && "$karpenter_test" -test.run='^$' -test.bench="^BenchmarkScheduling($sizes_re)\$" \
    -test.benchtime=1x -test.count="$count" -test.timeout=0) 2>&1 | tee "$work/karpenter.txt" >&2; then
    echo "bench: Karpenter's benchmark failed (output above)" >&2
    exit 1
  fi
  # BenchmarkScheduling1000-2   1   812345678 ns/op   200.0 nodes   1000 pods   1231 pods/sec
  for n in "${sizes[@]}"; do
    awk -v n="$n" '$1 ~ "^BenchmarkScheduling" n "(-[0-9]+)?$" {
      ns = ""; nodes = ""
      for (i = 3; i < NF; i++) {
        if ($(i + 1) == "ns/op") ns = $i
        if ($(i + 1) == "nodes") nodes = $i
      }
      if (ns != "") print ns, nodes
    }' "$work/karpenter.txt" >"$work/karpenter-$n.txt"
    [ -s "$work/karpenter-$n.txt" ] || continue
    cut -d' ' -f1 "$work/karpenter-$n.txt" >"$work/karpenter-$n.ns"
    k_ns[$n]="$(median "$work/karpenter-$n.ns")"
    passes="$(sort -g "$work/karpenter-$n.ns" | while read -r ns; do
      fmt_time "$ns"
      echo
    done | paste -sd,)"
    echo "bench: Karpenter, $n pods: ${passes//,/, }" >&2
    # The nodes of the median pass (each pass draws its own pods from the shared seeded generator).
    k_nodes[$n]="$(awk -v ns="${k_ns[$n]}" '$1 == ns { printf "%.0f", $2; exit }' "$work/karpenter-$n.txt")"
  done
fi

if [ "$run_tenon" = 1 ]; then
  echo "bench: tenon, sizes ${sizes[*]}" >&2
  touch "$work/tenon-start"
  # What `cargo bench` runs, run directly: the binary just built under nice, with no second build or wait
  # for cargo's lock in between (cargo runs it in the package's directory).
  if ! (cd core && CRITERION_HOME="$criterion_dir" "$tenon_bench" --bench "^scheduling/($sizes_re)_pods\$") \
    2>&1 | tee "$work/tenon.txt" >&2; then
    echo "bench: tenon's bench failed (output above)" >&2
    exit 1
  fi
  for n in "${sizes[@]}"; do
    estimates="$criterion_dir/scheduling/${n}_pods/new/estimates.json"
    # Only this run's estimates count, not those an earlier run left behind.
    if [ -f "$estimates" ] && [ "$estimates" -nt "$work/tenon-start" ]; then
      t_ns[$n]="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["median"]["point_estimate"])' \
        "$estimates")"
    fi
    # scheduling/1000: 1000 pods on 200 nodes, $219.18/h
    t_nodes[$n]="$(awk -v n="$n" '$1 == "scheduling/" n ":" && $6 == "nodes," { print $5; exit }' \
      "$work/tenon.txt")"
  done
fi

load_end="$(cut -d' ' -f1 /proc/loadavg)"

# --- report -------------------------------------------------------------------------------------------

cpu="$(awk -F': *' '$1 ~ /^model name/ { print $2; exit }' /proc/cpuinfo)"
tenon_rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain -- core 2>/dev/null)" ]; then
  tenon_rev+=" with changes to core/"
fi

missing=0
printf '%s%s\n' "| pods | Karpenter time per pass | Karpenter pods/s | Karpenter nodes |" \
  " tenon time per pass | tenon pods/s | tenon nodes | Karpenter time / tenon time |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in "${sizes[@]}"; do
  row="| $(fmt_count "$n")"
  if [ "$run_karpenter" = 1 ]; then
    if [ -n "${k_ns[$n]:-}" ]; then
      row+=" | $(fmt_time "${k_ns[$n]}") | $(fmt_rate "$n" "${k_ns[$n]}") | $(fmt_nodes "${k_nodes[$n]:-}")"
    else
      echo "bench: no result from Karpenter for $n pods (its sizes: $KARPENTER_SIZES)" >&2
      row+=" | — | — | —"
      missing=1
    fi
  else
    row+=" | not run | — | —"
  fi
  if [ "$run_tenon" = 1 ]; then
    if [ -n "${t_ns[$n]:-}" ]; then
      row+=" | $(fmt_time "${t_ns[$n]}") | $(fmt_rate "$n" "${t_ns[$n]}") | $(fmt_nodes "${t_nodes[$n]:-}")"
    else
      echo "bench: no result from tenon for $n pods (no bench id scheduling/${n}_pods ran)" >&2
      row+=" | — | — | —"
      missing=1
    fi
  else
    row+=" | not run | — | —"
  fi
  if [ -n "${k_ns[$n]:-}" ] && [ -n "${t_ns[$n]:-}" ]; then
    row+=" | $(fmt_ratio "${k_ns[$n]}" "${t_ns[$n]}")"
  else
    row+=" | —"
  fi
  echo "$row |"
done
echo
line="$(nproc) CPUs ($cpu), $started_at, one-minute load $load_start before the measurements and $load_end after;"
if [ "$run_karpenter" = 1 ]; then
  if [ "$count" = 1 ]; then
    line+=" Karpenter $karpenter_version built with $go_version, one run of one pass;"
  else
    line+=" Karpenter $karpenter_version built with $go_version, median of $count runs of one pass;"
  fi
fi
if [ "$run_tenon" = 1 ]; then
  line+=" tenon $tenon_rev, criterion's median;"
fi
echo "${line%;}."
exit "$missing"
