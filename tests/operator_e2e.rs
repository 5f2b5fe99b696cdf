//! `tenon run` against a real control plane (`scripts/peers/kube.sh`, started by `scripts/test.sh`), with
//! the simulated-node provider and kwok as the nodes' kubelet: pending pods get nodes that register and
//! initialize and kube-scheduler binds every pod; a scaled-down fleet is consolidated through evictions
//! that honour a PDB; a kill in the middle of a disruption leaks nothing; of two replicas one leads and the
//! other takes over; bad input gets a condition and nothing is applied.
//!
//! The operator runs as the chart's ServiceAccount, with a TokenRequest token, under the RBAC the chart
//! renders (`helm template`, applied to the server): the API server's audit log shows every call it made,
//! and one the chart's roles refused (403) fails the test.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Audit, CHART_NAMESPACE, install_chart, kubectl, ok, poll, real_time};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

/// One cluster name for every operator these tests start: each test cleans up what it made, and a
/// test's operator would garbage-collect another cluster name's leftovers as vanished.
const CLUSTER: &str = "tenon-e2e";

/// The tests share one API server, and an operator acts on every NodePool and pod it sees: they run one
/// at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Deletes what a test made and waits until the (still running) operator has drained and removed the
/// pool's nodes: the pool's claims go with it (they are owned by it).
fn clean_up(id: &str, pools: &[&str]) {
    ok(&kubectl(&["delete", "namespace", id, "--ignore-not-found", "--wait=false"], ""), "deleting the namespace");
    for pool in pools {
        ok(&kubectl(&["delete", "nodepool", pool, "--ignore-not-found", "--wait=false"], ""), "deleting the pool");
    }
    for pool in pools {
        poll("the pool's claims and nodes to go", Duration::from_secs(180), || {
            (claims_of(pool).is_empty() && nodes_of(pool).is_empty()).then_some(())
        });
    }
}

/// The operator as a child process, killed when dropped.
struct Operator {
    child: Child,
    health: u16,
    metrics: u16,
    audit: Audit,
}

impl Operator {
    /// `tenon run` named `identity`, with `env_vars` on top of the test's defaults.
    fn start_with(identity: &str, env_vars: &[(&str, &str)]) -> Self {
        let kubeconfig = install_chart();
        let audit = Audit::start();
        let (health, metrics) = (free_port(), free_port());
        let log = std::fs::File::create(std::env::temp_dir().join(format!("{identity}.log"))).expect("a log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenon"));
        cmd.arg("run")
            .env("KUBECONFIG", kubeconfig)
            .env("CLUSTER_NAME", CLUSTER)
            .env("POD_NAME", identity)
            .env("POD_NAMESPACE", CHART_NAMESPACE)
            .env("HEALTH_PROBE_PORT", health.to_string())
            .env("METRICS_PORT", metrics.to_string())
            .env("RUST_LOG", "info,tenon_core=debug")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env_vars {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("tenon run starts");
        Self { child, health, metrics, audit }
    }

    /// Stops the operator, failing the test if the chart's RBAC refused it a call since it started.
    fn finish(self) {
        let made = self.audit.assert_nothing_forbidden();
        assert!(made > 0, "the operator made no call as the chart's ServiceAccount");
    }

    fn start(identity: &str) -> Self {
        Self::start_with(
            identity,
            &[("PROVIDERS", "kwok"), ("KWOK_REGISTRATION_DELAY", "1s"), ("DISABLE_LEADER_ELECTION", "true")],
        )
    }

    /// Whether this replica says it leads, from its metrics.
    fn leads(&self) -> Option<bool> {
        let (code, text) = self.get(self.metrics, "/metrics")?;
        (code == 200).then(|| text.contains("tenon_leader 1"))
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().expect("kill runs");
        assert!(status.success());
    }

    fn get(&self, port: u16, path: &str) -> Option<(u16, String)> {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        let code = body.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn pending_pods_get_simulated_nodes_that_register_initialize_and_run_them() {
    let _serial = serial();
    install_chart();
    let id = format!("e2e-{}", std::process::id());
    let manifests = kwok_pool(&id, "{consolidateAfter: 1h}")
        + &format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {id}}}
spec:
  replicas: 20
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      nodeSelector: {{tenon.dev/e2e: {id}}}
      tolerations: [{{key: kwok.x-k8s.io/node, operator: Exists}}]
      containers:
      - name: web
        image: registry.invalid/web
        resources: {{requests: {{cpu: 500m, memory: 512Mi}}}}
"#
        );
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &manifests), "applying the workload");
    let operator = Operator::start(&id);
    poll("/readyz", Duration::from_secs(60), || operator.get(operator.health, "/readyz").filter(|(c, _)| *c == 200));

    // Every pod bound to a node of the pool, and every claim of the pool initialized.
    let nodes = poll("every pod bound", Duration::from_secs(240), || {
        let out =
            kubectl(&["get", "pods", "-n", &id, "-o", "jsonpath={range .items[*]}{.spec.nodeName}{\"\\n\"}{end}"], "");
        let text = ok(&out, "listing pods");
        let bound: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        (bound.len() == 20).then(|| bound.iter().map(|s| s.to_string()).collect::<std::collections::BTreeSet<_>>())
    });
    let claims = poll("every claim initialized", Duration::from_secs(120), || {
        let selector = format!("karpenter.sh/nodepool={id}");
        let out = kubectl(&["get", "nodeclaims", "-l", &selector, "-o", "json"], "");
        let list: serde_json::Value = serde_json::from_str(&ok(&out, "listing claims")).ok()?;
        let items = list["items"].as_array()?.clone();
        let initialized = |c: &serde_json::Value| {
            c["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|x| x["type"] == "Initialized" && x["status"] == "True"))
        };
        (!items.is_empty() && items.iter().all(initialized)).then_some(items)
    });
    for node in &nodes {
        assert!(claims.iter().any(|c| c["status"]["nodeName"] == node.as_str()), "{node} has no claim");
    }
    // The claims are owned by their pool, so deleting it cascades.
    assert!(claims.iter().all(|c| c["metadata"]["ownerReferences"][0]["kind"] == "NodePool"), "{claims:?}");
    let (code, metrics) = operator.get(operator.metrics, "/metrics").expect("metrics answer");
    assert_eq!(code, 200);
    assert!(metrics.contains("karpenter_cluster_state_synced 1"), "{metrics}");
    let created = format!("karpenter_nodeclaims_created_total{{nodepool=\"{id}\"}} {}", claims.len());
    assert!(metrics.contains(&created), "{created} missing from {metrics}");
    // The scheduler and provider calls were timed, and every node and pod has its series.
    assert!(metric_sum(&metrics, "karpenter_scheduler_scheduling_duration_seconds_count", "") >= 1.0, "{metrics}");
    let creates =
        metric_sum(&metrics, "karpenter_cloudprovider_duration_seconds_count", "method=\"Create\",provider=\"kwok\"");
    assert!(creates >= claims.len() as f64, "{creates} timed creates for {} claims", claims.len());
    let pool = format!("nodepool=\"{id}\"");
    let running = metric_sum(&metrics, "karpenter_pods_state", &format!("namespace=\"{id}\""));
    assert_eq!(running, 20.0, "one karpenter_pods_state series per pod: {metrics}");
    for node in &nodes {
        let labels = format!("node_name=\"{node}\",{pool},resource_type=\"cpu\"");
        assert!(metric_sum(&metrics, "karpenter_nodes_allocatable", &labels) > 0.0, "{node}: {metrics}");
        assert!(metric_sum(&metrics, "karpenter_nodes_total_pod_requests", &labels) >= 0.5, "{node}: {metrics}");
    }
    // Each pod was told where it goes, in an event of Karpenter's.
    let events = ok(&kubectl(&["get", "events", "-n", &id, "-o", "json"], ""), "listing events");
    let events: serde_json::Value = serde_json::from_str(&events).expect("JSON");
    let nominated = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reason"] == "Nominated"
                && e["message"].as_str().is_some_and(|n| n.starts_with("Pod should schedule on: "))
        })
        .count();
    assert!(nominated >= 20, "{nominated} Nominated events for 20 pods: {events}");
    clean_up(&id, &[&id]);
    operator.finish();
}

/// The leader-election Lease's default name: the chart's Role lets the operator write only it.
const LEASE: &str = "tenon-leader-election";

/// Two replicas: exactly one leads; when the leader is killed outright, the other takes over within the
/// lease's duration; a leader stopped with SIGTERM releases the lease, so the other takes over at once.
#[test]
fn one_of_two_replicas_leads_and_the_other_takes_over() {
    let _serial = serial();
    install_chart();
    let id = format!("le-{}", std::process::id());
    let replica = |n: usize| Operator::start_with(&format!("{id}-{n}"), &[("PROVIDERS", "self-managed")]);
    let (a, b) = (replica(1), replica(2));
    let a_leads = poll("exactly one leader", Duration::from_secs(60), || match (a.leads()?, b.leads()?) {
        (true, true) => panic!("both replicas lead"),
        (false, false) => None,
        (a_leads, _) => Some(a_leads),
    });
    let (leader, standby, leader_name) = if a_leads { (a, b, 1) } else { (b, a, 2) };
    // The standby stays ready: its stores are warm.
    assert_eq!(standby.get(standby.health, "/readyz").map(|(c, _)| c), Some(200));
    let holder = |name: &str| {
        let out = kubectl(&["get", "lease", name, "-n", CHART_NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}"], "");
        ok(&out, "reading the lease")
    };
    assert_eq!(holder(LEASE), format!("{id}-{leader_name}"));
    // Killed outright: no release, so the lease must run out first.
    let killed = Instant::now();
    leader.signal("-KILL");
    poll("the standby to take over", Duration::from_secs(40), || standby.leads().filter(|l| *l));
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_secs(tenon::run::LEASE_DURATION_SECONDS + 10),
        "took over after {took:?}, the lease lasts {} s",
        tenon::run::LEASE_DURATION_SECONDS
    );
    leader.finish();
    // A third replica stands by; the new leader stopped with SIGTERM hands over at once.
    let third = replica(3);
    poll("the third replica to be ready", Duration::from_secs(60), || {
        third.get(third.health, "/readyz").filter(|(c, _)| *c == 200)
    });
    assert_eq!(third.leads(), Some(false));
    let stopped = Instant::now();
    standby.signal("-TERM");
    poll("the third replica to take over", Duration::from_secs(30), || third.leads().filter(|l| *l));
    assert!(stopped.elapsed() < Duration::from_secs(tenon::run::LEASE_DURATION_SECONDS), "the lease was not released");
    assert_eq!(holder(LEASE), format!("{id}-3"));
    standby.finish();
    third.finish();
}

/// A KwokNodeClass and an on-demand NodePool named `id` whose nodes are labelled `tenon.dev/e2e: id`,
/// with `disruption` (a YAML flow map) as its disruption block, and a namespace
/// `id`: the start of a test's manifests.
fn kwok_pool(id: &str, disruption: &str) -> String {
    let requirements = "[{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}]";
    format!(
        r#"apiVersion: tenon.dev/v1alpha1
kind: KwokNodeClass
metadata: {{name: {id}}}
spec: {{}}
---
{}
  disruption: {disruption}
---
apiVersion: v1
kind: Namespace
metadata: {{name: {id}}}
---
"#,
        node_pool(id, "tenon.dev", "KwokNodeClass", requirements)
    )
}

/// A NodePool `id` of NodeClass `group`/`kind` named `id`, with `requirements` (a YAML flow sequence),
/// whose nodes are labelled `tenon.dev/e2e: id`; its `spec` may go on.
fn node_pool(id: &str, group: &str, kind: &str, requirements: &str) -> String {
    format!(
        r#"apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {id}}}
spec:
  template:
    metadata:
      labels: {{tenon.dev/e2e: {id}}}
    spec:
      nodeClassRef: {{group: {group}, kind: {kind}, name: {id}}}
      requirements: {requirements}"#
    )
}

/// A namespace `id` and, in it, a pod `web` asking for `requests` (a YAML flow map) on the nodes labelled
/// `tenon.dev/e2e: id`, as a YAML stream to append to a test's manifests.
fn namespace_and_pod(id: &str, requests: &str) -> String {
    format!(
        r#"---
apiVersion: v1
kind: Namespace
metadata: {{name: {id}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: {id}}}
spec:
  nodeSelector: {{tenon.dev/e2e: {id}}}
  containers:
  - name: web
    image: registry.invalid/web
    resources: {{requests: {requests}}}
"#
    )
}

/// The claims of NodePool `pool`, as JSON.
fn claims_of(pool: &str) -> Vec<serde_json::Value> {
    let selector = format!("karpenter.sh/nodepool={pool}");
    let out = kubectl(&["get", "nodeclaims", "-l", &selector, "-o", "json"], "");
    let list: serde_json::Value = serde_json::from_str(&ok(&out, "listing claims")).expect("JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The nodes of NodePool `pool`, as JSON.
fn nodes_of(pool: &str) -> Vec<serde_json::Value> {
    let selector = format!("karpenter.sh/nodepool={pool}");
    let out = kubectl(&["get", "nodes", "-l", &selector, "-o", "json"], "");
    let list: serde_json::Value = serde_json::from_str(&ok(&out, "listing nodes")).expect("JSON");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn has_condition(o: &serde_json::Value, type_: &str, status: &str) -> bool {
    o["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == status))
}

fn tainted_disrupted(node: &serde_json::Value) -> bool {
    node["spec"]["taints"].as_array().is_some_and(|ts| ts.iter().any(|t| t["key"] == "karpenter.sh/disrupted"))
}

/// The pods of `namespace` bound to a node, by name.
fn bound_pods(namespace: &str) -> Vec<(String, String)> {
    let out = kubectl(
        &[
            "get",
            "pods",
            "-n",
            namespace,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
        ],
        "",
    );
    ok(&out, "listing pods")
        .lines()
        .filter_map(|l| l.split_once(' ').filter(|(_, n)| !n.is_empty()).map(|(p, n)| (p.to_owned(), n.to_owned())))
        .collect()
}

/// A consolidating pool on simulated nodes, a Deployment of `replicas` one-CPU pods on it, and a PDB
/// keeping two of them up.
fn consolidating_workload(id: &str, replicas: u32) -> String {
    kwok_pool(
        id,
        r#"{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 0s, budgets: [{nodes: "100%"}]}"#,
    ) + &format!(
        r#"apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: web, namespace: {id}}}
spec:
  minAvailable: 2
  selector: {{matchLabels: {{app: web}}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {id}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      nodeSelector: {{tenon.dev/e2e: {id}}}
      containers:
      - name: web
        image: registry.invalid/web
        resources: {{requests: {{cpu: "1", memory: 1Gi}}}}
"#
    )
}

fn consolidating_operator(identity: &str) -> Operator {
    Operator::start_with(
        identity,
        &[
            ("PROVIDERS", "kwok"),
            ("KWOK_REGISTRATION_DELAY", "1s"),
            ("DISABLE_LEADER_ELECTION", "true"),
            ("COMMAND_VALIDATION_DELAY", "3s"),
            ("DISRUPTION_POLL_PERIOD", "5s"),
        ],
    )
}

/// Nothing of the pool is left half-done: no live node tainted `karpenter.sh/disrupted`, no live claim
/// with a disruption reason, every node owned by a claim, every pod bound.
fn settled(id: &str, replicas: usize) -> Option<usize> {
    let claims = claims_of(id);
    let live: Vec<&serde_json::Value> =
        claims.iter().filter(|c| c["metadata"]["deletionTimestamp"].is_null()).collect();
    if live.len() != claims.len() {
        return None;
    }
    if live.iter().any(|c| has_condition(c, "DisruptionReason", "True")) {
        return None;
    }
    let nodes = nodes_of(id);
    if nodes.iter().any(tainted_disrupted) || nodes.len() != live.len() {
        return None;
    }
    let names: Vec<&str> = live.iter().filter_map(|c| c["status"]["nodeName"].as_str()).collect();
    if nodes.iter().any(|n| !names.contains(&n["metadata"]["name"].as_str().unwrap_or_default())) {
        return None;
    }
    (bound_pods(id).len() == replicas).then_some(live.len())
}

/// Scaled down, the fleet shrinks: consolidation deletes or replaces the emptied and underused nodes,
/// draining them through the Eviction API (the PDB keeps two pods up), and every pod stays bound.
#[test]
fn a_scaled_down_fleet_is_consolidated_through_evictions_that_honour_the_pdb() {
    let _serial = serial();
    install_chart();
    let id = format!("cons-{}", std::process::id());
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &consolidating_workload(&id, 20)), "applying the workload");
    let operator = consolidating_operator(&id);
    let before = poll("20 pods on a settled fleet", Duration::from_secs(240), || settled(&id, 20));
    ok(&kubectl(&["scale", "deployment", "web", "-n", &id, "--replicas=3"], ""), "scaling down");
    let after = poll("a smaller settled fleet", Duration::from_secs(300), || settled(&id, 3).filter(|n| *n < before));
    assert!(after < before, "{after} nodes after, {before} before");
    // Three run, and the server's PDB shows its budget met.
    let pdb = ok(&kubectl(&["get", "pdb", "web", "-n", &id, "-o", "json"], ""), "reading the PDB");
    let pdb: serde_json::Value = serde_json::from_str(&pdb).expect("JSON");
    assert!(pdb["status"]["currentHealthy"].as_i64().unwrap_or(0) >= 2, "{pdb}");
    let events = ok(&kubectl(&["get", "events", "-A", "-o", "json"], ""), "listing events");
    assert!(events.contains("DisruptionTerminating"), "the disruption is reported in events");
    // And in Karpenter's decision metrics, with the budgets the pool allowed.
    let (_, metrics) = operator.get(operator.metrics, "/metrics").expect("metrics answer");
    let decided = metric_sum(&metrics, "karpenter_voluntary_disruption_decisions_total", "");
    assert!(decided >= 1.0, "no disruption decision counted: {metrics}");
    let allowed = format!("karpenter_nodepools_allowed_disruptions{{nodepool=\"{id}\",reason=\"Underutilized\"}}");
    assert!(metrics.contains(&allowed), "{allowed} missing from {metrics}");
    assert!(
        metric_sum(&metrics, "karpenter_voluntary_disruption_decision_evaluation_duration_seconds_count", "") >= 1.0
    );
    clean_up(&id, &[&id]);
    operator.finish();
}

/// The sum of the values of the series of `name` whose labels contain `labels` (all of them when empty).
fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (series, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            series.contains(labels).then(|| value.trim().parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// Killed in the middle of a disruption command and restarted, tenon leaks nothing: no node left
/// tainted, no orphan node, no claim left with a disruption reason, one node per claim, and the fleet
/// consolidated back to no more nodes than before.
#[test]
fn a_restart_in_the_middle_of_a_disruption_leaks_nothing() {
    let _serial = serial();
    install_chart();
    let id = format!("restart-{}", std::process::id());
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &consolidating_workload(&id, 12)), "applying the workload");
    let first = consolidating_operator(&format!("{id}-1"));
    let before = poll("12 pods on a settled fleet", Duration::from_secs(240), || settled(&id, 12));
    // Three replicas: the PDB (two must stay up) lets one pod move at a time.
    ok(&kubectl(&["scale", "deployment", "web", "-n", &id, "--replicas=3"], ""), "scaling down");
    // The moment a command has tainted a candidate, the process dies.
    poll("a disruption command to start", Duration::from_secs(120), || {
        nodes_of(&id).iter().any(tainted_disrupted).then_some(())
    });
    first.signal("-KILL");
    first.finish();
    let second = consolidating_operator(&format!("{id}-2"));
    // A replacement the first process created for the command it never finished is real capacity now;
    // consolidation takes the fleet back down, with every node owned by a claim all along.
    let settle = real_time(Duration::from_secs(300)).try_until_blocking(|| settled(&id, 3).filter(|n| *n <= before));
    let after = settle.unwrap_or_else(|| {
        let state = kubectl(&["get", "nodeclaims,nodes,pods", "-A", "-o", "wide"], "");
        let claims = serde_json::to_string_pretty(&claims_of(&id)).unwrap_or_default();
        panic!(
            "the restarted operator did not settle the fleet in 300 s:\n{}\n{claims}",
            String::from_utf8_lossy(&state.stdout)
        );
    });
    assert!(after <= before, "no more nodes than before: {after} against {before}");
    clean_up(&id, &[&id]);
    second.finish();
}

/// Bad input gets a condition and nothing is applied: a NodePool the API server accepts but tenon's
/// validation refuses is marked and never provisioned from; a NodeClaim whose NodeClass no provider
/// serves is marked and never launched.
#[test]
fn bad_input_gets_a_condition_and_nothing_is_applied() {
    let _serial = serial();
    install_chart();
    let id = format!("bad-{}", std::process::id());
    let manifests = format!(
        r#"apiVersion: tenon.dev/v1alpha1
kind: KwokNodeClass
metadata: {{name: {id}}}
spec: {{}}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {id}-bad}}
spec:
  weight: 100
  template:
    metadata:
      labels: {{tenon.dev/e2e: {id}}}
    spec:
      nodeClassRef: {{group: tenon.dev, kind: KwokNodeClass, name: {id}}}
      requirements: []
  disruption:
    budgets: [{{nodes: "1", schedule: "not a schedule", duration: 1h}}]
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {id}-good}}
spec:
  template:
    metadata:
      labels: {{tenon.dev/e2e: {id}}}
    spec:
      nodeClassRef: {{group: tenon.dev, kind: KwokNodeClass, name: {id}}}
      requirements: []
---
apiVersion: karpenter.sh/v1
kind: NodeClaim
metadata: {{name: {id}-stray}}
spec:
  nodeClassRef: {{group: example.com, kind: MissingNodeClass, name: nowhere}}
  requirements: []
"#
    ) + &namespace_and_pod(&id, "{cpu: 500m}");
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &manifests), "applying the objects");
    let operator = consolidating_operator(&id);
    let pool = |name: &str| -> serde_json::Value {
        let out = kubectl(&["get", "nodepool", name, "-o", "json"], "");
        serde_json::from_str(&ok(&out, "reading the NodePool")).expect("JSON")
    };
    let bad = format!("{id}-bad");
    poll("the bad pool's condition", Duration::from_secs(60), || {
        has_condition(&pool(&bad), "ValidationSucceeded", "False").then_some(())
    });
    let message = pool(&bad)["status"]["conditions"].to_string();
    assert!(message.contains("schedule"), "the condition names the field: {message}");
    // The pod gets its node from the good pool, though the bad one weighs more.
    poll("the pod bound", Duration::from_secs(120), || (bound_pods(&id).len() == 1).then_some(()));
    assert!(claims_of(&bad).is_empty(), "nothing provisioned from the invalid pool");
    assert_eq!(claims_of(&format!("{id}-good")).len(), 1);
    // The stray claim is marked, not launched.
    let stray = format!("{id}-stray");
    let claim = poll("the stray claim's condition", Duration::from_secs(60), || {
        let out = kubectl(&["get", "nodeclaim", &stray, "-o", "json"], "");
        let c: serde_json::Value = serde_json::from_str(&ok(&out, "reading the claim")).ok()?;
        has_condition(&c, "NodeClassReady", "False").then_some(c)
    });
    assert!(claim["status"]["providerID"].is_null(), "never launched: {claim}");
    assert!(!has_condition(&claim, "Launched", "True"));
    ok(&kubectl(&["delete", "nodeclaim", &stray, "--wait=false"], ""), "deleting the stray claim");
    clean_up(&id, &[&bad, &format!("{id}-good")]);
    operator.finish();
}

/// The stock binary built with `aws` serves EC2NodeClasses: the class is read from the API server and
/// fed to the provider, which launches the pending pod's claim on EC2 (moto's server, started by
/// `scripts/test.sh`), tagged with the claim; deleting the pool terminates the instance.
#[cfg(feature = "aws")]
#[test]
fn the_aws_provider_launches_claims_from_ec2_node_classes_it_watches() {
    use aws_sdk_ec2::types as ec2;

    let _serial = serial();
    install_chart();
    let moto = std::env::var("TENON_MOTO_ENDPOINT").expect("TENON_MOTO_ENDPOINT: start moto (scripts/test.sh)");
    let id = format!("aws-{}", std::process::id());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let conf = rt.block_on(
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .endpoint_url(&moto)
            .credentials_provider(aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "e2e"))
            .load(),
    );
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let tag = |rt: ec2::ResourceType| {
        ec2::TagSpecification::builder()
            .resource_type(rt)
            .tags(ec2::Tag::builder().key("tenon-e2e").value(&id).build())
            .build()
    };
    rt.block_on(async {
        let vpc = ec2.create_vpc().cidr_block("10.1.0.0/16").send().await.unwrap();
        let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_owned();
        ec2.create_subnet()
            .vpc_id(&vpc)
            .cidr_block("10.1.0.0/24")
            .availability_zone("us-east-1a")
            .tag_specifications(tag(ec2::ResourceType::Subnet))
            .send()
            .await
            .unwrap();
        ec2.create_security_group()
            .group_name(format!("nodes-{id}"))
            .description("tenon e2e nodes")
            .vpc_id(&vpc)
            .tag_specifications(tag(ec2::ResourceType::SecurityGroup))
            .send()
            .await
            .unwrap();
        // One of moto's bundled x86_64 images, copied and tagged (a registered image has no architecture).
        let image = ec2.copy_image().source_image_id("ami-760aaa0f").source_region("us-east-1").name(&id);
        let image = image.send().await.unwrap().image_id().unwrap().to_owned();
        let t = ec2::Tag::builder().key("tenon-e2e").value(&id).build();
        ec2.create_tags().resources(&image).tags(t).send().await.unwrap();
        // The nodes' role: the operator makes an instance profile for it.
        aws_sdk_iam::Client::new(&conf)
            .create_role()
            .role_name(format!("KarpenterNodeRole-{id}"))
            .assume_role_policy_document(r#"{"Version":"2012-10-17","Statement":[]}"#)
            .send()
            .await
            .unwrap();
    });
    let manifests = format!(
        r#"apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {{name: {id}}}
spec:
  role: KarpenterNodeRole-{id}
  amiSelectorTerms: [{{tags: {{tenon-e2e: {id}}}}}]
  subnetSelectorTerms: [{{tags: {{tenon-e2e: {id}}}}}]
  securityGroupSelectorTerms: [{{tags: {{tenon-e2e: {id}}}}}]
---
{}
"#,
        node_pool(
            &id,
            "karpenter.k8s.aws",
            "EC2NodeClass",
            "[{key: node.kubernetes.io/instance-type, operator: In, values: [m5.large, c5.large]}, \
             {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}]"
        )
    ) + &namespace_and_pod(&id, r#"{cpu: "1", memory: 1Gi}"#);
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &manifests), "applying the objects");
    let operator = Operator::start_with(
        &id,
        &[
            ("PROVIDERS", "aws"),
            ("DISABLE_LEADER_ELECTION", "true"),
            ("CLUSTER_NAME", id.as_str()),
            ("AWS_ENDPOINT_URL", moto.as_str()),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ],
    );
    let claim = poll("a claim launched on EC2", Duration::from_secs(180), || {
        claims_of(&id).into_iter().find(|c| has_condition(c, "Launched", "True"))
    });
    let name = claim["metadata"]["name"].as_str().unwrap().to_owned();
    let pid = claim["status"]["providerID"].as_str().unwrap_or_default().to_owned();
    assert!(pid.starts_with("aws:///us-east-1a/i-"), "{claim}");
    let instance_id = pid.rsplit('/').next().unwrap().to_owned();
    let describe = |id: &str| {
        let out = rt.block_on(ec2.describe_instances().instance_ids(id).send()).unwrap();
        out.reservations()[0].instances()[0].clone()
    };
    let instance = describe(&instance_id);
    let tags: std::collections::BTreeMap<_, _> =
        instance.tags().iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default())).collect();
    assert_eq!(tags.get("karpenter.sh/nodeclaim"), Some(&name.as_str()), "{tags:?}");
    assert_eq!(tags.get("karpenter.sh/nodepool"), Some(&id.as_str()), "{tags:?}");
    let instance_type = instance.instance_type().map(|t| t.as_str().to_owned()).unwrap_or_default();
    assert!(["m5.large", "c5.large"].contains(&instance_type.as_str()), "{instance_type}");
    // The class carries the termination finalizer and a status as Karpenter writes it.
    let class = poll("the EC2NodeClass status", Duration::from_secs(60), || {
        let out = kubectl(&["get", "ec2nodeclass", &id, "-o", "json"], "");
        let class: serde_json::Value = serde_json::from_str(&ok(&out, "reading the class")).ok()?;
        has_condition(&class, "Ready", "True").then_some(class)
    });
    for condition in ["SubnetsReady", "SecurityGroupsReady", "AMIsReady", "InstanceProfileReady", "ValidationSucceeded"]
    {
        assert!(has_condition(&class, condition, "True"), "{condition}: {class}");
    }
    assert_eq!(class["status"]["subnets"][0]["zone"], "us-east-1a", "{class}");
    // The instance profile the operator made for the role, holding it.
    let profile = class["status"]["instanceProfile"].as_str().unwrap_or_default().to_owned();
    assert!(profile.starts_with(&format!("{id}_")), "{class}");
    let got =
        rt.block_on(aws_sdk_iam::Client::new(&conf).get_instance_profile().instance_profile_name(&profile).send());
    let roles: Vec<String> =
        got.unwrap().instance_profile().unwrap().roles().iter().map(|r| r.role_name().to_owned()).collect();
    assert_eq!(roles, [format!("KarpenterNodeRole-{id}")]);
    assert!(class["metadata"]["finalizers"].to_string().contains("karpenter.k8s.aws/termination"), "{class}");
    // Deleted while a claim uses it, the class stays.
    ok(&kubectl(&["delete", "ec2nodeclass", &id, "--wait=false"], ""), "deleting the class");
    let out = kubectl(&["get", "ec2nodeclass", &id, "-o", "jsonpath={.metadata.deletionTimestamp}"], "");
    assert!(!ok(&out, "reading the class").is_empty(), "the class went while a claim used it");
    // The pool goes, its claim with it, and the instance is terminated.
    ok(&kubectl(&["delete", "nodepool", &id, "--wait=false"], ""), "deleting the pool");
    poll("the claim to go", Duration::from_secs(120), || claims_of(&id).is_empty().then_some(()));
    let state = describe(&instance_id).state().and_then(|s| s.name().cloned());
    assert!(
        matches!(state, Some(ec2::InstanceStateName::ShuttingDown | ec2::InstanceStateName::Terminated)),
        "{state:?}"
    );
    ok(&kubectl(&["delete", "namespace", &id, "--wait=false"], ""), "deleting the namespace");
    // Its last claim gone, the class goes, and its launch templates with it.
    poll("the class to go", Duration::from_secs(60), || {
        let out = kubectl(&["get", "ec2nodeclasses", "-o", "name"], "");
        (!ok(&out, "listing classes").contains(&format!("/{id}"))).then_some(())
    });
    let templates = rt.block_on(
        ec2.describe_launch_templates()
            .filters(ec2::Filter::builder().name("tag:karpenter.k8s.aws/ec2nodeclass").values(&id).build())
            .send(),
    );
    assert!(templates.unwrap().launch_templates().is_empty(), "the class's launch templates are left");
    operator.finish();
}

/// A machine added to a `SelfManagedNodeClass` while tenon runs is served without a restart: the
/// inventory is read again (its BMC Secret too) and a pod only the new machine fits is launched on it,
/// powered on through its BMC (the Redfish emulator).
#[test]
fn a_machine_added_to_a_self_managed_class_is_launched_without_a_restart() {
    let _serial = serial();
    install_chart();
    let var =
        |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name}: start the Redfish peer (scripts/test.sh)"));
    let (endpoint, username, password) =
        (var("TENON_REDFISH_ENDPOINT"), var("TENON_REDFISH_USERNAME"), var("TENON_REDFISH_PASSWORD"));
    let systems = var("TENON_REDFISH_SYSTEMS");
    let system = systems.split(',').next_back().expect("an emulated system").to_owned();
    let id = format!("sm-{}", std::process::id());
    let machine = |name: &str, domain: &str, system: &str| {
        format!(
            "  - name: {name}\n    domain: {domain}\n    bmc: {{endpoint: \"{endpoint}\", systemId: \"{system}\", credentialsRef: {id}-bmc}}\n    gpu: {{model: L4, count: 1}}\n    cpu: \"16\"\n    memory: 64Gi\n    pricePerHour: 1.5\n"
        )
    };
    let class = |machines: &str| {
        format!(
            "apiVersion: tenon.dev/v1alpha1\nkind: SelfManagedNodeClass\nmetadata: {{name: {id}}}\nspec:\n  bootBudget: 30s\n  gracefulShutdownTimeout: 5s\n  forcedShutdownTimeout: 5s\n  machines:\n{machines}"
        )
    };
    let first = machine(&format!("{id}-a"), "rack-1", "no-such-system");
    let manifests = format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: {id}-bmc, namespace: {CHART_NAMESPACE}}}
stringData: {{username: "{username}", password: "{password}"}}
---
{}
---
{}
"#,
        class(&first),
        node_pool(&id, "tenon.dev", "SelfManagedNodeClass", "[]")
    ) + &namespace_and_pod(&id, r#"{cpu: "2", memory: 4Gi}"#)
        .replace("  nodeSelector: {", "  nodeSelector: {topology.kubernetes.io/zone: rack-2, ");
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &manifests), "applying the objects");
    let operator = Operator::start_with(&id, &[("PROVIDERS", "self-managed"), ("DISABLE_LEADER_ELECTION", "true")]);
    poll("/readyz", Duration::from_secs(60), || operator.get(operator.health, "/readyz").filter(|(c, _)| *c == 200));
    // Only rack-1 is in the inventory: the pod fits nowhere, and nothing is launched for it.
    let (_, metrics) = poll("a provisioning pass", Duration::from_secs(60), || {
        operator
            .get(operator.metrics, "/metrics")
            .filter(|(_, m)| m.contains("karpenter_scheduler_scheduling_duration_seconds_count"))
    });
    assert!(claims_of(&id).is_empty(), "{metrics}");
    // A machine in rack-2 joins the class: tenon reloads its inventory and launches the pod's claim on it.
    let second = machine(&format!("{id}-b"), "rack-2", &system);
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &class(&(first + &second))), "adding a machine");
    let claim = poll("a claim launched on the new machine", Duration::from_secs(120), || {
        claims_of(&id).into_iter().find(|c| has_condition(c, "Launched", "True"))
    });
    let pid = claim["status"]["providerID"].as_str().unwrap_or_default();
    assert!(pid.ends_with(&format!("/{id}-b")), "{claim}");
    clean_up(&id, &[&id]);
    ok(&kubectl(&["delete", "selfmanagednodeclass", &id, "--wait=false"], ""), "deleting the class");
    ok(&kubectl(&["delete", "secret", &format!("{id}-bmc"), "-n", CHART_NAMESPACE], ""), "deleting the Secret");
    operator.finish();
}
