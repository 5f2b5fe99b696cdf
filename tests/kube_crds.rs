//! Against a real kube-apiserver (`scripts/peers/kube.sh`, started by `scripts/test.sh`): tenon's
//! CustomResourceDefinitions install, Karpenter NodePool manifests apply unchanged and pass the API
//! server's own validation, and an invalid NodePool is refused by the server, naming the field.
#![allow(clippy::expect_used)] // test helpers outside #[test] functions expect too

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// The kubectl the peer built, and the admin kubeconfig it wrote.
fn kubectl() -> (String, String) {
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
fn run(args: &[&str], stdin: &str) -> Output {
    let (kubectl, kubeconfig) = kubectl();
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

fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs the CRDs `tenon crds` prints and waits until the server serves them.
fn install_crds() {
    let crds = Command::new(env!("CARGO_BIN_EXE_tenon")).arg("crds").output().expect("tenon crds runs");
    ok(&crds, "tenon crds");
    let yaml = String::from_utf8(crds.stdout).expect("UTF-8");
    ok(&run(&["apply", "--server-side", "-f", "-"], &yaml), "applying the CRDs");
    let wait = run(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/nodepools.karpenter.sh",
            "crd/nodeclaims.karpenter.sh",
        ],
        "",
    );
    ok(&wait, "waiting for the CRDs");
}

#[test]
fn karpenter_nodepool_manifests_apply_unchanged() {
    install_crds();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/core/tests/manifests");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the manifests") {
        let path = entry.expect("a manifest").path();
        let text = std::fs::read_to_string(&path).expect("readable");
        let applied = run(&["apply", "--server-side", "-f", "-", "-o", "name"], &text);
        ok(&applied, &format!("applying {}", path.display()));
        names.push(String::from_utf8_lossy(&applied.stdout).trim().to_owned());
    }
    assert!(names.len() >= 5, "{names:?}");
    // What the server stored reads back as a NodePool tenon parses to the same spec.
    let got = run(&["get", "nodepool", "gpu", "-o", "json"], "");
    ok(&got, "reading the NodePool back");
    let stored: serde_json::Value = serde_json::from_slice(&got.stdout).expect("JSON");
    let yaml = serde_yaml_ng::to_string(&stored).expect("YAML");
    let pool = tenon_core::api::parse_node_pool(&yaml).expect("the stored NodePool parses");
    assert_eq!(pool.spec.weight, Some(10));
    assert_eq!(pool.spec.template.spec.requirements.len(), 5);
}

#[test]
fn the_api_server_refuses_an_invalid_nodepool_naming_the_field() {
    install_crds();
    let manifest = "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata:\n  name: refused\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n      requirements:\n        - key: karpenter.sh/capacity-type\n          operator: In\n          values: [\"spot\"]\n  disruption:\n    consolidationPolicy: WhenEmptyOrUnderutilized\n";
    for (good, bad, field) in [
        (
            "consolidationPolicy: WhenEmptyOrUnderutilized",
            "consolidationPolicy: Sometimes",
            "spec.disruption.consolidationPolicy",
        ),
        ("operator: In", "operator: Maybe", "spec.template.spec.requirements[0].operator"),
    ] {
        assert!(manifest.contains(good), "{good}");
        let broken = manifest.replace(good, bad);
        let out = run(&["apply", "--server-side", "-f", "-"], &broken);
        assert!(!out.status.success(), "the server accepted {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is invalid") && err.contains(field), "{bad}: {err}");
        let get = run(&["get", "nodepool", "refused", "--ignore-not-found", "-o", "name"], "");
        ok(&get, "looking for the refused NodePool");
        assert!(get.stdout.is_empty(), "nothing was stored");
    }
}
