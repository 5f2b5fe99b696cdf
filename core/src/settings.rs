//! The operator's settings, layered defaults < file < environment < flags.
//!
//! Every setting has a kebab-case key (`max-consolidation-replacements`), an environment variable
//! (`MAX_CONSOLIDATION_REPLACEMENTS`), a default and a meaning; [`SETTINGS`] lists them all and
//! `tenon settings` prints them with their value and where it came from. A file (`--config`, YAML, TOML or
//! JSON) may use either spelling of a key. A value that does not parse is an error naming the key and its
//! source; nothing is half-applied.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use config::{Config, Environment, File, Value, ValueKind};

use crate::api::parse_go_duration;

/// How a setting's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A duration (`10s`, `15m`).
    Duration,
    /// A duration, or `Never`/`0`/empty to turn the behaviour off.
    OptionalDuration,
    /// `true` or `false`.
    Bool,
    /// A non-negative integer.
    Count,
    /// A percentage (`5%`) or a fraction in `[0, 1]` (`0.05`).
    Percent,
    /// `Name=true,Other=false`.
    FeatureGates,
    /// Free text.
    Text,
    /// One of the listed words.
    OneOf(&'static [&'static str]),
}

/// One setting's definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingSpec {
    /// The kebab-case key.
    pub key: &'static str,
    /// The environment variable.
    pub env: &'static str,
    /// The default, as text.
    pub default: &'static str,
    /// How the value is written.
    pub kind: Kind,
    /// What it does.
    pub doc: &'static str,
}

const fn s(key: &'static str, env: &'static str, default: &'static str, kind: Kind, doc: &'static str) -> SettingSpec {
    SettingSpec { key, env, default, kind, doc }
}

/// The feature gates and their defaults.
pub const FEATURE_GATE_DEFAULTS: [(&str, bool); 5] = [
    ("SpotToSpotConsolidation", false),
    ("NodeRepair", false),
    ("ReservedCapacity", true),
    ("NodeOverlay", false),
    ("StaticCapacity", false),
];

/// Karpenter's feature gates that tenon does not implement: accepted, so that Karpenter's settings
/// carry over, and ignored with a warning.
pub const UPSTREAM_ONLY_FEATURE_GATES: [&str; 1] = ["CapacityBuffer"];

/// Every setting tenon reads.
pub const SETTINGS: &[SettingSpec] = &[
    s(
        "cluster-name",
        "CLUSTER_NAME",
        "tenon",
        Kind::Text,
        "Name of the cluster; providers tag and list instances by it.",
    ),
    s(
        "batch-idle-duration",
        "BATCH_IDLE_DURATION",
        "1s",
        Kind::Duration,
        "A provisioning batch closes after this long without a new pending pod.",
    ),
    s(
        "batch-max-duration",
        "BATCH_MAX_DURATION",
        "10s",
        Kind::Duration,
        "A provisioning batch closes at the latest this long after it opened.",
    ),
    s(
        "launch-timeout",
        "LAUNCH_TIMEOUT",
        "5m",
        Kind::Duration,
        "A claim not launched this long after creation is deleted.",
    ),
    s(
        "registration-timeout",
        "REGISTRATION_TIMEOUT",
        "15m",
        Kind::Duration,
        "A claim whose node has not registered this long after creation is deleted; pools override it with the karpenter.sh/nodeclaim-registration-timeout annotation.",
    ),
    s(
        "nodeclaim-initialization-timeout",
        "NODECLAIM_INITIALIZATION_TIMEOUT",
        "Never",
        Kind::OptionalDuration,
        "A registered node not initialized this long after registration is deleted (off by default).",
    ),
    s(
        "feature-gates",
        "FEATURE_GATES",
        "SpotToSpotConsolidation=false,NodeRepair=false,ReservedCapacity=true,NodeOverlay=false,StaticCapacity=false",
        Kind::FeatureGates,
        "Feature gates, as Name=true,Other=false.",
    ),
    s(
        "consolidation-split-fallback",
        "CONSOLIDATION_SPLIT_FALLBACK",
        "false",
        Kind::Bool,
        "Let single-node consolidation replace one node with several cheaper ones (also raise max-consolidation-replacements).",
    ),
    s(
        "max-consolidation-replacements",
        "MAX_CONSOLIDATION_REPLACEMENTS",
        "1",
        Kind::Count,
        "The most replacement claims one consolidation may create.",
    ),
    s(
        "consolidation-split-max-attempts",
        "CONSOLIDATION_SPLIT_MAX_ATTEMPTS",
        "10",
        Kind::Count,
        "The most split re-simulations one disruption pass may run.",
    ),
    s(
        "consolidation-split-min-savings",
        "CONSOLIDATION_SPLIT_MIN_SAVINGS",
        "5%",
        Kind::Percent,
        "A split must save at least this share of the candidate's price.",
    ),
    s(
        "marginal-cost-packing",
        "MARGINAL_COST_PACKING",
        "true",
        Kind::Bool,
        "Honour a NodePool's karpenter.sh/nodeclaim-packing-policy: marginal-cost annotation; off packs every pool fit-only.",
    ),
    s(
        "od-to-spot-consolidation",
        "OD_TO_SPOT_CONSOLIDATION",
        "true",
        Kind::Bool,
        "Retry an on-demand candidate's rejected replacement as spot-only in the zones whose spot price beats it.",
    ),
    s(
        "spot-to-spot-min-instance-types",
        "SPOT_TO_SPOT_MIN_INSTANCE_TYPES",
        "15",
        Kind::Count,
        "Single-node spot-to-spot consolidation needs at least this many cheaper instance types, and launches with that many.",
    ),
    s(
        "consolidation-replace-min-savings",
        "CONSOLIDATION_REPLACE_MIN_SAVINGS",
        "0%",
        Kind::Percent,
        "Every replace must save at least this share of the candidates' price.",
    ),
    s(
        "disruption-poll-period",
        "DISRUPTION_POLL_PERIOD",
        "10s",
        Kind::Duration,
        "How often the disruption controller looks for commands.",
    ),
    s(
        "command-validation-delay",
        "COMMAND_VALIDATION_DELAY",
        "15s",
        Kind::Duration,
        "How long a consolidation command settles before it is re-simulated against live state.",
    ),
    s(
        "single-node-consolidation-timeout",
        "SINGLE_NODE_CONSOLIDATION_TIMEOUT",
        "3m",
        Kind::Duration,
        "How long single-node consolidation may search in one pass.",
    ),
    s(
        "multi-node-consolidation-timeout",
        "MULTI_NODE_CONSOLIDATION_TIMEOUT",
        "1m",
        Kind::Duration,
        "How long multi-node consolidation may search in one pass.",
    ),
    s(
        "unavailable-offerings-ttl",
        "UNAVAILABLE_OFFERINGS_TTL",
        "3m",
        Kind::Duration,
        "How long an offering that failed for lack of capacity stays out of scheduling.",
    ),
    s(
        "orphan-instance-grace",
        "ORPHAN_INSTANCE_GRACE",
        "2m",
        Kind::Duration,
        "An instance the provider lists for this cluster without a claim is terminated after this long.",
    ),
    s(
        "vanished-instance-grace",
        "VANISHED_INSTANCE_GRACE",
        "5m",
        Kind::Duration,
        "A launched, unregistered claim whose instance has vanished is reclaimed after this long (list-after-create consistency).",
    ),
    s(
        "max-instance-types",
        "MAX_INSTANCE_TYPES",
        "600",
        Kind::Count,
        "The most instance-type options one claim carries to its provider.",
    ),
    s(
        "preference-policy",
        "PREFERENCE_POLICY",
        "Respect",
        Kind::OneOf(&["Respect", "Ignore"]),
        "Whether scheduling honours preferred affinities and ScheduleAnyway spreads.",
    ),
    s(
        "min-values-policy",
        "MIN_VALUES_POLICY",
        "Strict",
        Kind::OneOf(&["Strict", "BestEffort"]),
        "Strict: a claim whose minValues its options cannot meet is not made; BestEffort: it is made with minValues lowered to what they meet, and annotated karpenter.sh/nodeclaim-min-values-relaxed.",
    ),
    s("log-level", "LOG_LEVEL", "info", Kind::OneOf(&["error", "warn", "info", "debug", "trace"]), "Log verbosity."),
    s(
        "providers",
        "PROVIDERS",
        "",
        Kind::Text,
        "The built-in providers `tenon run` registers, comma-separated (kwok, self-managed, aws); empty registers every one built in that needs no cloud account (kwok, self-managed): a cloud provider runs only when named.",
    ),
    s(
        "leader-election-name",
        "LEADER_ELECTION_NAME",
        "tenon-leader-election",
        Kind::Text,
        "The coordination.k8s.io Lease the replicas of `tenon run` elect their leader on, in the pod's namespace.",
    ),
    s(
        "disable-leader-election",
        "DISABLE_LEADER_ELECTION",
        "false",
        Kind::Bool,
        "Run without leader election (one replica only).",
    ),
    s("metrics-port", "METRICS_PORT", "8080", Kind::Count, "The port `tenon run` serves /metrics on."),
    s(
        "health-probe-port",
        "HEALTH_PROBE_PORT",
        "8081",
        Kind::Count,
        "The port `tenon run` serves /healthz and /readyz on.",
    ),
    s(
        "interruption-queue",
        "INTERRUPTION_QUEUE",
        "",
        Kind::Text,
        "The interruption queue: for the aws provider the SQS queue (name or URL) EventBridge delivers EC2 interruption events to; for the azure provider the Service Bus queue (https://<namespace>.servicebus.windows.net/<queue>) Event Grid delivers Health Resources events to; empty turns interruption handling off.",
    ),
    s(
        "vm-memory-overhead-percent",
        "VM_MEMORY_OVERHEAD_PERCENT",
        "0.075",
        Kind::Percent,
        "The share of an instance's memory its hypervisor keeps, taken off memory capacity by the aws provider (Karpenter's default).",
    ),
    s(
        "cluster-endpoint",
        "CLUSTER_ENDPOINT",
        "",
        Kind::Text,
        "The API server URL nodes join, for the aws provider's user data; empty asks EKS DescribeCluster.",
    ),
    s(
        "cluster-ca-bundle",
        "CLUSTER_CA_BUNDLE",
        "",
        Kind::Text,
        "The cluster's CA bundle (base64 PEM) nodes trust, for the aws provider's user data; empty asks EKS DescribeCluster.",
    ),
    s(
        "cluster-service-cidr",
        "CLUSTER_SERVICE_CIDR",
        "",
        Kind::Text,
        "The cluster's service CIDR (AL2023 nodes derive the cluster DNS address from it), for the aws provider; empty asks EKS DescribeCluster.",
    ),
    s(
        "isolated-vpc",
        "ISOLATED_VPC",
        "false",
        Kind::Bool,
        "The cluster has no route to the AWS Pricing API: the aws provider prices on-demand from its bundled table only.",
    ),
    s(
        "project-id",
        "PROJECT_ID",
        "",
        Kind::Text,
        "The GCP project the gcp provider launches Compute Engine instances in.",
    ),
    s(
        "cluster-location",
        "CLUSTER_LOCATION",
        "",
        Kind::Text,
        "The GKE cluster's location (a region, or a zone of it), for the gcp provider: its region is where instances launch.",
    ),
    s(
        "default-nodepool-service-account",
        "DEFAULT_NODEPOOL_SERVICE_ACCOUNT",
        "",
        Kind::Text,
        "The service account the gcp provider's instances run as when their GCENodeClass names none; empty: the node pool template's.",
    ),
    s(
        "default-nodepool-template-name",
        "DEFAULT_NODEPOOL_TEMPLATE_NAME",
        "",
        Kind::Text,
        "The GKE node pool whose instance template the gcp provider's nodes take their bootstrap from; empty: default-pool, else the first.",
    ),
    s(
        "azure-subscription-id",
        "AZURE_SUBSCRIPTION_ID",
        "",
        Kind::Text,
        "The Azure subscription the azure provider makes VMs in.",
    ),
    s(
        "azure-node-resource-group",
        "AZURE_NODE_RESOURCE_GROUP",
        "",
        Kind::Text,
        "The AKS cluster's node resource group (MC_<group>_<cluster>_<location>), where the azure provider makes VMs, NICs and disks.",
    ),
    s(
        "azure-location",
        "AZURE_LOCATION",
        "",
        Kind::Text,
        "The Azure location (eastus) of the cluster, for the azure provider.",
    ),
    s(
        "azure-tenant-id",
        "AZURE_TENANT_ID",
        "",
        Kind::Text,
        "The Entra tenant of the subscription, written into AKS nodes' bootstrap by the azure provider.",
    ),
    s(
        "vnet-subnet-id",
        "VNET_SUBNET_ID",
        "",
        Kind::Text,
        "The subnet the azure provider's VMs join when their AKSNodeClass names none (/subscriptions/…/virtualNetworks/<vnet>/subnets/<subnet>).",
    ),
    s(
        "network-plugin",
        "NETWORK_PLUGIN",
        "azure",
        Kind::Text,
        "The AKS cluster's network plugin (azure, kubenet, none), for the azure provider's bootstrap and default max pods.",
    ),
    s(
        "network-plugin-mode",
        "NETWORK_PLUGIN_MODE",
        "overlay",
        Kind::Text,
        "The network plugin's mode (overlay, or empty for Azure CNI on the node subnet), for the azure provider.",
    ),
    s(
        "network-policy",
        "NETWORK_POLICY",
        "",
        Kind::Text,
        "The AKS cluster's network policy (calico, azure, cilium, or empty), for the azure provider's bootstrap.",
    ),
    s(
        "dns-service-ip",
        "DNS_SERVICE_IP",
        "",
        Kind::Text,
        "The cluster DNS service's address AKS nodes use; empty: 10.0.0.10.",
    ),
    s(
        "ssh-public-key",
        "SSH_PUBLIC_KEY",
        "",
        Kind::Text,
        "The SSH public key of the azure provider's VMs' admin user.",
    ),
    s(
        "node-identities",
        "NODE_IDENTITIES",
        "",
        Kind::Text,
        "User-assigned identities (resource ids, comma-separated) the azure provider attaches to every VM: the kubelet's identity.",
    ),
    s(
        "kubelet-identity-client-id",
        "KUBELET_IDENTITY_CLIENT_ID",
        "",
        Kind::Text,
        "The client id of the kubelet's identity, written into AKS nodes' bootstrap.",
    ),
    s(
        "network-security-group",
        "NETWORK_SECURITY_GROUP",
        "",
        Kind::Text,
        "The node resource group's network security group (aks-agentpool-<id>-nsg), for AKS nodes' bootstrap.",
    ),
    s(
        "azure-custom-data-file",
        "AZURE_CUSTOM_DATA_FILE",
        "",
        Kind::Text,
        "A file of custom data (a #cloud-config or a #! script) the azure provider's VMs boot with instead of AKS's bootstrap, for self-managed Kubernetes on Azure.",
    ),
    s(
        "kwok-catalog",
        "KWOK_CATALOG",
        "",
        Kind::Text,
        "An InstanceCatalog file the simulated-node provider offers; empty offers its built-in catalog.",
    ),
    s(
        "kwok-registration-delay",
        "KWOK_REGISTRATION_DELAY",
        "5s",
        Kind::Duration,
        "How long a simulated node takes to appear after its claim launches.",
    ),
];

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The built-in default.
    Default,
    /// The `--config` file.
    File,
    /// The environment.
    Environment,
    /// A command-line flag.
    Flag,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Default => "default",
            Self::File => "file",
            Self::Environment => "env",
            Self::Flag => "flag",
        })
    }
}

/// A setting that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("setting {key} (from {origin}): {message}")]
pub struct SettingsError {
    /// The key, or the file.
    pub key: String,
    /// Where the bad value came from (`file`, `env`, `flag`, or the file's path).
    pub origin: String,
    /// What is wrong.
    pub message: String,
}

fn err(key: &str, source: impl fmt::Display, message: impl Into<String>) -> SettingsError {
    SettingsError { key: key.to_owned(), origin: source.to_string(), message: message.into() }
}

/// Feature gates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeatureGates(BTreeMap<String, bool>);

impl FeatureGates {
    /// Whether `name` is on.
    pub fn enabled(&self, name: &str) -> bool {
        self.0.get(name).copied().unwrap_or(false)
    }

    /// Spot-to-spot consolidation.
    pub fn spot_to_spot_consolidation(&self) -> bool {
        self.enabled("SpotToSpotConsolidation")
    }

    /// Node auto repair.
    pub fn node_repair(&self) -> bool {
        self.enabled("NodeRepair")
    }

    /// Reserved capacity: cloud capacity reservations offered and targeted.
    pub fn reserved_capacity(&self) -> bool {
        self.enabled("ReservedCapacity")
    }

    fn parse(text: &str) -> Result<Self, String> {
        let mut gates: BTreeMap<String, bool> =
            FEATURE_GATE_DEFAULTS.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) =
                part.split_once('=').ok_or_else(|| format!("{part:?} is not Name=true or Name=false"))?;
            let name = name.trim();
            if UPSTREAM_ONLY_FEATURE_GATES.contains(&name) {
                parse_bool(value)?;
                tracing::warn!(gate = name, "feature gate of Karpenter's that tenon does not implement: ignored");
                continue;
            }
            if !gates.contains_key(name) {
                let known: Vec<&str> = FEATURE_GATE_DEFAULTS.iter().map(|(n, _)| *n).collect();
                return Err(format!("unknown feature gate {name:?} (known: {})", known.join(", ")));
            }
            gates.insert(name.to_owned(), parse_bool(value)?);
        }
        Ok(Self(gates))
    }
}

impl fmt::Display for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(n, v)| format!("{n}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{other:?} is not true or false")),
    }
}

fn parse_percent(v: &str) -> Result<f64, String> {
    let v = v.trim();
    let fraction = match v.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => v.parse::<f64>(),
    }
    .map_err(|_| format!("{v:?} is not a percentage such as \"5%\" or a fraction such as \"0.05\""))?;
    if !(0.0..=1.0).contains(&fraction) {
        return Err(format!("{v:?} is outside 0%..100%"));
    }
    Ok(fraction)
}

fn parse_optional_duration(v: &str) -> Result<Option<Duration>, String> {
    match v.trim() {
        "" | "Never" | "never" | "off" | "0" => Ok(None),
        other => parse_go_duration(other).map(|d| if d.is_zero() { None } else { Some(d) }),
    }
}

/// Whether preferences are honoured by scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreferencePolicy {
    /// Honour preferred terms, relaxing them one by one when a pod does not fit.
    Respect,
    /// Ignore preferred terms.
    Ignore,
}

/// The parsed settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Name of the cluster.
    pub cluster_name: String,
    /// Batch idle window.
    pub batch_idle_duration: Duration,
    /// Batch maximum window.
    pub batch_max_duration: Duration,
    /// Launch timeout.
    pub launch_timeout: Duration,
    /// Default registration timeout.
    pub registration_timeout: Duration,
    /// Initialization timeout, measured from registration (`None`: off).
    pub nodeclaim_initialization_timeout: Option<Duration>,
    /// Feature gates.
    pub feature_gates: FeatureGates,
    /// Whether the 1→N split fallback is on.
    pub consolidation_split_fallback: bool,
    /// The most replacements one consolidation may create.
    pub max_consolidation_replacements: u32,
    /// The most split attempts per pass.
    pub consolidation_split_max_attempts: u32,
    /// The minimum savings of a split, as a fraction.
    pub consolidation_split_min_savings: f64,
    /// Whether pools may ask for marginal-cost packing (off: every pool packs fit-only).
    pub marginal_cost_packing: bool,
    /// Whether the on-demand → spot retry is on.
    pub od_to_spot_consolidation: bool,
    /// The spot-to-spot flexibility floor.
    pub spot_to_spot_min_instance_types: u32,
    /// The minimum savings of any replace, as a fraction.
    pub consolidation_replace_min_savings: f64,
    /// Disruption pass period.
    pub disruption_poll_period: Duration,
    /// Command validation delay.
    pub command_validation_delay: Duration,
    /// Single-node consolidation time budget.
    pub single_node_consolidation_timeout: Duration,
    /// Multi-node consolidation time budget.
    pub multi_node_consolidation_timeout: Duration,
    /// Unavailable-offerings TTL.
    pub unavailable_offerings_ttl: Duration,
    /// Grace before an instance without a claim is terminated.
    pub orphan_instance_grace: Duration,
    /// Grace before a launched, unregistered claim whose instance vanished is reclaimed.
    pub vanished_instance_grace: Duration,
    /// The most instance types per claim.
    pub max_instance_types: u32,
    /// Preference policy.
    pub preference_policy: PreferencePolicy,
    /// Whether a claim whose `minValues` cannot be met is made anyway, with them lowered
    /// (`min-values-policy: BestEffort`).
    pub min_values_best_effort: bool,
    /// Log level.
    pub log_level: String,
    /// The built-in providers to register (empty: all built in).
    pub providers: Vec<String>,
    /// The leader-election Lease's name.
    pub leader_election_name: String,
    /// Whether leader election is off.
    pub disable_leader_election: bool,
    /// The metrics port.
    pub metrics_port: u16,
    /// The health-probe port.
    pub health_probe_port: u16,
    /// The aws provider's interruption queue (`None`: no interruption handling).
    pub interruption_queue: Option<String>,
    /// `vm-memory-overhead-percent`: the share of an instance's memory its hypervisor keeps, as a fraction.
    pub vm_memory_overhead: f64,
    /// `cluster-endpoint`: the API server URL nodes join; `None` asks the provider's cloud.
    pub cluster_endpoint: Option<String>,
    /// `cluster-ca-bundle`: the cluster CA bundle (base64 PEM) nodes trust; `None` asks the provider's cloud.
    pub cluster_ca_bundle: Option<String>,
    /// `cluster-service-cidr`: the service CIDR; `None` asks the provider's cloud.
    pub cluster_service_cidr: Option<String>,
    /// `isolated-vpc`: no route to the AWS Pricing API; on-demand prices are the bundled table's.
    pub isolated_vpc: bool,
    /// `project-id`: the gcp provider's project (`None`: unset).
    pub project_id: Option<String>,
    /// `cluster-location`: the GKE cluster's region or zone.
    pub cluster_location: Option<String>,
    /// `default-nodepool-service-account`: the gcp provider's default service account.
    pub default_nodepool_service_account: Option<String>,
    /// `default-nodepool-template-name`: the node pool the gcp provider's bootstrap comes from.
    pub default_nodepool_template_name: Option<String>,
    /// `azure-subscription-id`: the Azure subscription the azure provider makes VMs in.
    pub azure_subscription_id: String,
    /// `azure-node-resource-group`: The AKS cluster's node resource group (`MC_<group>_<cluster>_<location>`), where the azure provider makes VMs, NICs and disks.
    pub azure_node_resource_group: String,
    /// `azure-location`: the Azure location (eastus) of the cluster, for the azure provider.
    pub azure_location: String,
    /// `azure-tenant-id`: The Entra tenant of the subscription, written into AKS nodes' bootstrap by the azure provider.
    pub azure_tenant_id: String,
    /// `vnet-subnet-id`: the subnet the azure provider's VMs join when their AKSNodeClass names none (`/subscriptions/…/virtualNetworks/<vnet>/subnets/<subnet>`).
    pub vnet_subnet_id: String,
    /// `network-plugin`: The AKS cluster's network plugin (azure, kubenet, none), for the azure provider's bootstrap and default max pods.
    pub network_plugin: String,
    /// `network-plugin-mode`: the network plugin's mode (overlay, or empty for Azure CNI on the node subnet), for the azure provider.
    pub network_plugin_mode: String,
    /// `network-policy`: The AKS cluster's network policy (calico, azure, cilium, or empty), for the azure provider's bootstrap.
    pub network_policy: String,
    /// `dns-service-ip`: the cluster DNS service's address AKS nodes use; empty: 10.0.0.10.
    pub dns_service_ip: String,
    /// `ssh-public-key`: The SSH public key of the azure provider's VMs' admin user.
    pub ssh_public_key: String,
    /// `node-identities`: User-assigned identities (resource ids, comma-separated) the azure provider attaches to every VM: the kubelet's identity.
    pub node_identities: String,
    /// `kubelet-identity-client-id`: the client id of the kubelet's identity, written into AKS nodes' bootstrap.
    pub kubelet_identity_client_id: String,
    /// `network-security-group`: the node resource group's network security group (`aks-agentpool-<id>-nsg`), for AKS nodes' bootstrap.
    pub network_security_group: String,
    /// `azure-custom-data-file`: A file of custom data (a `#cloud-config` or a `#!` script) the azure provider's VMs boot with instead of AKS's bootstrap, for self-managed Kubernetes on Azure.
    pub azure_custom_data_file: String,
    /// The simulated-node provider's InstanceCatalog file (`None`: its built-in catalog).
    pub kwok_catalog: Option<String>,
    /// How long a simulated node takes to appear.
    pub kwok_registration_delay: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        match Self::from_values(
            &SETTINGS.iter().map(|s| (s.key, s.default.to_owned(), Source::Default)).collect::<Vec<_>>(),
        ) {
            Ok(s) => s,
            Err(e) => unreachable!("built-in defaults parse: {e}"),
        }
    }
}

/// A setting's resolved value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The definition.
    pub spec: SettingSpec,
    /// The value as text.
    pub value: String,
    /// Where it came from.
    pub source: Source,
}

/// The settings together with where each came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The parsed settings.
    pub settings: Settings,
    /// Every setting with its value and source, in [`SETTINGS`] order.
    pub resolved: Vec<Resolved>,
}

fn canonical(key: &str) -> String {
    key.trim().to_ascii_lowercase().replace('-', "_")
}

fn spec_for(key: &str) -> Option<&'static SettingSpec> {
    let k = canonical(key);
    SETTINGS.iter().find(|s| canonical(s.key) == k)
}

fn value_text(key: &str, source: &str, v: Value) -> Result<String, SettingsError> {
    match v.kind {
        ValueKind::Table(t) => {
            // `feature-gates: {SpotToSpotConsolidation: true}`
            let mut parts = Vec::new();
            for (k, v) in t {
                parts.push(format!("{k}={}", value_text(key, source, v)?));
            }
            Ok(parts.join(","))
        }
        ValueKind::Array(_) => Err(err(key, source, "expected a single value, got a list")),
        ValueKind::Nil => Ok(String::new()),
        _ => v.into_string().map_err(|e| err(key, source, e.to_string())),
    }
}

/// Reads the settings from the defaults, an optional file, the given environment and flag overrides
/// (`key=value`, either spelling of the key).
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    flags: &[(String, String)],
) -> Result<Loaded, SettingsError> {
    let mut layered: BTreeMap<&'static str, (String, Source)> =
        SETTINGS.iter().map(|s| (s.key, (s.default.to_owned(), Source::Default))).collect();

    if let Some(path) = file {
        for (key, value) in file_values(path)? {
            layered.insert(key, (value, Source::File));
        }
    }

    let wanted: BTreeMap<String, String> =
        env.into_iter().filter(|(k, _)| SETTINGS.iter().any(|s| s.env == k)).collect();
    if !wanted.is_empty() {
        let env_map: std::collections::HashMap<String, String> = wanted.into_iter().collect();
        let cfg = Config::builder()
            .add_source(Environment::default().source(Some(env_map)).try_parsing(false))
            .build()
            .map_err(|e| err("environment", "env", e.to_string()))?;
        let table = cfg
            .try_deserialize::<std::collections::HashMap<String, Value>>()
            .map_err(|e| err("environment", "env", e.to_string()))?;
        for (key, value) in table {
            if let Some(spec) = spec_for(&key) {
                layered.insert(spec.key, (value_text(spec.env, "env", value)?, Source::Environment));
            }
        }
    }

    for (key, value) in flags {
        let spec = spec_for(key).ok_or_else(|| err(key, "flag", "unknown setting"))?;
        layered.insert(spec.key, (value.clone(), Source::Flag));
    }

    let values: Vec<(&'static str, String, Source)> =
        SETTINGS.iter().map(|s| (s.key, layered[s.key].0.clone(), layered[s.key].1)).collect();
    let settings = Settings::from_values(&values)?;
    let resolved =
        SETTINGS.iter().zip(values).map(|(spec, (_, value, source))| Resolved { spec: *spec, value, source }).collect();
    Ok(Loaded { settings, resolved })
}

/// The settings a file (YAML, TOML or JSON, by its extension) sets, as `(key, value)` pairs: each key a
/// known setting's (`max-consolidation-replacements`, whichever spelling the file used) and each value
/// in the text form flags take. Lets a caller layer a
/// file where it wants it (the simulator puts `--config` over a scenario's own settings).
pub fn file_values(path: &Path) -> Result<Vec<(&'static str, String)>, SettingsError> {
    let shown = path.display().to_string();
    let cfg = Config::builder()
        .add_source(File::from(path).required(true))
        .build()
        .map_err(|e| err(&shown, "file", e.to_string()))?;
    let table = cfg.try_deserialize::<BTreeMap<String, Value>>().map_err(|e| err(&shown, "file", e.to_string()))?;
    table
        .into_iter()
        .map(|(key, value)| {
            let spec = spec_for(&key).ok_or_else(|| err(&key, &shown, "unknown setting"))?;
            Ok((spec.key, value_text(spec.key, &shown, value)?))
        })
        .collect()
}

/// Reads the settings from the defaults, an optional file, the process environment and flag overrides.
pub fn load_from_process(file: Option<&Path>, flags: &[(String, String)]) -> Result<Loaded, SettingsError> {
    load(file, std::env::vars(), flags)
}

impl Settings {
    fn from_values(values: &[(&'static str, String, Source)]) -> Result<Self, SettingsError> {
        let get = |key: &str| -> (&SettingSpec, &str, Source) {
            let spec = spec_for(key).unwrap_or_else(|| unreachable!("{key} is a known setting"));
            let (_, v, src) =
                values.iter().find(|(k, _, _)| *k == spec.key).unwrap_or_else(|| unreachable!("{key} resolved"));
            (spec, v.as_str(), *src)
        };
        let name = |spec: &SettingSpec, src: Source| {
            if src == Source::Environment { spec.env } else { spec.key }
        };
        let duration = |key: &str| {
            let (spec, v, src) = get(key);
            parse_go_duration(v).map_err(|e| err(name(spec, src), src, e))
        };
        let boolean = |key: &str| {
            let (spec, v, src) = get(key);
            parse_bool(v).map_err(|e| err(name(spec, src), src, e))
        };
        let count = |key: &str| {
            let (spec, v, src) = get(key);
            v.trim()
                .parse::<u32>()
                .map_err(|_| err(name(spec, src), src, format!("{v:?} is not a non-negative integer")))
        };
        let port = |key: &str| {
            let (spec, v, src) = get(key);
            v.trim().parse::<u16>().map_err(|_| err(name(spec, src), src, format!("{v:?} is not a port number")))
        };
        let percent = |key: &str| {
            let (spec, v, src) = get(key);
            parse_percent(v).map_err(|e| err(name(spec, src), src, e))
        };
        let one_of = |key: &str| {
            let (spec, v, src) = get(key);
            match spec.kind {
                Kind::OneOf(options) if options.contains(&v.trim()) => Ok(v.trim().to_owned()),
                Kind::OneOf(options) => {
                    Err(err(name(spec, src), src, format!("{v:?} is not one of {}", options.join(", "))))
                }
                _ => Ok(v.to_owned()),
            }
        };
        let (gates_spec, gates, gates_src) = get("feature-gates");
        let (init_spec, init, init_src) = get("nodeclaim-initialization-timeout");
        Ok(Self {
            cluster_name: get("cluster-name").1.to_owned(),
            batch_idle_duration: duration("batch-idle-duration")?,
            batch_max_duration: duration("batch-max-duration")?,
            launch_timeout: duration("launch-timeout")?,
            registration_timeout: duration("registration-timeout")?,
            nodeclaim_initialization_timeout: parse_optional_duration(init)
                .map_err(|e| err(name(init_spec, init_src), init_src, e))?,
            feature_gates: FeatureGates::parse(gates).map_err(|e| err(name(gates_spec, gates_src), gates_src, e))?,
            consolidation_split_fallback: boolean("consolidation-split-fallback")?,
            max_consolidation_replacements: count("max-consolidation-replacements")?,
            consolidation_split_max_attempts: count("consolidation-split-max-attempts")?,
            consolidation_split_min_savings: percent("consolidation-split-min-savings")?,
            marginal_cost_packing: boolean("marginal-cost-packing")?,
            od_to_spot_consolidation: boolean("od-to-spot-consolidation")?,
            spot_to_spot_min_instance_types: count("spot-to-spot-min-instance-types")?,
            consolidation_replace_min_savings: percent("consolidation-replace-min-savings")?,
            disruption_poll_period: duration("disruption-poll-period")?,
            command_validation_delay: duration("command-validation-delay")?,
            single_node_consolidation_timeout: duration("single-node-consolidation-timeout")?,
            multi_node_consolidation_timeout: duration("multi-node-consolidation-timeout")?,
            unavailable_offerings_ttl: duration("unavailable-offerings-ttl")?,
            orphan_instance_grace: duration("orphan-instance-grace")?,
            vanished_instance_grace: duration("vanished-instance-grace")?,
            max_instance_types: count("max-instance-types")?,
            preference_policy: if one_of("preference-policy")? == "Ignore" {
                PreferencePolicy::Ignore
            } else {
                PreferencePolicy::Respect
            },
            min_values_best_effort: one_of("min-values-policy")? == "BestEffort",
            log_level: one_of("log-level")?,
            providers: get("providers")
                .1
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
            leader_election_name: get("leader-election-name").1.trim().to_owned(),
            disable_leader_election: boolean("disable-leader-election")?,
            metrics_port: port("metrics-port")?,
            health_probe_port: port("health-probe-port")?,
            interruption_queue: Some(get("interruption-queue").1.trim().to_owned()).filter(|q| !q.is_empty()),
            vm_memory_overhead: percent("vm-memory-overhead-percent")?,
            cluster_endpoint: Some(get("cluster-endpoint").1.trim().to_owned()).filter(|q| !q.is_empty()),
            cluster_ca_bundle: Some(get("cluster-ca-bundle").1.trim().to_owned()).filter(|q| !q.is_empty()),
            cluster_service_cidr: Some(get("cluster-service-cidr").1.trim().to_owned()).filter(|q| !q.is_empty()),
            isolated_vpc: boolean("isolated-vpc")?,
            project_id: Some(get("project-id").1.trim().to_owned()).filter(|q| !q.is_empty()),
            cluster_location: Some(get("cluster-location").1.trim().to_owned()).filter(|q| !q.is_empty()),
            default_nodepool_service_account: Some(get("default-nodepool-service-account").1.trim().to_owned())
                .filter(|q| !q.is_empty()),
            default_nodepool_template_name: Some(get("default-nodepool-template-name").1.trim().to_owned())
                .filter(|q| !q.is_empty()),
            azure_subscription_id: get("azure-subscription-id").1.trim().to_owned(),
            azure_node_resource_group: get("azure-node-resource-group").1.trim().to_owned(),
            azure_location: get("azure-location").1.trim().to_owned(),
            azure_tenant_id: get("azure-tenant-id").1.trim().to_owned(),
            vnet_subnet_id: get("vnet-subnet-id").1.trim().to_owned(),
            network_plugin: get("network-plugin").1.trim().to_owned(),
            network_plugin_mode: get("network-plugin-mode").1.trim().to_owned(),
            network_policy: get("network-policy").1.trim().to_owned(),
            dns_service_ip: get("dns-service-ip").1.trim().to_owned(),
            ssh_public_key: get("ssh-public-key").1.trim().to_owned(),
            node_identities: get("node-identities").1.trim().to_owned(),
            kubelet_identity_client_id: get("kubelet-identity-client-id").1.trim().to_owned(),
            network_security_group: get("network-security-group").1.trim().to_owned(),
            azure_custom_data_file: get("azure-custom-data-file").1.trim().to_owned(),
            kwok_catalog: Some(get("kwok-catalog").1.trim().to_owned()).filter(|c| !c.is_empty()),
            kwok_registration_delay: duration("kwok-registration-delay")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn defaults_match_the_specification() {
        let s = Settings::default();
        assert_eq!(s.batch_idle_duration, Duration::from_secs(1));
        assert_eq!(s.batch_max_duration, Duration::from_secs(10));
        assert_eq!(s.registration_timeout, Duration::from_secs(15 * 60));
        assert_eq!(s.launch_timeout, Duration::from_secs(5 * 60));
        assert_eq!(s.nodeclaim_initialization_timeout, None);
        assert!(!s.feature_gates.spot_to_spot_consolidation());
        assert!(!s.feature_gates.node_repair());
        assert!(!s.consolidation_split_fallback);
        assert_eq!(s.max_consolidation_replacements, 1);
        assert!((s.consolidation_split_min_savings - 0.05).abs() < 1e-12);
        assert!(s.od_to_spot_consolidation);
        assert_eq!(s.spot_to_spot_min_instance_types, 15);
        assert_eq!(s.consolidation_replace_min_savings, 0.0);
        assert_eq!(s.max_instance_types, 600);
    }

    #[test]
    fn every_setting_has_a_screaming_snake_case_environment_name() {
        for spec in SETTINGS {
            assert_eq!(spec.env, spec.key.to_ascii_uppercase().replace('-', "_"), "{}", spec.key);
            assert!(!spec.doc.is_empty());
        }
    }

    #[test]
    fn layers_defaults_file_environment_flags_in_that_order() {
        let dir = std::env::temp_dir().join(format!("tenon-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tenon.yaml");
        std::fs::write(
            &file,
            "max-consolidation-replacements: 3\nSPOT_TO_SPOT_MIN_INSTANCE_TYPES: 4\nconsolidation-split-fallback: true\nfeature-gates:\n  SpotToSpotConsolidation: true\n",
        )
        .unwrap();
        let loaded = load(
            Some(&file),
            env(&[
                ("SPOT_TO_SPOT_MIN_INSTANCE_TYPES", "7"),
                ("NODECLAIM_INITIALIZATION_TIMEOUT", "30m"),
                ("PATH", "/bin"),
            ]),
            &[("spot-to-spot-min-instance-types".into(), "9".into())],
        )
        .unwrap();
        let s = &loaded.settings;
        assert_eq!(s.max_consolidation_replacements, 3);
        assert!(s.consolidation_split_fallback);
        assert!(s.feature_gates.spot_to_spot_consolidation());
        assert_eq!(s.spot_to_spot_min_instance_types, 9, "flags beat the environment, which beats the file");
        assert_eq!(s.nodeclaim_initialization_timeout, Some(Duration::from_secs(1800)));
        let source = |k: &str| loaded.resolved.iter().find(|r| r.spec.key == k).unwrap().source;
        assert_eq!(source("max-consolidation-replacements"), Source::File);
        assert_eq!(source("nodeclaim-initialization-timeout"), Source::Environment);
        assert_eq!(source("spot-to-spot-min-instance-types"), Source::Flag);
        assert_eq!(source("launch-timeout"), Source::Default);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn feature_gates_parse_name_value_lists() {
        let loaded =
            load(None, env(&[("FEATURE_GATES", "SpotToSpotConsolidation=true, NodeRepair=true")]), &[]).unwrap();
        assert!(loaded.settings.feature_gates.spot_to_spot_consolidation());
        assert!(loaded.settings.feature_gates.node_repair());
        assert!(loaded.settings.feature_gates.enabled("ReservedCapacity"), "unnamed gates keep their defaults");
    }

    #[test]
    fn bad_values_name_the_key_and_source() {
        let e = load(None, env(&[("MAX_CONSOLIDATION_REPLACEMENTS", "two")]), &[]).unwrap_err();
        assert_eq!(e.key, "MAX_CONSOLIDATION_REPLACEMENTS");
        assert_eq!(e.origin, "env");
        let e = load(None, env(&[("FEATURE_GATES", "Teleport=true")]), &[]).unwrap_err();
        assert!(e.message.contains("Teleport"), "{e}");
        // Karpenter's own gates carry over, those tenon lacks ignored.
        let gates = "NodeRepair=false,ReservedCapacity=true,SpotToSpotConsolidation=false,NodeOverlay=false,StaticCapacity=false,CapacityBuffer=false";
        assert!(load(None, env(&[("FEATURE_GATES", gates)]), &[]).is_ok());
        let e = load(None, env(&[("FEATURE_GATES", "CapacityBuffer=maybe")]), &[]).unwrap_err();
        assert_eq!(e.key, "FEATURE_GATES");
        let e = load(None, env(&[]), &[("consolidation-split-min-savings".into(), "150%".into())]).unwrap_err();
        assert_eq!(e.key, "consolidation-split-min-savings");
        let e = load(None, env(&[]), &[("no-such-thing".into(), "1".into())]).unwrap_err();
        assert_eq!(e.message, "unknown setting");
        let e = load(None, env(&[("LAUNCH_TIMEOUT", "5 minutes")]), &[]).unwrap_err();
        assert_eq!(e.key, "LAUNCH_TIMEOUT");
    }

    #[test]
    fn percentages_accept_percent_or_fraction() {
        assert_eq!(parse_percent("5%").unwrap(), 0.05);
        assert_eq!(parse_percent("0.2").unwrap(), 0.2);
        assert!(parse_percent("20").is_err());
    }
}
