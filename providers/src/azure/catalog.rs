//! Azure VM sizes as tenon instance types, from Resource SKUs (`Microsoft.Compute/skus` for the
//! location): capacity, AKS's reservations, zones net of restrictions, and the `karpenter.azure.com/*`
//! labels karpenter-provider-azure defines.
//!
//! AKS holds back, as its node-resource-reservation documentation gives it (Kubernetes 1.29 and later):
//! - CPU: 60m for the first core, 40m for the second, 20m each for the third and fourth and 10m for each
//!   core after (2 cores 100m, 4 cores 140m, 8 cores 180m, 64 cores 740m);
//! - memory: 20 MiB per pod the node may run plus 50 MiB, at most 25% of the VM's memory;
//! - a hard-eviction threshold of 100 MiB of memory.
//!
//! A size is offered where its SKU lists it (`locationInfo[].zones`) less the zones a restriction names;
//! a size restricted in the location (for the subscription, or by quota) is not offered at all. Sizes in
//! a location without zones are offered in zone `0`, as AKS labels such nodes. Sizes AKS does not run
//! (below 2 vCPUs or 3.5 GiB, the sizes AKS refuses, confidential `DC`/`EC` sizes, sizes with constrained
//! vCPUs, GPU sizes of a model not known here, and NVads A10 v5 sizes with a fraction of a GPU) are left
//! out, as karpenter-provider-azure leaves them out.

use std::collections::BTreeMap;

use serde::Deserialize;
use tenon_core::api::labels;
use tenon_core::cloud::{InstanceType, Offering, Overhead};
use tenon_core::resources::{ResourceName, Resources};

/// Label: the VM size (`Standard_D4s_v5`).
pub const LABEL_SKU_NAME: &str = "karpenter.azure.com/sku-name";
/// Label: the size's family letter (`D`, `N`).
pub const LABEL_SKU_FAMILY: &str = "karpenter.azure.com/sku-family";
/// Label: the size's series (`Ds_v5`, `NCads_v4`).
pub const LABEL_SKU_SERIES: &str = "karpenter.azure.com/sku-series";
/// Label: the size's version (`5`; `1` when the name has none).
pub const LABEL_SKU_VERSION: &str = "karpenter.azure.com/sku-version";
/// Label: vCPUs.
pub const LABEL_SKU_CPU: &str = "karpenter.azure.com/sku-cpu";
/// Label: memory in MiB.
pub const LABEL_SKU_MEMORY: &str = "karpenter.azure.com/sku-memory";
/// Label: accelerated networking (`true`/`false`).
pub const LABEL_SKU_ACCELERATED_NETWORKING: &str = "karpenter.azure.com/sku-networking-accelerated";
/// Label: premium storage (`true`/`false`).
pub const LABEL_SKU_PREMIUM_STORAGE: &str = "karpenter.azure.com/sku-storage-premium-capable";
/// Label: the largest ephemeral OS disk in GB.
pub const LABEL_SKU_EPHEMERAL_OS_MAX: &str = "karpenter.azure.com/sku-storage-ephemeralos-maxsize";
/// Label: the GPU model (`A100`, `T4`).
pub const LABEL_SKU_GPU_NAME: &str = "karpenter.azure.com/sku-gpu-name";
/// Label: the GPUs' maker (`nvidia`, `amd`).
pub const LABEL_SKU_GPU_MANUFACTURER: &str = "karpenter.azure.com/sku-gpu-manufacturer";
/// Label: the number of GPUs.
pub const LABEL_SKU_GPU_COUNT: &str = "karpenter.azure.com/sku-gpu-count";
/// Label: the Hyper-V generation images must be built for (`1`, `2`).
pub const LABEL_SKU_HYPERV_GENERATION: &str = "karpenter.azure.com/sku-hyperv-generation";
/// AKS's vCPU label.
pub const LABEL_AKS_SKU_CPU: &str = "kubernetes.azure.com/sku-cpu";
/// AKS's memory label.
pub const LABEL_AKS_SKU_MEMORY: &str = "kubernetes.azure.com/sku-memory";

/// Every label key this provider sets, announced as well known.
pub const WELL_KNOWN_LABELS: [&str; 15] = [
    LABEL_SKU_NAME,
    LABEL_SKU_FAMILY,
    LABEL_SKU_SERIES,
    LABEL_SKU_VERSION,
    LABEL_SKU_CPU,
    LABEL_SKU_MEMORY,
    LABEL_SKU_ACCELERATED_NETWORKING,
    LABEL_SKU_PREMIUM_STORAGE,
    LABEL_SKU_EPHEMERAL_OS_MAX,
    LABEL_SKU_GPU_NAME,
    LABEL_SKU_GPU_MANUFACTURER,
    LABEL_SKU_GPU_COUNT,
    LABEL_SKU_HYPERV_GENERATION,
    LABEL_AKS_SKU_CPU,
    LABEL_AKS_SKU_MEMORY,
];

/// The zone of a VM in a location without zones, as AKS labels its nodes.
pub const REGIONAL_ZONE: &str = "0";

/// Sizes AKS refuses to run nodes on, and two karpenter-provider-azure leaves out.
pub const RESTRICTED_SIZES: [&str; 14] = [
    "Standard_A0",
    "Standard_A1",
    "Standard_A1_v2",
    "Standard_B1s",
    "Standard_B1ms",
    "Standard_F1",
    "Standard_F1s",
    "Basic_A0",
    "Basic_A1",
    "Basic_A2",
    "Basic_A3",
    "Basic_A4",
    "Standard_E64i_v3",
    "Standard_E64is_v3",
];

const MIB: i64 = 1 << 20;

/// A Resource SKU, the fields read here (`ResourceSku`, api-version 2021-07-01).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSku {
    /// `virtualMachines`, `disks`, …
    #[serde(default)]
    pub resource_type: Option<String>,
    /// The size (`Standard_D4s_v5`).
    #[serde(default)]
    pub name: Option<String>,
    /// The quota family (`standardDSv5Family`).
    #[serde(default)]
    pub family: Option<String>,
    /// The locations it is in.
    #[serde(default)]
    pub locations: Vec<String>,
    /// The zones of each location.
    #[serde(default)]
    pub location_info: Vec<LocationInfo>,
    /// Name/value capabilities (`vCPUs`, `MemoryGB`, `GPUs`, …).
    #[serde(default)]
    pub capabilities: Vec<Capability>,
    /// Why it cannot be used where.
    #[serde(default)]
    pub restrictions: Vec<Restriction>,
}

/// `ResourceSkuLocationInfo`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct LocationInfo {
    /// The location.
    #[serde(default)]
    pub location: Option<String>,
    /// Its zones (`1`, `2`, `3`).
    #[serde(default)]
    pub zones: Vec<String>,
}

/// `ResourceSkuCapabilities`.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Capability {
    /// The name.
    #[serde(default)]
    pub name: String,
    /// The value, as text.
    #[serde(default)]
    pub value: String,
}

/// `ResourceSkuRestrictions`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Restriction {
    /// `Location` or `Zone`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The locations (for `Location`) or location (for `Zone`) it applies to.
    #[serde(default)]
    pub values: Vec<String>,
    /// The locations and zones it applies to.
    #[serde(default)]
    pub restriction_info: Option<RestrictionInfo>,
    /// `QuotaId` or `NotAvailableForSubscription`.
    #[serde(default)]
    pub reason_code: Option<String>,
}

/// `ResourceSkuRestrictionInfo`.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct RestrictionInfo {
    /// Locations.
    #[serde(default)]
    pub locations: Vec<String>,
    /// Zones.
    #[serde(default)]
    pub zones: Vec<String>,
}

/// A VM size as the provider uses it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SkuShape {
    /// `Standard_NC24ads_A100_v4`.
    pub name: String,
    /// The quota family (`standardNCADSA100v4Family`).
    pub quota_family: String,
    /// vCPUs.
    pub vcpu: i64,
    /// Memory in MiB.
    pub memory_mib: i64,
    /// GPUs, their model (`A100`) and maker (`nvidia`).
    pub gpus: Option<(i64, String, String)>,
    /// Arm64 or x64.
    pub arm64: bool,
    /// Hyper-V generation 2 is supported (images are picked for it).
    pub gen2: bool,
    /// Hyper-V generation 1 is supported.
    pub gen1: bool,
    /// Accelerated networking.
    pub accelerated_networking: bool,
    /// Premium storage.
    pub premium_io: bool,
    /// The largest ephemeral OS disk in GB, when it may have one.
    pub ephemeral_os_max_gb: Option<i64>,
    /// Spot is possible.
    pub spot_capable: bool,
    /// Encryption at host is possible.
    pub encryption_at_host: bool,
    /// The zone labels it is offered in (`eastus-1`; `0` without zones).
    pub zones: Vec<String>,
}

impl ResourceSku {
    fn capability(&self, name: &str) -> Option<&str> {
        self.capabilities.iter().find(|c| c.name == name).map(|c| c.value.as_str())
    }

    fn flag(&self, name: &str) -> bool {
        self.capability(name).is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

/// The parts of a VM size's name (`Standard_NC24ads_A100_v4`): family letter, sub-family letters, vCPUs,
/// constrained vCPUs, feature letters, accelerator, version.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SizeName {
    /// `N`.
    pub family: String,
    /// `C`.
    pub subfamily: String,
    /// `24`.
    pub vcpu: String,
    /// `2` of `E4-2s_v3`.
    pub constrained: Option<String>,
    /// `ads`.
    pub features: String,
    /// `A100`.
    pub accelerator: Option<String>,
    /// `4`; `None` when the name has no version.
    pub version: Option<String>,
}

/// Reads a size's name; `None` for a name of another shape.
pub fn parse_size(name: &str) -> Option<SizeName> {
    let body = name.strip_prefix("Standard_").or_else(|| name.strip_prefix("Basic_"))?;
    let mut parts = body.split('_');
    let head = parts.next()?;
    let letters: String = head.chars().take_while(char::is_ascii_uppercase).collect();
    if letters.is_empty() || letters.len() > 3 {
        return None;
    }
    let rest = &head[letters.len()..];
    let vcpu: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if vcpu.is_empty() {
        return None;
    }
    let mut rest = &rest[vcpu.len()..];
    let mut constrained = None;
    if let Some(r) = rest.strip_prefix('-') {
        let c: String = r.chars().take_while(char::is_ascii_digit).collect();
        rest = &r[c.len()..];
        constrained = Some(c);
    }
    let mut out = SizeName {
        family: letters[..1].to_owned(),
        subfamily: letters[1..].to_owned(),
        vcpu,
        constrained,
        features: rest.to_owned(),
        ..Default::default()
    };
    for p in parts {
        if let Some(v) = p
            .strip_prefix('v')
            .or_else(|| p.strip_prefix('V'))
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        {
            out.version = Some(v.to_owned());
        } else if p != "xl" && p != "Promo" && p != "NDR" && p.starts_with(|c: char| c.is_ascii_uppercase()) {
            out.accelerator = Some(p.to_owned());
        }
    }
    Some(out)
}

impl SizeName {
    /// The series label: `NCads_v4`, `Ds_v5`.
    pub fn series(&self) -> String {
        let base = format!("{}{}{}", self.family, self.subfamily, self.features);
        match &self.version {
            Some(v) => format!("{base}_v{v}"),
            None => base,
        }
    }
}

/// GPU sizes whose name has no accelerator part, and their model.
const GPU_BY_SIZE: [(&str, &str); 7] = [
    ("Standard_NC6s_v3", "V100"),
    ("Standard_NC12s_v3", "V100"),
    ("Standard_NC24s_v3", "V100"),
    ("Standard_NC24rs_v3", "V100"),
    ("Standard_ND40rs_v2", "V100"),
    ("Standard_ND96asr_v4", "A100"),
    ("Standard_ND96amsr_A100_v4", "A100"),
];

/// GPU models known here, and their maker.
const GPU_MODELS: [(&str, &str); 12] = [
    ("A100", "nvidia"),
    ("A10", "nvidia"),
    ("H100", "nvidia"),
    ("H200", "nvidia"),
    ("T4", "nvidia"),
    ("V100", "nvidia"),
    ("L4", "nvidia"),
    ("L40S", "nvidia"),
    ("GB200", "nvidia"),
    ("RTXPRO6000BSE", "nvidia"),
    ("MI300X", "amd"),
    ("V710", "amd"),
];

/// The GPU model and maker of a size.
pub fn gpu_model(name: &str, parsed: &SizeName) -> Option<(&'static str, &'static str)> {
    let model = GPU_BY_SIZE.iter().find(|(s, _)| *s == name).map(|(_, m)| *m).or(parsed.accelerator.as_deref())?;
    GPU_MODELS.iter().find(|(m, _)| *m == model).copied()
}

/// The size `sku` describes in `location` (lower case, `eastus`), or why it is left out.
pub fn shape_of(sku: &ResourceSku, location: &str) -> Result<SkuShape, String> {
    let name = sku.name.clone().ok_or("a SKU without a name")?;
    if sku.resource_type.as_deref() != Some("virtualMachines") {
        return Err(format!("{name}: not a VM size"));
    }
    if RESTRICTED_SIZES.contains(&name.as_str()) {
        return Err(format!("{name}: AKS does not run nodes on it"));
    }
    let in_location = |values: &[String]| values.iter().any(|v| v.eq_ignore_ascii_case(location));
    if sku.restrictions.iter().any(|r| r.kind.as_deref() == Some("Location") && in_location(&r.values)) {
        return Err(format!("{name}: restricted in {location}"));
    }
    let parsed = parse_size(&name).ok_or_else(|| format!("{name}: not a size name"))?;
    if parsed.constrained.is_some() {
        return Err(format!("{name}: constrained vCPUs"));
    }
    if parsed.family == "D" && parsed.subfamily.starts_with('C')
        || parsed.family == "E" && parsed.subfamily.starts_with('C')
    {
        return Err(format!("{name}: confidential"));
    }
    let number = |cap: &str| -> Result<f64, String> {
        let v = sku.capability(cap).ok_or_else(|| format!("{name}: no {cap} capability"))?;
        v.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("{name}: capability {cap} {v:?} is not a number"))
    };
    let vcpu = number("vCPUs")? as i64;
    let memory_gib = number("MemoryGB")?;
    if vcpu < 2 || memory_gib < 3.5 {
        return Err(format!("{name}: below 2 vCPUs or 3.5 GiB"));
    }
    let gpu_count = sku.capability("GPUs").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    let gpus = if gpu_count > 0 {
        let (model, maker) = gpu_model(&name, &parsed).ok_or_else(|| format!("{name}: a GPU model not known here"))?;
        if model == "A10" && parsed.family == "N" && parsed.subfamily == "V" && vcpu < 36 {
            return Err(format!("{name}: a fraction of a GPU"));
        }
        Some((gpu_count, model.to_owned(), maker.to_owned()))
    } else {
        None
    };
    let generations = sku.capability("HyperVGenerations").unwrap_or("V1");
    let ephemeral_os_max_gb = if sku.flag("EphemeralOSDiskSupported") {
        let mib = ["CachedDiskBytes", "MaxResourceVolumeMB"]
            .iter()
            .find_map(|cap| {
                let v = sku.capability(cap)?.parse::<f64>().ok().filter(|v| *v > 0.0)?;
                Some(if *cap == "CachedDiskBytes" { v / MIB as f64 } else { v })
            })
            .unwrap_or(0.0);
        Some((mib * MIB as f64 / 1e9) as i64).filter(|gb| *gb > 0)
    } else {
        None
    };
    let restricted_zones: Vec<&str> = sku
        .restrictions
        .iter()
        .filter(|r| r.kind.as_deref() == Some("Zone"))
        .flat_map(|r| r.restriction_info.iter().flat_map(|i| i.zones.iter().map(String::as_str)))
        .collect();
    let listed: Vec<&String> = sku
        .location_info
        .iter()
        .filter(|i| i.location.as_deref().is_some_and(|l| l.eq_ignore_ascii_case(location)))
        .flat_map(|i| &i.zones)
        .collect();
    let in_location = in_location(&sku.locations)
        || sku.location_info.iter().any(|i| i.location.as_deref().is_some_and(|l| l.eq_ignore_ascii_case(location)));
    if !in_location {
        return Err(format!("{name}: not in {location}"));
    }
    let mut zones: Vec<String> = if listed.is_empty() {
        vec![REGIONAL_ZONE.to_owned()]
    } else {
        listed
            .into_iter()
            .filter(|z| !restricted_zones.contains(&z.as_str()))
            .map(|z| zone_label(location, z))
            .collect()
    };
    zones.sort();
    zones.dedup();
    Ok(SkuShape {
        quota_family: sku.family.clone().unwrap_or_default(),
        vcpu,
        memory_mib: (memory_gib * 1024.0).round() as i64,
        gpus,
        arm64: sku.capability("CpuArchitectureType").is_some_and(|a| a.eq_ignore_ascii_case("Arm64")),
        gen2: generations.split(',').any(|g| g.trim().eq_ignore_ascii_case("V2")),
        gen1: generations.split(',').any(|g| g.trim().eq_ignore_ascii_case("V1")),
        accelerated_networking: sku.flag("AcceleratedNetworkingEnabled"),
        premium_io: sku.flag("PremiumIO"),
        ephemeral_os_max_gb,
        spot_capable: sku.flag("LowPriorityCapable"),
        encryption_at_host: sku.flag("EncryptionAtHostSupported"),
        zones,
        name,
    })
}

/// The zone label of ARM zone `zone` in `location`: `eastus-1`.
pub fn zone_label(location: &str, zone: &str) -> String {
    format!("{}-{zone}", location.to_ascii_lowercase())
}

/// The ARM zone of a zone label (`eastus-1` → `1`); `None` for the regional `0`.
pub fn arm_zone(label: &str) -> Option<&str> {
    if label == REGIONAL_ZONE { None } else { label.rsplit_once('-').map(|(_, z)| z) }
}

/// AKS's kube-reserved CPU in millicores for `vcpu` cores.
pub fn aks_reserved_cpu_millis(vcpu: i64) -> i64 {
    let mut m = 0;
    for core in 1..=vcpu {
        m += match core {
            1 => 60,
            2 => 40,
            3 | 4 => 20,
            _ => 10,
        };
    }
    m
}

/// AKS's kube-reserved memory in MiB for a VM of `memory_mib` running at most `max_pods` pods.
pub fn aks_reserved_memory_mib(memory_mib: i64, max_pods: i64) -> i64 {
    (20 * max_pods + 50).min(memory_mib / 4)
}

/// AKS's hard-eviction threshold of memory, in MiB.
pub const EVICTION_MEMORY_MIB: i64 = 100;

/// What the class adds to a size's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeShape {
    /// Pods per node.
    pub max_pods: i64,
    /// The OS disk in GB (ephemeral storage).
    pub os_disk_gb: i64,
    /// The share of memory the hypervisor and kernel keep (0.075 by default, as karpenter-provider-azure).
    pub vm_memory_overhead: f64,
}

/// The instance type of `shape` with `offerings`.
pub fn instance_type(shape: &SkuShape, node: &NodeShape, offerings: Vec<Offering>) -> InstanceType {
    let memory_mib =
        shape.memory_mib - (shape.memory_mib as f64 * node.vm_memory_overhead.clamp(0.0, 1.0)).ceil() as i64;
    let mut capacity = Resources::cpu_memory(shape.vcpu * 1000, memory_mib * MIB)
        .with(ResourceName::PODS, node.max_pods)
        .with(ResourceName::EPHEMERAL_STORAGE, node.os_disk_gb * 1_000_000_000);
    if let Some((n, _, maker)) = &shape.gpus {
        let resource =
            if maker == "amd" { ResourceName::intern("amd.com/gpu").ok() } else { Some(ResourceName::NVIDIA_GPU) };
        if let Some(r) = resource {
            capacity.set(r, *n);
        }
    }
    let kube_reserved = Resources::cpu_memory(
        aks_reserved_cpu_millis(shape.vcpu),
        aks_reserved_memory_mib(shape.memory_mib, node.max_pods) * MIB,
    );
    InstanceType {
        name: shape.name.clone(),
        labels: shape_labels(shape),
        capacity,
        overhead: Overhead {
            kube_reserved,
            system_reserved: Resources::ZERO,
            eviction_threshold: Resources::cpu_memory(0, EVICTION_MEMORY_MIB * MIB),
        },
        offerings,
    }
}

/// The labels every VM of `shape` carries.
pub fn shape_labels(shape: &SkuShape) -> BTreeMap<String, String> {
    let parsed = parse_size(&shape.name).unwrap_or_default();
    let mut l = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        l.insert(k.to_owned(), v);
    };
    put(labels::OS, "linux".into());
    put(labels::ARCH, if shape.arm64 { "arm64" } else { "amd64" }.into());
    put(LABEL_SKU_NAME, shape.name.clone());
    put(LABEL_SKU_FAMILY, parsed.family.clone());
    put(LABEL_SKU_SERIES, parsed.series());
    put(LABEL_SKU_VERSION, parsed.version.clone().unwrap_or_else(|| "1".into()));
    put(LABEL_SKU_CPU, shape.vcpu.to_string());
    put(LABEL_SKU_MEMORY, shape.memory_mib.to_string());
    put(LABEL_AKS_SKU_CPU, shape.vcpu.to_string());
    put(LABEL_AKS_SKU_MEMORY, shape.memory_mib.to_string());
    put(LABEL_SKU_ACCELERATED_NETWORKING, shape.accelerated_networking.to_string());
    put(LABEL_SKU_PREMIUM_STORAGE, shape.premium_io.to_string());
    if let Some(gb) = shape.ephemeral_os_max_gb {
        put(LABEL_SKU_EPHEMERAL_OS_MAX, gb.to_string());
    }
    put(LABEL_SKU_HYPERV_GENERATION, if shape.gen2 { "2" } else { "1" }.into());
    match &shape.gpus {
        Some((n, model, maker)) => {
            put(LABEL_SKU_GPU_NAME, model.clone());
            put(LABEL_SKU_GPU_MANUFACTURER, maker.clone());
            put(LABEL_SKU_GPU_COUNT, n.to_string());
        }
        None => put(LABEL_SKU_GPU_COUNT, "0".into()),
    }
    l
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn size_names_read_into_their_parts() {
        let p = parse_size("Standard_NC24ads_A100_v4").unwrap();
        assert_eq!((p.family.as_str(), p.subfamily.as_str(), p.vcpu.as_str()), ("N", "C", "24"));
        assert_eq!(p.features, "ads");
        assert_eq!(p.accelerator.as_deref(), Some("A100"));
        assert_eq!(p.version.as_deref(), Some("4"));
        assert_eq!(p.series(), "NCads_v4");
        assert_eq!(parse_size("Standard_D4s_v5").unwrap().series(), "Ds_v5");
        assert_eq!(parse_size("Standard_E4-2s_v3").unwrap().constrained.as_deref(), Some("2"));
        assert_eq!(parse_size("Standard_NC4as_T4_v3").unwrap().accelerator.as_deref(), Some("T4"));
        assert_eq!(parse_size("Standard_A2").unwrap().version, None);
        assert!(parse_size("Custom_thing").is_none());
    }

    #[test]
    fn aks_reservations_follow_its_tables() {
        let cpu: Vec<i64> = [1, 2, 4, 8, 16, 32, 64].iter().map(|c| aks_reserved_cpu_millis(*c)).collect();
        assert_eq!(cpu, [60, 100, 140, 180, 260, 420, 740]);
        assert_eq!(aks_reserved_memory_mib(8 * 1024, 250), 2048);
        assert_eq!(aks_reserved_memory_mib(64 * 1024, 250), 5050);
        assert_eq!(aks_reserved_memory_mib(64 * 1024, 30), 650);
    }

    #[test]
    fn zone_labels_round_trip() {
        assert_eq!(zone_label("EastUS", "2"), "eastus-2");
        assert_eq!(arm_zone("eastus-2"), Some("2"));
        assert_eq!(arm_zone(REGIONAL_ZONE), None);
    }
}
