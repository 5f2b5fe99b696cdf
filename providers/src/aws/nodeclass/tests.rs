//! `EC2NodeClass` parsing, hashing and validation.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

fn class(yaml: serde_json::Value) -> EC2NodeClass {
    serde_json::from_value(yaml).unwrap()
}

/// A manifest written for Karpenter's AWS provider reads and writes back unchanged: every field name as
/// Karpenter's CRD spells it (`kmsKeyID`, `snapshotID`, `associatePublicIPAddress`, …).
#[test]
fn a_karpenter_manifest_round_trips_unchanged() {
    let manifest = serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
        "spec": {
            "amiFamily": "AL2023",
            "amiSelectorTerms": [{"ssmParameter": "/prod/nodes/ami"}, {"name": "my-ami-*", "owner": "123456789012"}],
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "prod"}}, {"id": "subnet-0abc"}],
            "capacityReservationSelectorTerms": [{"id": "cr-0123456789abcdef0"},
                {"tags": {"karpenter.sh/discovery": "prod"}, "ownerID": "123456789012", "instanceMatchCriteria": "targeted"}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "prod"}}, {"name": "nodes"}],
            "role": "KarpenterNodeRole-prod",
            "userData": "#!/bin/bash\necho hello\n",
            "tags": {"team": "ml"},
            "kubelet": {"maxPods": 110, "kubeReserved": {"cpu": "200m"}, "shutdownGracePeriod": "30s"},
            "blockDeviceMappings": [{
                "deviceName": "/dev/xvda", "rootVolume": true,
                "ebs": {"volumeSize": "100Gi", "volumeType": "gp3", "iops": 3000, "throughput": 125,
                    "encrypted": true, "kmsKeyID": "arn:aws:kms:us-west-2:123456789012:key/abcd",
                    "snapshotID": "snap-0123", "deleteOnTermination": true, "volumeInitializationRate": 100}
            }],
            "instanceStorePolicy": "RAID0",
            "associatePublicIPAddress": false,
            "detailedMonitoring": true,
            "context": "cr-context",
            "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled",
                "httpPutResponseHopLimit": 1, "httpTokens": "required"}
        }
    });
    let parsed: EC2NodeClass = serde_json::from_value(manifest.clone()).unwrap();
    assert_eq!(
        parsed.spec.block_device_mappings[0].ebs.as_ref().unwrap().kms_key_id.as_deref(),
        Some("arn:aws:kms:us-west-2:123456789012:key/abcd")
    );
    assert_eq!(serde_json::to_value(&parsed).unwrap(), manifest);
    parsed.validate().unwrap();
}

#[test]
fn name_terms_without_an_owner_search_this_account_and_amazon_only() {
    let term = |v: serde_json::Value| -> AmiSelectorTerm { serde_json::from_value(v).unwrap() };
    assert_eq!(image_owners(&term(serde_json::json!({"name": "eks-*"}))), ["self", "amazon"]);
    assert_eq!(image_owners(&term(serde_json::json!({"name": "eks-*", "owner": "0123"}))), ["0123"]);
    assert!(image_owners(&term(serde_json::json!({"id": "ami-1"}))).is_empty());
}

#[test]
fn each_family_has_default_volumes() {
    let spec = |family: &str| -> EC2NodeClassSpec {
        serde_json::from_value(serde_json::json!({"amiFamily": family})).unwrap()
    };
    let al2023 = spec("AL2023").block_devices(20);
    assert_eq!(al2023.len(), 1);
    let ebs = al2023[0].ebs.as_ref().unwrap();
    assert_eq!((al2023[0].device_name.as_str(), ebs.volume_size.as_deref()), ("/dev/xvda", Some("20Gi")));
    assert_eq!((ebs.volume_type.as_deref(), ebs.encrypted), (Some("gp3"), Some(true)));
    let br = spec("Bottlerocket").block_devices(20);
    let sizes: Vec<(&str, Option<&str>)> =
        br.iter().map(|b| (b.device_name.as_str(), b.ebs.as_ref().unwrap().volume_size.as_deref())).collect();
    assert_eq!(sizes, [("/dev/xvda", Some("4Gi")), ("/dev/xvdb", Some("20Gi"))]);
    assert_eq!(br[1].root_volume, Some(true), "the data volume holds ephemeral storage");
}

#[test]
fn reads_a_karpenter_manifest_and_hashes_only_static_fields() {
    let nc = class(serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
        "spec": {
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
            "role": "KarpenterNodeRole-demo",
            "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "100Gi", "volumeType": "gp3"}}],
            "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
            "tags": {"team": "ml"}
        }
    }));
    nc.validate().unwrap();
    assert_eq!(nc.spec.block_device_mappings[0].ebs.as_ref().unwrap().size_gib().unwrap(), Some(100));
    let h = nc.static_hash();
    let mut other = nc.clone();
    other.spec.subnet_selector_terms[0].tags.insert("extra".into(), "x".into());
    assert_eq!(other.static_hash(), h, "selector terms are dynamic, not hashed");
    other.spec.user_data = Some("#!/bin/sh".into());
    assert_ne!(other.static_hash(), h);
}

#[test]
fn rejects_ambiguous_terms() {
    let mut nc = class(serde_json::json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "x"},
        "spec": {
            "amiSelectorTerms": [{"alias": "al2023@latest", "id": "ami-1"}],
            "subnetSelectorTerms": [{"id": "subnet-1"}],
            "securityGroupSelectorTerms": [{"id": "sg-1"}],
            "role": "r"
        }
    }));
    assert!(nc.validate().unwrap_err().contains("amiSelectorTerms[0]"));
    nc.spec.ami_selector_terms[0].id = None;
    nc.validate().unwrap();
    nc.spec.instance_profile = Some("p".into());
    assert!(nc.validate().unwrap_err().contains("mutually exclusive"));
    assert!(parse_alias("windows@latest").is_err());
    assert_eq!(parse_alias("al2023").unwrap().version, "latest");
    // Karpenter accepts a name with tags; an alias or an id stands alone.
    nc.spec.instance_profile = None;
    nc.spec.ami_selector_terms[0] =
        serde_json::from_value(serde_json::json!({"name": "eks-*", "tags": {"team": "ml"}})).unwrap();
    nc.validate().unwrap();
    nc.spec.ami_selector_terms[0].id = Some("ami-1".into());
    assert!(nc.validate().unwrap_err().contains("amiSelectorTerms[0]"));
    nc.spec.ami_selector_terms[0].id = None;
    // Tags tenon owns, and bad family or kubelet values, are refused at once, naming the field.
    for (key, field) in [("eks:eks-cluster-name", "spec.tags"), ("kubernetes.io/cluster/prod", "spec.tags")] {
        let mut bad = nc.clone();
        bad.spec.tags.insert(key.into(), "x".into());
        assert!(bad.validate().unwrap_err().contains(field), "{key}");
    }
    let mut bad = nc.clone();
    bad.spec.ami_family = Some("Windows2022".into());
    assert!(bad.validate().unwrap_err().contains("spec.amiFamily"));
    let mut bad = nc.clone();
    bad.spec.kubelet = serde_json::json!({"maxPods": "lots"}).as_object().cloned();
    assert!(bad.validate().unwrap_err().contains("spec.kubelet.maxPods"));
}
