//! AL2023: `nodeadm` reads every `NodeConfig` part of the user data and merges them.

use serde_json::{Map, Value, json};

use super::mime::{self, Part};
use super::{Options, node_labels_flag};

/// The MIME archive: the user's parts first (a `NodeConfig` or a script given bare becomes one part of
/// that type), then the generated `NodeConfig`.
pub fn user_data(o: &Options<'_>) -> Result<String, String> {
    let mut parts = match o.custom.filter(|c| !c.trim().is_empty()) {
        None => Vec::new(),
        Some(c) if mime::is_archive(c) => mime::parse(c)?,
        Some(c) if serde_yaml_ng::from_str::<serde_yaml_ng::Mapping>(c).is_ok() => {
            vec![Part { content_type: mime::NODE_CONFIG.into(), content: c.to_owned() }]
        }
        Some(c) => vec![Part { content_type: mime::SHELL.into(), content: c.to_owned() }],
    };
    parts.push(Part { content_type: mime::NODE_CONFIG.into(), content: node_config(o)? });
    Ok(mime::serialize(&parts))
}

/// The generated `NodeConfig`, as YAML.
pub fn node_config(o: &Options<'_>) -> Result<String, String> {
    let cidr = o.cluster.service_cidr.as_deref().filter(|c| !c.is_empty()).ok_or(
        "the cluster's service CIDR is not known (set it, or let EKS DescribeCluster report it): nodeadm needs it",
    )?;
    let mut cluster = json!({"name": o.cluster.name, "apiServerEndpoint": o.cluster.endpoint, "cidr": cidr});
    if let Some(ca) = o.cluster.ca_bundle.as_deref().filter(|c| !c.is_empty()) {
        aws_smithy_types::base64::decode(ca).map_err(|e| format!("the cluster CA bundle is not base64: {e}"))?;
        cluster["certificateAuthority"] = json!(ca);
    }
    let mut config: Map<String, Value> = o.kubelet.raw.clone();
    config.insert("registerWithTaints".into(), serde_json::to_value(o.taints).map_err(|e| e.to_string())?);
    let mut kubelet = json!({"config": config});
    if let Some(flag) = node_labels_flag(o.labels) {
        kubelet["flags"] = json!([flag]);
    }
    let mut spec = json!({"cluster": cluster, "kubelet": kubelet});
    if o.raid0 {
        spec["instance"] = json!({"localStorage": {"strategy": "RAID0"}});
    }
    let doc = json!({"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec});
    let yaml = serde_yaml_ng::to_string(&doc).map_err(|e| e.to_string())?;
    Ok(format!("# tenon generated NodeConfig\n{yaml}"))
}
