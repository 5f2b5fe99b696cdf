#!/usr/bin/env python3
"""How close tenon's provisioning packing comes to the cost optimum.

For each seed it makes a small random provisioning problem, lets `tenon plan` solve it twice (fit-only
packing, the default, and with the NodePool annotated `karpenter.sh/nodeclaim-packing-policy:
marginal-cost`), solves it exactly with OR-Tools' CP-SAT, and prints what each of tenon's plans costs
against the optimum.

The problem: about 24 pending pods, CPU pods and GPU pods mixed (requests of cpu, memory and, for GPU pods,
one `nvidia.com/gpu`), and nine instance types taken as they are from the bundled catalog
examples/catalogs/aws-us-east-1.yaml (six c5/m5/r5 sizes and three g5 sizes), each with its one on-demand
offering in us-east-1a. There are no placement constraints (no affinity, spread, selectors or taints) and no
DaemonSets, so a pod fits a node of a type exactly when the node's pods' requests (with `pods: 1` each) fit
the type's allocatable: its capacity minus its kube-reserved, system-reserved and eviction threshold, as
tenon computes it. The optimum is the cheapest set of nodes (total price per hour) that holds every pod.

Every plan of tenon's is checked against this model, and the run fails (exit status 1) on any mismatch:
every pod lands on a new claim (none unschedulable), each claim's pods fit its launch type, the launch
price is the type's catalog price and the cheapest of the types that fit the claim's pods, and no plan
costs less than the optimum. A solve that does not prove optimality (a time limit hit) fails the run too.
The `marginal-cost-packing` setting, which gates the annotation, is set on explicitly.

The exact solve (see solve_exact) names each node by its lowest-index pod, which leaves no symmetric copies
of a packing, and adds cuts that keep some optimum; prices are in integer micro-dollars. Problems of 24 pods
take seconds; larger ones (--pods 32) can take minutes.

Run it from anywhere, after `cargo build --release --bin tenon`:

    scripts/optimality.py                      # seeds 1..30, 24 pods each
    scripts/optimality.py --seeds 50 --start-seed 100 --pods 30
    scripts/optimality.py --details            # also what each plan and the optimum buy, per seed
    scripts/optimality.py --json > out.json    # machine-readable, with every solution
    scripts/optimality.py --keep /tmp/snaps    # keep the snapshots given to `tenon plan`
    scripts/optimality.py --tenon PATH         # another tenon binary (default target/release/tenon)

It runs under the venv .venv-optimality at the repository's root (TENON_OPTIMALITY_VENV to change it),
which it creates and fills from scripts/optimality-requirements.txt when it is started from another
interpreter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "scripts" / "optimality-requirements.txt"
VENV = Path(os.environ.get("TENON_OPTIMALITY_VENV", ROOT / ".venv-optimality"))
CATALOG = ROOT / "examples" / "catalogs" / "aws-us-east-1.yaml"

# The instance types of every problem, from the catalog: CPU types of three memory-to-CPU ratios in two
# sizes, and three GPU sizes (one GPU each).
INSTANCE_TYPES = [
    "c5.xlarge", "c5.2xlarge", "m5.xlarge", "m5.2xlarge", "r5.xlarge", "r5.2xlarge",
    "g5.xlarge", "g5.2xlarge", "g5.4xlarge",
]
ZONE = "us-east-1a"
CAPACITY_TYPE = "on-demand"
GPU = "nvidia.com/gpu"
POOL = "optimality"
PACKING_ANNOTATION = "karpenter.sh/nodeclaim-packing-policy"
POLICIES = ("fit-only", "marginal-cost")
# A fixed planning time: nothing in these snapshots depends on it, but it keeps runs identical.
PLAN_TIME = "2026-01-01T00:00:00Z"
MICRO = 1_000_000
MI = 1 << 20
GI = 1 << 30


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_venv() -> None:
    """Re-runs this script under the venv, creating it and installing the requirements first."""
    if in_venv():
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    # A no-op when the pinned versions are installed already.
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
        check=True,
        stdout=sys.stderr,
    )
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


# ---------------------------------------------------------------------------------------------------------
# Quantities and instance types, as tenon reads them.

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")
_SCALE = {
    None: Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
    "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


def parse_quantity(resource: str, text) -> int:
    """A Kubernetes quantity as tenon holds it: cpu in millicores, everything else in units (bytes for
    memory), rounded up."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"invalid quantity {text!r} for {resource}")
    value = Fraction(Decimal(m.group(1)))
    value *= Fraction(10) ** int(m.group(2)) if m.group(2) else _SCALE[m.group(3)]
    if resource == "cpu":
        value *= 1000
    if value < 0:
        raise ValueError(f"negative quantity {text!r} for {resource}")
    return math.ceil(value)


def resources(listing: dict | None) -> dict[str, int]:
    return {name: parse_quantity(name, q) for name, q in (listing or {}).items()}


@dataclass
class InstanceType:
    name: str
    allocatable: dict[str, int]  # capacity minus overhead, never negative (tenon's InstanceType::allocatable)
    price: float  # the offering's price per hour, as the catalog gives it
    document: dict  # the catalog entry written into the snapshots (only the one offering kept)

    @property
    def micro(self) -> int:
        return round(self.price * MICRO)

    def fits(self, requests: dict[str, int]) -> bool:
        return all(v <= self.allocatable.get(r, 0) for r, v in requests.items())


def load_instance_types() -> list[InstanceType]:
    import yaml

    docs = [d for d in yaml.safe_load_all(CATALOG.read_text()) if d]
    catalogs = [d for d in docs if d.get("kind") == "InstanceCatalog"]
    if len(catalogs) != 1 or catalogs[0].get("apiVersion") != "tenon.dev/v1alpha1":
        raise SystemExit(f"{CATALOG}: expected one tenon.dev/v1alpha1 InstanceCatalog")
    by_name = {t["name"]: t for t in catalogs[0]["spec"]["instanceTypes"]}
    types = []
    for name in INSTANCE_TYPES:
        entry = dict(by_name[name])
        offerings = [
            o for o in entry.get("offerings", [])
            if o["zone"] == ZONE and o["capacityType"] == CAPACITY_TYPE and o.get("available", True)
        ]
        if len(offerings) != 1:
            raise SystemExit(f"{CATALOG}: {name} has {len(offerings)} {CAPACITY_TYPE} offerings in {ZONE}")
        entry["offerings"] = offerings
        capacity = resources(entry["capacity"])
        overhead = entry.get("overhead") or {}
        reserved: dict[str, int] = {}
        for part in ("kubeReserved", "systemReserved", "evictionThreshold"):
            for r, v in resources(overhead.get(part)).items():
                reserved[r] = reserved.get(r, 0) + v
        allocatable = {r: max(0, capacity.get(r, 0) - reserved.get(r, 0)) for r in capacity.keys() | reserved.keys()}
        price = float(offerings[0]["price"])
        if abs(round(price * MICRO) - price * MICRO) > 1e-6:
            raise SystemExit(f"{CATALOG}: {name}'s price {price} is finer than a micro-dollar")
        types.append(InstanceType(name, allocatable, price, entry))
    return types


# ---------------------------------------------------------------------------------------------------------
# Problems.


@dataclass
class Pod:
    name: str
    requests: dict[str, int]  # cpu (millicores), memory (bytes), nvidia.com/gpu, pods (always 1)

    @property
    def gpu(self) -> bool:
        return self.requests.get(GPU, 0) > 0

    def describe(self) -> str:
        parts = [f"{self.requests['cpu'] / 1000:g}c", fmt_memory(self.requests["memory"])]
        if self.gpu:
            parts.append(f"{self.requests[GPU]}g")
        return f"{self.name}[{' '.join(parts)}]"

    def document(self) -> dict:
        requests = {"cpu": f"{self.requests['cpu']}m", "memory": f"{self.requests['memory'] // MI}Mi"}
        resources_ = {"requests": requests}
        if self.gpu:
            requests[GPU] = str(self.requests[GPU])
            resources_["limits"] = {GPU: str(self.requests[GPU])}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": "default"},
            "spec": {"containers": [{"name": "app", "resources": resources_}]},
        }


def fmt_memory(b: int) -> str:
    return f"{b / GI:g}Gi"


def generate(seed: int, n_pods: int, types: list[InstanceType]) -> list[Pod]:
    """A random mix of CPU and GPU pods: a twelfth to a quarter GPU pods (at least one), each needing one
    GPU, 1-8 CPUs and 4-32 GiB; CPU pods of 0.25-3 CPUs, compute-, general- or memory-shaped (1-2, 3-4 or
    6-8 GiB a CPU)."""
    rng = random.Random(seed)
    n_gpu = rng.randint(max(1, n_pods // 12), max(1, n_pods // 4))
    kinds = ["gpu"] * n_gpu + ["cpu"] * (n_pods - n_gpu)
    rng.shuffle(kinds)
    pods = []
    for i, kind in enumerate(kinds):
        if kind == "gpu":
            cpu = rng.choices([1000, 2000, 3000, 4000, 6000, 8000], weights=[3, 3, 2, 2, 1, 1])[0]
            memory = rng.choices([4, 8, 12, 16, 24, 32], weights=[2, 3, 2, 2, 1, 1])[0] * GI
            requests = {"cpu": cpu, "memory": memory, GPU: 1, "pods": 1}
        else:
            cpu = rng.choices([250, 500, 750, 1000, 1500, 2000, 3000], weights=[2, 3, 2, 3, 2, 2, 1])[0]
            low, high = rng.choice([(1, 2), (3, 4), (6, 8)])
            gib = cpu / 1000 * rng.uniform(low, high)
            memory = max(256, round(gib * 4) * 256) * MI  # whole quarters of a GiB
            requests = {"cpu": cpu, "memory": memory, "pods": 1}
        pod = Pod(f"{kind}-{i:02d}", requests)
        if not any(t.fits(pod.requests) for t in types):
            raise AssertionError(f"seed {seed}: {pod.describe()} fits no instance type")
        pods.append(pod)
    return pods


def snapshot(pods: list[Pod], types: list[InstanceType], policy: str, seed: int) -> str:
    """The `tenon plan` input: the NodePool, the catalog of the nine types and the pods, as JSON documents."""
    metadata: dict = {"name": POOL}
    if policy == "marginal-cost":
        metadata["annotations"] = {PACKING_ANNOTATION: "marginal-cost"}
    pool = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": metadata,
        "spec": {"template": {"spec": {"requirements": []}}},
    }
    catalog = {
        "apiVersion": "tenon.dev/v1alpha1",
        "kind": "InstanceCatalog",
        "metadata": {"name": f"aws-us-east-1-{ZONE}-{CAPACITY_TYPE}"},
        "spec": {"instanceTypes": [t.document for t in types]},
    }
    head = f"# scripts/optimality.py: seed {seed}, {policy} packing, {len(pods)} pods\n"
    return head + "\n---\n".join(json.dumps(d) for d in [pool, catalog, *[p.document() for p in pods]]) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Solutions.


@dataclass
class Node:
    type: InstanceType
    pods: list[Pod]


@dataclass
class Solution:
    nodes: list[Node]
    seconds: float = 0.0
    status: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def micro(self) -> int:
        return sum(n.type.micro for n in self.nodes)

    @property
    def cost(self) -> float:
        return self.micro / MICRO

    def to_json(self) -> list[dict]:
        return [
            {"instanceType": n.type.name, "price": n.type.price, "pods": [p.name for p in n.pods]} for n in self.nodes
        ]

    def describe(self, indent: str) -> list[str]:
        lines = []
        for n in sorted(self.nodes, key=lambda n: (-n.type.price, n.type.name, [p.name for p in n.pods])):
            used = total_requests(n.pods)
            a = n.type.allocatable
            load = (
                f"cpu {used['cpu'] / 1000:g}/{a['cpu'] / 1000:g}, "
                f"mem {fmt_memory(used['memory'])}/{a['memory'] / GI:.2f}Gi"
            )
            pods = " ".join(p.describe() for p in n.pods)
            lines.append(f"{indent}{n.type.name:<11} ${n.type.price:.4f}  ({load})  {pods}")
        return lines


def total_requests(pods: list[Pod]) -> dict[str, int]:
    total: dict[str, int] = {}
    for p in pods:
        for r, v in p.requests.items():
            total[r] = total.get(r, 0) + v
    return total


def cheapest_fitting(pods: list[Pod], types: list[InstanceType]) -> InstanceType | None:
    need = total_requests(pods)
    return min((t for t in types if t.fits(need)), key=lambda t: t.micro, default=None)


def run_tenon(tenon: Path, path: Path, pods: list[Pod], types: list[InstanceType]) -> Solution:
    """Tenon's plan for one snapshot, checked against the model (the problems found are listed)."""
    cmd = [str(tenon), "--set", "marginal-cost-packing=true", "plan", "--output", "json", "--now", PLAN_TIME, str(path)]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    prov = json.loads(done.stdout)["provisioning"]
    problems = []
    for u in prov["unschedulable"]:
        problems.append(f"{u['pod']} unschedulable: {u['reason']}")
    for e in prov["existingNodes"]:
        problems.append(f"pods placed on a node that does not exist: {e}")
    by_key = {f"default/{p.name}": p for p in pods}
    by_type = {t.name: t for t in types}
    seen: set[str] = set()
    nodes = []
    for i, claim in enumerate(prov["nodeClaims"]):
        launch = claim.get("launch")
        claim_pods = [by_key[k] for k in claim["pods"]]
        dup = seen.intersection(claim["pods"])
        if dup:
            problems.append(f"claim {i}: pods placed twice: {sorted(dup)}")
        seen.update(claim["pods"])
        if claim["nodePool"] != POOL:
            problems.append(f"claim {i}: from NodePool {claim['nodePool']!r}")
        if not launch:
            problems.append(f"claim {i}: no launch")
            continue
        t = by_type.get(launch["instanceType"])
        if t is None or launch["zone"] != ZONE or launch["capacityType"] != CAPACITY_TYPE:
            problems.append(f"claim {i}: launch {launch} is not one of the model's offerings")
            continue
        if launch["price"] != t.price:
            problems.append(f"claim {i}: launch price {launch['price']} but the model prices {t.name} at {t.price}")
        need = total_requests(claim_pods)
        if not t.fits(need):
            problems.append(f"claim {i}: its pods {need} do not fit {t.name}'s allocatable {t.allocatable}")
        best = cheapest_fitting(claim_pods, types)
        if best is not None and best.micro != t.micro:
            problems.append(f"claim {i}: launches {t.name} at {t.price} but {best.name} at {best.price} fits its pods")
        if claim["daemonOverhead"] and any(parse_quantity(r, q) for r, q in claim["daemonOverhead"].items()):
            problems.append(f"claim {i}: daemon overhead {claim['daemonOverhead']}")
        nodes.append(Node(t, claim_pods))
    missing = set(by_key) - seen
    if missing:
        problems.append(f"pods on no claim: {sorted(missing)}")
    return Solution(nodes, seconds, "plan", problems)


def mergeable_pairs(types: list[InstanceType], total: dict[str, int]) -> list[tuple[int, int]]:
    """Pairs of types (a, b) such that a node of a and a node of b can always be replaced by one node of
    some type c costing no more: c's allocatable holds whatever the two could hold (a resource the pods do
    not need that much of in all counts only up to their total). Some optimum has no such pair, since each
    merge removes a node: e.g. at most one m5.xlarge, as two make an m5.2xlarge at the same price."""
    pairs = []
    for i, a in enumerate(types):
        for j in range(i, len(types)):
            b = types[j]
            for c in types:
                if c.micro <= a.micro + b.micro and all(
                    c.allocatable.get(r, 0) >= min(a.allocatable.get(r, 0) + b.allocatable.get(r, 0), total[r])
                    for r in total
                ):
                    pairs.append((i, j))
                    break
    return pairs


def solve_exact(pods: list[Pod], types: list[InstanceType], time_limit: float, workers: int,
                hint: Solution | None) -> Solution:
    """The cheapest set of nodes holding every pod, by CP-SAT.

    Node slot k exists only to hold pod k (pods sorted largest first) together with pods of higher index:
    a node is named by its lowest-index pod, which makes every packing's representation unique (no
    symmetric copies for the search to wade through). Slot k picks at most one type, and then holds pod k;
    each pod is on exactly one slot; the pods' requests on a slot fit its type's allocatable, resource by
    resource. The objective is the slots' prices in micro-dollars. Cuts that keep some optimum: pods with
    equal requests take slots in index order, and no two nodes that one node could replace at no more cost
    (mergeable_pairs) are both bought. Each resource is counted in units of the greatest common divisor
    of the pods' requests of it (allocatable rounded down to whole units), which keeps the coefficients
    small and changes no fit."""
    from ortools.sat.python import cp_model

    order = sorted(pods, key=lambda p: (-p.requests.get(GPU, 0), -p.requests["cpu"], -p.requests["memory"], p.name))
    n = len(order)
    total = total_requests(order)
    unit = {r: math.gcd(*(p.requests.get(r, 0) for p in order)) for r in total}
    need = [{r: p.requests.get(r, 0) // unit[r] for r in total} for p in order]
    room = [{r: it.allocatable.get(r, 0) // unit[r] for r in total} for it in types]

    model = cp_model.CpModel()
    y: dict[tuple[int, int], cp_model.IntVar] = {}  # slot k is a node of type t
    used: list[cp_model.IntVar] = []
    for k, p in enumerate(order):
        for t, it in enumerate(types):
            if it.fits(p.requests):
                y[k, t] = model.NewBoolVar(f"y{k}_{t}")
        used.append(model.NewBoolVar(f"used{k}"))
        model.Add(sum(v for (kk, _), v in y.items() if kk == k) == used[k])
    x: dict[tuple[int, int], cp_model.IntVar] = {}  # pod p (p > k) is on slot k
    for k, leader in enumerate(order):
        slot_types = [t for (kk, t) in y if kk == k]
        for p in range(k + 1, n):
            pair = total_requests([leader, order[p]])
            if any(types[t].fits(pair) for t in slot_types):
                x[p, k] = model.NewBoolVar(f"x{p}_{k}")
                model.AddImplication(x[p, k], used[k])
    for p in range(n):
        model.AddExactlyOne([used[p], *[v for (pp, _), v in x.items() if pp == p]])
    for k in range(n):
        on_slot = [(p, v) for (p, kk), v in x.items() if kk == k]
        for r in total:
            load = need[k][r] * used[k] + sum(need[p][r] * v for p, v in on_slot)
            model.Add(load <= sum(room[t][r] * v for (kk, t), v in y.items() if kk == k))
    # Redundant, for a stronger bound: the nodes bought hold at least the pods' total of each resource.
    for r in total:
        model.Add(sum(room[t][r] * v for (_, t), v in y.items()) >= sum(d[r] for d in need))
    # Pods with equal requests are interchangeable: the later one's slot is never before the earlier one's.
    slot = [p * used[p] + sum(k * v for (pp, k), v in x.items() if pp == p) for p in range(n)]
    for p in range(n - 1):
        if order[p].requests == order[p + 1].requests:
            model.Add(slot[p] <= slot[p + 1])
    # No two nodes one node could replace at no more cost.
    bought = [model.NewBoolVar(f"bought{t}") for t in range(len(types))]
    for (_, t), v in y.items():
        model.AddImplication(v, bought[t])
    for a, b in mergeable_pairs(types, total):
        if a == b:
            model.Add(sum(v for (_, t), v in y.items() if t == a) <= 1)
        else:
            model.AddBoolOr([bought[a].Not(), bought[b].Not()])
    model.Minimize(sum(types[t].micro * v for (_, t), v in y.items()))

    if hint is not None:
        # A known packing (tenon's), in this model's terms, as the search's first guess.
        index = {p.name: i for i, p in enumerate(order)}
        type_index = {it.name: t for t, it in enumerate(types)}
        chosen: set[tuple[int, int]] = set()
        members: dict[int, list[int]] = {}
        for node in hint.nodes:
            ids = sorted(index[p.name] for p in node.pods)
            chosen.add((ids[0], type_index[node.type.name]))
            members[ids[0]] = ids[1:]
        on = {(p, k) for k, ids in members.items() for p in ids}
        for key, v in y.items():
            model.AddHint(v, key in chosen)
        for k, v in enumerate(used):
            model.AddHint(v, k in members)
        for key, v in x.items():
            model.AddHint(v, key in on)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    started = time.monotonic()
    status = solver.Solve(model)
    seconds = time.monotonic() - started
    name = solver.StatusName(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solution([], seconds, name, [f"the solver found no solution ({name})"])
    nodes = []
    for k in range(n):
        if not solver.Value(used[k]):
            continue
        (t,) = [t for (kk, t), v in y.items() if kk == k and solver.Value(v)]
        members_k = [order[k], *[order[p] for (p, kk), v in x.items() if kk == k and solver.Value(v)]]
        nodes.append(Node(types[t], members_k))
    problems = []
    if status != cp_model.OPTIMAL:
        bound = solver.BestObjectiveBound() / MICRO
        problems.append(f"optimality not proven in {time_limit:g}s (status {name}, bound ${bound:.4f})")
    # The solution, checked independently of the solver.
    placed = sorted(p.name for node in nodes for p in node.pods)
    if placed != sorted(p.name for p in pods):
        problems.append("the solver's nodes do not hold every pod exactly once")
    for node in nodes:
        if not node.type.fits(total_requests(node.pods)):
            problems.append(f"the solver's {node.type.name} does not hold {[p.name for p in node.pods]}")
    solution = Solution(nodes, seconds, name, problems)
    if solution.micro != round(solver.ObjectiveValue()):
        problems.append(f"the solver's objective {solver.ObjectiveValue()} is not its nodes' price {solution.micro}")
    return solution


# ---------------------------------------------------------------------------------------------------------
# The run.


def wait_for(tenon: Path, patience: float) -> None:
    """Waits up to `patience` seconds for the binary to appear (e.g. while a build is still going)."""
    deadline = time.monotonic() + patience
    announced = False
    while not os.access(tenon, os.X_OK):
        if time.monotonic() >= deadline:
            raise SystemExit(f"{tenon} does not exist: build it with `cargo build --release --bin tenon`")
        if not announced:
            print(f"waiting for {tenon} ...", file=sys.stderr)
            announced = True
        time.sleep(5)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=30, help="how many seeds (default 30)")
    parser.add_argument("--start-seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--pods", type=int, default=24, help="pods per problem (default 24)")
    parser.add_argument("--tenon", type=Path, default=ROOT / "target" / "release" / "tenon", help="the tenon binary")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the snapshots into DIR and keep them")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--details", action="store_true", help="also print what each plan and the optimum buy")
    parser.add_argument("--time-limit", type=float, default=120.0, help="CP-SAT seconds per problem (default 120)")
    parser.add_argument("--workers", type=int, default=8, help="CP-SAT search workers (default 8)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait this long for the tenon binary to appear (default: not at all)")
    args = parser.parse_args()
    if args.seeds < 1 or args.pods < 1:
        parser.error("--seeds and --pods must be positive")
    tenon = args.tenon.resolve()
    wait_for(tenon, args.wait)

    types = load_instance_types()
    out_dir = args.keep or Path(tempfile.mkdtemp(prefix="tenon-optimality."))
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    failures = []
    try:
        for seed in range(args.start_seed, args.start_seed + args.seeds):
            pods = generate(seed, args.pods, types)
            plans = {}
            for policy in POLICIES:
                path = out_dir / f"seed-{seed:04d}-{policy}.yaml"
                path.write_text(snapshot(pods, types, policy, seed))
                plans[policy] = run_tenon(tenon, path, pods, types)
            best_plan = min(plans.values(), key=lambda s: s.micro)
            opt = solve_exact(pods, types, args.time_limit, args.workers, best_plan)
            problems = [f"optimum: {m}" for m in opt.problems]
            for policy, plan in plans.items():
                problems += [f"{policy}: {m}" for m in plan.problems]
                if opt.status == "OPTIMAL" and plan.micro < opt.micro:
                    problems.append(f"{policy}: costs ${plan.cost:.4f}, below the optimum ${opt.cost:.4f}")
            failures += [f"seed {seed}: {m}" for m in problems]
            row = {
                "seed": seed,
                "pods": len(pods),
                "gpuPods": sum(p.gpu for p in pods),
                "optimum": opt.cost,
                "solverStatus": opt.status,
                "solverSeconds": round(opt.seconds, 3),
                **{
                    key: {"cost": plans[p].cost, "ratio": plans[p].micro / opt.micro if opt.micro else None,
                          "nodes": plans[p].to_json()}
                    for key, p in (("fitOnly", "fit-only"), ("marginalCost", "marginal-cost"))
                },
                "optimumNodes": opt.to_json(),
                "podRequests": {p.name: {"cpu": f"{p.requests['cpu']}m", "memory": f"{p.requests['memory'] // MI}Mi",
                                         **({GPU: p.requests[GPU]} if p.gpu else {})} for p in pods},
                "problems": problems,
            }
            results.append(row)
            if not args.json:
                if len(results) == 1:
                    print(f"{'seed':>5} {'pods':>4} {'gpu':>3} {'optimum':>9} {'fit-only':>9} {'ratio':>6} "
                          f"{'marginal':>9} {'ratio':>6} {'solve':>7}")
                print(f"{seed:>5} {len(pods):>4} {row['gpuPods']:>3} {opt.cost:>9.4f} "
                      f"{row['fitOnly']['cost']:>9.4f} {row['fitOnly']['ratio']:>6.3f} "
                      f"{row['marginalCost']['cost']:>9.4f} {row['marginalCost']['ratio']:>6.3f} "
                      f"{opt.seconds:>6.2f}s{'' if opt.status == 'OPTIMAL' else ' ' + opt.status}", flush=True)
                if args.details:
                    print("  optimum:")
                    print("\n".join(opt.describe("    ")))
                    for policy, plan in plans.items():
                        print(f"  {policy}:")
                        print("\n".join(plan.describe("    ")))
                for m in problems:
                    print(f"  INCONSISTENT: {m}", flush=True)
    finally:
        if args.keep is None:
            for f in out_dir.iterdir():
                f.unlink()
            out_dir.rmdir()

    summary = {}
    for key in ("fitOnly", "marginalCost"):
        ratios = [(r[key]["ratio"], r["seed"]) for r in results if r[key]["ratio"] is not None]
        worst = max(ratios)
        summary[key] = {
            "meanRatio": sum(x for x, _ in ratios) / len(ratios),
            "worstRatio": worst[0],
            "worstSeed": worst[1],
            "optimalSeeds": sum(1 for x, _ in ratios if x == 1.0),
        }
    time_limited = [r["seed"] for r in results if r["solverStatus"] != "OPTIMAL"]
    if args.json:
        json.dump({
            "instanceTypes": [{"name": t.name, "price": t.price, "allocatable": t.allocatable} for t in types],
            "zone": ZONE,
            "capacityType": CAPACITY_TYPE,
            "seeds": results,
            "summary": summary,
            "timeLimited": time_limited,
            "consistent": not failures,
        }, sys.stdout, indent=2)
        print()
    else:
        print()
        for key, label in (("fitOnly", "fit-only"), ("marginalCost", "marginal-cost")):
            s = summary[key]
            print(f"{label:<14} mean {s['meanRatio']:.3f}x  worst {s['worstRatio']:.3f}x (seed {s['worstSeed']})  "
                  f"optimal on {s['optimalSeeds']}/{len(results)} seeds")
        print(f"solver: {len(results) - len(time_limited)}/{len(results)} proven optimal"
              + (f"; time limit hit on seeds {time_limited}" if time_limited else ""))
        if args.keep:
            print(f"snapshots in {args.keep}")
    if failures:
        print(f"{len(failures)} inconsistencies:", file=sys.stderr)
        for m in failures:
            print(f"  {m}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    ensure_venv()
    sys.exit(main())
