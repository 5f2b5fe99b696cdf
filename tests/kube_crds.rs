//! Against a real kube-apiserver (`scripts/peers/kube.sh`, started by `scripts/test.sh`): tenon's
//! CustomResourceDefinitions install, Karpenter NodePool manifests apply unchanged and pass the API
//! server's own validation, and an invalid NodePool is refused by the server, naming the field.

mod common;

use common::{install_crds, kubectl as run, ok};

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

/// A GCENodeClass manifest written for the community GCP provider applies unchanged and reads back as
/// the same spec (`x-kubernetes-preserve-unknown-fields` keeps its kubelet configuration whole).
#[cfg(feature = "gcp")]
#[test]
fn a_community_gcenodeclass_applies_unchanged() {
    install_crds();
    let manifest = "apiVersion: karpenter.k8s.gcp/v1alpha1\nkind: GCENodeClass\nmetadata:\n  name: gke-default\nspec:\n  serviceAccount: nodes@prod.iam.gserviceaccount.com\n  imageSelectorTerms:\n    - alias: ContainerOptimizedOS@latest\n  networkTags: [gke-prod-node]\n  disks:\n    - {category: pd-balanced, sizeGiB: 100, boot: true}\n  kubeletConfiguration:\n    maxPods: 64\n    kubeReserved: {cpu: 200m}\n";
    ok(&run(&["apply", "--server-side", "-f", "-"], manifest), "applying the GCENodeClass");
    let got = run(&["get", "gcenodeclass", "gke-default", "-o", "json"], "");
    ok(&got, "reading it back");
    let stored: tenon_providers::gcp::GCENodeClass = serde_json::from_slice(&got.stdout).expect("a GCENodeClass");
    let sent: tenon_providers::gcp::GCENodeClass = serde_yaml_ng::from_str(manifest).expect("the manifest");
    assert_eq!(stored.spec, sent.spec);
    stored.validate().expect("valid");
}
