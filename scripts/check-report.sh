#!/usr/bin/env bash
# Renders a simulation report in headless Chromium: the page must load offline, lay out its five charts,
# and produce a screenshot. Usage: scripts/check-report.sh [scenario] [out-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-tests/scenarios/short.yaml}
out=${2:-target/report-check}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z $browser ]]; then
  echo "no Chromium found (Debian: apt-get install chromium)" >&2
  exit 2
fi
mkdir -p "$out"
out=$(realpath "$out")
cargo run --quiet -- simulate "$scenario" --report "$out/report.html" >/dev/null
flags=(--headless --no-sandbox --disable-gpu --window-size=1000,2400)
# Rendered DOM, with the network switched off: every chart must be there after layout.
"$browser" "${flags[@]}" --dump-dom "file://$out/report.html" 2>/dev/null >"$out/dom.html"
charts=$(grep -o '<svg' "$out/dom.html" | wc -l)
if [[ $charts -ne 5 ]]; then
  echo "expected 5 rendered charts, found $charts" >&2
  exit 1
fi
"$browser" "${flags[@]}" --screenshot="$out/report.png" "file://$out/report.html" 2>/dev/null
size=$(stat -c %s "$out/report.png")
if [[ $size -lt 20000 ]]; then
  echo "the screenshot is nearly empty ($size bytes)" >&2
  exit 1
fi
echo "rendered $out/report.html: $charts charts, screenshot $out/report.png ($size bytes)"
