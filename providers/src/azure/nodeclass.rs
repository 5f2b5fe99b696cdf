//! `AKSNodeClass` (group `karpenter.azure.com`, version `v1beta1`): how the Azure provider launches a VM,
//! with karpenter-provider-azure's field names, defaults and validation, so its manifests apply as they
//! are. Beside them, `imageVersion` pins the node image version (unset, the newest published).
//!
//! The static fields (all but `tags`) are covered by [`AKSNodeClass::static_hash`], versioned by
//! [`HASH_VERSION`].

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of `AKSNodeClass`.
pub const GROUP: &str = "karpenter.azure.com";
/// The kind.
pub const KIND: &str = "AKSNodeClass";
/// The key of the static hash.
pub const HASH_ANNOTATION: &str = "karpenter.azure.com/aksnodeclass-hash";
/// The key of the hash's recipe version.
pub const HASH_VERSION_ANNOTATION: &str = "karpenter.azure.com/aksnodeclass-hash-version";
/// The version of the hash's recipe.
pub const HASH_VERSION: &str = "v3";
/// The finalizer on an `AKSNodeClass`.
pub const FINALIZER: &str = "karpenter.azure.com/termination";
/// The OS disk size when the class names none, in GB.
pub const DEFAULT_OS_DISK_GB: i32 = 128;

/// The desired state of an `AKSNodeClass`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "karpenter.azure.com",
    version = "v1beta1",
    kind = "AKSNodeClass",
    plural = "aksnodeclasses",
    shortname = "aksnc",
    derive = "PartialEq",
    status = "AKSNodeClassStatus",
    doc = "An AKSNodeClass says how the Azure provider launches VMs: node image, OS disk, subnet, kubelet, max pods and tags."
)]
#[serde(rename_all = "camelCase")]
pub struct AKSNodeClassSpec {
    /// The subnet the VMs' interfaces join (`/subscriptions/…/virtualNetworks/<vnet>/subnets/<subnet>`);
    /// unset, the settings' `vnet_subnet_id`.
    #[serde(default, rename = "vnetSubnetID", skip_serializing_if = "Option::is_none")]
    pub vnet_subnet_id: Option<String>,
    /// The OS disk's size in GB (30 to 2048; default 128). A size that fits the VM size's cache or
    /// resource disk is an ephemeral OS disk.
    #[serde(default, rename = "osDiskSizeGB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 2048))]
    pub os_disk_size_gb: Option<i32>,
    /// The node image family: `Ubuntu` (the default: Ubuntu 24.04 from Kubernetes 1.34, else 22.04),
    /// `Ubuntu2204`, `Ubuntu2404` or `AzureLinux` (3 from Kubernetes 1.32, else 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["Ubuntu", "Ubuntu2204", "Ubuntu2404", "AzureLinux"]))]
    pub image_family: Option<String>,
    /// The node image version to boot (`202505.27.0`); unset, the newest the gallery has published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_version: Option<String>,
    /// `FIPS` or `Disabled`. FIPS images are in AKS's shared image gallery only, which this provider does
    /// not read: a class asking for FIPS is not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["FIPS", "Disabled"]))]
    pub fips_mode: Option<String>,
    /// Tags on the VMs, their interfaces and disks (not part of the hash: changing them drifts nothing).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The kubelet's configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletConfiguration>,
    /// Pods per node (10 to 250); unset, the network plugin's default (250 for Azure CNI overlay and for
    /// no plugin, 30 for Azure CNI on the node subnet, 110 otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 250))]
    pub max_pods: Option<i32>,
    /// Security options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<Security>,
}

/// The kubelet options AKS lets a node pool set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    /// `none` or `static`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_manager_policy: Option<String>,
    /// Whether CPU limits are enforced with CFS quota.
    #[serde(default, rename = "cpuCFSQuota", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota: Option<bool>,
    /// The CFS quota period (`100ms`).
    #[serde(default, rename = "cpuCFSQuotaPeriod", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota_period: Option<String>,
    /// Disk use above which image garbage collection always runs (0 to 100).
    #[serde(default, rename = "imageGCHighThresholdPercent", skip_serializing_if = "Option::is_none")]
    pub image_gc_high_threshold_percent: Option<i32>,
    /// Disk use below which it never runs (0 to 100, below the high threshold).
    #[serde(default, rename = "imageGCLowThresholdPercent", skip_serializing_if = "Option::is_none")]
    pub image_gc_low_threshold_percent: Option<i32>,
    /// `none`, `best-effort`, `restricted` or `single-numa-node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_manager_policy: Option<String>,
    /// Unsafe sysctls (or patterns) pods may set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The size a container log is rotated at (`50Mi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_log_max_size: Option<String>,
    /// How many rotated logs a container keeps (at least 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_log_max_files: Option<i32>,
    /// The most processes a pod may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_pids_limit: Option<i64>,
    /// Whether the kubelet refuses to start with swap on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_swap_on: Option<bool>,
}

/// Security options of the VMs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Security {
    /// Encrypt the VMs' temporary and cache disks on the host (only sizes that support it are offered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_at_host: Option<bool>,
}

/// What the class resolved to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AKSNodeClassStatus {
    /// The node images, each with the VM sizes it boots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<NodeImage>,
    /// The cluster's Kubernetes version the images were resolved for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// `ValidationSucceeded`, `ImagesReady`, `SubnetsReady` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<tenon_core::api::Condition>,
}

/// A resolved node image.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImage {
    /// `/CommunityGalleries/<gallery>/images/<definition>/versions/<version>`.
    pub id: String,
    /// The VM sizes it boots, as node selector requirements (architecture, Hyper-V generation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<tenon_core::api::NodeSelectorRequirement>,
}

/// The image families.
pub const IMAGE_FAMILIES: [&str; 4] = ["Ubuntu", "Ubuntu2204", "Ubuntu2404", "AzureLinux"];

impl AKSNodeClass {
    /// The class's name.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The hash of the static fields (the spec without `tags`), as the hash annotation records it.
    pub fn static_hash(&self) -> String {
        let mut spec = serde_json::to_value(&self.spec).unwrap_or_default();
        if let Some(o) = spec.as_object_mut() {
            o.remove("tags");
        }
        tenon_core::api::stable_hash(&spec)
    }

    /// The image family, `Ubuntu` when unset.
    pub fn image_family(&self) -> &str {
        self.spec.image_family.as_deref().unwrap_or("Ubuntu")
    }

    /// The OS disk's size in GB.
    pub fn os_disk_gb(&self) -> i64 {
        i64::from(self.spec.os_disk_size_gb.unwrap_or(DEFAULT_OS_DISK_GB))
    }

    /// Checks the CRD's rules (for manifests that did not pass the API server's schema: a snapshot, a
    /// test); the error names the object and the field.
    pub fn validate(&self) -> Result<(), String> {
        let s = &self.spec;
        let err = |m: String| format!("AKSNodeClass/{}: {m}", self.name());
        if let Some(f) = &s.image_family
            && !IMAGE_FAMILIES.contains(&f.as_str())
        {
            return Err(err(format!("spec.imageFamily {f:?} is not one of {}", IMAGE_FAMILIES.join(", "))));
        }
        if let Some(gb) = s.os_disk_size_gb
            && !(30..=2048).contains(&gb)
        {
            return Err(err(format!("spec.osDiskSizeGB {gb} is not between 30 and 2048")));
        }
        if let Some(p) = s.max_pods
            && !(10..=250).contains(&p)
        {
            return Err(err(format!("spec.maxPods {p} is not between 10 and 250")));
        }
        if let Some(m) = &s.fips_mode
            && m != "FIPS"
            && m != "Disabled"
        {
            return Err(err(format!("spec.fipsMode {m:?} is not FIPS or Disabled")));
        }
        if let Some(id) = &s.vnet_subnet_id {
            super::provider::parse_subnet_id(id).map_err(|e| err(format!("spec.vnetSubnetID: {e}")))?;
        }
        if let Some(v) = &s.image_version
            && (v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
        {
            return Err(err(format!("spec.imageVersion {v:?} is not a version (202505.27.0)")));
        }
        for (k, v) in &s.tags {
            if k.len() > 512 || k.contains(['<', '>', '%', '&', '?', '\\']) {
                return Err(err(format!("spec.tags key {k:?} is longer than 512 or has one of <>%&?\\")));
            }
            if v.len() > 256 {
                return Err(err(format!("spec.tags[{k}] is longer than 256")));
            }
        }
        if let Some(k) = &s.kubelet {
            let enumerated = [
                ("cpuManagerPolicy", &k.cpu_manager_policy, &["none", "static"][..]),
                (
                    "topologyManagerPolicy",
                    &k.topology_manager_policy,
                    &["restricted", "best-effort", "none", "single-numa-node"][..],
                ),
            ];
            for (field, value, allowed) in enumerated {
                if let Some(v) = value
                    && !allowed.contains(&v.as_str())
                {
                    return Err(err(format!("spec.kubelet.{field} {v:?} is not one of {}", allowed.join(", "))));
                }
            }
            for (field, v) in [
                ("imageGCHighThresholdPercent", k.image_gc_high_threshold_percent),
                ("imageGCLowThresholdPercent", k.image_gc_low_threshold_percent),
            ] {
                if let Some(v) = v
                    && !(0..=100).contains(&v)
                {
                    return Err(err(format!("spec.kubelet.{field} {v} is not between 0 and 100")));
                }
            }
            if let (Some(high), Some(low)) = (k.image_gc_high_threshold_percent, k.image_gc_low_threshold_percent)
                && high <= low
            {
                return Err(err(
                    "spec.kubelet.imageGCHighThresholdPercent must be above imageGCLowThresholdPercent".into()
                ));
            }
            if let Some(n) = k.container_log_max_files
                && n < 2
            {
                return Err(err(format!("spec.kubelet.containerLogMaxFiles {n} is below 2")));
            }
            if let Some(size) = &k.container_log_max_size {
                let digits = size.trim_end_matches(|c: char| c.is_ascii_alphabetic());
                let unit = &size[digits.len()..];
                let units = ["E", "P", "T", "G", "M", "K", "Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || !units.contains(&unit) {
                    return Err(err(format!("spec.kubelet.containerLogMaxSize {size:?} is not a size (50Mi)")));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn class(spec: serde_json::Value) -> AKSNodeClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.azure.com/v1beta1", "kind": "AKSNodeClass", "metadata": {"name": "default"}, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn a_karpenter_manifest_reads_and_validates() {
        let c = class(serde_json::json!({
            "imageFamily": "AzureLinux", "osDiskSizeGB": 100, "maxPods": 110,
            "vnetSubnetID": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes",
            "kubelet": {"cpuManagerPolicy": "static", "imageGCHighThresholdPercent": 85, "imageGCLowThresholdPercent": 80,
                "containerLogMaxSize": "50Mi", "cpuCFSQuota": true},
            "tags": {"team": "ml"}
        }));
        c.validate().unwrap();
        assert_eq!(c.image_family(), "AzureLinux");
        assert_eq!(c.os_disk_gb(), 100);
        assert_eq!(class(serde_json::json!({})).os_disk_gb(), 128);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (serde_json::json!({"imageFamily": "Windows"}), "spec.imageFamily"),
            (serde_json::json!({"osDiskSizeGB": 10}), "spec.osDiskSizeGB"),
            (serde_json::json!({"maxPods": 500}), "spec.maxPods"),
            (serde_json::json!({"vnetSubnetID": "/subscriptions/s/nope"}), "spec.vnetSubnetID"),
            (
                serde_json::json!({"kubelet": {"imageGCHighThresholdPercent": 50, "imageGCLowThresholdPercent": 60}}),
                "imageGCHighThresholdPercent",
            ),
            (serde_json::json!({"kubelet": {"containerLogMaxSize": "lots"}}), "containerLogMaxSize"),
            (serde_json::json!({"imageVersion": "latest"}), "spec.imageVersion"),
        ];
        for (spec, field) in cases {
            let e = class(spec.clone()).validate().unwrap_err();
            assert!(e.contains("AKSNodeClass/default") && e.contains(field), "{spec}: {e}");
        }
    }

    #[test]
    fn tags_are_not_in_the_hash() {
        let a = class(serde_json::json!({"tags": {"a": "1"}}));
        let b = class(serde_json::json!({"tags": {"a": "2"}}));
        assert_eq!(a.static_hash(), b.static_hash());
        assert_ne!(a.static_hash(), class(serde_json::json!({"osDiskSizeGB": 64})).static_hash());
    }
}
