//! `EC2NodeClass.spec.kubelet`: the kubelet configuration of the class's nodes, and what it does to each
//! instance type's allocatable.
//!
//! As in Karpenter's AWS provider the field is an open map of the upstream `KubeletConfiguration`: every
//! field reaches the node (inline in AL2023's `NodeConfig`; as flags or settings for AL2 and Bottlerocket
//! where the image has one), and the fields scheduling depends on are read here — `maxPods`,
//! `podsPerCore`, `kubeReserved`, `systemReserved`, `evictionHard`, `clusterDNS` — so that the allocatable
//! the scheduler plans with is the one the kubelet will report. [`Kubelet::parse`] rejects a value of the
//! wrong type or a quantity that is not one, naming the field.

use tenon_core::cloud::Overhead;
use tenon_core::resources::{ResourceName, Resources};

use super::catalog::{self, Shape};
use crate::kubelet::apply;
pub use crate::kubelet::{Kubelet, MEMORY_AVAILABLE, NODEFS_AVAILABLE};

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

/// The AMI families, each with its bootstrap and its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AmiFamily {
    /// Amazon Linux 2023: `nodeadm` reads a `NodeConfig`.
    Al2023,
    /// Amazon Linux 2: `/etc/eks/bootstrap.sh`.
    Al2,
    /// Bottlerocket: TOML settings.
    Bottlerocket,
    /// The user's image and user data, untouched.
    Custom,
}

impl AmiFamily {
    /// The family named as Karpenter's `amiFamily` field and aliases name it (`AL2023`, `al2023`, …).
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "al2023" => Some(Self::Al2023),
            "al2" => Some(Self::Al2),
            "bottlerocket" => Some(Self::Bottlerocket),
            "custom" => Some(Self::Custom),
            _ => None,
        }
    }

    /// The name in `amiFamily`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Al2023 => "AL2023",
            Self::Al2 => "AL2",
            Self::Bottlerocket => "Bottlerocket",
            Self::Custom => "Custom",
        }
    }

    /// Whether kube-reserved memory follows the ENI-limited pod count whatever `maxPods` says (the EKS
    /// images' formula; Bottlerocket reserves for the pods it runs).
    fn eni_limited_memory_overhead(self) -> bool {
        !matches!(self, Self::Bottlerocket)
    }

    /// Whether `podsPerCore` is honoured (Bottlerocket has no such setting).
    fn pods_per_core(self) -> bool {
        !matches!(self, Self::Bottlerocket)
    }
}

impl Kubelet {
    /// The pods a node of `shape` runs: `maxPods`, else the ENI-limited count (the VPC CNI's), capped at
    /// `podsPerCore` × vCPUs where the family honours it.
    pub fn pods(&self, shape: &Shape, family: AmiFamily) -> i64 {
        let mut pods = self.max_pods.unwrap_or_else(|| catalog::max_pods(shape.max_enis, shape.ipv4_per_eni));
        if let Some(per_core) = self.pods_per_core.filter(|p| *p > 0 && family.pods_per_core()) {
            pods = pods.min(per_core * shape.vcpu);
        }
        pods
    }

    /// What the kubelet holds back on a node of `shape` with `memory` bytes of memory capacity and
    /// `storage` bytes of ephemeral storage (its root volume, or its RAID 0 instance store), as Karpenter
    /// computes it: the EKS kube-reserved formulas unless `kubeReserved` names a resource,
    /// `systemReserved`, and the hard-eviction thresholds (memory 100Mi and nodefs 10% unless
    /// `evictionHard` says otherwise; `evictionSoft` reserves nothing). Quantities were checked by
    /// [`Kubelet::parse`].
    pub fn overhead(&self, shape: &Shape, family: AmiFamily, storage: i64, memory: i64) -> Overhead {
        let pods = if family.eni_limited_memory_overhead() {
            catalog::max_pods(shape.max_enis, shape.ipv4_per_eni)
        } else {
            self.pods(shape, family)
        };
        let mut kube_reserved = Resources::cpu_memory(
            catalog::kube_reserved_cpu_millis(shape.vcpu),
            catalog::kube_reserved_memory_mib(pods) * MIB,
        )
        .with(ResourceName::EPHEMERAL_STORAGE, GIB);
        apply(&mut kube_reserved, &self.kube_reserved);
        let mut system_reserved = Resources::ZERO;
        apply(&mut system_reserved, &self.system_reserved);
        Overhead { kube_reserved, system_reserved, eviction_threshold: self.eviction_threshold(memory, storage) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn shape() -> Shape {
        Shape::nitro("m5.xlarge", 4, 16384)
    }

    fn parse(v: Value) -> Result<Kubelet, String> {
        Kubelet::parse(v.as_object())
    }

    #[test]
    fn defaults_are_the_eks_formulas() {
        let k = parse(json!({})).unwrap();
        assert_eq!(k.pods(&shape(), AmiFamily::Al2023), 58);
        let o = k.overhead(&shape(), AmiFamily::Al2023, 20 * GIB, 16384 * MIB);
        assert_eq!(o.kube_reserved, Resources::cpu_memory(80, 893 * MIB).with(ResourceName::EPHEMERAL_STORAGE, GIB));
        assert_eq!(o.eviction_threshold.get(ResourceName::MEMORY), 100 * MIB);
        assert_eq!(o.eviction_threshold.get(ResourceName::EPHEMERAL_STORAGE), 2 * GIB);
    }

    #[test]
    fn kubelet_settings_change_pods_reservations_and_eviction() {
        let k = parse(json!({"maxPods": 110, "podsPerCore": 10, "kubeReserved": {"cpu": "200m"},
            "systemReserved": {"memory": "1Gi"}, "evictionHard": {"memory.available": "5%", "nodefs.available": "2Gi"}}))
        .unwrap();
        assert_eq!(k.pods(&shape(), AmiFamily::Al2023), 40, "podsPerCore caps maxPods");
        assert_eq!(k.pods(&shape(), AmiFamily::Bottlerocket), 110, "Bottlerocket has no podsPerCore");
        let o = k.overhead(&shape(), AmiFamily::Al2023, 20 * GIB, 16384 * MIB);
        assert_eq!(o.kube_reserved.get(ResourceName::CPU), 200);
        assert_eq!(o.kube_reserved.get(ResourceName::MEMORY), 893 * MIB, "AL2023 reserves for the ENI-limited pods");
        assert_eq!(o.system_reserved.get(ResourceName::MEMORY), GIB);
        assert_eq!(o.eviction_threshold.get(ResourceName::MEMORY), 858_993_460, "5% of 16Gi, rounded up");
        assert_eq!(o.eviction_threshold.get(ResourceName::EPHEMERAL_STORAGE), 2 * GIB);
        let bottlerocket = k.overhead(&shape(), AmiFamily::Bottlerocket, 20 * GIB, 16384 * MIB);
        assert_eq!(bottlerocket.kube_reserved.get(ResourceName::MEMORY), (11 * 110 + 255) * MIB);
    }

    #[test]
    fn bad_values_name_the_field() {
        for (v, field) in [
            (json!({"maxPods": "many"}), "spec.kubelet.maxPods"),
            (json!({"maxPods": -1}), "spec.kubelet.maxPods"),
            (json!({"kubeReserved": {"cpu": "lots"}}), "spec.kubelet.kubeReserved.cpu"),
            (json!({"evictionHard": {"memory.available": "120%"}}), "spec.kubelet.evictionHard.memory.available"),
            (json!({"clusterDNS": ["10.100.0.10", "dns"]}), "spec.kubelet.clusterDNS[1]"),
            (json!({"cpuCFSQuota": "yes"}), "spec.kubelet.cpuCFSQuota"),
            (
                json!({"imageGCHighThresholdPercent": 50, "imageGCLowThresholdPercent": 80}),
                "spec.kubelet.imageGCLowThresholdPercent",
            ),
        ] {
            let err = parse(v.clone()).unwrap_err();
            assert!(err.starts_with(field), "{v}: {err}");
        }
    }
}
