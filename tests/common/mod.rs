//! Helpers the tests against the real control plane (`scripts/peers/kube.sh`) share: kubectl as the
//! admin, the CRDs `tenon crds` prints, and polling the server with a deadline.
#![allow(dead_code, clippy::expect_used)] // each test file uses a part; helpers outside #[test] expect too

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// The one real wait of these tests: the API server and the operator act in real time, so between two
/// polls they get half a second. Every poll loop ends at its deadline.
pub(crate) fn between_polls() {
    std::thread::sleep(Duration::from_millis(500));
}

/// Polls `check` until it answers, or fails the test at `deadline`.
pub(crate) fn poll<T>(what: &str, deadline: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + deadline;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < until, "timed out after {deadline:?} waiting for {what}");
        between_polls();
    }
}
