//! User data that joins an instance to the cluster, per AMI family, as Karpenter's AWS provider writes
//! it:
//!
//! - **AL2023**: a `nodeadm` `NodeConfig` (cluster endpoint, CA, service CIDR, the whole `spec.kubelet`
//!   inline, `registerWithTaints`, `--node-labels`) in a MIME multipart archive after the user's own parts
//!   ([`al2023`]);
//! - **AL2**: `/etc/eks/bootstrap.sh` with its flags, after the user's parts ([`al2`]);
//! - **Bottlerocket**: the user's TOML with the cluster and kubelet settings written over it
//!   ([`bottlerocket`]);
//! - **Custom**: the user's data, untouched.
//!
//! Every family registers the node with the claim's taints and `karpenter.sh/unregistered:NoExecute`, and
//! with the claim's labels. The archives are built here (a fixed boundary, so equal inputs give equal
//! templates); the user's own MIME archives are read with `mail-parser`.

pub mod al2;
pub mod al2023;
pub mod bottlerocket;
pub mod mime;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

use super::kubelet::{AmiFamily, Kubelet};

/// What the node needs to know of its cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The cluster's name.
    pub name: String,
    /// The API server's URL.
    pub endpoint: String,
    /// The cluster CA bundle, base64 PEM as EKS reports it.
    pub ca_bundle: Option<String>,
    /// The service CIDR (`10.100.0.0/16`): AL2023's `nodeadm` needs it to derive the cluster DNS address.
    pub service_cidr: Option<String>,
}

/// The inputs of one node's user data.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    /// The cluster.
    pub cluster: &'a ClusterInfo,
    /// `spec.kubelet`.
    pub kubelet: &'a Kubelet,
    /// The labels the node registers with.
    pub labels: &'a BTreeMap<String, String>,
    /// The taints the node registers with (the claim's and its startup taints, and
    /// `karpenter.sh/unregistered:NoExecute`).
    pub taints: &'a [Taint],
    /// The class's own `userData`.
    pub custom: Option<&'a str>,
    /// `instanceStorePolicy: RAID0`: the instance-store disks become one RAID 0 array for ephemeral
    /// storage.
    pub raid0: bool,
}

/// The user data of `family` for `options`, as plain text (the launch template base64-encodes it). An
/// error says which input cannot be used (a user MIME archive that does not parse, TOML that does not).
pub fn user_data(family: AmiFamily, options: &Options<'_>) -> Result<String, String> {
    match family {
        AmiFamily::Al2023 => al2023::user_data(options),
        AmiFamily::Al2 => al2::user_data(options),
        AmiFamily::Bottlerocket => bottlerocket::user_data(options),
        AmiFamily::Custom => Ok(options.custom.unwrap_or_default().to_owned()),
    }
}

pub use crate::kubelet::kubelet_labels;

/// `--node-labels=a=b,c=d`, sorted, or nothing.
fn node_labels_flag(labels: &BTreeMap<String, String>) -> Option<String> {
    let labels = kubelet_labels(labels);
    if labels.is_empty() {
        return None;
    }
    let joined: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Some(format!("--node-labels={}", joined.join(",")))
}

/// A taint as the kubelet's flag writes it: `key=value:Effect`, or `key:Effect`.
fn taint_string(t: &Taint) -> String {
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}={v}:{}", t.key, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    }
}

#[cfg(test)]
mod tests;
