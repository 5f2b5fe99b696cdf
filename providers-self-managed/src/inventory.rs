//! The inventory: `SelfManagedNodeClass`, the machines it owns and how they are driven.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tenon_core::api::{KubeDuration, NodeClassRef, labels};
use tenon_core::cloud::{CapacityType, InstanceType, Offering};
use tenon_core::resources::{ResourceName, Resources};

/// The API group of [`SelfManagedNodeClass`].
pub const GROUP: &str = "tenon.dev";
/// The API version of [`SelfManagedNodeClass`].
pub const VERSION: &str = "v1alpha1";
/// The kind of [`SelfManagedNodeClass`].
pub const KIND: &str = "SelfManagedNodeClass";

/// Label on every owned node: the machine's inventory name.
pub const MACHINE_LABEL: &str = "tenon.dev/machine";
/// Label on every owned node: the GPU model.
pub const GPU_MODEL_LABEL: &str = "tenon.dev/gpu-model";
/// Label on every owned node: the number of GPUs.
pub const GPU_COUNT_LABEL: &str = "tenon.dev/gpu-count";

/// A fleet of owned bare-metal machines, each driven through its Redfish BMC.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "tenon.dev",
    version = "v1alpha1",
    kind = "SelfManagedNodeClass",
    plural = "selfmanagednodeclasses",
    doc = "Owned bare-metal machines tenon powers on and off through their Redfish BMCs."
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelfManagedNodeClassSpec {
    /// The machines.
    pub machines: Vec<MachineSpec>,
    /// How long a machine may take from the power-on request until its BMC reports it on; past it the
    /// machine is quarantined and its claim fails over (default 20m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_budget: Option<KubeDuration>,
    /// How long a graceful shutdown may take before the power is forced off (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_shutdown_timeout: Option<KubeDuration>,
    /// How long a forced power-off may take before the machine is quarantined (default 2m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_shutdown_timeout: Option<KubeDuration>,
    /// Failures (boots past the budget, BMC errors, repair reboots) after which a machine is quarantined
    /// (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failures: Option<u32>,
    /// Sets a one-time PXE boot before every power-on, so each claim gets a freshly provisioned OS.
    #[serde(default)]
    pub pxe_boot: bool,
    /// Sets a one-time PXE boot when a machine is returned to the pool, so its next boot reimages it.
    #[serde(default)]
    pub reimage_on_release: bool,
    /// Cloud capacity to burst into, under a lease, when no owned machine is free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<BurstSpec>,
}

/// A cloud NodeClass to burst into when the owned fleet is full.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BurstSpec {
    /// The cloud NodeClass (for example a `karpenter.k8s.aws/EC2NodeClass`).
    pub node_class_ref: NodeClassRef,
    /// How long a burst node may run before its lease expires and it is reclaimed to owned capacity
    /// (default 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<KubeDuration>,
}

/// One owned machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineSpec {
    /// A unique name; also the node's `tenon.dev/machine` label.
    pub name: String,
    /// The machine class, used as the instance type; machines of one class must have the same shape
    /// (default: `<gpu model>-<count>x`, lowercased).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The topology domain (rack, NVLink or InfiniBand island), used as the zone.
    pub domain: String,
    /// The BMC.
    pub bmc: BmcSpec,
    /// The GPUs.
    pub gpu: GpuSpec,
    /// CPU cores, as a Kubernetes quantity.
    pub cpu: String,
    /// Memory, as a Kubernetes quantity.
    pub memory: String,
    /// The pod capacity (default 110).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<i64>,
    /// The CPU architecture label (default `amd64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// The amortized cost of the machine in USD per hour.
    pub price_per_hour: f64,
    /// Labels for the node; those every machine of the class shares are also advertised to the scheduler.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Where a machine's BMC answers and how to log in.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BmcSpec {
    /// The BMC's base URL, e.g. `https://10.0.8.11`.
    pub endpoint: String,
    /// The Redfish `ComputerSystem` id under `/redfish/v1/Systems/`.
    pub system_id: String,
    /// The name of the credentials (a Secret with `username` and `password`).
    pub credentials_ref: String,
    /// Accepts any TLS certificate (BMCs often ship self-signed ones).
    #[serde(default)]
    pub insecure_skip_tls_verify: bool,
}

/// A machine's GPUs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSpec {
    /// The model, e.g. `H100-SXM5-80GB`.
    pub model: String,
    /// How many.
    pub count: i64,
}

/// Why an inventory is rejected: the object, the field and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct InventoryError {
    /// `SelfManagedNodeClass/name`.
    pub object: String,
    /// The field's path, e.g. `spec.machines[2].cpu`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl InventoryError {
    fn new(object: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { object: object.to_owned(), field: field.into(), message: message.into() }
    }
}

/// Parses and validates a `SelfManagedNodeClass` from YAML; errors name the field.
pub fn parse_node_class(text: &str) -> Result<SelfManagedNodeClass, InventoryError> {
    let class: SelfManagedNodeClass = tenon_core::api::parse_manifest(&format!("{GROUP}/{VERSION}"), KIND, text)
        .map_err(|e| InventoryError { object: e.object, field: e.field, message: e.message })?;
    class.resolve()?;
    Ok(class)
}

/// A machine as the provider uses it: validated, with its shape resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Machine {
    pub(crate) node_class: String,
    pub(crate) name: String,
    pub(crate) class: String,
    pub(crate) domain: String,
    pub(crate) bmc: BmcSpec,
    pub(crate) capacity: Resources,
    pub(crate) arch: String,
    pub(crate) gpu_model: String,
    pub(crate) gpu_count: i64,
    pub(crate) price: f64,
    pub(crate) labels: BTreeMap<String, String>,
}

impl Machine {
    /// The labels of the machine's class as an instance type: architecture, OS, GPU model and count.
    pub(crate) fn type_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::ARCH.to_owned(), self.arch.clone()),
            (labels::OS.to_owned(), "linux".to_owned()),
            (GPU_MODEL_LABEL.to_owned(), self.gpu_model.clone()),
            (GPU_COUNT_LABEL.to_owned(), self.gpu_count.to_string()),
        ])
    }

    /// The labels the machine's node carries.
    pub(crate) fn node_labels(&self) -> BTreeMap<String, String> {
        let mut l = self.labels.clone();
        l.extend(self.type_labels());
        l.insert(MACHINE_LABEL.into(), self.name.clone());
        l.insert(labels::INSTANCE_TYPE.into(), self.class.clone());
        l.insert(labels::ZONE.into(), self.domain.clone());
        l.insert(labels::CAPACITY_TYPE.into(), CapacityType::Reserved.as_str().into());
        l.insert(labels::RESERVATION_ID.into(), reservation_id(&self.node_class, &self.class, &self.domain));
        l
    }
}

/// The reservation id of an offering: one per NodeClass, machine class and domain.
pub(crate) fn reservation_id(node_class: &str, class: &str, domain: &str) -> String {
    format!("{node_class}.{class}.{domain}")
}

/// The timeouts and policies of one NodeClass, resolved with their defaults.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Policy {
    pub(crate) boot_budget: Duration,
    pub(crate) graceful_shutdown_timeout: Duration,
    pub(crate) forced_shutdown_timeout: Duration,
    pub(crate) max_failures: u32,
    pub(crate) pxe_boot: bool,
    pub(crate) reimage_on_release: bool,
    pub(crate) burst: Option<(NodeClassRef, Duration)>,
}

/// Default boot budget.
pub const DEFAULT_BOOT_BUDGET: Duration = Duration::from_secs(20 * 60);
/// Default graceful shutdown timeout.
pub const DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Default forced shutdown timeout.
pub const DEFAULT_FORCED_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2 * 60);
/// Default failures before quarantine.
pub const DEFAULT_MAX_FAILURES: u32 = 3;
/// Default burst lease.
pub const DEFAULT_BURST_LEASE: Duration = Duration::from_secs(60 * 60);

impl SelfManagedNodeClass {
    fn object(&self) -> String {
        format!("{KIND}/{}", self.metadata.name.as_deref().unwrap_or_default())
    }

    /// The NodeClass's name.
    pub fn class_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub(crate) fn policy(&self) -> Policy {
        let s = &self.spec;
        Policy {
            boot_budget: s.boot_budget.map_or(DEFAULT_BOOT_BUDGET, |d| d.0),
            graceful_shutdown_timeout: s.graceful_shutdown_timeout.map_or(DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT, |d| d.0),
            forced_shutdown_timeout: s.forced_shutdown_timeout.map_or(DEFAULT_FORCED_SHUTDOWN_TIMEOUT, |d| d.0),
            max_failures: s.max_failures.unwrap_or(DEFAULT_MAX_FAILURES).max(1),
            pxe_boot: s.pxe_boot,
            reimage_on_release: s.reimage_on_release,
            burst: s.burst.as_ref().map(|b| (b.node_class_ref.clone(), b.lease.map_or(DEFAULT_BURST_LEASE, |d| d.0))),
        }
    }

    /// Validates the machines and resolves their shapes.
    pub(crate) fn resolve(&self) -> Result<Vec<Machine>, InventoryError> {
        let object = self.object();
        if self.metadata.name.as_deref().is_none_or(str::is_empty) {
            return Err(InventoryError::new(&object, "metadata.name", "is required"));
        }
        if self.spec.machines.is_empty() {
            return Err(InventoryError::new(&object, "spec.machines", "lists no machine"));
        }
        let mut names = BTreeSet::new();
        let mut shapes: BTreeMap<String, (usize, Resources, String, String)> = BTreeMap::new();
        let mut out = Vec::new();
        for (i, m) in self.spec.machines.iter().enumerate() {
            let field = |f: &str| format!("spec.machines[{i}].{f}");
            let err = |f: &str, msg: String| InventoryError::new(&object, field(f), msg);
            if m.name.is_empty() || !names.insert(m.name.clone()) {
                return Err(err("name", format!("{:?} is empty or repeated", m.name)));
            }
            if m.domain.is_empty() {
                return Err(err("domain", "is empty".into()));
            }
            if !(m.bmc.endpoint.starts_with("http://") || m.bmc.endpoint.starts_with("https://")) {
                return Err(err("bmc.endpoint", format!("{:?} is not an http(s) URL", m.bmc.endpoint)));
            }
            if m.bmc.system_id.is_empty() || m.bmc.system_id.contains('/') {
                return Err(err("bmc.systemId", format!("{:?} is not a system id", m.bmc.system_id)));
            }
            if m.gpu.count < 0 {
                return Err(err("gpu.count", format!("{} is negative", m.gpu.count)));
            }
            if !m.price_per_hour.is_finite() || m.price_per_hour < 0.0 {
                return Err(err("pricePerHour", format!("{} is not a finite non-negative price", m.price_per_hour)));
            }
            let (_, cpu) = Resources::parse_quantity("cpu", &m.cpu).map_err(|e| err("cpu", e.to_string()))?;
            let (_, memory) =
                Resources::parse_quantity("memory", &m.memory).map_err(|e| err("memory", e.to_string()))?;
            let pods = m.pods.unwrap_or(110);
            if pods <= 0 {
                return Err(err("pods", format!("{pods} is not positive")));
            }
            let capacity = Resources::cpu_memory(cpu, memory)
                .with(ResourceName::PODS, pods)
                .with(ResourceName::NVIDIA_GPU, m.gpu.count);
            let class = m.class.clone().unwrap_or_else(|| {
                format!(
                    "{}-{}x",
                    m.gpu.model.to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-"),
                    m.gpu.count
                )
            });
            let arch = m.arch.clone().unwrap_or_else(|| "amd64".into());
            match shapes.get(&class) {
                Some((first, shape, model, first_arch))
                    if *shape != capacity || *model != m.gpu.model || *first_arch != arch =>
                {
                    return Err(err(
                        "class",
                        format!("machine class {class:?} has another shape in spec.machines[{first}]"),
                    ));
                }
                Some(_) => {}
                None => {
                    shapes.insert(class.clone(), (i, capacity.clone(), m.gpu.model.clone(), arch.clone()));
                }
            }
            out.push(Machine {
                node_class: self.class_name().to_owned(),
                name: m.name.clone(),
                class,
                domain: m.domain.clone(),
                bmc: m.bmc.clone(),
                capacity,
                arch,
                gpu_model: m.gpu.model.clone(),
                gpu_count: m.gpu.count,
                price: m.price_per_hour,
                labels: m.labels.clone(),
            });
        }
        if let Some(b) = &self.spec.burst
            && (b.node_class_ref.kind.is_empty() || b.node_class_ref.name.is_empty())
        {
            return Err(InventoryError::new(&object, "spec.burst.nodeClassRef", "needs a kind and a name"));
        }
        Ok(out)
    }
}

/// The instance types of `machines` (one per class), with one reserved offering per domain whose
/// reservation capacity is the number of free machines there. `free` and `coming` count, per machine,
/// whether it is free now and whether it is on its way back (powering off).
pub(crate) fn instance_types<'a>(machines: impl IntoIterator<Item = (&'a Machine, bool, bool)>) -> Vec<InstanceType> {
    let mut types: BTreeMap<String, (InstanceType, Option<BTreeMap<String, String>>)> = BTreeMap::new();
    // (class, domain) -> (price, free, coming, node class)
    let mut offers: BTreeMap<(String, String), (f64, u32, u32, String)> = BTreeMap::new();
    for (m, free, coming) in machines {
        let entry = types.entry(m.class.clone()).or_insert_with(|| {
            let it = InstanceType {
                name: m.class.clone(),
                labels: m.type_labels(),
                capacity: m.capacity.clone(),
                overhead: Default::default(),
                offerings: Vec::new(),
            };
            (it, None)
        });
        // Labels every machine of the class shares are the type's.
        let shared = entry.1.get_or_insert_with(|| m.labels.clone());
        shared.retain(|k, v| m.labels.get(k) == Some(v));
        let o = offers.entry((m.class.clone(), m.domain.clone())).or_insert((0.0, 0, 0, m.node_class.clone()));
        o.0 = o.0.max(m.price);
        o.1 += u32::from(free);
        o.2 += u32::from(coming);
    }
    for ((class, domain), (price, free, coming, node_class)) in offers {
        if let Some((it, _)) = types.get_mut(&class) {
            it.offerings.push(Offering {
                zone: domain.clone(),
                capacity_type: CapacityType::Reserved,
                price,
                // Available while a machine is free or on its way back: a launch then waits ("not yet")
                // instead of failing. The scheduler only plans onto free machines (the capacity).
                available: free + coming > 0,
                reservation_id: Some(reservation_id(&node_class, &class, &domain)),
                reservation_capacity: Some(free),
                labels: Default::default(),
            });
        }
    }
    types
        .into_values()
        .map(|(mut it, shared)| {
            for (k, v) in shared.unwrap_or_default() {
                it.labels.entry(k).or_insert(v);
            }
            it
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const YAML: &str = r#"
apiVersion: tenon.dev/v1alpha1
kind: SelfManagedNodeClass
metadata: {name: owned}
spec:
  bootBudget: 15m
  machines:
  - name: m1
    domain: island-a
    bmc: {endpoint: "https://10.0.0.1", systemId: "1", credentialsRef: bmc}
    gpu: {model: H100-SXM5-80GB, count: 8}
    cpu: "192"
    memory: 2Ti
    pricePerHour: 12.5
    labels: {team: ml, rack: r1}
  - name: m2
    domain: island-b
    bmc: {endpoint: "https://10.0.0.2", systemId: "1", credentialsRef: bmc}
    gpu: {model: H100-SXM5-80GB, count: 8}
    cpu: "192"
    memory: 2Ti
    pricePerHour: 12.5
    labels: {team: ml, rack: r2}
"#;

    #[test]
    fn parses_resolves_and_offers_one_type_per_class() {
        let nc = parse_node_class(YAML).unwrap();
        assert_eq!(nc.policy().boot_budget, Duration::from_secs(15 * 60));
        let machines = nc.resolve().unwrap();
        assert_eq!(machines[0].class, "h100-sxm5-80gb-8x");
        assert_eq!(machines[0].capacity.get(ResourceName::NVIDIA_GPU), 8);
        let types = instance_types(machines.iter().map(|m| (m, m.name == "m1", false)));
        assert_eq!(types.len(), 1);
        let it = &types[0];
        assert_eq!(it.labels.get("team").map(String::as_str), Some("ml"), "shared labels are the type's");
        assert!(!it.labels.contains_key("rack"), "per-machine labels are not");
        let a = it.offering("island-a", CapacityType::Reserved).unwrap();
        let b = it.offering("island-b", CapacityType::Reserved).unwrap();
        assert_eq!((a.reservation_capacity, a.available), (Some(1), true));
        assert_eq!((b.reservation_capacity, b.available), (Some(0), false));
    }

    #[test]
    fn errors_name_the_field() {
        let bad = YAML.replacen("cpu: \"192\"", "cpu: lots", 1);
        let e = parse_node_class(&bad).unwrap_err();
        assert_eq!((e.object.as_str(), e.field.as_str()), ("SelfManagedNodeClass/owned", "spec.machines[0].cpu"));
        let bad = YAML.replacen("count: 8", "count: eight", 1);
        let e = parse_node_class(&bad).unwrap_err();
        assert_eq!(e.field, "spec.machines[0].gpu.count", "{e}");
        let bad = YAML.replacen("name: m2", "name: m1", 1);
        assert_eq!(parse_node_class(&bad).unwrap_err().field, "spec.machines[1].name");
        let bad = YAML.replacen(
            "memory: 2Ti\n    pricePerHour: 12.5\n    labels: {team: ml, rack: r2}",
            "memory: 1Ti\n    pricePerHour: 12.5",
            1,
        );
        let e = parse_node_class(&bad).unwrap_err();
        assert_eq!(e.field, "spec.machines[1].class", "{e}");
        let bad = YAML.replacen("bootBudget: 15m", "bootBudget: soon", 1);
        assert_eq!(parse_node_class(&bad).unwrap_err().field, "spec.bootBudget");
        let bad = YAML.replacen("credentialsRef", "credentialRef", 1);
        assert!(parse_node_class(&bad).unwrap_err().field.starts_with("spec.machines[0].bmc"));
    }
}
