//! EC2 instance shapes as tenon instance types: capacity, the EKS overhead formulas, well-known labels,
//! and the bundled on-demand price table.

use std::collections::{BTreeMap, HashMap};

use tenon_core::api::labels;
use tenon_core::cloud::{InstanceType, Offering};

use super::kubelet::{AmiFamily, Kubelet};
use tenon_core::resources::{ResourceName, Resources};

/// Label: the instance category (`p` of `p4d.24xlarge`).
pub const LABEL_INSTANCE_CATEGORY: &str = "karpenter.k8s.aws/instance-category";
/// Label: the instance family (`p4d`).
pub const LABEL_INSTANCE_FAMILY: &str = "karpenter.k8s.aws/instance-family";
/// Label: the instance generation (`4`).
pub const LABEL_INSTANCE_GENERATION: &str = "karpenter.k8s.aws/instance-generation";
/// Label: the instance size (`24xlarge`).
pub const LABEL_INSTANCE_SIZE: &str = "karpenter.k8s.aws/instance-size";
/// Label: vCPUs.
pub const LABEL_INSTANCE_CPU: &str = "karpenter.k8s.aws/instance-cpu";
/// Label: memory in MiB.
pub const LABEL_INSTANCE_MEMORY: &str = "karpenter.k8s.aws/instance-memory";
/// Label: the hypervisor (`nitro`, `xen`, empty for bare metal).
pub const LABEL_INSTANCE_HYPERVISOR: &str = "karpenter.k8s.aws/instance-hypervisor";
/// Label: the GPU model, lower case (`a100`).
pub const LABEL_GPU_NAME: &str = "karpenter.k8s.aws/instance-gpu-name";
/// Label: the GPU maker, lower case (`nvidia`).
pub const LABEL_GPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-gpu-manufacturer";
/// Label: the number of GPUs.
pub const LABEL_GPU_COUNT: &str = "karpenter.k8s.aws/instance-gpu-count";
/// Label: memory of one GPU in MiB.
pub const LABEL_GPU_MEMORY: &str = "karpenter.k8s.aws/instance-gpu-memory";
/// Label: the CPU's maker (`intel`, `amd`, `aws`).
pub const LABEL_CPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-cpu-manufacturer";
/// Label: the CPU's sustained clock speed in MHz.
pub const LABEL_CPU_CLOCK: &str = "karpenter.k8s.aws/instance-cpu-sustained-clock-speed-mhz";
/// Label: the local NVMe instance storage in GB.
pub const LABEL_LOCAL_NVME: &str = "karpenter.k8s.aws/instance-local-nvme";
/// Label: the maximum EBS bandwidth in Mbps.
pub const LABEL_EBS_BANDWIDTH: &str = "karpenter.k8s.aws/instance-ebs-bandwidth";
/// Label: whether traffic between instances is encrypted in transit (`true`, `false`).
pub const LABEL_ENCRYPTION_IN_TRANSIT: &str = "karpenter.k8s.aws/instance-encryption-in-transit-supported";

/// Label: the baseline network bandwidth in Mbps, over every network card.
pub const LABEL_NETWORK_BANDWIDTH: &str = "karpenter.k8s.aws/instance-network-bandwidth";
/// Label: the accelerator model, lower case (`inferentia2`, `trainium`).
pub const LABEL_ACCELERATOR_NAME: &str = "karpenter.k8s.aws/instance-accelerator-name";
/// Label: the accelerator maker, lower case (`aws`).
pub const LABEL_ACCELERATOR_MANUFACTURER: &str = "karpenter.k8s.aws/instance-accelerator-manufacturer";
/// Label: the number of accelerator devices.
pub const LABEL_ACCELERATOR_COUNT: &str = "karpenter.k8s.aws/instance-accelerator-count";
/// Label: the cluster's capacity reservation an instance runs in.
pub const LABEL_CAPACITY_RESERVATION_ID: &str = "karpenter.k8s.aws/capacity-reservation-id";
/// Label: the kind of that reservation (`default`, `capacity-block`).
pub const LABEL_CAPACITY_RESERVATION_TYPE: &str = "karpenter.k8s.aws/capacity-reservation-type";
/// Label: whether that reservation may be interrupted (`true`, `false`).
pub const LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE: &str = "karpenter.k8s.aws/capacity-reservation-interruptible";
/// Label: the zone's id (`use1-az1`), the same in every account unlike the zone's name.
pub const LABEL_ZONE_ID: &str = "topology.k8s.aws/zone-id";

/// The Neuron device resource (Inferentia, Trainium).
pub const NEURON: &str = "aws.amazon.com/neuron";
/// The Neuron core resource.
pub const NEURON_CORE: &str = "aws.amazon.com/neuroncore";
/// The EFA interface resource.
pub const EFA: &str = "vpc.amazonaws.com/efa";
/// The Habana Gaudi resource.
pub const HABANA_GAUDI: &str = "habana.ai/gaudi";
/// The branch network interface resource (security groups for pods).
pub const POD_ENI: &str = "vpc.amazonaws.com/pod-eni";

/// The branch network interfaces of each trunking instance type: the VPC resource controller's table
/// (aws/amazon-vpc-resource-controller-k8s v1.8.2, generated 2026-09-02, Apache-2.0), as
/// `scripts/gen-aws-trunk-limits.py` converts it; EC2's API does not describe trunking.
pub const BUNDLED_TRUNK_LIMITS_CSV: &str = include_str!("../../data/aws-trunk-limits.csv");

/// The branch interfaces (`vpc.amazonaws.com/pod-eni`) of instance type `name`, if it supports trunking.
pub fn branch_interfaces(name: &str) -> Option<i64> {
    static TABLE: std::sync::OnceLock<HashMap<&'static str, i64>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        BUNDLED_TRUNK_LIMITS_CSV
            .lines()
            .skip(1)
            .filter_map(|l| {
                let (t, n) = l.split_once(',')?;
                Some((t, n.trim().parse().ok()?))
            })
            .collect()
    });
    table.get(name).copied()
}

/// Every label key this provider sets, announced as well known.
pub const WELL_KNOWN_LABELS: [&str; 24] = [
    LABEL_INSTANCE_CATEGORY,
    LABEL_INSTANCE_FAMILY,
    LABEL_INSTANCE_GENERATION,
    LABEL_INSTANCE_SIZE,
    LABEL_INSTANCE_CPU,
    LABEL_INSTANCE_MEMORY,
    LABEL_INSTANCE_HYPERVISOR,
    LABEL_GPU_NAME,
    LABEL_GPU_MANUFACTURER,
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY,
    LABEL_CPU_MANUFACTURER,
    LABEL_CPU_CLOCK,
    LABEL_LOCAL_NVME,
    LABEL_EBS_BANDWIDTH,
    LABEL_ENCRYPTION_IN_TRANSIT,
    LABEL_NETWORK_BANDWIDTH,
    LABEL_ACCELERATOR_NAME,
    LABEL_ACCELERATOR_MANUFACTURER,
    LABEL_ACCELERATOR_COUNT,
    LABEL_CAPACITY_RESERVATION_ID,
    LABEL_CAPACITY_RESERVATION_TYPE,
    LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE,
    LABEL_ZONE_ID,
];

/// The AMD GPU resource.
pub const AMD_GPU: &str = "amd.com/gpu";

/// One kind of GPU in an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// The model (`A100`).
    pub name: String,
    /// The maker (`NVIDIA`).
    pub manufacturer: String,
    /// How many.
    pub count: i64,
    /// Memory of one, in MiB.
    pub memory_mib: i64,
}

/// The accelerator devices of an instance (Neuron's Inferentia or Trainium).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accelerator {
    /// The model (`Inferentia2`).
    pub name: String,
    /// The maker (`AWS`).
    pub manufacturer: String,
    /// How many devices.
    pub count: i64,
    /// Neuron cores over all devices (0 when not a Neuron device).
    pub cores: i64,
}

/// An EC2 instance type as `DescribeInstanceTypes` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shape {
    /// The type name (`p4d.24xlarge`).
    pub name: String,
    /// Default vCPUs.
    pub vcpu: i64,
    /// Memory in MiB.
    pub memory_mib: i64,
    /// Kubernetes architectures (`amd64`, `arm64`).
    pub architectures: Vec<String>,
    /// GPUs.
    pub gpus: Vec<Gpu>,
    /// Network interfaces.
    pub max_enis: i64,
    /// IPv4 addresses per interface.
    pub ipv4_per_eni: i64,
    /// The hypervisor (`nitro`, `xen`), empty for bare metal.
    pub hypervisor: String,
    /// Whether it is a bare-metal type.
    pub bare_metal: bool,
    /// The CPU's maker, as EC2 names it (`Intel`).
    pub cpu_manufacturer: Option<String>,
    /// The CPU's sustained clock speed in MHz.
    pub cpu_clock_mhz: Option<i64>,
    /// Local NVMe instance storage in GB.
    pub local_nvme_gb: Option<i64>,
    /// The maximum EBS bandwidth in Mbps.
    pub ebs_bandwidth_mbps: Option<i64>,
    /// Whether traffic between instances is encrypted in transit.
    pub encryption_in_transit: Option<bool>,
    /// Accelerator devices (Neuron), when the type has one kind of them.
    pub accelerator: Option<Accelerator>,
    /// EFA interfaces the type supports.
    pub efa_interfaces: i64,
    /// The baseline network bandwidth in Mbps, over every network card.
    pub network_bandwidth_mbps: Option<i64>,
}

#[cfg(test)]
impl Shape {
    /// A Nitro amd64 shape with four ENIs of 15 addresses (58 pods), for tests.
    pub(crate) fn nitro(name: &str, vcpu: i64, memory_mib: i64) -> Self {
        Self {
            name: name.into(),
            vcpu,
            memory_mib,
            architectures: vec!["amd64".into()],
            gpus: Vec::new(),
            max_enis: 4,
            ipv4_per_eni: 15,
            hypervisor: "nitro".into(),
            bare_metal: false,
            ..Default::default()
        }
    }
}

/// The memory capacity of `shape` in bytes, as Karpenter computes it: what EC2 reports, less 64 MiB on
/// arm64 (the kernel's CMA reservation on Graviton), less `vm_overhead` of it rounded up to the MiB (what
/// the hypervisor keeps; the kubelet never reports it).
pub fn memory_bytes(shape: &Shape, vm_overhead: f64) -> i64 {
    let mut mib = shape.memory_mib;
    if shape.architectures.first().is_some_and(|a| a == "arm64") {
        mib -= 64;
    }
    let overhead_mib = (mib as f64 * vm_overhead.clamp(0.0, 1.0)).ceil() as i64;
    (mib - overhead_mib) * MIB
}

/// The maximum pods of the EKS VPC CNI: `ENIs × (IPv4 per ENI − 1) + 2`.
pub fn max_pods(max_enis: i64, ipv4_per_eni: i64) -> i64 {
    (max_enis * (ipv4_per_eni - 1).max(0) + 2).max(2)
}

pub use crate::kubelet::kube_reserved_cpu_millis;

/// The kube-reserved memory of EKS in MiB: `11 × max pods + 255`.
pub fn kube_reserved_memory_mib(max_pods: i64) -> i64 {
    11 * max_pods + 255
}

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

/// Capacity, overhead and labels of `shape`, offered as `offerings`. `root_volume_gib` is the root volume
/// the NodeClass gives it (ephemeral storage); `kubelet` and `family` decide the pods it runs and what the
/// kubelet holds back ([`Kubelet::overhead`]).
pub fn instance_type(
    shape: &Shape,
    root_volume_gib: i64,
    kubelet: &Kubelet,
    family: AmiFamily,
    vm_overhead: f64,
    offerings: Vec<Offering>,
) -> InstanceType {
    instance_type_with_storage(shape, root_volume_gib * GIB, kubelet, family, vm_overhead, offerings)
}

/// The ephemeral storage of an instance of `shape` in bytes: its instance store when the class makes a
/// RAID 0 of it (`instanceStorePolicy: RAID0`, NVMe instance storage, in EC2's decimal gigabytes), else
/// its root volume, as Karpenter counts it.
pub fn ephemeral_storage_bytes(shape: &Shape, root_volume_gib: i64, raid0: bool) -> i64 {
    match shape.local_nvme_gb {
        Some(gb) if raid0 && gb > 0 => gb * 1_000_000_000,
        _ => root_volume_gib * GIB,
    }
}

/// [`instance_type`] with `storage` bytes of ephemeral storage ([`ephemeral_storage_bytes`]).
pub fn instance_type_with_storage(
    shape: &Shape,
    storage: i64,
    kubelet: &Kubelet,
    family: AmiFamily,
    vm_overhead: f64,
    offerings: Vec<Offering>,
) -> InstanceType {
    let pods = kubelet.pods(shape, family);
    let memory = memory_bytes(shape, vm_overhead);
    let mut capacity = Resources::cpu_memory(shape.vcpu * 1000, memory)
        .with(ResourceName::PODS, pods)
        .with(ResourceName::EPHEMERAL_STORAGE, storage);
    let nvidia: i64 =
        shape.gpus.iter().filter(|g| g.manufacturer.eq_ignore_ascii_case("nvidia")).map(|g| g.count).sum();
    if nvidia > 0 {
        capacity.set(ResourceName::NVIDIA_GPU, nvidia);
    }
    let gpus_of = |maker: &str| -> i64 {
        shape.gpus.iter().filter(|g| g.manufacturer.eq_ignore_ascii_case(maker)).map(|g| g.count).sum()
    };
    let (neuron, cores) = shape.accelerator.as_ref().map_or((0, 0), |a| (a.count, a.cores));
    let branches = branch_interfaces(&shape.name).unwrap_or(0);
    for (resource, quantity) in [
        (AMD_GPU, gpus_of("amd")),
        (HABANA_GAUDI, gpus_of("habana")),
        (NEURON, neuron),
        (NEURON_CORE, cores),
        (EFA, shape.efa_interfaces),
        (POD_ENI, branches),
    ] {
        if quantity > 0
            && let Ok(r) = ResourceName::intern(resource)
        {
            capacity.set(r, quantity);
        }
    }
    let overhead = kubelet.overhead(shape, family, storage, memory);
    InstanceType { name: shape.name.clone(), labels: shape_labels(shape), capacity, overhead, offerings }
}

/// The labels every instance of `shape` carries.
pub fn shape_labels(shape: &Shape) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        l.insert(k.to_owned(), v);
    };
    put(labels::OS, "linux".into());
    if let Some(arch) = shape.architectures.first() {
        put(labels::ARCH, arch.clone());
    }
    let (family, size) = shape.name.split_once('.').unwrap_or((&shape.name, ""));
    put(LABEL_INSTANCE_FAMILY, family.to_owned());
    put(LABEL_INSTANCE_SIZE, size.to_owned());
    let category: String = family.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
    put(LABEL_INSTANCE_CATEGORY, category.clone());
    let generation: String = family[category.len()..].chars().take_while(char::is_ascii_digit).collect();
    if !generation.is_empty() {
        put(LABEL_INSTANCE_GENERATION, generation);
    }
    put(LABEL_INSTANCE_CPU, shape.vcpu.to_string());
    put(LABEL_INSTANCE_MEMORY, shape.memory_mib.to_string());
    put(LABEL_INSTANCE_HYPERVISOR, shape.hypervisor.clone());
    if let Some(m) = &shape.cpu_manufacturer {
        put(LABEL_CPU_MANUFACTURER, m.to_ascii_lowercase());
    }
    if let Some(mhz) = shape.cpu_clock_mhz {
        put(LABEL_CPU_CLOCK, mhz.to_string());
    }
    if let Some(gb) = shape.local_nvme_gb {
        put(LABEL_LOCAL_NVME, gb.to_string());
    }
    if let Some(mbps) = shape.ebs_bandwidth_mbps {
        put(LABEL_EBS_BANDWIDTH, mbps.to_string());
    }
    if let Some(e) = shape.encryption_in_transit {
        put(LABEL_ENCRYPTION_IN_TRANSIT, e.to_string());
    }
    if let Some(mbps) = shape.network_bandwidth_mbps {
        put(LABEL_NETWORK_BANDWIDTH, mbps.to_string());
    }
    if let Some(a) = &shape.accelerator {
        put(LABEL_ACCELERATOR_NAME, a.name.to_ascii_lowercase().replace(' ', "-"));
        put(LABEL_ACCELERATOR_MANUFACTURER, a.manufacturer.to_ascii_lowercase().replace(' ', "-"));
        put(LABEL_ACCELERATOR_COUNT, a.count.to_string());
    }
    if let Some(g) = shape.gpus.first() {
        put(LABEL_GPU_NAME, g.name.to_ascii_lowercase());
        put(LABEL_GPU_MANUFACTURER, g.manufacturer.to_ascii_lowercase());
        put(LABEL_GPU_COUNT, shape.gpus.iter().map(|g| g.count).sum::<i64>().to_string());
        put(LABEL_GPU_MEMORY, g.memory_mib.to_string());
    }
    l
}

/// The bundled on-demand price table: Linux, us-east-1, from the AWS Pricing API on 2026-07-20 (see
/// `providers/data/README.md`).
pub const BUNDLED_PRICES_CSV: &str = include_str!("../../data/aws-on-demand-prices.csv");
/// The date of the bundled table.
pub const BUNDLED_PRICES_DATE: &str = "2026-07-20";

/// Reads a `region,instance_type,usd_per_hour` table and keeps the rows of `region`.
pub fn parse_prices(csv: &str, region: &str) -> Result<HashMap<String, f64>, String> {
    let mut out = HashMap::new();
    for (n, line) in csv.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (n == 0 && line.starts_with("region,")) {
            continue;
        }
        let mut cols = line.split(',');
        let (Some(r), Some(t), Some(p), None) = (cols.next(), cols.next(), cols.next(), cols.next()) else {
            return Err(format!("price table line {}: expected region,instance_type,usd_per_hour: {line:?}", n + 1));
        };
        if r != region {
            continue;
        }
        let price: f64 =
            p.parse().map_err(|_| format!("price table line {}: usd_per_hour {p:?} is not a number", n + 1))?;
        if !price.is_finite() || price < 0.0 {
            return Err(format!("price table line {}: usd_per_hour {p:?} is negative or not finite", n + 1));
        }
        out.insert(t.to_owned(), price);
    }
    Ok(out)
}

/// The vCPU quota bucket an instance family counts against (`standard`, `g`, `p`, …), for quota errors.
pub fn quota_bucket(instance_type: &str) -> &'static str {
    let family = instance_type.split('.').next().unwrap_or(instance_type);
    let category: String = family.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
    match category.as_str() {
        "g" | "vt" => "g-vt",
        "p" => "p",
        "f" => "f",
        "x" => "x",
        "inf" => "inf",
        "trn" => "trn",
        "dl" => "dl",
        "hpc" => "hpc",
        _ => "standard",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// `instanceStorePolicy: RAID0` makes the NVMe instance store the ephemeral storage (EC2's decimal
    /// gigabytes), and the kubelet's 10 % nodefs eviction threshold follows it; a type without NVMe
    /// storage keeps its root volume.
    #[test]
    fn a_raid0_instance_store_is_the_ephemeral_storage() {
        let mut shape = Shape::nitro("m6id.xlarge", 4, 16384);
        shape.local_nvme_gb = Some(237);
        let storage = ephemeral_storage_bytes(&shape, 20, true);
        assert_eq!(storage, 237_000_000_000);
        let it = instance_type_with_storage(&shape, storage, &Kubelet::default(), AmiFamily::Al2023, 0.075, Vec::new());
        assert_eq!(it.capacity.get(ResourceName::EPHEMERAL_STORAGE), 237_000_000_000);
        assert_eq!(it.overhead.eviction_threshold.get(ResourceName::EPHEMERAL_STORAGE), 23_700_000_000);
        assert_eq!(ephemeral_storage_bytes(&shape, 20, false), 20 * GIB);
        assert_eq!(ephemeral_storage_bytes(&Shape::nitro("m6i.xlarge", 4, 16384), 20, true), 20 * GIB);
    }

    #[test]
    fn eks_formulas() {
        assert_eq!(max_pods(4, 15), 58, "m5.xlarge");
        assert_eq!(max_pods(3, 10), 29, "m5.large");
        assert_eq!(kube_reserved_cpu_millis(1), 60);
        assert_eq!(kube_reserved_cpu_millis(2), 70);
        assert_eq!(kube_reserved_cpu_millis(4), 80);
        assert_eq!(kube_reserved_cpu_millis(8), 90);
        assert_eq!(kube_reserved_cpu_millis(96), 310);
        assert_eq!(kube_reserved_memory_mib(58), 893);
    }

    #[test]
    fn the_bundled_table_has_the_documented_prices() {
        let p = parse_prices(BUNDLED_PRICES_CSV, "us-east-1").unwrap();
        assert!(p.len() > 1000);
        assert_eq!(p["g5.2xlarge"], 1.212);
        assert_eq!(p["g5.12xlarge"], 5.672);
        assert!(parse_prices(BUNDLED_PRICES_CSV, "eu-west-1").unwrap().is_empty());
        assert!(parse_prices("region,instance_type,usd_per_hour\nus-east-1,x,abc\n", "us-east-1").is_err());
    }

    #[test]
    fn gpu_shapes_become_gpu_capacity_and_labels() {
        let shape = Shape {
            name: "g5.xlarge".into(),
            vcpu: 4,
            memory_mib: 16384,
            architectures: vec!["amd64".into()],
            gpus: vec![Gpu { name: "A10G".into(), manufacturer: "NVIDIA".into(), count: 1, memory_mib: 22888 }],
            max_enis: 4,
            ipv4_per_eni: 15,
            hypervisor: "nitro".into(),
            bare_metal: false,
            cpu_manufacturer: Some("AMD".into()),
            local_nvme_gb: Some(250),
            ..Default::default()
        };
        let it = instance_type(&shape, 20, &Kubelet::default(), AmiFamily::Al2023, 0.0, Vec::new());
        assert_eq!(it.labels[LABEL_CPU_MANUFACTURER], "amd");
        assert_eq!(it.labels[LABEL_LOCAL_NVME], "250");
        assert!(!it.labels.contains_key(LABEL_EBS_BANDWIDTH), "a figure EC2 did not give is no label");
        assert_eq!(it.capacity.get(ResourceName::NVIDIA_GPU), 1);
        assert_eq!(it.labels[LABEL_GPU_NAME], "a10g");
        assert_eq!(it.labels[LABEL_INSTANCE_GENERATION], "5");
        assert_eq!(it.labels[LABEL_INSTANCE_CATEGORY], "g");
        let a = it.allocatable();
        assert_eq!(a.get(ResourceName::CPU), 4000 - 80);
        assert_eq!(a.get(ResourceName::MEMORY), (16384 - 893 - 100) * MIB);
        assert_eq!(a.get(ResourceName::PODS), 58);
        assert_eq!(quota_bucket("g5.xlarge"), "g-vt");
        assert_eq!(quota_bucket("m5.large"), "standard");
    }
}
