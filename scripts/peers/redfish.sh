#!/usr/bin/env bash
# The Redfish BMC peer: sushy-tools' emulator with fake systems, for the self-managed provider's tests.
#
#   scripts/peers/redfish.sh start DIR   starts it; prints `export NAME=VALUE` lines, nothing else
#   scripts/peers/redfish.sh stop DIR    stops it
#
# Every start gets a fresh state directory inside DIR, so all systems begin Off. Basic auth is on
# (bcrypt htpasswd made with the venv's python). Power changes take effect after
# REDFISH_POWER_DELAY_S seconds (default 2, which the emulator truncates to 1-2 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/peers/common.bash
. scripts/peers/common.bash

peer_args "$@"

SYSTEMS=12
USERNAME=tenon
PASSWORD=redfish-test-password
uuid() { printf '5e1f0000-0000-4000-8000-%012d' "$1"; }

case "$cmd" in
start)
  venv="${TENON_VENV:-.venv}"
  python="$venv/bin/python"
  if [ ! -x "$python" ]; then
    echo "redfish peer: no python at $python; run scripts/test.sh (it creates the venv)" >&2
    exit 1
  fi
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  rm -rf "$dir/state" && mkdir -p "$dir/state" "$dir/tmp"
  port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$python" - "$USERNAME" "$PASSWORD" > "$dir/htpasswd" <<'PY'
import sys, bcrypt
user, password = sys.argv[1], sys.argv[2]
print(user + ":" + bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode())
PY
  {
    echo "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'"
    echo "SUSHY_EMULATOR_LISTEN_PORT = $port"
    echo "SUSHY_EMULATOR_FAKE_DRIVER = True"
    echo "SUSHY_EMULATOR_STATE_DIR = '$dir/state'"
    echo "SUSHY_EMULATOR_AUTH_FILE = '$dir/htpasswd'"
    echo "SUSHY_EMULATOR_FAKE_SYSTEMS = ["
    for i in $(seq 1 "$SYSTEMS"); do
      printf "    {'uuid': '%s', 'name': 'gpu-node-%02d', 'power_state': 'Off', 'nics': [{'mac': '52:54:00:00:00:%02x', 'ip': '127.0.0.1'}]},\n" \
        "$(uuid "$i")" "$i" "$i"
    done
    echo "]"
  } > "$dir/emulator.conf"
  REDFISH_POWER_DELAY_S="${REDFISH_POWER_DELAY_S:-2}" TMPDIR="$dir/tmp" \
    "$python" scripts/peers/redfish_emulator.py --config "$dir/emulator.conf" -i 127.0.0.1 -p "$port" \
    > "$dir/emulator.log" 2>&1 &
  echo $! > "$dir/pid"
  deadline=$((SECONDS + 30))
  until "$python" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$port/redfish/v1/', timeout=1)" 2>/dev/null; do
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "redfish peer: the emulator exited; see $dir/emulator.log:" >&2
      tail -n 20 "$dir/emulator.log" >&2
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "redfish peer: the emulator did not answer on 127.0.0.1:$port within 30 s; see $dir/emulator.log" >&2
      kill "$(cat "$dir/pid")" 2>/dev/null || true
      exit 1
    fi
    sleep 0.2
  done
  systems=""
  for i in $(seq 1 "$SYSTEMS"); do systems="${systems:+$systems,}$(uuid "$i")"; done
  echo "export TENON_REDFISH_ENDPOINT=http://127.0.0.1:$port"
  echo "export TENON_REDFISH_USERNAME=$USERNAME"
  echo "export TENON_REDFISH_PASSWORD=$PASSWORD"
  echo "export TENON_REDFISH_SYSTEMS=$systems"
  ;;
stop)
  stop_pid "$dir/pid"
  ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
