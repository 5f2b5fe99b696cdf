//! Compute Engine machine types as tenon instance types: capacity, GKE's reservations, and the labels the
//! community Karpenter provider for GCP defines (`karpenter.k8s.gcp/*`) beside GKE's own.
//!
//! GKE holds back, as its node-sizing documentation gives it:
//! - CPU: 6% of the first core, 1% of the second, 0.5% of the third and fourth, 0.25% of the rest (the
//!   shared-core `e2-micro`, `e2-small` and `e2-medium`: 1060m), plus 100m of system reserve (kube-proxy);
//! - memory: 255 MiB on machines of 1 GiB or less; else 25% of the first 4 GiB, 20% of the next 4, 10% of
//!   the next 8, 6% of the next 112 and 2% of the rest;
//! - ephemeral storage: 50, 75 or 100 GiB with one, two or more local SSDs as the kubelet's disk; else the
//!   least of half the boot disk, 35% of it plus 6 GiB, and 100 GiB;
//! - a hard-eviction threshold of 100 MiB of memory and 10% of the ephemeral storage.
//!
//! `kubeletConfiguration` replaces any of these as the kubelet will: `kubeReserved` per resource,
//! `systemReserved` on top, `evictionHard`'s `memory.available` and `nodefs.available`, and the pods
//! (`maxPods`, default 110, capped at `podsPerCore` × vCPUs).

use std::collections::BTreeMap;

use tenon_core::api::labels;
use tenon_core::cloud::{InstanceType, Offering, Overhead};
use tenon_core::resources::{ResourceName, Resources};

use crate::kubelet::{Kubelet, apply, kube_reserved_cpu_millis};

/// Label: vCPUs.
pub const LABEL_INSTANCE_CPU: &str = "karpenter.k8s.gcp/instance-cpu";
/// Label: memory in MiB.
pub const LABEL_INSTANCE_MEMORY: &str = "karpenter.k8s.gcp/instance-memory";
/// Label: the machine family (`n2`, `a3`).
pub const LABEL_INSTANCE_FAMILY: &str = "karpenter.k8s.gcp/instance-family";
/// Label: the machine shape (`standard`, `highmem`, `highgpu`).
pub const LABEL_INSTANCE_SHAPE: &str = "karpenter.k8s.gcp/instance-shape";
/// Label: the size (`8`, `8g`, `medium`).
pub const LABEL_INSTANCE_SIZE: &str = "karpenter.k8s.gcp/instance-size";
/// Label: the family's generation (`2` of `n2d`).
pub const LABEL_INSTANCE_GENERATION: &str = "karpenter.k8s.gcp/instance-generation";
/// Label: the GPU model, as Compute Engine names its accelerator type (`nvidia-h100-80gb`).
pub const LABEL_GPU_NAME: &str = "karpenter.k8s.gcp/instance-gpu-name";
/// Label: the GPUs' maker (`nvidia`).
pub const LABEL_GPU_MANUFACTURER: &str = "karpenter.k8s.gcp/instance-gpu-manufacturer";
/// Label: the number of GPUs.
pub const LABEL_GPU_COUNT: &str = "karpenter.k8s.gcp/instance-gpu-count";
/// Label: GKE's accelerator label (the accelerator type).
pub const LABEL_GKE_ACCELERATOR: &str = "cloud.google.com/gke-accelerator";
/// Label: GKE's accelerator count label.
pub const LABEL_GKE_ACCELERATOR_COUNT: &str = "cloud.google.com/gke-accelerator-count";
/// Label: GKE's machine-family label.
pub const LABEL_MACHINE_FAMILY: &str = "cloud.google.com/machine-family";

/// Every label key this provider sets, announced as well known.
pub const WELL_KNOWN_LABELS: [&str; 12] = [
    LABEL_INSTANCE_CPU,
    LABEL_INSTANCE_MEMORY,
    LABEL_INSTANCE_FAMILY,
    LABEL_INSTANCE_SHAPE,
    LABEL_INSTANCE_SIZE,
    LABEL_INSTANCE_GENERATION,
    LABEL_GPU_NAME,
    LABEL_GPU_MANUFACTURER,
    LABEL_GPU_COUNT,
    LABEL_GKE_ACCELERATOR,
    LABEL_GKE_ACCELERATOR_COUNT,
    LABEL_MACHINE_FAMILY,
];

/// The pods a GKE node runs unless `maxPods` says otherwise.
pub const DEFAULT_MAX_PODS: i64 = 110;
/// The size of one local SSD partition in GiB.
pub const LOCAL_SSD_GIB: i64 = 375;

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

/// A machine type as `machineTypes.aggregatedList` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MachineShape {
    /// The name (`a3-highgpu-8g`).
    pub name: String,
    /// `guestCpus`.
    pub vcpu: i64,
    /// `memoryMb` (MiB).
    pub memory_mib: i64,
    /// `architecture` is `ARM64`.
    pub arm64: bool,
    /// `isSharedCpu`.
    pub shared_cpu: bool,
    /// The GPUs it comes with: each entry of `accelerators[]`, its `guestAcceleratorType` and
    /// `guestAcceleratorCount` (counted, not just listed).
    pub accelerators: Vec<(String, i64)>,
    /// `bundledLocalSsds.partitionCount`: local SSDs every instance of the type has.
    pub local_ssd_partitions: i64,
}

impl MachineShape {
    /// The GPUs over every accelerator entry.
    pub fn gpu_count(&self) -> i64 {
        self.accelerators.iter().map(|(_, n)| n).sum()
    }
}

/// A GPU Compute Engine attaches to N1 machines through `guestAccelerators`: the counts it comes in and,
/// for each count, the most vCPUs and memory (GiB) the machine may have, as Compute Engine's GPU
/// documentation lists them (cloud.google.com/compute/docs/gpus, "N1 machine series").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attachable {
    /// The accelerator type (`nvidia-tesla-t4`).
    pub model: &'static str,
    /// (GPUs, most vCPUs, most GiB of memory).
    pub counts: &'static [(i64, i64, i64)],
}

/// The GPUs N1 machines can have attached.
pub const ATTACHABLE: [Attachable; 4] = [
    Attachable { model: "nvidia-tesla-t4", counts: &[(1, 48, 312), (2, 48, 312), (4, 96, 624)] },
    Attachable { model: "nvidia-tesla-v100", counts: &[(1, 12, 78), (2, 24, 156), (4, 48, 312), (8, 96, 624)] },
    Attachable { model: "nvidia-tesla-p100", counts: &[(1, 16, 104), (2, 32, 208), (4, 64, 208)] },
    Attachable { model: "nvidia-tesla-p4", counts: &[(1, 24, 156), (2, 48, 312), (4, 96, 624)] },
];

/// The instance type of machine type `machine` with `count` GPUs of `model` attached:
/// `n1-standard-16.4xnvidia-tesla-t4`. Machine type names never hold a `.`, so the name reads back
/// unambiguously ([`split_attached`]) and is a valid label value.
pub fn attached_name(machine: &str, count: i64, model: &str) -> String {
    format!("{machine}.{count}x{model}")
}

/// An instance type's machine type, and the GPUs attached to it if any (`n1-standard-16.4xnvidia-tesla-t4`
/// → `n1-standard-16`, 4 × `nvidia-tesla-t4`).
pub fn split_attached(name: &str) -> (&str, Option<(i64, &str)>) {
    let Some((machine, gpus)) = name.split_once('.') else { return (name, None) };
    match gpus.split_once('x').and_then(|(n, model)| Some((n.parse::<i64>().ok()?, model))) {
        Some((n, model)) if n > 0 && !model.is_empty() => (machine, Some((n, model))),
        _ => (name, None),
    }
}

/// The shapes of `base` with each allowed count of `gpu` (up to `max_cards`, the accelerator type's
/// `maximumCardsPerInstance`) attached: none unless `base` is an N1 standard, high-memory or high-CPU
/// machine within the count's vCPU and memory limits.
pub fn attached_shapes(base: &MachineShape, gpu: &Attachable, max_cards: i64) -> Vec<MachineShape> {
    let (family, shape, _, _) = name_parts(&base.name);
    if family != "n1" || base.shared_cpu || !matches!(shape.as_str(), "standard" | "highmem" | "highcpu") {
        return Vec::new();
    }
    gpu.counts
        .iter()
        .filter(|(n, cpus, gib)| *n <= max_cards && base.vcpu <= *cpus && base.memory_mib <= gib * 1024)
        .map(|(n, _, _)| MachineShape {
            name: attached_name(&base.name, *n, gpu.model),
            accelerators: vec![(gpu.model.to_owned(), *n)],
            ..base.clone()
        })
        .collect()
}

/// What of a `GCENodeClass` shapes an instance type: its disks and its kubelet configuration.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeShape {
    /// The boot disk in GiB.
    pub boot_disk_gib: i64,
    /// Local SSDs the class attaches, in GiB (a type's bundled ones count otherwise).
    pub local_ssd_gib: i64,
    /// `kubeletConfiguration`, parsed.
    pub kubelet: Kubelet,
    /// The share of memory the hypervisor keeps (`vm_memory_overhead`).
    pub vm_memory_overhead: f64,
}

/// The parts of a machine type's name: family, shape and size (`a3-highgpu-8g` → `a3`, `highgpu`, `8g`;
/// `c4-standard-8-lssd` → `c4`, `standard`, `8`), and the family's generation.
pub fn name_parts(name: &str) -> (String, String, String, String) {
    let parts: Vec<&str> = name.split('-').collect();
    let family = parts.first().copied().unwrap_or_default().to_owned();
    let shape = parts.get(1).copied().unwrap_or_default().to_owned();
    let size = match parts.len() {
        0..=2 => parts.last().copied().unwrap_or_default(),
        3 => parts[2],
        n => parts[n - 2],
    }
    .to_owned();
    let generation = family.chars().find(char::is_ascii_digit).map(String::from).unwrap_or_default();
    (family, shape, size, generation)
}

/// GKE's kube-reserved memory in MiB for a machine of `memory_mib`.
pub fn gke_reserved_memory_mib(memory_mib: i64) -> i64 {
    if memory_mib <= 1024 {
        return 255;
    }
    let tiers: [(f64, f64); 5] = [(4.0, 0.25), (4.0, 0.20), (8.0, 0.10), (112.0, 0.06), (f64::INFINITY, 0.02)];
    let mut left = memory_mib as f64 / 1024.0;
    let mut total = 0.0;
    for (size, share) in tiers {
        let take = left.min(size);
        total += take * share;
        left -= take;
        if left <= 0.0 {
            break;
        }
    }
    (total * 1024.0) as i64
}

/// GKE's kube-reserved CPU in millicores: the tiered formula, or 1060m on a shared-core machine.
pub fn gke_reserved_cpu_millis(shape: &MachineShape) -> i64 {
    if shape.shared_cpu { 1060 } else { kube_reserved_cpu_millis(shape.vcpu) }
}

/// GKE's kube-reserved ephemeral storage in bytes: by the local SSDs the kubelet's disk is made of, else
/// by the boot disk.
pub fn gke_reserved_storage(local_ssds: i64, boot_gib: i64) -> i64 {
    match local_ssds {
        0 => {
            let boot = boot_gib * GIB;
            (boot / 2).min(boot * 35 / 100 + 6 * GIB).min(100 * GIB)
        }
        1 => 50 * GIB,
        2 => 75 * GIB,
        _ => 100 * GIB,
    }
}

/// The pods a node of `shape` runs.
pub fn pods(shape: &MachineShape, kubelet: &Kubelet) -> i64 {
    let mut pods = kubelet.max_pods.unwrap_or(DEFAULT_MAX_PODS);
    if let Some(per_core) = kubelet.pods_per_core.filter(|p| *p > 0) {
        pods = pods.min(per_core * shape.vcpu);
    }
    pods
}

/// Capacity, overhead and labels of `shape` on a node shaped by `node`, offered as `offerings`.
pub fn instance_type(shape: &MachineShape, node: &NodeShape, offerings: Vec<Offering>) -> InstanceType {
    let memory_mib =
        shape.memory_mib - (shape.memory_mib as f64 * node.vm_memory_overhead.clamp(0.0, 1.0)).ceil() as i64;
    let ssd_gib = if node.local_ssd_gib > 0 { node.local_ssd_gib } else { shape.local_ssd_partitions * LOCAL_SSD_GIB };
    let ssds = if ssd_gib > 0 { (ssd_gib + LOCAL_SSD_GIB - 1) / LOCAL_SSD_GIB } else { 0 };
    let storage = if ssd_gib > 0 { ssd_gib * GIB } else { node.boot_disk_gib * GIB };
    let mut capacity = Resources::cpu_memory(shape.vcpu * 1000, memory_mib * MIB)
        .with(ResourceName::PODS, pods(shape, &node.kubelet))
        .with(ResourceName::EPHEMERAL_STORAGE, storage);
    let gpus = shape.gpu_count();
    if gpus > 0 {
        capacity.set(ResourceName::NVIDIA_GPU, gpus);
    }
    let k = &node.kubelet;
    let mut kube_reserved =
        Resources::cpu_memory(gke_reserved_cpu_millis(shape), gke_reserved_memory_mib(shape.memory_mib) * MIB)
            .with(ResourceName::EPHEMERAL_STORAGE, gke_reserved_storage(ssds, node.boot_disk_gib));
    apply(&mut kube_reserved, &k.kube_reserved);
    let mut system_reserved = Resources::cpu_memory(100, 0);
    let mut extra = Resources::ZERO;
    apply(&mut extra, &k.system_reserved);
    system_reserved.add_assign(&extra);
    let eviction = k.eviction_threshold(memory_mib * MIB, storage);
    InstanceType {
        name: shape.name.clone(),
        labels: shape_labels(shape),
        capacity,
        overhead: Overhead { kube_reserved, system_reserved, eviction_threshold: eviction },
        offerings,
    }
}

/// The labels every instance of `shape` carries.
pub fn shape_labels(shape: &MachineShape) -> BTreeMap<String, String> {
    let (family, machine_shape, size, generation) = name_parts(split_attached(&shape.name).0);
    let mut l = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        l.insert(k.to_owned(), v);
    };
    put(labels::OS, "linux".into());
    put(labels::ARCH, if shape.arm64 { "arm64" } else { "amd64" }.into());
    put(LABEL_INSTANCE_CPU, shape.vcpu.to_string());
    put(LABEL_INSTANCE_MEMORY, shape.memory_mib.to_string());
    put(LABEL_INSTANCE_SHAPE, machine_shape);
    put(LABEL_INSTANCE_SIZE, size);
    if !generation.is_empty() {
        put(LABEL_INSTANCE_GENERATION, generation);
    }
    put(LABEL_MACHINE_FAMILY, family.clone());
    put(LABEL_INSTANCE_FAMILY, family);
    if let Some((model, _)) = shape.accelerators.first() {
        let count = shape.gpu_count().to_string();
        put(LABEL_GPU_NAME, model.clone());
        put(LABEL_GKE_ACCELERATOR, model.clone());
        put(LABEL_GPU_MANUFACTURER, model.split('-').next().unwrap_or_default().to_owned());
        put(LABEL_GPU_COUNT, count.clone());
        put(LABEL_GKE_ACCELERATOR_COUNT, count);
    }
    l
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// N1 machines take T4s in ones, twos and fours within each count's vCPU and memory limits; other
    /// families take none; the names read back.
    #[test]
    fn n1_machines_take_attachable_gpus_within_their_limits() {
        let n1 = |name: &str, vcpu: i64, gib: i64| MachineShape {
            name: name.into(),
            vcpu,
            memory_mib: gib * 1024,
            ..Default::default()
        };
        let t4 = ATTACHABLE[0];
        let names = |v: Vec<MachineShape>| v.into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(
            names(attached_shapes(&n1("n1-standard-16", 16, 60), &t4, 4)),
            [
                "n1-standard-16.1xnvidia-tesla-t4",
                "n1-standard-16.2xnvidia-tesla-t4",
                "n1-standard-16.4xnvidia-tesla-t4"
            ]
        );
        assert_eq!(
            names(attached_shapes(&n1("n1-standard-64", 64, 240), &t4, 4)),
            ["n1-standard-64.4xnvidia-tesla-t4"]
        );
        assert_eq!(names(attached_shapes(&n1("n1-standard-16", 16, 60), &t4, 2)).len(), 2, "the zone's card limit");
        let v100 = ATTACHABLE[1];
        assert_eq!(
            names(attached_shapes(&n1("n1-highmem-16", 16, 104), &v100, 8)),
            [
                "n1-highmem-16.2xnvidia-tesla-v100",
                "n1-highmem-16.4xnvidia-tesla-v100",
                "n1-highmem-16.8xnvidia-tesla-v100"
            ]
        );
        assert!(attached_shapes(&n1("n2-standard-16", 16, 64), &t4, 4).is_empty());
        assert!(attached_shapes(&n1("n1-ultramem-40", 40, 961), &t4, 4).is_empty());
        let four = attached_shapes(&n1("n1-standard-16", 16, 60), &t4, 4).pop().unwrap();
        assert_eq!(split_attached(&four.name), ("n1-standard-16", Some((4, "nvidia-tesla-t4"))));
        assert_eq!(split_attached("n1-standard-16"), ("n1-standard-16", None));
        let it = instance_type(&four, &node(), Vec::new());
        assert_eq!(it.capacity.get(ResourceName::NVIDIA_GPU), 4);
        let l = &it.labels;
        assert_eq!(l.get(LABEL_GKE_ACCELERATOR).map(String::as_str), Some("nvidia-tesla-t4"));
        assert_eq!(l.get(LABEL_GPU_COUNT).map(String::as_str), Some("4"));
        assert_eq!(l.get(LABEL_MACHINE_FAMILY).map(String::as_str), Some("n1"));
        assert_eq!(l.get(LABEL_INSTANCE_SIZE).map(String::as_str), Some("16"));
        assert_eq!(l.get(LABEL_INSTANCE_SHAPE).map(String::as_str), Some("standard"));
    }

    fn node() -> NodeShape {
        NodeShape { boot_disk_gib: 100, local_ssd_gib: 0, kubelet: Kubelet::default(), vm_memory_overhead: 0.0 }
    }

    /// a3-highgpu-8g, g2-standard-24 and a2-highgpu-8g as machineTypes.aggregatedList lists them: their
    /// GPUs are counted from `guestAcceleratorCount`, not from the number of accelerator entries.
    #[test]
    fn gpus_are_counted_from_the_accelerators_of_the_machine_type() {
        let shape = |name: &str, vcpu, memory_mib, model: &str, count| MachineShape {
            name: name.into(),
            vcpu,
            memory_mib,
            accelerators: vec![(model.into(), count)],
            ..Default::default()
        };
        for (s, gpus) in [
            (shape("a3-highgpu-8g", 208, 1_916_928, "nvidia-h100-80gb", 8), 8),
            (shape("g2-standard-24", 24, 98_304, "nvidia-l4", 2), 2),
            (shape("a2-highgpu-8g", 96, 696_320, "nvidia-tesla-a100", 8), 8),
        ] {
            let it = instance_type(&s, &node(), Vec::new());
            assert_eq!(it.capacity.get(ResourceName::NVIDIA_GPU), gpus, "{}", s.name);
            assert_eq!(it.labels[LABEL_GPU_COUNT], gpus.to_string());
            assert_eq!(it.labels[LABEL_GKE_ACCELERATOR], s.accelerators[0].0);
            assert_eq!(it.labels[LABEL_GPU_MANUFACTURER], "nvidia");
        }
        let plain = instance_type(
            &MachineShape { name: "n2-standard-8".into(), vcpu: 8, memory_mib: 32_768, ..Default::default() },
            &node(),
            Vec::new(),
        );
        assert!(!plain.labels.contains_key(LABEL_GPU_COUNT));
        assert_eq!(plain.capacity.get(ResourceName::NVIDIA_GPU), 0);
    }

    /// GKE's published reservations: an e2-standard-4 (4 vCPU, 16 GiB) holds back 80m and 2662 MiB (the
    /// figures of the bundled gcp-us-central1 catalog), plus 100m of system reserve; shared-core machines
    /// 1060m.
    #[test]
    fn reservations_follow_gke_node_sizing() {
        let e2 = MachineShape { name: "e2-standard-4".into(), vcpu: 4, memory_mib: 16_384, ..Default::default() };
        let it = instance_type(&e2, &node(), Vec::new());
        assert_eq!(it.overhead.kube_reserved.get(ResourceName::CPU), 80);
        assert_eq!(it.overhead.kube_reserved.get(ResourceName::MEMORY), 2662 * MIB);
        assert_eq!(it.overhead.system_reserved.get(ResourceName::CPU), 100);
        assert_eq!(it.overhead.eviction_threshold.get(ResourceName::MEMORY), 100 * MIB);
        assert_eq!(it.capacity.get(ResourceName::PODS), 110);
        // 100 GiB boot: min(50, 41, 100) GiB reserved, 10 GiB eviction.
        assert_eq!(it.overhead.kube_reserved.get(ResourceName::EPHEMERAL_STORAGE), 41 * GIB);
        assert_eq!(gke_reserved_memory_mib(1024), 255);
        assert_eq!(gke_reserved_memory_mib(8 * 1024), 1024 + 819);
        let micro =
            MachineShape { name: "e2-micro".into(), vcpu: 2, memory_mib: 1024, shared_cpu: true, ..Default::default() };
        assert_eq!(gke_reserved_cpu_millis(&micro), 1060);
        // Local SSDs as the kubelet's disk: 2 × 375 GiB, 75 GiB reserved.
        let lssd = MachineShape {
            name: "c3-standard-8-lssd".into(),
            vcpu: 8,
            memory_mib: 32_768,
            local_ssd_partitions: 2,
            ..Default::default()
        };
        let it = instance_type(&lssd, &node(), Vec::new());
        assert_eq!(it.capacity.get(ResourceName::EPHEMERAL_STORAGE), 750 * GIB);
        assert_eq!(it.overhead.kube_reserved.get(ResourceName::EPHEMERAL_STORAGE), 75 * GIB);
    }

    #[test]
    fn the_kubelet_configuration_shapes_allocatable() {
        let raw = serde_json::json!({"maxPods": 64, "podsPerCore": 4, "kubeReserved": {"cpu": "500m"},
            "systemReserved": {"memory": "1Gi"}, "evictionHard": {"memory.available": "5%"}});
        let mut n = node();
        n.kubelet = Kubelet::parse_at(raw.as_object(), "spec.kubeletConfiguration").unwrap();
        let s = MachineShape { name: "n2-standard-8".into(), vcpu: 8, memory_mib: 32_768, ..Default::default() };
        let it = instance_type(&s, &n, Vec::new());
        assert_eq!(it.capacity.get(ResourceName::PODS), 32, "podsPerCore 4 × 8 vCPUs under maxPods 64");
        assert_eq!(it.overhead.kube_reserved.get(ResourceName::CPU), 500);
        assert_eq!(it.overhead.system_reserved.get(ResourceName::MEMORY), GIB);
        assert_eq!(
            it.overhead.eviction_threshold.get(ResourceName::MEMORY),
            (32_768 * MIB + 19) / 20,
            "5%, rounded up"
        );
        let bad = serde_json::json!({"maxPods": "many"});
        let e = Kubelet::parse_at(bad.as_object(), "spec.kubeletConfiguration").unwrap_err();
        assert!(e.contains("spec.kubeletConfiguration.maxPods"), "{e}");
    }

    #[test]
    fn names_split_into_family_shape_size_and_generation() {
        let p = |n: &str| {
            let (f, s, z, g) = name_parts(n);
            (f, s, z, g)
        };
        assert_eq!(p("a3-highgpu-8g"), ("a3".into(), "highgpu".into(), "8g".into(), "3".into()));
        assert_eq!(p("e2-medium"), ("e2".into(), "medium".into(), "medium".into(), "2".into()));
        assert_eq!(p("c4-standard-8-lssd"), ("c4".into(), "standard".into(), "8".into(), "4".into()));
        assert_eq!(p("n2d-highmem-16"), ("n2d".into(), "highmem".into(), "16".into(), "2".into()));
    }
}
