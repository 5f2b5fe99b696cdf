#!/usr/bin/env bash
# The test command: sets up what the tests need, runs every test of the workspace, and tears it down.
#
#   scripts/test.sh            all tests
#   scripts/test.sh -p NAME    one crate (any cargo test arguments are passed through)
set -euo pipefail
cd "$(dirname "$0")/.."

# Python tools the emulator-backed tests use live in the project's own venv, created on first use.
VENV="${TENON_VENV:-.venv}"
if [ -n "${TENON_PYTHON_PACKAGES:-}" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $TENON_PYTHON_PACKAGES
fi

if [ "$#" -eq 0 ]; then
  set -- --workspace
fi
cargo test "$@"
