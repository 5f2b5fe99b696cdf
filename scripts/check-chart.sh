#!/usr/bin/env bash
# Lints and renders the Helm chart charts/tenon with a real helm, and checks what it renders.
#
#   scripts/check-chart.sh          builds helm if needed, then:
#                                     checks the chart's README has a row for every value of values.yaml
#                                     helm lint --strict (default values, then charts/tenon/ci/*-values.yaml)
#                                     helm template (default values, then each ci values file, CRDs included)
#                                     checks every rendered document parses as YAML, names its apiVersion,
#                                     kind and metadata.name, and that the kinds, the container's
#                                     environment and the RBAC rules are the expected ones
#                                     renders it with an unknown setting, which must fail
#   scripts/check-chart.sh helm     builds helm if needed and prints its path (for rendering by hand)
#
# helm is built with Go from the Go module proxy through the wrapper module scripts/tools/helm (a go.mod
# whose `tool` directive names helm.sh/helm/v3/cmd/helm; helm's own go.mod has no replace directives, so
# the wrapper only pins the version and its dependencies' checksums). It goes to
#   ${TENON_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tenon-peers}/helm-VERSION-HASH/helm
# where HASH covers the wrapper module and the build flags; a missing binary is built (under nice, output
# in that directory's build.log), a present one is reused. Go's module and build caches stay where Go
# keeps them. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=charts/tenon
MODULE=scripts/tools/helm
GO_BUILD_FLAGS=(-mod=readonly -trimpath)
LDFLAGS="-s -w"

say() { echo "check-chart: $*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}

# module_version MODULE: the version of MODULE that the wrapper's go.mod requires.
module_version() {
  awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$MODULE/go.mod"
}

# build_helm: sets $helm to the cached helm binary, building it first if it is missing.
build_helm() {
  local version k8s_minor ldflags key bin started
  version="$(module_version helm.sh/helm/v3)"
  [ -n "$version" ] || fail "$MODULE/go.mod requires no helm.sh/helm/v3"
  # helm reports this Kubernetes version as the default capabilities (.Capabilities.KubeVersion) and
  # lints deprecated APIs against it: the client-go minor it is built with, as helm's own build does.
  k8s_minor="$(module_version k8s.io/client-go)"
  k8s_minor="${k8s_minor#v0.}"
  k8s_minor="${k8s_minor%%.*}"
  ldflags="$LDFLAGS -X helm.sh/helm/v3/internal/version.version=$version"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  key="$(cat "$MODULE/go.mod" "$MODULE/go.sum" <(echo "${GO_BUILD_FLAGS[*]} $ldflags") | sha256sum | cut -c1-12)"
  bin="${TENON_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tenon-peers}/helm-$version-$key"
  helm="$bin/helm"
  mkdir -p "$bin"
  # One build at a time per cache directory, however many checks run at once.
  exec 9>"$bin/.lock"
  flock 9
  if [ ! -x "$helm" ]; then
    if ! command -v go >/dev/null; then
      fail "$helm is not built yet, and building it needs Go ($(awk '$1 == "go" { print $2 }' "$MODULE/go.mod") or later)"
    fi
    started="$SECONDS"
    say "building helm $version into $bin (log: $bin/build.log)"
    echo "== $(date -u +%FT%TZ) helm: go build helm.sh/helm/v3/cmd/helm" >>"$bin/build.log"
    if ! (cd "$MODULE" &&
      CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local nice -n 19 \
        go build "${GO_BUILD_FLAGS[@]}" -ldflags "$ldflags" -o "$helm.partial" helm.sh/helm/v3/cmd/helm) \
      >>"$bin/build.log" 2>&1; then
      say "building helm failed; the end of $bin/build.log:"
      tail -n 40 "$bin/build.log" >&2
      exit 1
    fi
    mv "$helm.partial" "$helm"
    say "built helm in $((SECONDS - started)) s"
  fi
  exec 9>&-
}

# python_with_yaml: prints a Python interpreter that can import yaml (PyYAML).
python_with_yaml() {
  local py
  for py in python3 "${TENON_VENV:-.venv}/bin/python"; do
    if command -v "$py" >/dev/null && "$py" -c 'import yaml' 2>/dev/null; then
      echo "$py"
      return 0
    fi
  done
  fail "checking the rendered YAML needs Python 3 with PyYAML (python3 -c 'import yaml')"
}

# run DESCRIPTION COMMAND...: prints COMMAND, runs it, fails with its output if it fails.
run() {
  local what="$1"
  shift
  say "$what: $*"
  "$@" || fail "$what"
}

# check_render FILE VALUES_FILE: checks the documents `helm template` rendered into FILE (VALUES_FILE:
# the values they were rendered with, or empty for the defaults).
check_render() {
  "$py" - "$1" "$2" "$CHART/values.yaml" <<'EOF'
import os, sys, yaml

path, values_path, defaults_path = sys.argv[1], sys.argv[2], sys.argv[3]
errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)

docs = []
with open(path) as f:
    for doc in yaml.safe_load_all(f):
        if doc is None:
            continue
        check(isinstance(doc, dict), f"a document is not a mapping: {doc!r:.80}")
        if isinstance(doc, dict):
            docs.append(doc)
for d in docs:
    what = f"{d.get('kind')}/{(d.get('metadata') or {}).get('name')}"
    check(d.get("apiVersion") and d.get("kind") and (d.get("metadata") or {}).get("name"),
          f"{what}: no apiVersion, kind or metadata.name")

def merge(base, over):
    # helm's rule: maps merge key by key, a null deletes the key, anything else replaces.
    out = dict(base)
    for k, v in (over or {}).items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out

values = yaml.safe_load(open(defaults_path))
if values_path:
    values = merge(values, yaml.safe_load(open(values_path)))

kinds = sorted(f"{d['apiVersion']} {d['kind']}" for d in docs)
# One CRD per file in the chart's crds/ (what `tenon crds` prints).
crd_files = [f for f in os.listdir(os.path.join(os.path.dirname(defaults_path), "crds")) if f.endswith(".yaml")]
expected = ["apiextensions.k8s.io/v1 CustomResourceDefinition"] * len(crd_files) + [
    "apps/v1 Deployment",
    "rbac.authorization.k8s.io/v1 ClusterRole",
    "rbac.authorization.k8s.io/v1 ClusterRoleBinding",
    "rbac.authorization.k8s.io/v1 Role",
    "rbac.authorization.k8s.io/v1 RoleBinding",
    "v1 Service",
]
if values["podDisruptionBudget"]["enabled"]:
    expected.append("policy/v1 PodDisruptionBudget")
if values["serviceAccount"]["create"]:
    expected.append("v1 ServiceAccount")
if values["serviceMonitor"]["enabled"]:
    expected.append("monitoring.coreos.com/v1 ServiceMonitor")
check(kinds == sorted(expected), f"kinds {kinds} are not the expected {sorted(expected)}")

def one(kind):
    found = [d for d in docs if d["kind"] == kind]
    check(len(found) == 1, f"{len(found)} {kind} documents, not one")
    return found[0] if found else {}

# The container's environment: the downward API, then one variable per setting that is set, then extraEnv.
deploy = one("Deployment")
pod = deploy.get("spec", {}).get("template", {}).get("spec", {})
container = (pod.get("containers") or [{}])[0]
check(container.get("args") == ["run"], f"container args {container.get('args')} are not [run]")
env = container.get("env") or []
names = [e["name"] for e in env]
check(len(names) == len(set(names)), f"an environment variable is set twice: {names}")
byname = {e["name"]: e for e in env}
for name, field in (("POD_NAMESPACE", "metadata.namespace"), ("POD_NAME", "metadata.name")):
    got = byname.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    check(got == field, f"{name} is not from the downward API's {field}")

def env_name(key):
    return "".join("_" + c if c.isupper() else c.upper() for c in key)

def env_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)

settings = values.get("settings") or {}
for key, v in settings.items():
    name = env_name(key)
    if key == "featureGates":
        gates = [f"{k[0].upper()}{k[1:]}={env_text(g)}" for k, g in (v or {}).items() if g is not None and g != ""]
        want = sorted(gates) if gates else None
        got = byname.get("FEATURE_GATES", {}).get("value")
        check((sorted(got.split(",")) if got else None) == want, f"FEATURE_GATES={got}, expected the gates {want}")
        continue
    if v is None or v == "":
        check(name not in byname, f"{name} is rendered although settings.{key} is empty")
        continue
    check(byname.get(name, {}).get("value") == env_text(v),
          f"{name}={byname.get(name, {}).get('value')!r}, expected settings.{key}={env_text(v)!r}")
for e in values.get("extraEnv") or []:
    check(byname.get(e["name"]) == e, f"extraEnv {e['name']} is not rendered as given")
expected_names = {"POD_NAMESPACE", "POD_NAME"} | {e["name"] for e in values.get("extraEnv") or []}
expected_names |= {env_name(k) for k, v in settings.items() if v is not None and v != "" and k != "featureGates"}
if byname.get("FEATURE_GATES"):
    expected_names.add("FEATURE_GATES")
check(set(names) == expected_names, f"environment {sorted(names)}, expected {sorted(expected_names)}")

# Ports and probes.
ports = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
metrics_port = settings.get("metricsPort") or 8080
probe_port = settings.get("healthProbePort") or 8081
check(ports == {"http-metrics": metrics_port, "http": probe_port}, f"container ports {ports}")
for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
    get = (container.get(probe) or {}).get("httpGet") or {}
    check(get.get("path") == path and get.get("port") == "http", f"{probe} is not GET {path} on http")

# Scheduling and security.
check(deploy.get("spec", {}).get("replicas") == values["replicas"], "replicas")
check(pod.get("priorityClassName") == values["priorityClassName"], "priorityClassName")
if not values.get("affinity"):
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    check({"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"} in terms[0]["matchExpressions"],
          "no karpenter.sh/nodepool DoesNotExist node affinity")
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    check(anti[0]["topologyKey"] == "kubernetes.io/hostname", "no required hostname anti-affinity")
else:
    check(pod.get("affinity") == values["affinity"], "the affinity override is not rendered as given")
if not values.get("topologySpreadConstraints"):
    spread = pod.get("topologySpreadConstraints") or [{}]
    check(spread[0].get("topologyKey") == "topology.kubernetes.io/zone" and spread[0].get("maxSkew") == 1
          and spread[0].get("whenUnsatisfiable") == "ScheduleAnyway", f"zone spread {spread}")
check(pod.get("tolerations") == values["tolerations"], "tolerations")
sc = container.get("securityContext") or {}
check(sc.get("runAsNonRoot") is True and sc.get("readOnlyRootFilesystem") is True
      and sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities", {}).get("drop") == ["ALL"]
      and sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"container securityContext {sc}")

# RBAC: no wildcard anywhere; secrets only in the Role; the lease's writes only by name.
for d in docs:
    for rule in d.get("rules") or []:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            check("*" not in (rule.get(field) or []), f"{d['kind']}: a wildcard in {field}: {rule}")
cluster_resources = {r for rule in one("ClusterRole").get("rules", []) for r in rule["resources"]}
check("secrets" not in cluster_resources and "leases" not in cluster_resources,
      "the ClusterRole grants secrets or leases")
lease_name = settings.get("leaderElectionName") or "tenon-leader-election"
for rule in one("Role").get("rules", []):
    if "leases" in rule["resources"] and {"patch", "update"} & set(rule["verbs"]):
        check(rule.get("resourceNames") == [lease_name], f"lease writes not restricted to {lease_name}: {rule}")
    if "secrets" in rule["resources"]:
        check(rule["verbs"] == ["get"], f"secrets verbs {rule['verbs']}")

if errors:
    for e in errors:
        print(f"check-chart:   {e}", file=sys.stderr)
    sys.exit(1)
print(f"check-chart:   {len(docs)} documents: " + ", ".join(sorted({d['kind'] for d in docs})), file=sys.stderr)
EOF
}

# check_readme: every value of values.yaml (or a map that holds it) has a row in the chart's README's
# values table, and every row names a value.
check_readme() {
  "$py" - "$CHART/values.yaml" "$CHART/README.md" <<'EOF'
import re, sys, yaml

values = yaml.safe_load(open(sys.argv[1]))
rows = set(re.findall(r"^\| `([^`]+)` \|", open(sys.argv[2]).read(), re.M))
paths, leaves = set(), []
def walk(node, prefix):
    for k, v in node.items():
        path = f"{prefix}{k}"
        paths.add(path)
        if isinstance(v, dict) and v:
            walk(v, path + ".")
        else:
            leaves.append(path)
walk(values, "")
errors = [f"values.yaml's {leaf} has no row in README.md" for leaf in leaves
          if not any(leaf == row or leaf.startswith(row + ".") for row in rows)]
errors += [f"README.md's row {row} is no value of values.yaml" for row in sorted(rows - paths)]
for e in errors:
    print(f"check-chart:   {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"check-chart:   {len(rows)} rows cover the {len(leaves)} values", file=sys.stderr)
EOF
}

build_helm
if [ "${1:-}" = helm ]; then
  echo "$helm"
  exit 0
fi
[ "$#" -eq 0 ] || {
  echo "usage: $0 [helm]" >&2
  exit 2
}
py="$(python_with_yaml)"
say "helm $("$helm" version --template '{{ .Version }}')"

out="$(mktemp -d "${TMPDIR:-/tmp}/tenon-chart.XXXXXX")"
trap 'rm -rf "$out"' EXIT
# helm's own configuration, cache and data stay out of the user's.
export HELM_CONFIG_HOME="$out/helm-config" HELM_CACHE_HOME="$out/helm-cache" HELM_DATA_HOME="$out/helm-data"

say "README.md's values table against values.yaml"
check_readme || fail "the README's values table"
run "lint (default values)" "$helm" lint --strict "$CHART"
values_files=("$CHART"/ci/*-values.yaml)
[ -e "${values_files[0]}" ] || fail "no values files in $CHART/ci/"
for values in "${values_files[@]}"; do
  run "lint ($values)" "$helm" lint --strict -f "$values" "$CHART"
done

for values in "" "${values_files[@]}"; do
  name="$(basename "${values:-default}" .yaml)"
  args=(template tenon "$CHART" --namespace tenon-system --include-crds)
  [ -z "$values" ] || args+=(-f "$values")
  say "template (${values:-default values}): helm ${args[*]}"
  "$helm" "${args[@]}" >"$out/$name.yaml" || fail "helm template (${values:-default values})"
  check_render "$out/$name.yaml" "$values" || fail "the rendering with ${values:-default values}"
done

# A setting that is unknown to tenon is an error, not silently ignored.
say "template with an unknown setting (must fail): helm template tenon $CHART --set settings.noSuchSetting=1"
if "$helm" template tenon "$CHART" --set settings.noSuchSetting=1 >/dev/null 2>"$out/unknown.err"; then
  fail "an unknown setting was accepted"
fi
grep -q noSuchSetting "$out/unknown.err" || fail "the unknown setting's error does not name it: $(cat "$out/unknown.err")"

say "ok"
