#!/usr/bin/env bash
# The test command: sets up what the tests need, runs every test of the workspace, and tears it down.
#
#   scripts/test.sh            all tests, every feature (the AWS provider included)
#   scripts/test.sh -p NAME    one crate (any cargo test arguments are passed through)
#
# The emulator-backed tests talk to peers started here, on 127.0.0.1: from the project's own venv, moto's
# server for EC2 and SQS and sushy-tools' Redfish emulator for the self-managed provider; built with Go
# (cached outside the repo), a Kubernetes control plane with kwok for the operator's API-server tests.
# The GCP provider's tests run against a Compute Engine fake of the test crate's own, held to Google's
# discovery document from the venv's google-api-python-client (TENON_GCE_DISCOVERY). The Azure provider's
# tests run against an Azure Resource Manager fake held to the models of the venv's azure-mgmt-compute and
# azure-mgmt-network, which scripts/azure-arm-models.py writes into the venv (TENON_AZURE_MODELS).
# Each peer has a script in scripts/peers/ with `start DIR` (prints `export NAME=VALUE` lines naming its
# endpoint) and `stop DIR`. Every run gets fresh state.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${TENON_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# Installing is a no-op when the pinned versions are already there.
"$VENV/bin/pip" install --quiet --disable-pip-version-check -r scripts/peers/requirements.txt
export TENON_VENV="$VENV"
# The discovery document the GCP provider's Compute Engine fake is held to.
TENON_GCE_DISCOVERY="$("$VENV/bin/python" -c 'import googleapiclient, os; print(os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "compute.v1.json"))')"
export TENON_GCE_DISCOVERY
# The Azure Resource Manager shapes the Azure provider's fake is held to.
TENON_AZURE_MODELS="$VENV/tenon-azure-arm-models.json"
"$VENV/bin/python" scripts/azure-arm-models.py >"$TENON_AZURE_MODELS.tmp"
mv "$TENON_AZURE_MODELS.tmp" "$TENON_AZURE_MODELS"
TENON_AZURE_MODELS="$(cd "$(dirname "$TENON_AZURE_MODELS")" && pwd)/$(basename "$TENON_AZURE_MODELS")"
export TENON_AZURE_MODELS

PEERS_DIR="$(mktemp -d "${TMPDIR:-/tmp}/tenon-peers.XXXXXX")"
PEERS=()
stop_peers() {
  for peer in "${PEERS[@]}"; do
    "scripts/peers/$peer.sh" stop "$PEERS_DIR/$peer" || true
  done
  rm -rf "$PEERS_DIR"
}
trap stop_peers EXIT
for script in scripts/peers/*.sh; do
  peer="$(basename "$script" .sh)"
  mkdir -p "$PEERS_DIR/$peer"
  PEERS+=("$peer")
  eval "$("$script" start "$PEERS_DIR/$peer")"
done

# helm, built here like the peers: the operator's end-to-end tests install what the chart renders.
TENON_HELM="$(scripts/check-chart.sh helm)"
export TENON_HELM

if [ "$#" -eq 0 ]; then
  set -- --workspace --all-features --no-fail-fast
fi
cargo test "$@"
