#!/usr/bin/env bash
# A real Kubernetes control plane for the operator's end-to-end tests: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler, with kwok playing the kubelet of fake nodes.
#
#   scripts/peers/kube.sh start DIR   starts it on 127.0.0.1 (free ports) with fresh state; certificates,
#                                     kubeconfigs, data, logs and PIDs in DIR; prints
#                                     export KUBECONFIG=DIR/admin.kubeconfig       (system:masters)
#                                     export TENON_KUBE_SERVER=https://127.0.0.1:PORT
#                                     export TENON_KUBE_VERSION=v1.34.N
#                                     export TENON_KUBECTL=CACHE/kubectl           (same version)
#                                     export TENON_KUBE_AUDIT_LOG=DIR/audit.log    (see below)
#   scripts/peers/kube.sh stop DIR    stops every process it started
#
# The binaries are built with Go from the Go module proxy through three wrapper modules:
# scripts/peers/kube (k8s.io/kubernetes, each staging module replaced by its published release of the same
# Kubernetes version), scripts/peers/etcd (go.etcd.io/etcd/server/v3) and scripts/peers/kwok
# (sigs.k8s.io/kwok). They go to
#   ${TENON_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tenon-peers}/kube-VERSION-HASH/
# where HASH covers the wrapper modules and the build flags; a binary missing there is built (under nice,
# one at a time, output in that directory's build.log; the first build takes many minutes), one present
# is reused. Go's module and build caches stay where Go keeps them.
#
# The cluster: one fresh CA signs the apiserver's serving certificate (127.0.0.1, localhost) and the client
# certificates: admin (system:masters), kube-controller-manager, kube-scheduler, and kwok (system:masters:
# it writes the status of every fake node and its pods). ServiceAccount tokens are signed with a fresh
# key, so the TokenRequest API works and its tokens authenticate; authorization is Node,RBAC. The
# controller manager runs its default controllers (garbage collector, namespace, serviceaccount and
# tokens, deployment/replicaset, disruption, node lifecycle, ...), each with its own ServiceAccount. kwok
# manages the nodes annotated kwok.x-k8s.io/node=fake: it marks them Ready, renews their leases and runs
# the pods bound to them. The apiserver writes an audit log (JSON lines, metadata level, written before
# each response is sent) of every request made by a ServiceAccount outside kube-system: what a test's
# operator running as its chart's ServiceAccount did, and which calls RBAC refused (403). start returns once the apiserver is ready, every component answers its health
# check and the default ServiceAccount exists; on failure it prints the failing component's log tail
# and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/peers/common.bash
. scripts/peers/common.bash

peer_args "$@"

READY_TIMEOUT_S=120
GO_BUILD_FLAGS=(-mod=readonly -trimpath)
LDFLAGS="-s -w"
SERVICE_CIDR=10.96.0.0/16
POD_CIDR=10.244.0.0/16

# stop_all: stops the apiserver's clients together, then the apiserver, then etcd.
stop_all() {
  local c stoppers=()
  for c in kwok kube-scheduler kube-controller-manager; do
    stop_pid "$dir/$c.pid" &
    stoppers+=($!)
  done
  wait "${stoppers[@]}"
  stop_pid "$dir/kube-apiserver.pid"
  stop_pid "$dir/etcd.pid"
}

# module_version MODULE_DIR MODULE: the version of MODULE that scripts/peers/MODULE_DIR/go.mod requires.
module_version() {
  awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }' "scripts/peers/$1/go.mod"
}

# build NAME MODULE_DIR PACKAGE [LDFLAGS]: builds PACKAGE in wrapper module MODULE_DIR into $bin/NAME,
# unless it is there.
build() {
  local name="$1" module="$2" package="$3" ldflags="${4:-}" started="$SECONDS"
  [ -x "$bin/$name" ] && return 0
  if ! command -v go >/dev/null; then
    echo "kube peer: $bin/$name is not built yet, and building it needs Go (1.24 or later)" >&2
    exit 1
  fi
  echo "kube peer: building $name into $bin (log: $bin/build.log)" >&2
  echo "== $(date -u +%FT%TZ) $name: go build $package" >>"$bin/build.log"
  if ! (cd "scripts/peers/$module" &&
    CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local nice -n 19 \
      go build "${GO_BUILD_FLAGS[@]}" -ldflags "$LDFLAGS $ldflags" -o "$bin/$name.partial" "$package") \
    >>"$bin/build.log" 2>&1; then
    echo "kube peer: building $name failed; the end of $bin/build.log:" >&2
    tail -n 40 "$bin/build.log" >&2
    exit 1
  fi
  mv "$bin/$name.partial" "$bin/$name"
  echo "kube peer: built $name in $((SECONDS - started)) s" >&2
}

# new_key FILE: a fresh P-256 private key (PKCS#8 PEM).
new_key() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

# new_ca NAME SUBJECT: pki/NAME.key and the self-signed pki/NAME.crt of a CA.
new_ca() {
  new_key "$pki/$1.key"
  openssl req -x509 -new -key "$pki/$1.key" -subj "$2" -days 30 -out "$pki/$1.crt" \
    -addext "basicConstraints = critical, CA:TRUE" -addext "keyUsage = critical, keyCertSign, cRLSign" 2>/dev/null
}

# new_cert NAME SUBJECT EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES [CA]]: pki/NAME.key and pki/NAME.crt, signed
# by pki/CA (default: ca).
new_cert() {
  local name="$1" subject="$2" usage="$3" sans="${4:-}" ca="${5:-ca}"
  new_key "$pki/$name.key"
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature"
    echo "extendedKeyUsage = $usage"
    echo "subjectKeyIdentifier = hash"
    echo "authorityKeyIdentifier = keyid"
    if [ -n "$sans" ]; then echo "subjectAltName = $sans"; fi
  } >"$pki/$name.ext"
  openssl req -new -key "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

# kubeconfig USER: DIR/USER.kubeconfig, for the apiserver with pki/USER.crt's identity, all embedded.
kubeconfig() {
  local user="$1"
  cat >"$dir/$user.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tenon
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$pki/$user.crt")
    client-key-data: $(base64 -w0 "$pki/$user.key")
contexts:
- name: tenon
  context:
    cluster: tenon
    user: $user
current-context: tenon
EOF
}

# launch NAME COMMAND...: runs COMMAND in the background, output in DIR/NAME.log, PID in DIR/NAME.pid.
launch() {
  local name="$1"
  shift
  "$@" </dev/null >"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
}

# wait_for NAME WHAT COMMAND...: polls COMMAND until it succeeds, within READY_TIMEOUT_S; fails with NAME's
# log tail if NAME exits or the time runs out.
wait_for() {
  local name="$1" what="$2" deadline=$((SECONDS + READY_TIMEOUT_S))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ! kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
      echo "kube peer: $name exited before $what; the end of $dir/$name.log:" >&2
      tail -n 30 "$dir/$name.log" >&2
      return 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "kube peer: no $what within $READY_TIMEOUT_S s; the end of $dir/$name.log:" >&2
      tail -n 30 "$dir/$name.log" >&2
      return 1
    fi
    sleep 0.2
  done
}

# api PATH: GETs PATH from the apiserver as admin; fails unless the answer is 2xx.
api() {
  curl -sf --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" "$server$1"
}

# healthy URL: the component's health endpoint answers 200 (the self-signed serving certificates of the
# controller manager and the scheduler are not checked).
healthy() {
  curl -skf --max-time 5 "$1"
}

case "$cmd" in
start)
  for tool in openssl curl python3; do
    if ! command -v "$tool" >/dev/null; then
      echo "kube peer: $tool not found" >&2
      exit 1
    fi
  done
  KUBE_VERSION="$(module_version kube k8s.io/kubernetes)"
  ETCD_VERSION="$(module_version etcd go.etcd.io/etcd/server/v3)"
  KWOK_VERSION="$(module_version kwok sigs.k8s.io/kwok)"
  kube_minor="${KUBE_VERSION#v1.}"
  kube_minor="${kube_minor%%.*}"
  kube_ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
    kube_ldflags+=" -X $pkg.gitTreeState=clean"
  done
  build_key="$(cat scripts/peers/{kube,etcd,kwok}/go.{mod,sum} <(echo "${GO_BUILD_FLAGS[*]} $LDFLAGS $kube_ldflags") |
    sha256sum | cut -c1-12)"
  bin="${TENON_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tenon-peers}/kube-$KUBE_VERSION-$build_key"
  mkdir -p "$bin"
  # One build at a time per cache directory, however many starts run at once.
  exec 9>"$bin/.lock"
  flock 9
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    build "$c" kube "k8s.io/kubernetes/cmd/$c" "$kube_ldflags"
  done
  build etcd etcd go.etcd.io/etcd/server/v3
  build kwok kwok sigs.k8s.io/kwok/cmd/kwok
  exec 9>&-

  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  stop_all
  trap stop_all EXIT
  umask 077
  pki="$dir/pki"
  rm -rf "$pki" "$dir/etcd-data" "$dir/kwok-home" "$dir"/*-serving "$dir"/*.log "$dir"/*.kubeconfig "$dir/audit-policy.yaml"
  mkdir -p "$pki" "$dir/kwok-home"

  read -r etcd_port etcd_peer_port api_port kcm_port scheduler_port kwok_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
')
  server="https://127.0.0.1:$api_port"

  new_ca ca "/CN=tenon-kube-peer-ca"
  new_cert apiserver "/CN=kube-apiserver" serverAuth \
    "IP:127.0.0.1, DNS:localhost, IP:${SERVICE_CIDR%.0/*}.1, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local"
  new_cert admin "/O=system:masters/CN=tenon-admin" clientAuth
  new_cert kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
  new_cert kube-scheduler "/CN=system:kube-scheduler" clientAuth
  new_cert kwok "/O=system:masters/CN=kwok-controller" clientAuth
  # The front proxy's CA and client: the apiserver's identity towards aggregated APIs, and what the
  # controller manager's and scheduler's delegated authentication expects to find published.
  new_ca front-proxy-ca "/CN=tenon-kube-peer-front-proxy-ca"
  new_cert front-proxy-client "/CN=front-proxy-client" clientAuth "" front-proxy-ca
  new_key "$pki/service-account.key"
  openssl pkey -in "$pki/service-account.key" -pubout -out "$pki/service-account.pub" 2>/dev/null
  for user in admin kube-controller-manager kube-scheduler kwok; do
    kubeconfig "$user"
  done

  cat >"$dir/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  userGroups: ["system:serviceaccounts:kube-system"]
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
EOF

  # No fsync: the data lives as long as one test run.
  launch etcd "$bin/etcd" --name=tenon --data-dir="$dir/etcd-data" --unsafe-no-fsync \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="tenon=http://127.0.0.1:$etcd_peer_port" --log-level=warn
  wait_for etcd "etcd health" healthy "http://127.0.0.1:$etcd_port/health"

  # The kubernetes Service gets no endpoints: a loopback address is not a valid endpoint, and nothing
  # in the cluster runs for real to use it.
  launch kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
    --endpoint-reconciler-type=none \
    --cert-dir="$pki" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --requestheader-client-ca-file="$pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/service-account.pub" \
    --service-account-signing-key-file="$pki/service-account.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/audit.log" --audit-log-format=json \
    --audit-log-mode=blocking --audit-log-maxsize=0 \
    --profiling=false
  wait_for kube-apiserver "ready apiserver (/readyz)" api /readyz

  for c in kube-controller-manager kube-scheduler; do
    kc="$dir/$c.kubeconfig"
    common=(--kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc"
      --bind-address=127.0.0.1 --cert-dir="$dir/$c-serving" --leader-elect=false --profiling=false)
    if [ "$c" = kube-controller-manager ]; then
      launch "$c" "$bin/$c" "${common[@]}" --secure-port="$kcm_port" \
        --use-service-account-credentials=true \
        --service-account-private-key-file="$pki/service-account.key" --root-ca-file="$pki/ca.crt" \
        --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
        --service-cluster-ip-range="$SERVICE_CIDR" --controllers='*'
    else
      launch "$c" "$bin/$c" "${common[@]}" --secure-port="$scheduler_port"
    fi
  done
  # kwok keeps a Lease per fake node, so the node lifecycle controller sees them alive (it would taint
  # them unreachable otherwise); its working directory is DIR's, so no kwok configuration of the
  # user's is read.
  KWOK_WORKDIR="$dir/kwok-home" launch kwok "$bin/kwok" --kubeconfig="$dir/kwok.kubeconfig" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=40 --server-address="127.0.0.1:$kwok_port" --cidr="$POD_CIDR"

  wait_for kube-controller-manager "kube-controller-manager health" healthy "https://127.0.0.1:$kcm_port/healthz"
  wait_for kube-scheduler "kube-scheduler health" healthy "https://127.0.0.1:$scheduler_port/healthz"
  wait_for kwok "kwok health" healthy "http://127.0.0.1:$kwok_port/healthz"
  wait_for kube-controller-manager "the default ServiceAccount" \
    api /api/v1/namespaces/default/serviceaccounts/default
  trap - EXIT

  echo "export KUBECONFIG=$dir/admin.kubeconfig"
  echo "export TENON_KUBE_SERVER=$server"
  echo "export TENON_KUBE_VERSION=$KUBE_VERSION"
  echo "export TENON_KUBECTL=$bin/kubectl"
  echo "export TENON_KUBE_AUDIT_LOG=$dir/audit.log"
  echo "kube peer: $KUBE_VERSION (etcd $ETCD_VERSION, kwok $KWOK_VERSION) ready at $server" >&2
  ;;
stop)
  stop_all
  ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
