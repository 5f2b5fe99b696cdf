//! The kubelet configuration a NodeClass carries (the upstream `KubeletConfiguration`'s field names, as an
//! open map every field of which reaches the node): the fields scheduling depends on, read and checked,
//! each error naming the field. Each provider turns them into its images' allocatable.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use tenon_core::resources::{ResourceName, Resources};

/// The kubelet's hard-eviction signal on memory.
pub const MEMORY_AVAILABLE: &str = "memory.available";
/// The kubelet's hard-eviction signal on the root filesystem.
pub const NODEFS_AVAILABLE: &str = "nodefs.available";

/// The fields of `spec.kubelet` scheduling reads, parsed, beside the whole map (passed through).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kubelet {
    /// The map as written.
    pub raw: Map<String, Value>,
    /// `maxPods`.
    pub max_pods: Option<i64>,
    /// `podsPerCore`.
    pub pods_per_core: Option<i64>,
    /// `kubeReserved`, as written (`cpu: 200m`).
    pub kube_reserved: BTreeMap<String, String>,
    /// `systemReserved`, as written.
    pub system_reserved: BTreeMap<String, String>,
    /// `evictionHard` (`memory.available: 5%`).
    pub eviction_hard: BTreeMap<String, String>,
    /// `evictionSoft`.
    pub eviction_soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod` (`memory.available: 1m30s`).
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// `evictionMaxPodGracePeriod`, in seconds.
    pub eviction_max_pod_grace_period: Option<i64>,
    /// `clusterDNS`.
    pub cluster_dns: Vec<String>,
    /// `imageGCHighThresholdPercent`.
    pub image_gc_high_threshold_percent: Option<i64>,
    /// `imageGCLowThresholdPercent`.
    pub image_gc_low_threshold_percent: Option<i64>,
    /// `cpuCFSQuota`.
    pub cpu_cfs_quota: Option<bool>,
}

impl Kubelet {
    /// Reads `spec.kubelet`; an error names the field (`spec.kubelet.maxPods`) and says what is wrong.
    pub fn parse(raw: Option<&Map<String, Value>>) -> Result<Self, String> {
        Self::parse_at(raw, "spec.kubelet")
    }

    /// Reads the map found at `path` (`spec.kubeletConfiguration`); errors name `path.<field>`.
    pub fn parse_at(raw: Option<&Map<String, Value>>, path: &str) -> Result<Self, String> {
        let Some(raw) = raw else { return Ok(Self::default()) };
        let field = |k: &str| format!("{path}.{k}");
        let int = |k: &str| -> Result<Option<i64>, String> {
            match raw.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => match n.as_i64() {
                    Some(v) if v >= 0 => Ok(Some(v)),
                    _ => Err(format!("{}: {n} is not a non-negative integer", field(k))),
                },
                Some(v) => Err(format!("{}: expected an integer, got {v}", field(k))),
            }
        };
        let strings = |k: &str| -> Result<BTreeMap<String, String>, String> {
            match raw.get(k) {
                None | Some(Value::Null) => Ok(BTreeMap::new()),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(name, v)| match v {
                        Value::String(s) => Ok((name.clone(), s.clone())),
                        Value::Number(n) => Ok((name.clone(), n.to_string())),
                        other => Err(format!("{}.{name}: expected a string, got {other}", field(k))),
                    })
                    .collect(),
                Some(v) => Err(format!("{}: expected a map of strings, got {v}", field(k))),
            }
        };
        let mut out = Self {
            raw: raw.clone(),
            max_pods: int("maxPods")?,
            pods_per_core: int("podsPerCore")?,
            kube_reserved: strings("kubeReserved")?,
            system_reserved: strings("systemReserved")?,
            eviction_hard: strings("evictionHard")?,
            eviction_soft: strings("evictionSoft")?,
            eviction_soft_grace_period: strings("evictionSoftGracePeriod")?,
            eviction_max_pod_grace_period: int("evictionMaxPodGracePeriod")?,
            cluster_dns: Vec::new(),
            image_gc_high_threshold_percent: int("imageGCHighThresholdPercent")?,
            image_gc_low_threshold_percent: int("imageGCLowThresholdPercent")?,
            cpu_cfs_quota: match raw.get("cpuCFSQuota") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(v) => return Err(format!("{}: expected true or false, got {v}", field("cpuCFSQuota"))),
            },
        };
        match raw.get("clusterDNS") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) => {
                for (i, v) in a.iter().enumerate() {
                    let Value::String(ip) = v else {
                        return Err(format!("{}[{i}]: expected an IP address, got {v}", field("clusterDNS")));
                    };
                    if ip.parse::<std::net::IpAddr>().is_err() {
                        return Err(format!("{}[{i}]: {ip:?} is not an IP address", field("clusterDNS")));
                    }
                    out.cluster_dns.push(ip.clone());
                }
            }
            Some(v) => return Err(format!("{}: expected a list of IP addresses, got {v}", field("clusterDNS"))),
        }
        for (k, map) in [("kubeReserved", &out.kube_reserved), ("systemReserved", &out.system_reserved)] {
            for (name, q) in map {
                Resources::parse_quantity(name, q).map_err(|e| format!("{}.{name}: {e}", field(k)))?;
            }
        }
        for (name, v) in &out.eviction_hard {
            signal_value(v, 1).map_err(|e| format!("{}.{name}: {e}", field("evictionHard")))?;
        }
        if let (Some(high), Some(low)) = (out.image_gc_high_threshold_percent, out.image_gc_low_threshold_percent)
            && low > high
        {
            return Err(format!(
                "{}: {low} is above imageGCHighThresholdPercent {high}",
                field("imageGCLowThresholdPercent")
            ));
        }
        Ok(out)
    }
}

impl Kubelet {
    /// The hard-eviction threshold on a node of `memory` bytes of memory and `storage` bytes of ephemeral
    /// storage: 100 MiB of memory and 10% of the storage, as EKS's and GKE's kubelets default, unless
    /// `evictionHard` sets `memory.available` or `nodefs.available` (a quantity, or a percentage of it).
    pub fn eviction_threshold(&self, memory: i64, storage: i64) -> Resources {
        let mut eviction = Resources::cpu_memory(0, 100 << 20).with(ResourceName::EPHEMERAL_STORAGE, storage / 10);
        if let Some(v) = self.eviction_hard.get(MEMORY_AVAILABLE).and_then(|v| signal_value(v, memory).ok()) {
            eviction.set(ResourceName::MEMORY, v);
        }
        if let Some(v) = self.eviction_hard.get(NODEFS_AVAILABLE).and_then(|v| signal_value(v, storage).ok()) {
            eviction.set(ResourceName::EPHEMERAL_STORAGE, v);
        }
        eviction
    }
}

/// Sets each of `quantities` (checked by [`Kubelet::parse`]) in `into`.
pub fn apply(into: &mut Resources, quantities: &BTreeMap<String, String>) {
    for (name, q) in quantities {
        if let Ok((slot, v)) = Resources::parse_quantity(name, q) {
            into.set(slot, v);
        }
    }
}

/// An eviction signal's value against `capacity`: a percentage of it (rounded up), or a quantity.
pub fn signal_value(value: &str, capacity: i64) -> Result<i64, String> {
    if let Some(p) = value.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| format!("{value:?} is not a percentage"))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("{value:?} is not between 0% and 100%"));
        }
        return Ok((capacity as f64 / 100.0 * p).ceil() as i64);
    }
    Resources::parse_quantity("memory", value).map(|(_, v)| v).map_err(|e| e.to_string())
}

/// Kube-reserved CPU in millicores, as EKS, GKE and AKS compute it: 6% of the first core, 1% of the second,
/// 0.5% of the third and fourth, 0.25% of every other (fractions of a millicore dropped).
pub fn kube_reserved_cpu_millis(vcpu: i64) -> i64 {
    let mut tenths = 0; // in tenths of a millicore
    for core in 0..vcpu {
        tenths += match core {
            0 => 600,
            1 => 100,
            2 | 3 => 50,
            _ => 25,
        };
    }
    tenths / 10
}

/// The labels a kubelet may register itself with: it refuses to start on `kubernetes.io` and `k8s.io`
/// labels outside the few the NodeRestriction admission plugin allows, so those are left to the API.
pub fn kubelet_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    const ALLOWED: [&str; 9] = [
        "kubernetes.io/hostname",
        "kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    const ALLOWED_PREFIXES: [&str; 3] =
        ["kubelet.kubernetes.io/", "node.kubernetes.io/", "failure-domain.beta.kubernetes.io/"];
    labels
        .iter()
        .filter(|(k, _)| {
            let domain = k.split_once('/').map(|(d, _)| d).unwrap_or("");
            let restricted = domain == "kubernetes.io"
                || domain.ends_with(".kubernetes.io")
                || domain == "k8s.io"
                || domain.ends_with(".k8s.io");
            !restricted || ALLOWED.contains(&k.as_str()) || ALLOWED_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::kubelet_labels;

    #[test]
    fn the_kubelet_registers_only_labels_node_restriction_allows() {
        let labels = [
            "karpenter.sh/nodepool",
            "kubernetes.io/arch",
            "node.kubernetes.io/instance-type",
            "node-role.kubernetes.io/worker",
            "example.k8s.io/thing",
        ]
        .into_iter()
        .map(|k| (k.to_owned(), "x".to_owned()))
        .collect();
        let kept: Vec<String> = kubelet_labels(&labels).into_keys().collect();
        assert_eq!(kept, ["karpenter.sh/nodepool", "kubernetes.io/arch", "node.kubernetes.io/instance-type"]);
    }
}
