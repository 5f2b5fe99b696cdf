#!/usr/bin/env bash
# moto's EC2 and SQS server for the AWS provider's tests, with tenon's fault switchboard
# (scripts/peers/moto_faults.py: capacity errors and spot prices moto cannot produce).
#
#   scripts/peers/moto.sh start DIR   starts it on 127.0.0.1 (a free port), logs and PID in DIR, and prints
#                                     export TENON_MOTO_ENDPOINT=http://127.0.0.1:PORT
#   scripts/peers/moto.sh stop DIR    stops it
#
# Python comes from $TENON_VENV (default .venv), where scripts/test.sh installs moto[server].
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/peers/common.bash
. scripts/peers/common.bash

peer_args "$@"

case "$cmd" in
start)
  mkdir -p "$dir"
  py="${TENON_VENV:-.venv}/bin/python"
  if [ ! -x "$py" ]; then
    echo "moto.sh: $py not found: run scripts/test.sh (it creates the venv) or set TENON_VENV" >&2
    exit 1
  fi
  port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
  "$py" scripts/peers/moto_faults.py 127.0.0.1 "$port" >"$dir/moto.log" 2>&1 &
  echo $! >"$dir/moto.pid"
  echo "$port" >"$dir/moto.port"
  url="http://127.0.0.1:$port"
  deadline=$((SECONDS + 60))
  until curl -s -o /dev/null "$url/moto-api/"; do
    if ! kill -0 "$(cat "$dir/moto.pid")" 2>/dev/null; then
      echo "moto.sh: the server exited; its log:" >&2
      cat "$dir/moto.log" >&2
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "moto.sh: no answer from $url within 60 s; log in $dir/moto.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  # The first EC2 call loads moto's EC2 data (about 2 s): pay it here, not in a test.
  # moto routes by the SigV4 credential scope; the signature itself is not checked.
  curl -s -o /dev/null "$url/" \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=t/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=x' \
    --data 'Action=DescribeAvailabilityZones&Version=2016-11-15'
  echo "export TENON_MOTO_ENDPOINT=$url"
  ;;
stop)
  stop_pid "$dir/moto.pid"
  ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
