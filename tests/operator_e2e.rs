//! `tenon run` against a real control plane (`scripts/peers/kube.sh`, started by `scripts/test.sh`): the
//! operator binary provisions simulated nodes for pending pods, kube-scheduler binds them, every claim
//! initializes, and the operator serves its health and metrics endpoints.
#![allow(clippy::expect_used, clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too

use std::io::Write;
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The kubectl the peer built, and the admin kubeconfig it wrote.
fn env() -> (String, String) {
    let missing = |name: &str| {
        panic!(
            "{name} is not set: these tests need the Kubernetes control plane. Run scripts/test.sh, or start scripts/peers/kube.sh and export what it prints"
        )
    };
    let kubectl = std::env::var("TENON_KUBECTL").unwrap_or_else(|_| missing("TENON_KUBECTL"));
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_else(|_| missing("KUBECONFIG"));
    (kubectl, kubeconfig)
}

fn kubectl(args: &[&str], stdin: &str) -> Output {
    let (kubectl, kubeconfig) = env();
    let mut child = Command::new(kubectl)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("kubectl reads its input");
    child.wait_with_output().expect("kubectl finishes")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

/// Polls `check` every half second until it answers, or fails the test at `deadline`.
fn poll<T>(what: &str, deadline: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + deadline;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < until, "timed out after {deadline:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The operator as a child process, killed when dropped.
struct Operator {
    child: Child,
    health: u16,
    metrics: u16,
}

impl Operator {
    /// `tenon run` for cluster `cluster` with `env` on top of the test's defaults.
    fn start_with(cluster: &str, identity: &str, env_vars: &[(&str, &str)]) -> Self {
        let (_, kubeconfig) = env();
        let (health, metrics) = (free_port(), free_port());
        let log = std::fs::File::create(std::env::temp_dir().join(format!("{identity}.log"))).expect("a log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenon"));
        cmd.arg("run")
            .env("KUBECONFIG", kubeconfig)
            .env("CLUSTER_NAME", cluster)
            .env("POD_NAME", identity)
            .env("POD_NAMESPACE", "default")
            .env("HEALTH_PROBE_PORT", health.to_string())
            .env("METRICS_PORT", metrics.to_string())
            .env("RUST_LOG", "info,tenon_core=debug")
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env_vars {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("tenon run starts");
        Self { child, health, metrics }
    }

    fn start(cluster: &str) -> Self {
        Self::start_with(
            cluster,
            cluster,
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

fn install_crds() {
    let crds = Command::new(env!("CARGO_BIN_EXE_tenon")).arg("crds").output().expect("tenon crds runs");
    let yaml = ok(&crds, "tenon crds");
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &yaml), "applying the CRDs");
    let wait = kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"], "");
    ok(&wait, "waiting for the CRDs");
}

#[test]
fn pending_pods_get_simulated_nodes_that_register_initialize_and_run_them() {
    install_crds();
    let id = format!("e2e-{}", std::process::id());
    let manifests = format!(
        r#"apiVersion: tenon.dev/v1alpha1
kind: KwokNodeClass
metadata: {{name: {id}}}
spec: {{}}
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: {id}}}
spec:
  template:
    metadata:
      labels: {{tenon.dev/e2e: {id}}}
    spec:
      nodeClassRef: {{group: tenon.dev, kind: KwokNodeClass, name: {id}}}
      requirements:
      - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}
  disruption:
    consolidateAfter: 1h
---
apiVersion: v1
kind: Namespace
metadata: {{name: {id}}}
---
apiVersion: apps/v1
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
    assert!(!metrics.contains("karpenter_nodeclaims_created_total 0\n"), "{metrics}");
    let events = ok(&kubectl(&["get", "events", "-A", "-o", "json"], ""), "listing events");
    let _ = events;
}

/// Two replicas: exactly one leads; when the leader is killed outright, the other takes over within the
/// lease's duration; a leader stopped with SIGTERM releases the lease, so the other takes over at once.
#[test]
fn one_of_two_replicas_leads_and_the_other_takes_over() {
    install_crds();
    let id = format!("le-{}", std::process::id());
    let replica = |n: usize| {
        Operator::start_with(
            &id,
            &format!("{id}-{n}"),
            &[("PROVIDERS", "self-managed"), ("LEADER_ELECTION_NAME", id.as_str())],
        )
    };
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
        let out = kubectl(&["get", "lease", name, "-n", "default", "-o", "jsonpath={.spec.holderIdentity}"], "");
        ok(&out, "reading the lease")
    };
    assert_eq!(holder(&id), format!("{id}-{leader_name}"));
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
    drop(leader);
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
    assert_eq!(holder(&id), format!("{id}-3"));
}
