//! `GCENodeClass` (group `karpenter.k8s.gcp`, version `v1alpha1`): how the GCP provider launches a
//! Compute Engine instance, with the field names of the community Karpenter provider for GCP, so its
//! manifests apply as they are, and what that provider leaves out (OAuth scopes, resource-manager tags, a
//! network of one's own).
//!
//! The spec names the images by selector terms; the status holds what they resolved to. The static fields
//! are covered by [`GCENodeClass::static_hash`], versioned by [`HASH_VERSION`].

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of `GCENodeClass`.
pub const GROUP: &str = "karpenter.k8s.gcp";
/// The kind.
pub const KIND: &str = "GCENodeClass";
/// The key of the static hash.
pub const HASH_ANNOTATION: &str = "karpenter.k8s.gcp/gcenodeclass-hash";
/// The version of the hash's recipe.
pub const HASH_VERSION: &str = "v1";
/// The finalizer on a `GCENodeClass`.
pub const FINALIZER: &str = "karpenter.k8s.gcp/termination";
/// The scope instances get when the class names none: every API the service account's roles allow.
pub const DEFAULT_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// The desired state of a `GCENodeClass`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "karpenter.k8s.gcp",
    version = "v1alpha1",
    kind = "GCENodeClass",
    plural = "gcenodeclasses",
    shortname = "gcenc",
    derive = "PartialEq",
    status = "GCENodeClassStatus",
    doc = "A GCENodeClass says how the GCP provider launches Compute Engine instances: images, network, service account, disks, labels, metadata and shielded-instance options."
)]
#[serde(rename_all = "camelCase")]
pub struct GCENodeClassSpec {
    /// Which images to boot, OR'd: the first term that resolves for an instance type's architecture and
    /// accelerator wins.
    #[serde(default)]
    pub image_selector_terms: Vec<ImageSelectorTerm>,
    /// The image family when no term implies one (`ContainerOptimizedOS`, `Ubuntu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_family: Option<String>,
    /// The service account instances run as (`name@project.iam.gserviceaccount.com`); unset, the
    /// settings' default, else the project's Compute Engine default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// The OAuth scopes of that service account (default: `cloud-platform`, the roles decide).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// The subnetwork's secondary range pod addresses come from (default: the cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet_range_name: Option<String>,
    /// The network and subnetwork of the instances, and extra interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_config: Option<NetworkConfig>,
    /// Network tags (firewall rules select instances by them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_tags: Vec<String>,
    /// Labels on the instances (and their disks).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Resource-manager tags (`tagKeys/123` or `org/key` → `tagValues/456` or the value's short name),
    /// bound to the instances at creation: what IAM conditions and firewall policies select on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_manager_tags: BTreeMap<String, String>,
    /// Instance metadata beside what the bootstrap writes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The disks: one `boot`, local SSDs (`category: local-ssd`), further persistent disks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
    /// Shielded VM options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shielded_instance_config: Option<ShieldedInstanceConfig>,
    /// Confidential computing (`SEV`, `SEV_SNP`, `TDX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidential_instance_type: Option<String>,
    /// GPU nodes register with `nvidia.com/gpu=present:NoSchedule`.
    #[serde(default, rename = "autoGPUTaint", skip_serializing_if = "Option::is_none")]
    pub auto_gpu_taint: Option<bool>,
    /// The GPU driver GKE installs (`default`, `latest`, `disabled`).
    #[serde(default, rename = "gpuDriverVersion", skip_serializing_if = "Option::is_none")]
    pub gpu_driver_version: Option<String>,
    /// The kubelet's configuration (upstream `KubeletConfiguration` field names): `maxPods`,
    /// `podsPerCore`, `kubeReserved`, `systemReserved` and `evictionHard` shape allocatable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub kubelet_configuration: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The schema of an open object the API server keeps as written.
fn open_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// One image selector term: an `alias` (`ContainerOptimizedOS@latest`), an `id` (an image's resource
/// path), or a `family` with a `channel` or a `version`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSelectorTerm {
    /// `family@version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// `projects/<project>/global/images/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `ContainerOptimizedOS`, `Ubuntu2404`, `Ubuntu2204`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    /// A GKE release channel (`rapid`, `regular`, `stable`, `extended`, `cluster`), Container-Optimized OS only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// `latest`, a Container-Optimized OS milestone `N.N.N.N`, or an Ubuntu `vYYYYMMDD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The network of the instances.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// The network (`projects/<p>/global/networks/<n>`; default: the cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The subnetwork (`projects/<p>/regions/<r>/subnetworks/<s>`; default: the cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnetwork: Option<String>,
    /// No external address (default: the cluster's private-nodes setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_private_nodes: Option<bool>,
    /// Further interfaces, at most seven.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_network_interfaces: Vec<NetworkInterface>,
}

/// One extra network interface.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// Its network (default: the cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Its subnetwork.
    pub subnetwork: String,
}

/// One disk.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Size in GiB (at least 10); local SSDs come in 375 GiB units.
    #[serde(rename = "sizeGiB", default, skip_serializing_if = "Option::is_none")]
    pub size_gib: Option<i64>,
    /// `pd-balanced`, `pd-ssd`, `pd-standard`, `pd-extreme`, `hyperdisk-*`, `local-ssd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// The boot disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<bool>,
    /// An image to make a secondary boot disk from (a container image cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_boot_image: Option<String>,
    /// `MODE_UNSPECIFIED` or `CONTAINER_IMAGE_CACHE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_boot_mode: Option<String>,
    /// A customer-managed key (`projects/*/locations/*/keyRings/*/cryptoKeys/*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms_key_name: Option<String>,
    /// The service account that uses the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms_key_service_account: Option<String>,
    /// Provisioned IOPS (pd-extreme, hyperdisk).
    #[serde(rename = "provisionedIOPS", default, skip_serializing_if = "Option::is_none")]
    pub provisioned_iops: Option<i64>,
    /// Provisioned throughput in MiB/s (hyperdisk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned_throughput: Option<i64>,
}

/// Shielded VM options; each unset one is Compute Engine's default.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShieldedInstanceConfig {
    /// Secure boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_secure_boot: Option<bool>,
    /// The virtual TPM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_vtpm: Option<bool>,
    /// Integrity monitoring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_integrity_monitoring: Option<bool>,
}

/// What the class's terms resolved to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GCENodeClassStatus {
    /// The images, each with the instance types it boots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ResolvedImage>,
    /// The network instances get (the class's, the settings', or the cluster's node pool's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The subnetwork instances get, resolved the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnetwork: Option<String>,
    /// `ValidationSucceeded`, `ImagesReady`, `NetworkReady` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<tenon_core::api::Condition>,
}

/// A resolved image.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedImage {
    /// `projects/<p>/global/images/<name>`.
    pub source_image: String,
    /// The instance types it boots, as node selector requirements (architecture, GPU or not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<tenon_core::api::NodeSelectorRequirement>,
}

/// Metadata keys the bootstrap writes: a class may not set them. (`startup-script` and `user-data` carry
/// a bootstrap of one's own, and are checked against the provider's mode at launch.)
pub const RESERVED_METADATA: [&str; 23] = [
    "karpenter-max-pods",
    "karpenter-node-labels",
    "karpenter-node-taints",
    "cluster-location",
    "cluster-name",
    "cluster-uid",
    "configure-sh",
    "containerd-configure-sh",
    "disable-address-manager",
    "enable-os-login",
    "gci-ensure-gke-docker",
    "gci-metrics-enabled",
    "gci-update-strategy",
    "instance-template",
    "install-ssh-psm1",
    "k8s-node-setup-psm1",
    "kube-env",
    "kube-labels",
    "user-profile-psm1",
    "windows-startup-script-ps1",
    "common-psm1",
    "kubeconfig",
    "kubelet-config",
];

/// Label keys the provider sets for ownership: a class may not set them.
pub const RESERVED_LABEL_PREFIXES: [&str; 6] = [
    "goog-k8s-cluster-name",
    "goog-k8s-cluster-location",
    "karpenter-sh-nodepool",
    "karpenter-sh-nodeclaim",
    "karpenter-k8s-gcp-gcenodeclass",
    "kubernetes-io-cluster",
];

impl GCENodeClass {
    /// The name of the object.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// A hash of the static fields (every field but the image terms, which resolve into the status).
    pub fn static_hash(&self) -> String {
        let mut spec = serde_json::to_value(&self.spec).unwrap_or_default();
        if let Some(o) = spec.as_object_mut() {
            o.remove("imageSelectorTerms");
        }
        tenon_core::api::stable_hash(&spec)
    }

    /// Checks what the API server's schema cannot, as the community provider's CRD rules do; the error
    /// names the object and the field.
    pub fn validate(&self) -> Result<(), String> {
        let s = &self.spec;
        let name = self.name();
        let err = |m: String| format!("GCENodeClass/{name}: {m}");
        if s.image_selector_terms.is_empty() || s.image_selector_terms.len() > 30 {
            return Err(err("spec.imageSelectorTerms must have 1 to 30 terms".into()));
        }
        for (i, t) in s.image_selector_terms.iter().enumerate() {
            let field = format!("spec.imageSelectorTerms[{i}]");
            let set = [t.alias.is_some(), t.id.is_some(), t.family.is_some()].iter().filter(|b| **b).count();
            if set != 1 {
                return Err(err(format!("{field} must set exactly one of alias, id, family")));
            }
            if let Some(alias) = &t.alias {
                parse_alias(alias).map_err(|e| err(format!("{field}.alias: {e}")))?;
            }
            if let Some(id) = &t.id {
                let parts: Vec<&str> = id.split('/').collect();
                if !(parts.len() == 5 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "images") {
                    return Err(err(format!("{field}.id: {id:?} is not projects/<project>/global/images/<name>")));
                }
            }
            if let Some(family) = &t.family {
                if !["ContainerOptimizedOS", "Ubuntu2404", "Ubuntu2204"].contains(&family.as_str()) {
                    return Err(err(format!(
                        "{field}.family: {family:?} is not ContainerOptimizedOS, Ubuntu2404 or Ubuntu2204"
                    )));
                }
                if t.channel.is_some() == t.version.is_some() {
                    return Err(err(format!("{field}: a family needs exactly one of channel, version")));
                }
                if let Some(c) = &t.channel {
                    if family != "ContainerOptimizedOS" {
                        return Err(err(format!("{field}.channel: only ContainerOptimizedOS follows a channel")));
                    }
                    if !["rapid", "regular", "stable", "extended", "cluster"].contains(&c.as_str()) {
                        return Err(err(format!(
                            "{field}.channel: {c:?} is not rapid, regular, stable, extended or cluster"
                        )));
                    }
                }
            }
        }
        if let Some(sa) = &s.service_account {
            let ok = sa.split_once('@').is_some_and(|(user, domain)| {
                !user.is_empty()
                    && (domain == "developer.gserviceaccount.com" || domain.ends_with(".iam.gserviceaccount.com"))
            });
            if !ok {
                return Err(err(format!("spec.serviceAccount: {sa:?} is not a service account's email")));
            }
        }
        if s.network_tags.len() > 20 {
            return Err(err("spec.networkTags has more than 20 tags".into()));
        }
        for tag in &s.network_tags {
            let ok = tag.len() <= 63
                && tag.starts_with(|c: char| c.is_ascii_lowercase())
                && tag.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !tag.ends_with('-');
            if !ok {
                return Err(err(format!("spec.networkTags: {tag:?} is not a lower-case RFC 1035 name")));
            }
        }
        for key in s.labels.keys() {
            if key.is_empty() || RESERVED_LABEL_PREFIXES.iter().any(|p| key.starts_with(p)) {
                return Err(err(format!("spec.labels: {key:?} is a label tenon sets itself")));
            }
        }
        for key in s.metadata.keys() {
            if RESERVED_METADATA.contains(&key.as_str()) {
                return Err(err(format!("spec.metadata: {key:?} is written by the node's bootstrap")));
            }
        }
        let boots = s.disks.iter().filter(|d| d.boot == Some(true)).count();
        if boots > 1 || s.disks.len() > 10 {
            return Err(err("spec.disks: at most 10 disks, one of them the boot disk".into()));
        }
        for (i, d) in s.disks.iter().enumerate() {
            if d.size_gib.is_some_and(|g| g < 10) {
                return Err(err(format!("spec.disks[{i}].sizeGiB: at least 10")));
            }
        }
        if let Some(nc) = &s.network_config
            && nc.additional_network_interfaces.len() > 7
        {
            return Err(err("spec.networkConfig.additionalNetworkInterfaces: at most 7".into()));
        }
        if let Some(v) = &s.gpu_driver_version
            && !["default", "latest", "disabled"].contains(&v.as_str())
        {
            return Err(err(format!("spec.gpuDriverVersion: {v:?} is not default, latest or disabled")));
        }
        Ok(())
    }

    /// The boot disk's size in GiB (100, as GKE's default, when the class has none).
    pub fn boot_disk_gib(&self) -> i64 {
        self.spec.disks.iter().find(|d| d.boot == Some(true)).and_then(|d| d.size_gib).unwrap_or(100)
    }

    /// The local SSDs the class attaches, in GiB.
    pub fn local_ssd_gib(&self) -> i64 {
        self.spec
            .disks
            .iter()
            .filter(|d| d.category.as_deref() == Some("local-ssd"))
            .map(|d| d.size_gib.unwrap_or(375))
            .sum()
    }
}

pub use crate::alias::Alias;

/// Parses an image alias: `ContainerOptimizedOS@latest`, `Ubuntu@v20260601`.
pub fn parse_alias(alias: &str) -> Result<Alias, String> {
    crate::alias::parse(alias, &["ContainerOptimizedOS", "Ubuntu"], false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A manifest written for the community provider reads and writes back unchanged.
    #[test]
    fn a_community_manifest_round_trips_unchanged_and_validates() {
        let manifest = serde_json::json!({
            "apiVersion": "karpenter.k8s.gcp/v1alpha1", "kind": "GCENodeClass", "metadata": {"name": "default"},
            "spec": {
                "serviceAccount": "nodes@prod.iam.gserviceaccount.com",
                "imageSelectorTerms": [{"alias": "ContainerOptimizedOS@latest"}],
                "subnetRangeName": "pods",
                "networkConfig": {"enablePrivateNodes": true, "subnetwork": "projects/p/regions/us-central1/subnetworks/nodes",
                    "additionalNetworkInterfaces": [{"subnetwork": "projects/p/regions/us-central1/subnetworks/rdma"}]},
                "networkTags": ["gke-prod-node"],
                "labels": {"team": "ml"},
                "metadata": {"block-project-ssh-keys": "true"},
                "disks": [{"category": "pd-balanced", "sizeGiB": 100, "boot": true},
                          {"category": "local-ssd", "sizeGiB": 375}],
                "shieldedInstanceConfig": {"enableSecureBoot": true, "enableIntegrityMonitoring": true},
                "autoGPUTaint": true,
                "gpuDriverVersion": "latest",
                "kubeletConfiguration": {"maxPods": 64, "kubeReserved": {"cpu": "200m"}}
            }
        });
        let class: GCENodeClass = serde_json::from_value(manifest.clone()).unwrap();
        assert_eq!(serde_json::to_value(&class).unwrap(), manifest);
        class.validate().unwrap();
        assert_eq!((class.boot_disk_gib(), class.local_ssd_gib()), (100, 375));
    }

    #[test]
    fn bad_fields_are_named() {
        let base: GCENodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.gcp/v1alpha1", "kind": "GCENodeClass", "metadata": {"name": "x"},
            "spec": {"imageSelectorTerms": [{"family": "ContainerOptimizedOS", "channel": "stable"}]}
        }))
        .unwrap();
        base.validate().unwrap();
        type Break = fn(&mut GCENodeClassSpec);
        let cases: [(Break, &str); 8] = [
            (|s| s.image_selector_terms.clear(), "spec.imageSelectorTerms"),
            (|s| s.image_selector_terms[0].alias = Some("COS@latest".into()), "exactly one of"),
            (|s| s.image_selector_terms[0].version = Some("latest".into()), "exactly one of channel, version"),
            (
                |s| {
                    s.image_selector_terms[0] =
                        ImageSelectorTerm { id: Some("global/images/x".into()), ..Default::default() }
                },
                ".id",
            ),
            (|s| s.service_account = Some("someone@gmail.com".into()), "spec.serviceAccount"),
            (|s| s.network_tags = vec!["Bad_Tag".into()], "spec.networkTags"),
            (
                |s| {
                    s.labels.insert("goog-k8s-cluster-name".into(), "x".into());
                },
                "spec.labels",
            ),
            (
                |s| {
                    s.metadata.insert("kube-env".into(), "x".into());
                },
                "spec.metadata",
            ),
        ];
        for (break_it, says) in cases {
            let mut c = base.clone();
            break_it(&mut c.spec);
            let e = c.validate().unwrap_err();
            assert!(e.contains("GCENodeClass/x") && e.contains(says), "{says}: {e}");
        }
        assert!(parse_alias("Ubuntu@v20260601").is_ok());
        assert!(parse_alias("Windows@latest").is_err());
    }

    #[test]
    fn the_hash_follows_static_fields_not_image_terms() {
        let mut c = GCENodeClass::new("x", GCENodeClassSpec::default());
        let h = c.static_hash();
        c.spec
            .image_selector_terms
            .push(ImageSelectorTerm { alias: Some("Ubuntu@latest".into()), ..Default::default() });
        assert_eq!(c.static_hash(), h);
        c.spec.network_tags.push("web".into());
        assert_ne!(c.static_hash(), h);
    }
}
