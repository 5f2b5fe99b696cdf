//! Helpers the tests against the real control plane (`scripts/peers/kube.sh`) share: kubectl as the
//! admin, the CRDs `tenon crds` prints, and polling the server with a deadline.
#![allow(dead_code, clippy::expect_used)] // each test file uses a part; helpers outside #[test] expect too

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tenon_core::cloud::conformance::RealTimePoll;

/// The kubectl the peer built, and the admin kubeconfig it wrote.
pub(crate) fn env() -> (String, String) {
    let missing = |name: &str| {
        panic!(
            "{name} is not set: these tests need the Kubernetes control plane. Run scripts/test.sh, or start scripts/peers/kube.sh and export what it prints"
        )
    };
    let kubectl = std::env::var("TENON_KUBECTL").unwrap_or_else(|_| missing("TENON_KUBECTL"));
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_else(|_| missing("KUBECONFIG"));
    (kubectl, kubeconfig)
}

/// Runs kubectl with `args`, feeding it `stdin`.
pub(crate) fn kubectl(args: &[&str], stdin: &str) -> Output {
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

/// `out`'s stdout, or a failure naming `what` with kubectl's stderr.
pub(crate) fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Installs the CRDs `tenon crds` prints and waits until the server serves them.
pub(crate) fn install_crds() {
    let crds = Command::new(env!("CARGO_BIN_EXE_tenon")).arg("crds").output().expect("tenon crds runs");
    let yaml = ok(&crds, "tenon crds");
    ok(&kubectl(&["apply", "--server-side", "-f", "-"], &yaml), "applying the CRDs");
    let wait = kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"], "");
    ok(&wait, "waiting for the CRDs");
}

/// The API server and the operator act in real time: between two polls they get half a second, until
/// `deadline`.
pub(crate) fn real_time(deadline: Duration) -> RealTimePoll {
    RealTimePoll { deadline, interval: Duration::from_millis(500) }
}

/// Polls `check` until it answers, or fails the test at `deadline`.
pub(crate) fn poll<T>(what: &str, deadline: Duration, check: impl FnMut() -> Option<T>) -> T {
    real_time(deadline)
        .try_until_blocking(check)
        .unwrap_or_else(|| panic!("timed out after {deadline:?} waiting for {what}"))
}

/// The namespace the chart is installed in, and the operator's ServiceAccount there.
pub(crate) const CHART_NAMESPACE: &str = "tenon-system";
/// The ServiceAccount the chart creates for release `tenon`.
pub(crate) const SERVICE_ACCOUNT: &str = "tenon";

/// The chart's manifests as `helm template` renders them for release `tenon` in [`CHART_NAMESPACE`]
/// (CRDs included), with no replicas: the tests run the operator as a process, as the ServiceAccount.
pub(crate) fn render_chart() -> String {
    let helm = std::env::var("TENON_HELM").unwrap_or_else(|_| {
        panic!("TENON_HELM is not set: run scripts/test.sh, or export TENON_HELM=$(scripts/check-chart.sh helm)")
    });
    let home = std::env::temp_dir().join(format!("tenon-helm-{}", std::process::id()));
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/tenon");
    let out = Command::new(helm)
        .args(["template", "tenon", chart, "--namespace", CHART_NAMESPACE, "--include-crds", "--set", "replicas=0"])
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("helm runs");
    ok(&out, "helm template")
}

/// Installs the chart's rendered manifests (CRDs, ServiceAccount, ClusterRole, Role, bindings, the
/// Deployment with no replicas, Service, PDB) once per test process, and returns a kubeconfig that
/// authenticates as the chart's ServiceAccount with a token from the TokenRequest API: an operator run
/// with it has exactly the chart's RBAC.
pub(crate) fn install_chart() -> String {
    static KUBECONFIG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    KUBECONFIG
        .get_or_init(|| {
            let namespace = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {CHART_NAMESPACE}}}\n");
            ok(&kubectl(&["apply", "-f", "-"], &namespace), "creating the chart's namespace");
            ok(&kubectl(&["apply", "--server-side", "-f", "-"], &render_chart()), "applying the chart's manifests");
            let wait = kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"], "");
            ok(&wait, "waiting for the CRDs");
            let token = kubectl(&["create", "token", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE, "--duration=4h"], "");
            let token = ok(&token, "requesting the ServiceAccount's token").trim().to_owned();
            let jsonpath = |path: &str| {
                let out = kubectl(&["config", "view", "--raw", "--minify", "-o", &format!("jsonpath={path}")], "");
                ok(&out, "reading the admin kubeconfig")
            };
            let server = jsonpath("{.clusters[0].cluster.server}");
            let ca = jsonpath("{.clusters[0].cluster.certificate-authority-data}");
            let config = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster: {{server: {server:?}, certificate-authority-data: {ca}}}\nusers:\n- name: {SERVICE_ACCOUNT}\n  user: {{token: {token:?}}}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: {SERVICE_ACCOUNT}, namespace: {CHART_NAMESPACE}}}\ncurrent-context: e2e\n"
            );
            let path = std::env::temp_dir().join(format!("tenon-e2e-{}.kubeconfig", std::process::id()));
            std::fs::write(&path, config).expect("writing the ServiceAccount's kubeconfig");
            path.to_string_lossy().into_owned()
        })
        .clone()
}

/// One request of the audit log.
pub(crate) struct Audited {
    pub(crate) verb: String,
    pub(crate) uri: String,
    pub(crate) code: i64,
    /// Whether the authorizer (RBAC) refused it.
    pub(crate) refused: bool,
}

/// The API server's audit log of ServiceAccount requests, read from where it stood when this was made.
pub(crate) struct Audit {
    path: String,
    from: u64,
}

impl Audit {
    /// Marks the log's end now: later checks see only what follows.
    pub(crate) fn start() -> Self {
        let path = std::env::var("TENON_KUBE_AUDIT_LOG").unwrap_or_else(|_| {
            panic!("TENON_KUBE_AUDIT_LOG is not set: start the control plane with scripts/test.sh")
        });
        let from = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        Self { path, from }
    }

    /// The requests of the chart's ServiceAccount since [`Audit::start`].
    pub(crate) fn requests(&self) -> Vec<Audited> {
        use std::io::{Read, Seek, SeekFrom};
        let user = format!("system:serviceaccount:{CHART_NAMESPACE}:{SERVICE_ACCOUNT}");
        let mut file = std::fs::File::open(&self.path).expect("the audit log opens");
        file.seek(SeekFrom::Start(self.from)).expect("seeking the audit log");
        let mut text = String::new();
        file.read_to_string(&mut text).expect("reading the audit log");
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["user"]["username"] == user.as_str() && e["stage"] == "ResponseComplete")
            .map(|e| Audited {
                verb: e["verb"].as_str().unwrap_or_default().to_owned(),
                uri: e["requestURI"].as_str().unwrap_or_default().to_owned(),
                code: e["responseStatus"]["code"].as_i64().unwrap_or_default(),
                refused: e["annotations"]["authorization.k8s.io/decision"] == "forbid",
            })
            .collect()
    }

    /// Fails the test if RBAC refused the ServiceAccount anything since [`Audit::start`], and returns how
    /// many requests it made. (Other 403s are not RBAC's: an eviction in a namespace being deleted, say.)
    pub(crate) fn assert_nothing_forbidden(&self) -> usize {
        let requests = self.requests();
        let forbidden: Vec<String> =
            requests.iter().filter(|r| r.refused).map(|r| format!("{} {} ({})", r.verb, r.uri, r.code)).collect();
        assert!(forbidden.is_empty(), "the chart's RBAC refused the operator:\n{}", forbidden.join("\n"));
        requests.len()
    }
}

/// A client of the cluster the kubeconfig at `path` names. The dependency stack enables rustls with two
/// crypto back-ends; the process picks one, as `tenon run` does.
pub(crate) async fn client_from(path: &str) -> kube::Client {
    use kube::config::{Config, KubeConfigOptions, Kubeconfig};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The condition `type_` of an object's `status.conditions`, as (status, reason, message).
pub(crate) fn condition_of<T: serde::Serialize>(object: &T, type_: &str) -> Option<(String, String, String)> {
    let v = serde_json::to_value(object).ok()?;
    let c = v["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?;
    let field = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    Some((field("status"), field("reason"), field("message")))
}

/// Whether `object` carries `finalizer`.
pub(crate) fn has_finalizer_of(object: &impl kube::ResourceExt, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}
