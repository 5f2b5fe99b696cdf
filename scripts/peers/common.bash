# Shared by the peer scripts (sourced, not a peer itself: scripts/test.sh runs only scripts/peers/*.sh).

# stop_pid FILE: stops the process whose PID FILE holds (SIGTERM, up to 5 s, then SIGKILL) and removes FILE.
stop_pid() {
  local file="$1" pid
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

# peer_args "$@": reads a peer script's `start|stop DIR` into $cmd and $dir, or prints its usage and exits 2.
peer_args() {
  cmd="${1:-}"
  dir="${2:-}"
  if [ -z "$cmd" ] || [ -z "$dir" ]; then
    echo "usage: $0 start|stop DIR" >&2
    exit 2
  fi
}
