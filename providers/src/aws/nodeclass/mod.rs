//! `EC2NodeClass` (group `karpenter.k8s.aws`, version `v1`): how the AWS provider launches a node.
//!
//! The spec names the AMIs, subnets and security groups by selector terms; the status holds what those
//! terms resolved to. Dynamic fields (the selector terms) are compared through the status for drift; the
//! static fields (user data, tags, block devices, metadata options, role) are covered by
//! [`EC2NodeClass::static_hash`].

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of `EC2NodeClass`.
pub const GROUP: &str = "karpenter.k8s.aws";
/// The kind.
pub const KIND: &str = "EC2NodeClass";
/// The key of the static hash: tenon tags every instance with it at launch.
pub const HASH_ANNOTATION: &str = "karpenter.k8s.aws/ec2nodeclass-hash";
/// The key of the version of the static hash's recipe, beside the hash.
pub const HASH_VERSION_ANNOTATION: &str = "karpenter.k8s.aws/ec2nodeclass-hash-version";
/// The version of [`EC2NodeClass::static_hash`]'s recipe. An instance tagged with another version is not
/// judged on the hash (the recipe changed, not the class), as Karpenter skips static drift across
/// versions; bump it whenever the recipe changes.
pub const HASH_VERSION: &str = "v1";

/// The desired state of an `EC2NodeClass`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "karpenter.k8s.aws",
    version = "v1",
    kind = "EC2NodeClass",
    plural = "ec2nodeclasses",
    shortname = "ec2nc",
    derive = "PartialEq",
    status = "EC2NodeClassStatus",
    doc = "An EC2NodeClass says how the AWS provider launches instances: AMIs, subnets, security groups, IAM role, user data, block devices, tags and instance metadata options."
)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassSpec {
    /// Which AMIs to boot; the first term that resolves wins per architecture, newest image first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ami_selector_terms: Vec<AmiSelectorTerm>,
    /// Which subnets to launch into (one per zone is used, the one with the most free addresses).
    #[serde(default)]
    pub subnet_selector_terms: Vec<SelectorTerm>,
    /// Which security groups the instances get.
    #[serde(default)]
    pub security_group_selector_terms: Vec<SecurityGroupSelectorTerm>,
    /// The IAM role of the node; its instance profile is named after the role unless `instanceProfile` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// An existing instance profile, instead of `role`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    /// User data passed to the instance as is (base64-encoded by the provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// EBS volumes attached at launch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_device_mappings: Vec<BlockDeviceMapping>,
    /// Extra tags on instances, volumes and launch templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The instance metadata service options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_options: Option<MetadataOptions>,
    /// The AMI family (`AL2023`, `AL2`, `Bottlerocket`, `Custom`): how user data is written. Implied by an
    /// `alias` term; required without one.
    #[serde(default, rename = "amiFamily", skip_serializing_if = "Option::is_none")]
    pub ami_family: Option<String>,
    /// The kubelet's configuration: any field of the upstream `KubeletConfiguration`. The scheduling fields shape each instance type's allocatable; every field
    /// reaches the node's user data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "open_object")]
    pub kubelet: Option<serde_json::Map<String, serde_json::Value>>,
    /// `RAID0`: the instance-store disks become one RAID 0 array for the kubelet, containerd and pod logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_store_policy: Option<String>,
    /// Whether instances get a public IPv4 address (`false` for private subnets that map one by default);
    /// unset leaves it to the subnet.
    #[serde(default, rename = "associatePublicIPAddress", skip_serializing_if = "Option::is_none")]
    pub associate_public_ip_address: Option<bool>,
    /// Whether CloudWatch detailed (1-minute) monitoring is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detailed_monitoring: Option<bool>,
    /// The EC2 Fleet context (a reserved-capacity or partner context id) passed to `CreateFleet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Which capacity reservations (on-demand capacity reservations, capacity blocks for ML) the class
    /// launches into as `reserved` capacity. A dynamic field: not hashed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 30))]
    pub capacity_reservation_selector_terms: Vec<super::reservations::CapacityReservationSelectorTerm>,
}

/// The schema of an open object the API server keeps as written.
fn open_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

impl EC2NodeClassSpec {
    /// The volumes instances get: `blockDeviceMappings`, else the family's defaults as Karpenter's are, an
    /// encrypted gp3 root of `root_gib` (Bottlerocket: a 4 GiB OS volume and a `root_gib` data volume).
    pub fn block_devices(&self, root_gib: i64) -> Vec<BlockDeviceMapping> {
        if !self.block_device_mappings.is_empty() {
            return self.block_device_mappings.clone();
        }
        let volume = |device: &str, gib: i64, root: bool| BlockDeviceMapping {
            device_name: device.to_owned(),
            ebs: Some(Ebs {
                volume_size: Some(format!("{gib}Gi")),
                volume_type: Some("gp3".into()),
                encrypted: Some(true),
                ..Default::default()
            }),
            root_volume: root.then_some(true),
        };
        match self.family() {
            Ok(crate::aws::kubelet::AmiFamily::Bottlerocket) => {
                vec![volume("/dev/xvda", 4, false), volume("/dev/xvdb", root_gib, true)]
            }
            _ => vec![volume("/dev/xvda", root_gib, true)],
        }
    }

    /// The AMI family: `amiFamily`, else the first alias term's, else `Custom`. An unknown name is an
    /// error naming the field.
    pub fn family(&self) -> Result<crate::aws::kubelet::AmiFamily, String> {
        use crate::aws::kubelet::AmiFamily;
        if let Some(f) = &self.ami_family {
            return AmiFamily::parse(f)
                .ok_or_else(|| format!("spec.amiFamily: {f:?} is not AL2023, AL2, Bottlerocket or Custom"));
        }
        for t in &self.ami_selector_terms {
            if let Some(alias) = &t.alias {
                let family = alias.split('@').next().unwrap_or_default();
                return AmiFamily::parse(family)
                    .ok_or_else(|| format!("spec.amiSelectorTerms: alias {alias:?} names no AMI family tenon knows"));
            }
        }
        Ok(AmiFamily::Custom)
    }

    /// `spec.kubelet`, parsed ([`crate::aws::kubelet::Kubelet::parse`]).
    pub fn kubelet(&self) -> Result<crate::aws::kubelet::Kubelet, String> {
        crate::aws::kubelet::Kubelet::parse(self.kubelet.as_ref())
    }

    /// Whether `instanceStorePolicy` is `RAID0`; another value is an error naming the field.
    pub fn raid0(&self) -> Result<bool, String> {
        match self.instance_store_policy.as_deref() {
            None => Ok(false),
            Some("RAID0") => Ok(true),
            Some(other) => Err(format!("spec.instanceStorePolicy: {other:?} is not RAID0")),
        }
    }
}

/// One AMI selector term: exactly one of `alias`, `id`, `name` (with an optional `owner`) or `tags`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AmiSelectorTerm {
    /// An AMI family and version, `al2023@latest`, `al2@v20260101`, `bottlerocket@latest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// An AMI id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// An AMI name, wildcards allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The owner of `name` (an account id, `self` or `amazon`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Tags the AMI must carry (`*` as a value matches any value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The name (or ARN) of an SSM parameter holding the image id.
    #[serde(rename = "ssmParameter", default, skip_serializing_if = "Option::is_none")]
    pub ssm_parameter: Option<String>,
}

/// The owners an AMI term's `DescribeImages` is limited to: its `owner`, and for a `name` term without
/// one, this account and Amazon (`self`, `amazon`), as Karpenter has it, so a name never matches an image
/// a stranger shared publicly.
pub fn image_owners(term: &AmiSelectorTerm) -> Vec<String> {
    match (&term.owner, &term.name) {
        (Some(o), _) => vec![o.clone()],
        (None, Some(_)) => vec!["self".into(), "amazon".into()],
        (None, None) => Vec::new(),
    }
}

/// A subnet selector term: an `id`, or `tags` that must all match.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectorTerm {
    /// A resource id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Tags that must all match (`*` as a value matches any value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// A security group selector term: an `id`, a `name`, or `tags`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupSelectorTerm {
    /// A security group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A security group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tags that must all match (`*` as a value matches any value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// One block device mapping.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockDeviceMapping {
    /// The device name, e.g. `/dev/xvda`.
    pub device_name: String,
    /// The EBS volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebs: Option<Ebs>,
    /// Whether this is the root volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_volume: Option<bool>,
}

/// An EBS volume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ebs {
    /// The size, as a Kubernetes quantity (`100Gi`) or a number of GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_size: Option<String>,
    /// `gp3`, `gp2`, `io2`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<String>,
    /// Provisioned IOPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<i32>,
    /// Provisioned throughput in MiB/s (gp3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<i32>,
    /// Whether the volume is encrypted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<bool>,
    /// The KMS key of an encrypted volume.
    #[serde(default, rename = "kmsKeyID", skip_serializing_if = "Option::is_none")]
    pub kms_key_id: Option<String>,
    /// Whether the volume goes with the instance (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    /// A snapshot to restore.
    #[serde(default, rename = "snapshotID", skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// How fast a volume restored from a snapshot is initialized, in MiB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_initialization_rate: Option<i32>,
}

impl Ebs {
    /// The size in GiB (`100Gi`, `100G` and `100` all read as 100).
    pub fn size_gib(&self) -> Result<Option<i32>, String> {
        let Some(s) = self.volume_size.as_deref() else { return Ok(None) };
        let digits = s.trim_end_matches("Gi").trim_end_matches('G');
        digits.parse::<i32>().map(Some).map_err(|_| format!("volumeSize {s:?} is not a size in GiB (like 100Gi)"))
    }
}

/// Instance metadata service options.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOptions {
    /// `enabled` or `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_endpoint: Option<String>,
    /// `enabled` or `disabled`.
    #[serde(default, rename = "httpProtocolIPv6", skip_serializing_if = "Option::is_none")]
    pub http_protocol_ipv6: Option<String>,
    /// The hop limit of metadata responses (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_put_response_hop_limit: Option<i32>,
    /// `required` (IMDSv2 only) or `optional`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_tokens: Option<String>,
}

/// What the selector terms resolved to.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassStatus {
    /// The subnets, one entry per subnet.
    #[serde(default)]
    pub subnets: Vec<ResolvedSubnet>,
    /// The security groups.
    #[serde(default)]
    pub security_groups: Vec<ResolvedSecurityGroup>,
    /// The AMIs, newest first.
    #[serde(default)]
    pub amis: Vec<ResolvedAmi>,
    /// The instance profile instances are launched with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    /// The capacity reservations the class launches into, by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_reservations: Vec<super::reservations::ResolvedCapacityReservation>,
    /// `SubnetsReady`, `SecurityGroupsReady`, `AMIsReady`, `InstanceProfileReady`,
    /// `CapacityReservationsReady` (with reserved capacity on), and `Ready` over them all, as Karpenter's
    /// AWS provider writes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<tenon_core::api::Condition>,
}

/// The condition types of an `EC2NodeClass` status.
pub mod condition_types {
    /// The subnet selector terms resolved to at least one subnet.
    pub const SUBNETS_READY: &str = "SubnetsReady";
    /// The security group selector terms resolved to at least one group.
    pub const SECURITY_GROUPS_READY: &str = "SecurityGroupsReady";
    /// The AMI selector terms resolved to at least one image.
    pub const AMIS_READY: &str = "AMIsReady";
    /// The class names a role or an instance profile.
    pub const INSTANCE_PROFILE_READY: &str = "InstanceProfileReady";
    /// The capacity reservation selector terms could be read (zero reservations is ready).
    pub const CAPACITY_RESERVATIONS_READY: &str = "CapacityReservationsReady";
    /// Every other condition is true: the class can launch.
    pub const READY: &str = "Ready";
}

/// The finalizer on an `EC2NodeClass`: the class stays until no NodeClaim uses it and its launch
/// templates are deleted.
pub const FINALIZER: &str = "karpenter.k8s.aws/termination";

/// A resolved subnet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedSubnet {
    /// The subnet id.
    pub id: String,
    /// Its availability zone.
    pub zone: String,
    /// Its availability zone id (`use1-az1`), when known.
    #[serde(default, rename = "zoneID", skip_serializing_if = "Option::is_none")]
    pub zone_id: Option<String>,
    /// Free IPv4 addresses when resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_ips: Option<i32>,
}

/// A resolved security group.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedSecurityGroup {
    /// The group id.
    pub id: String,
    /// The group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A resolved AMI.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedAmi {
    /// The image id.
    pub id: String,
    /// The image name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The Kubernetes architecture (`amd64`, `arm64`).
    pub architecture: String,
    /// Whether the image is meant for GPU instances (an alias's `nvidia` variant, or a name with `nvidia`/`gpu`).
    #[serde(default)]
    pub nvidia: bool,
    /// Whether the image is meant for AWS Inferentia and Trainium instances (an alias's `neuron` variant).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub neuron: bool,
    /// When it was created, as EC2 reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_date: Option<String>,
}

impl EC2NodeClass {
    /// The name of the object.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// A hash of the static fields (user data, tags, block devices, metadata options, role, instance
    /// profile): a change in any of them drifts every instance launched from this NodeClass. The selector
    /// terms are left out: their result is compared through the status instead.
    pub fn static_hash(&self) -> String {
        let s = &self.spec;
        let mut fields = serde_json::json!({
            "role": s.role,
            "instanceProfile": s.instance_profile,
            "userData": s.user_data,
            "blockDeviceMappings": s.block_device_mappings,
            "tags": s.tags,
            "metadataOptions": s.metadata_options,
        });
        // Fields added later join the hash only when set, so a class that does not use them keeps the hash
        // its nodes were launched with and nothing drifts on an upgrade.
        for (key, value) in [
            ("amiFamily", serde_json::to_value(&s.ami_family)),
            ("kubelet", serde_json::to_value(&s.kubelet)),
            ("instanceStorePolicy", serde_json::to_value(&s.instance_store_policy)),
            ("associatePublicIPAddress", serde_json::to_value(s.associate_public_ip_address)),
            ("detailedMonitoring", serde_json::to_value(s.detailed_monitoring)),
            ("context", serde_json::to_value(&s.context)),
        ] {
            if let Ok(v) = value
                && !v.is_null()
            {
                fields[key] = v;
            }
        }
        tenon_core::api::stable_hash(&fields)
    }
}

mod validation;
pub use validation::{Alias, parse_alias};
#[cfg(test)]
mod tests;
