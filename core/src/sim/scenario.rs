//! Scenario files for `tenon simulate`: a workload, a catalog, NodePools and events, replayed in virtual
//! time against the real controllers, with a cost report.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Kubelet, Sim};
use crate::api::{KubeDuration, NodePool, labels};
use crate::clock::{self, Clock, VirtualClock};
use crate::cloud::fake::FakeCloud;
use crate::cloud::{CapacityType, InstanceType, InterruptionKind, OfferingKey};
use crate::disruption::queue::{Event, Outcome};
use crate::scheduling::workload::Rng;
use crate::settings::{self, Settings};
use crate::snapshot::Snapshot;

/// A scenario that cannot be run, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct ScenarioError {
    /// The scenario file.
    pub file: String,
    /// The field.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// How many replicas a deployment wants over time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase", deny_unknown_fields)]
pub enum Replicas {
    /// Always this many.
    Constant(u32),
    /// Step changes: `[{at: 2h, replicas: 10}, …]`.
    Steps(Vec<Step>),
    /// A daily curve between `min` and `max`, peaking at `peakHour` (UTC).
    Diurnal {
        /// Replicas at the trough.
        min: u32,
        /// Replicas at the peak.
        max: u32,
        /// Hour of the peak (0–23).
        #[serde(default = "default_peak")]
        peak_hour: u32,
    },
}

fn default_peak() -> u32 {
    14
}

/// One step of a [`Replicas::Steps`] schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// From when.
    pub at: KubeDuration,
    /// How many.
    pub replicas: u32,
}

/// A deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Deployment {
    /// Name.
    pub name: String,
    /// Replica schedule.
    pub replicas: Replicas,
    /// CPU request per pod.
    pub cpu: String,
    /// Memory request per pod.
    #[serde(default = "default_memory")]
    pub memory: String,
    /// GPUs per pod.
    #[serde(default)]
    pub gpus: u32,
    /// Spread replicas across zones (maxSkew 1).
    #[serde(default)]
    pub zone_spread: bool,
    /// Extra pod spec fields (nodeSelector, tolerations, affinity…), merged into every pod.
    #[serde(default)]
    pub pod_spec: serde_json::Value,
}

fn default_memory() -> String {
    "1Gi".into()
}

/// A stream of batch jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Jobs {
    /// Name prefix.
    pub name: String,
    /// One job arrives this often.
    pub every: KubeDuration,
    /// The first arrives at.
    #[serde(default)]
    pub start: KubeDuration,
    /// How many arrive in all.
    pub count: u32,
    /// How long each runs once scheduled.
    pub duration: KubeDuration,
    /// CPU per job.
    pub cpu: String,
    /// Memory per job.
    #[serde(default = "default_memory")]
    pub memory: String,
    /// GPUs per job.
    #[serde(default)]
    pub gpus: u32,
    /// Marked `karpenter.sh/do-not-disrupt: "true"` (training jobs that cannot move).
    #[serde(default)]
    pub do_not_disrupt: bool,
    /// Extra pod spec fields.
    #[serde(default)]
    pub pod_spec: serde_json::Value,
}

/// A DaemonSet: one pod on every node it fits (its `podSpec` carries the nodeSelector, affinity and
/// tolerations that choose them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DaemonSetWorkload {
    /// Name.
    pub name: String,
    /// CPU per pod.
    pub cpu: String,
    /// Memory per pod.
    #[serde(default = "default_memory")]
    pub memory: String,
    /// Extra pod spec fields.
    #[serde(default)]
    pub pod_spec: serde_json::Value,
}

impl DaemonSetWorkload {
    /// The DaemonSet object.
    pub fn to_daemon_set(&self) -> Result<DaemonSet, String> {
        let pod =
            pod_from(&self.name, &self.cpu, &self.memory, 0, json!({"app": self.name}), &self.pod_spec, json!({}))?;
        let ds = serde_json::from_value::<DaemonSet>(json!({
            "metadata": {"name": self.name, "namespace": "default", "uid": format!("ds-{}", self.name)},
            "spec": {"selector": {"matchLabels": {"app": self.name}},
                "template": {"metadata": {"labels": {"app": self.name}}, "spec": pod.spec}}
        }))
        .map_err(|e| e.to_string())?;
        crate::state::daemon_pod(&ds).map_err(|e| e.to_string())?;
        Ok(ds)
    }
}

/// A workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Workload {
    /// A DaemonSet.
    DaemonSet(DaemonSetWorkload),
    /// A deployment.
    Deployment(Deployment),
    /// Batch jobs.
    Jobs(Jobs),
}

/// Something that happens at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioEvent {
    /// When.
    pub at: KubeDuration,
    /// Make offerings run out of capacity.
    #[serde(default)]
    pub ice: Option<Ice>,
    /// Interrupt this share (0–1) of the spot nodes with the 2-minute notice.
    #[serde(default)]
    pub spot_interruptions: Option<f64>,
    /// Move spot prices: from now on, chosen spot offerings cost their catalog price times a factor.
    #[serde(default)]
    pub spot_price: Option<SpotPrice>,
    /// Answer the next launches with "not yet" (`LaunchDeferred`).
    #[serde(default)]
    pub defer_launches: Option<DeferLaunches>,
    /// From now on, when a claim allows spot but no spot offering can launch, the provider buys on-demand
    /// under a lease of this length, and the lease's expiry marks the node drifted.
    #[serde(default)]
    pub on_demand_leases: Option<KubeDuration>,
    /// Instances launched in a window whose kubelet never registers.
    #[serde(default)]
    pub registration_failures: Option<FailureWindow>,
    /// Instances launched in a window whose node registers but never turns Ready (so never initializes).
    #[serde(default)]
    pub readiness_failures: Option<FailureWindow>,
}

/// Deferred launches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeferLaunches {
    /// How many launches are deferred.
    pub count: usize,
    /// The retry the provider asks for.
    pub retry_after: KubeDuration,
}

/// A window in which some of the instances launched fail (never register, or never turn Ready).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailureWindow {
    /// The share (0–1) of instances launched in the window that fail.
    pub share: f64,
    /// How long the window lasts.
    pub duration: KubeDuration,
}

/// A spot price change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpotPrice {
    /// Instance types affected (all when empty).
    #[serde(default)]
    pub instance_types: Vec<String>,
    /// Zones affected (all when empty).
    #[serde(default)]
    pub zones: Vec<String>,
    /// The new price as a multiple of the catalog's spot price (1 restores it).
    pub factor: f64,
}

/// An insufficient-capacity window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ice {
    /// Instance types affected (all when empty).
    #[serde(default)]
    pub instance_types: Vec<String>,
    /// Zones affected (all when empty).
    #[serde(default)]
    pub zones: Vec<String>,
    /// Capacity type affected.
    pub capacity_type: CapacityType,
    /// For how long.
    pub duration: KubeDuration,
}

/// Kubelet delays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletSpec {
    /// From launch to registration.
    #[serde(default = "default_registration")]
    pub registration_delay: KubeDuration,
    /// From registration to GPUs reported.
    #[serde(default = "default_plugin")]
    pub device_plugin_delay: KubeDuration,
    /// Registration delays by instance family (the instance type's name up to its first `.`), replacing
    /// `registrationDelay` for those families: `{p4d: 6m, g5: 3m}`.
    #[serde(default)]
    pub registration_delay_by_family: BTreeMap<String, KubeDuration>,
}

fn default_registration() -> KubeDuration {
    KubeDuration::from_secs(90)
}

fn default_plugin() -> KubeDuration {
    KubeDuration::from_secs(45)
}

impl Default for KubeletSpec {
    fn default() -> Self {
        Self {
            registration_delay: default_registration(),
            device_plugin_delay: default_plugin(),
            registration_delay_by_family: BTreeMap::new(),
        }
    }
}

/// The scenario spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioSpec {
    /// How long to simulate.
    pub duration: KubeDuration,
    /// Random seed.
    #[serde(default)]
    pub seed: u64,
    /// Simulation step.
    #[serde(default = "default_step")]
    pub step: KubeDuration,
    /// Setting overrides (`KEY: value`, either spelling).
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Paths (relative to the scenario) of InstanceCatalog files.
    #[serde(default)]
    pub catalogs: Vec<String>,
    /// Inline instance types.
    #[serde(default)]
    pub instance_types: Vec<InstanceType>,
    /// NodePool manifests.
    pub node_pools: Vec<serde_json::Value>,
    /// Workloads.
    pub workloads: Vec<Workload>,
    /// Events.
    #[serde(default)]
    pub events: Vec<ScenarioEvent>,
    /// Kubelet delays.
    #[serde(default)]
    pub kubelet: KubeletSpec,
}

fn default_step() -> KubeDuration {
    KubeDuration::from_secs(30)
}

/// A loaded scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// Its spec.
    pub spec: ScenarioSpec,
    /// NodePools, validated.
    pub pools: Vec<NodePool>,
    /// Instance types, from the catalogs and inline.
    pub types: Vec<InstanceType>,
    /// Each workload's pod, checked when the scenario loaded (`None` for DaemonSets), in the order of
    /// `spec.workloads`.
    pub templates: Vec<Option<Pod>>,
    /// Each DaemonSet workload's DaemonSet, checked when the scenario loaded.
    pub daemon_sets: Vec<DaemonSet>,
}

impl Scenario {
    /// Loads and validates a scenario file; nothing runs if anything is wrong.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: path.display().to_string(),
            field: String::new(),
            message: e.to_string(),
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates a scenario's text, read from `path` (catalogs are found relative to it).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ScenarioError> {
        let file = path.display().to_string();
        let err = |field: &str, message: String| ScenarioError { file: file.clone(), field: field.into(), message };
        let value: serde_json::Value = serde_yaml_ng::from_str(text).map_err(|e| err("", format!("not YAML: {e}")))?;
        if value.get("kind").and_then(|k| k.as_str()) != Some("Scenario") {
            return Err(err("kind", "expected \"Scenario\"".into()));
        }
        let name = value.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or("scenario").to_owned();
        let spec_value = value.get("spec").cloned().unwrap_or_default();
        let spec: ScenarioSpec = serde_path_to_error::deserialize(&spec_value)
            .map_err(|e| err(&format!("spec.{}", e.path()), e.into_inner().to_string()))?;
        if spec.step.0.is_zero() {
            return Err(err("spec.step", "must be positive".into()));
        }
        let mut pools = Vec::new();
        for (i, v) in spec.node_pools.iter().enumerate() {
            let yaml = serde_yaml_ng::to_string(v).map_err(|e| err(&format!("spec.nodePools[{i}]"), e.to_string()))?;
            let pool = crate::api::parse_node_pool(&yaml)
                .map_err(|e| err(&format!("spec.nodePools[{i}].{}", e.field), e.message.clone()))?;
            pools.push(pool);
        }
        if pools.is_empty() {
            return Err(err("spec.nodePools", "at least one NodePool is needed".into()));
        }
        let base = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
        let files: Vec<PathBuf> = spec.catalogs.iter().map(|c| base.join(c)).collect();
        let snapshot = Snapshot::load_files(&files).map_err(|e| err("spec.catalogs", e.to_string()))?;
        let mut types = snapshot.instance_types();
        types.extend(spec.instance_types.iter().cloned());
        if types.is_empty() {
            return Err(err("spec.catalogs", "no instance types: name a catalog or list instanceTypes".into()));
        }
        let flags: Vec<(String, String)> = spec.settings.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        settings::load(None, Vec::new(), &flags).map_err(|e| err(&format!("spec.settings.{}", e.key), e.message))?;
        let mut templates = Vec::with_capacity(spec.workloads.len());
        let mut daemon_sets = Vec::new();
        // Deployments and jobs name their pods after themselves: two of one name would share pods.
        let mut named_pods: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, w) in spec.workloads.iter().enumerate() {
            let (kind, name) = match w {
                Workload::Deployment(d) => ("deployment", d.name.as_str()),
                Workload::Jobs(j) => ("jobs", j.name.as_str()),
                Workload::DaemonSet(_) => continue,
            };
            if let Some(first) = named_pods.insert(name, i) {
                return Err(err(
                    &format!("spec.workloads[{i}].{kind}.name"),
                    format!("{name:?} is already the name of spec.workloads[{first}]: each names its own pods"),
                ));
            }
        }
        for (i, w) in spec.workloads.iter().enumerate() {
            match w {
                Workload::DaemonSet(d) => {
                    let ds = d.to_daemon_set().map_err(|m| err(&format!("spec.workloads[{i}].daemonSet"), m))?;
                    daemon_sets.push(ds);
                    templates.push(None);
                }
                Workload::Deployment(d) => {
                    let at = format!("spec.workloads[{i}].deployment");
                    if let Replicas::Diurnal { min, max, peak_hour } = &d.replicas {
                        if min > max {
                            return Err(err(
                                &format!("{at}.replicas.diurnal"),
                                format!("min {min} is above max {max}"),
                            ));
                        }
                        if *peak_hour > 23 {
                            return Err(err(
                                &format!("{at}.replicas.diurnal.peakHour"),
                                format!("{peak_hour} is not an hour of the day (0-23)"),
                            ));
                        }
                    }
                    if let Replicas::Steps(steps) = &d.replicas
                        && let Some(k) = steps.windows(2).position(|w| w[1].at.0 < w[0].at.0)
                    {
                        return Err(err(
                            &format!("{at}.replicas.steps[{}].at", k + 1),
                            "steps must be in time order".into(),
                        ));
                    }
                    let spread = if d.zone_spread {
                        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": labels::ZONE,
                            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": d.name}}}]})
                    } else {
                        json!({})
                    };
                    let mut extra = d.pod_spec.clone();
                    if let (Some(e), Some(s)) = (extra.as_object_mut(), spread.as_object()) {
                        e.extend(s.clone());
                    } else if extra.is_null() {
                        extra = spread;
                    }
                    let pod = pod_from(&d.name, &d.cpu, &d.memory, d.gpus, json!({"app": d.name}), &extra, json!({}))
                        .map_err(|m| err(&at, m))?;
                    templates.push(Some(pod));
                }
                Workload::Jobs(j) => {
                    let at = format!("spec.workloads[{i}].jobs");
                    if j.count > 1 && j.every.0.is_zero() {
                        return Err(err(
                            &format!("{at}.every"),
                            "must be positive when more than one job arrives".into(),
                        ));
                    }
                    let annotations =
                        if j.do_not_disrupt { json!({labels::DO_NOT_DISRUPT: "true"}) } else { json!({}) };
                    let pod =
                        pod_from(&j.name, &j.cpu, &j.memory, j.gpus, json!({"job": j.name}), &j.pod_spec, annotations)
                            .map_err(|m| err(&at, m))?;
                    templates.push(Some(pod));
                }
            }
        }
        for (i, e) in spec.events.iter().enumerate() {
            for (field, f) in
                [("registrationFailures", &e.registration_failures), ("readinessFailures", &e.readiness_failures)]
            {
                if let Some(f) = f
                    && !(0.0..=1.0).contains(&f.share)
                {
                    return Err(err(
                        &format!("spec.events[{i}].{field}.share"),
                        format!("{} is not a share between 0 and 1", f.share),
                    ));
                }
            }
            if let Some(change) = &e.spot_price
                && !(change.factor.is_finite() && change.factor > 0.0)
            {
                return Err(err(
                    &format!("spec.events[{i}].spotPrice.factor"),
                    format!("{} is not a positive multiple", change.factor),
                ));
            }
            if let Some(f) = e.spot_interruptions
                && !(0.0..=1.0).contains(&f)
            {
                return Err(err(
                    &format!("spec.events[{i}].spotInterruptions"),
                    format!("{f} is not a share between 0 and 1"),
                ));
            }
        }
        Ok(Self { name, spec, pools, types, templates, daemon_sets })
    }

    /// The scenario's settings: `base` with its overrides.
    pub fn settings(&self, extra: &[(String, String)]) -> Result<Settings, settings::SettingsError> {
        let mut flags: Vec<(String, String)> = self.spec.settings.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        flags.extend(extra.iter().cloned());
        Ok(settings::load(None, Vec::new(), &flags)?.settings)
    }
}

/// What a run cost and did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The scenario.
    pub scenario: String,
    /// Simulated hours.
    pub hours: f64,
    /// Total cost in USD.
    pub total_cost: f64,
    /// Cost per hour by capacity type.
    pub cost_per_hour_by_capacity_type: BTreeMap<String, f64>,
    /// Node-hours.
    pub node_hours: f64,
    /// Seconds from a pod's creation to its binding: p50, p95, max.
    pub time_to_schedule_seconds: Percentiles,
    /// Nodes disrupted, by the method that proposed it; counted when the command completes (rejected and
    /// rolled-back commands disrupt nothing).
    pub disruptions: BTreeMap<String, u64>,
    /// Instances launched.
    pub launches: u64,
    /// Launch failures.
    pub launch_failures: u64,
    /// Deferred launches.
    pub launch_deferrals: u64,
    /// Pods evicted.
    pub pods_evicted: u64,
    /// Pods still pending at the end.
    pub pending_at_end: u64,
    /// A sample every simulated 10 minutes: time (hours), nodes, pending pods, cost per hour.
    pub timeline: Vec<Sample>,
    /// Every disruption decision.
    pub decisions: Vec<Decision>,
}

/// p50 / p95 / max.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// Maximum.
    pub max: f64,
}

/// A point of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// Hours since the start.
    pub hour: f64,
    /// Live nodes by capacity type.
    pub nodes: BTreeMap<String, u32>,
    /// Live nodes by instance type.
    pub nodes_by_instance_type: BTreeMap<String, u32>,
    /// Pending pods.
    pub pending: u32,
    /// Fleet cost per hour.
    pub cost_per_hour: f64,
}

/// A disruption decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Hours since the start.
    pub hour: f64,
    /// What happened.
    pub what: String,
}

/// A workload's pod, checked as the scheduler reads it: a bad quantity or pod spec field is an error
/// naming it.
fn pod_from(
    name: &str,
    cpu: &str,
    memory: &str,
    gpus: u32,
    labels_: serde_json::Value,
    extra: &serde_json::Value,
    annotations: serde_json::Value,
) -> Result<Pod, String> {
    if !(extra.is_null() || extra.is_object()) {
        return Err("podSpec: expected a mapping of pod spec fields".into());
    }
    for (field, q) in [("cpu", cpu), ("memory", memory)] {
        crate::resources::Resources::parse_quantity(field, q).map_err(|e| format!("{field}: {e}"))?;
    }
    let mut requests = json!({"cpu": cpu, "memory": memory});
    if gpus > 0 {
        requests["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    let mut spec = json!({"containers": [{"name": "main", "resources": {"requests": requests}}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    let value = json!({"metadata": {"name": name, "namespace": "default", "labels": labels_, "annotations": annotations}, "spec": spec});
    let pod: Pod = serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        let path = path.strip_prefix("spec.").map_or(path.clone(), |p| format!("podSpec.{p}"));
        format!("{path}: {}", e.into_inner())
    })?;
    crate::scheduling::PodInfo::from_pod(&pod).map_err(|e| e.to_string())?;
    Ok(pod)
}

/// A copy of a workload's pod template under another name.
fn named(template: &Pod, name: String) -> Pod {
    let mut p = template.clone();
    p.metadata.name = Some(name);
    p
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The catalog offerings of `capacity_type` an event names (every instance type or zone when its list is
/// empty).
fn offerings<'a>(
    types: &'a [InstanceType],
    instance_types: &'a [String],
    zones: &'a [String],
    capacity_type: CapacityType,
) -> impl Iterator<Item = (&'a InstanceType, &'a crate::cloud::Offering)> {
    types.iter().filter(move |t| instance_types.is_empty() || instance_types.contains(&t.name)).flat_map(move |t| {
        t.offerings
            .iter()
            .filter(move |o| o.capacity_type == capacity_type && (zones.is_empty() || zones.contains(&o.zone)))
            .map(move |o| (t, o))
    })
}

/// Whether something set for `at` happens in the step that ends at `elapsed`: the window
/// `(elapsed - step, elapsed]`, with the first step also taking what is set for the start.
fn due(at: Duration, elapsed: Duration, step: Duration) -> bool {
    at <= elapsed && (at + step > elapsed || elapsed <= step)
}

fn hours(since: Duration) -> f64 {
    since.as_secs_f64() / 3600.0
}

/// Runs a scenario with `settings`, calling `progress` every simulated hour.
pub async fn run(scenario: &Scenario, settings: Settings, progress: &mut dyn FnMut(&Report, usize, usize)) -> Report {
    let clock = VirtualClock::at_epoch();
    let start = clock.now();
    let cloud = Arc::new(FakeCloud::builder().name("sim").clock(clock.clone()).catalog(scenario.types.clone()).build());
    let mut sim = Sim::new(clock.clone(), cloud.clone(), scenario.pools.clone(), settings);
    sim.kubelet = Kubelet {
        registration_delay: scenario.spec.kubelet.registration_delay.0,
        device_plugin_delay: scenario.spec.kubelet.device_plugin_delay.0,
        registration_delay_by_family: scenario
            .spec
            .kubelet
            .registration_delay_by_family
            .iter()
            .map(|(f, d)| (f.clone(), d.0))
            .collect(),
    };
    for ds in &scenario.daemon_sets {
        // Checked when the scenario loaded.
        let _ = sim.add_daemon_set(ds.clone());
    }
    let mut rng = Rng::new(scenario.spec.seed);
    let step = scenario.spec.step.0;
    let total = scenario.spec.duration.0;
    let mut prices: BTreeMap<(String, String, CapacityType), f64> = scenario
        .types
        .iter()
        .flat_map(|t| t.offerings.iter().map(move |o| ((t.name.clone(), o.zone.clone(), o.capacity_type), o.price)))
        .collect();
    let mut report = Report { scenario: scenario.name.clone(), ..Report::default() };
    let mut created: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut waits: Vec<f64> = Vec::new();
    let mut job_started: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut job_keys: std::collections::HashSet<String> = std::collections::HashSet::new();
    // Jobs created and not yet bound: their clocks start when they bind.
    let mut jobs_unstarted: BTreeSet<String> = BTreeSet::new();
    let mut ice_until: Vec<(OfferingKey, Timestamp)> = Vec::new();
    let mut failing_registrations: Option<(Timestamp, f64)> = None;
    let mut failing_readiness: Option<(Timestamp, f64)> = None;
    let mut seen_instances: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut by_ct: BTreeMap<String, f64> = BTreeMap::new();
    // The method that proposed each node's disruption, until the command completes. The simulated cluster
    // names a node after its claim.
    let mut proposed: HashMap<String, String> = HashMap::new();
    // Each deployment's replicas that exist, by index (names are unique per workload, so the scenario's
    // own record matches what `sim.desired` holds of them).
    let mut replicas: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); scenario.spec.workloads.len()];
    let mut events_seen = 0;
    let steps = (total.as_secs() / step.as_secs().max(1)) as usize;
    for i in 0..steps {
        clock.advance(step);
        let now = clock.now();
        let elapsed = clock::since(now, start);
        // Workloads.
        for ((w, template), have) in scenario.spec.workloads.iter().zip(&scenario.templates).zip(&mut replicas) {
            let Some(template) = template else { continue };
            match w {
                Workload::Deployment(d) => {
                    let want = match &d.replicas {
                        Replicas::Constant(n) => *n,
                        Replicas::Steps(steps) => {
                            steps.iter().filter(|s| s.at.0 <= elapsed).map(|s| s.replicas).next_back().unwrap_or(0)
                        }
                        Replicas::Diurnal { min, max, peak_hour } => {
                            let hour = (elapsed.as_secs_f64() / 3600.0) % 24.0;
                            let phase = (hour - f64::from(*peak_hour)) / 24.0 * std::f64::consts::TAU;
                            let level = (phase.cos() + 1.0) / 2.0;
                            // Checked when the scenario loaded: min <= max.
                            min + ((f64::from(max.saturating_sub(*min))) * level).round() as u32
                        }
                    };
                    // Replicas below `want` are created, those from `want` up to twice it removed, in index
                    // order; only the missing and the present are touched.
                    let missing: Vec<u32> = (0..want).filter(|r| !have.contains(r)).collect();
                    for r in missing {
                        sim.add_pod(named(template, format!("{}-{r}", d.name)));
                        created.insert(format!("default/{}-{r}", d.name), now);
                        have.insert(r);
                    }
                    let extra: Vec<u32> = have.range(want..want.max(1) * 2).copied().collect();
                    for r in extra {
                        sim.remove_pod(&format!("default/{}-{r}", d.name));
                        have.remove(&r);
                    }
                }
                Workload::DaemonSet(_) => {}
                Workload::Jobs(j) => {
                    for n in 0..j.count {
                        let arrive = j.start.0 + j.every.0 * n;
                        let key = format!("default/{}-{n}", j.name);
                        if due(arrive, elapsed, step) && !job_keys.contains(&key) {
                            sim.add_pod(named(template, format!("{}-{n}", j.name)));
                            created.insert(key.clone(), now);
                            job_keys.insert(key.clone());
                            jobs_unstarted.insert(key.clone());
                        }
                        if let Some(started) = job_started.get(&key)
                            && clock::since(now, *started) >= j.duration.0
                        {
                            sim.remove_pod(&key);
                            job_started.remove(&key);
                        }
                    }
                }
            }
        }
        // Events.
        for e in &scenario.spec.events {
            if !due(e.at.0, elapsed, step) {
                continue;
            }
            if let Some(ice) = &e.ice {
                for (t, o) in offerings(&scenario.types, &ice.instance_types, &ice.zones, ice.capacity_type) {
                    let key = o.key(&t.name);
                    cloud.exhaust_offering(key.clone());
                    ice_until.push((key, clock::add(now, ice.duration.0)));
                }
            }
            if let Some(change) = &e.spot_price {
                for (t, o) in offerings(&scenario.types, &change.instance_types, &change.zones, CapacityType::Spot) {
                    let price = o.price * change.factor;
                    cloud.update_offering(&o.key(&t.name), |live| live.price = price);
                    prices.insert((t.name.clone(), o.zone.clone(), o.capacity_type), price);
                }
            }
            if let Some(d) = &e.defer_launches {
                cloud.defer_launches(d.count, d.retry_after.0, "capacity is being provisioned");
            }
            if let Some(lease) = &e.on_demand_leases {
                cloud.fallback_to_on_demand_under_lease(lease.0);
            }
            if let Some(f) = &e.registration_failures {
                failing_registrations = Some((clock::add(now, f.duration.0), f.share));
            }
            if let Some(f) = &e.readiness_failures {
                failing_readiness = Some((clock::add(now, f.duration.0), f.share));
            }
            if let Some(share) = e.spot_interruptions {
                for inst in cloud.instances().iter().filter(|i| i.capacity_type == CapacityType::Spot) {
                    if (rng.below(1000) as f64) < share * 1000.0 {
                        cloud.announce(&inst.provider_id, InterruptionKind::SpotInterruption);
                    }
                }
            }
        }
        ice_until.retain(|(key, until)| {
            if *until <= now {
                cloud.clear_offering_failure(key);
                false
            } else {
                true
            }
        });
        sim.tick().await;
        // Instances launched in a registration-failure window may never register.
        cloud.for_each_instance(|inst| {
            if seen_instances.contains(&inst.provider_id) {
                return;
            }
            seen_instances.insert(inst.provider_id.clone());
            let hit = |window: Option<(Timestamp, f64)>, rng: &mut Rng| {
                window.is_some_and(|(until, share)| now < until && (rng.below(1000) as f64) < share * 1000.0)
            };
            if hit(failing_registrations, &mut rng) {
                sim.never_register.insert(inst.provider_id.clone());
            } else if hit(failing_readiness, &mut rng) {
                sim.never_ready.insert(inst.provider_id.clone());
            }
        });
        // Bookkeeping: binding waits and job clocks, for the pods that just bound (those still waiting are
        // few; the bound ones, a whole fleet).
        let pods = sim.api.lock().pods.clone();
        let bound =
            |key: &str| pods.get(key).is_some_and(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
        created.retain(|key, c| {
            let waiting = !bound(key);
            if !waiting {
                waits.push(clock::since(now, *c).as_secs_f64());
            }
            waiting
        });
        jobs_unstarted.retain(|key| {
            let waiting = !bound(key);
            if !waiting {
                job_started.insert(key.clone(), now);
            }
            waiting
        });
        let mut rate = 0.0;
        let mut nodes_by_ct: BTreeMap<String, u32> = BTreeMap::new();
        let mut nodes_by_it: BTreeMap<String, u32> = BTreeMap::new();
        cloud.for_each_instance(|inst| {
            let price = prices
                .get(&(inst.instance_type.clone(), inst.zone.clone(), inst.capacity_type))
                .copied()
                .unwrap_or(0.0);
            rate += price;
            *by_ct.entry(inst.capacity_type.to_string()).or_default() += price * hours(step);
            *nodes_by_ct.entry(inst.capacity_type.to_string()).or_default() += 1;
            *nodes_by_it.entry(inst.instance_type.clone()).or_default() += 1;
            report.node_hours += hours(step);
        });
        report.total_cost += rate * hours(step);
        for (at, e) in &sim.events[events_seen..] {
            let hour = hours(clock::since(*at, start));
            let what = match e {
                Event::Started { nodes, why, .. } => Some(format!("started disruption of {}: {why}", nodes.join(", "))),
                Event::Rejected { nodes, reason } => {
                    Some(format!("rejected disruption of {}: {reason}", nodes.join(", ")))
                }
                Event::Finished(Outcome::Completed { claims, replacements }) => {
                    // A disruption counts once done: proposals rejected on validation and commands rolled
                    // back disrupted nothing.
                    for c in claims {
                        if let Some(method) = proposed.remove(c) {
                            *report.disruptions.entry(method).or_default() += 1;
                        }
                    }
                    Some(format!(
                        "replaced {} with {}",
                        claims.join(", "),
                        if replacements.is_empty() { "nothing".into() } else { replacements.join(", ") }
                    ))
                }
                Event::Finished(Outcome::RolledBack { nodes, reason }) => {
                    Some(format!("rolled back {}: {reason}", nodes.join(", ")))
                }
                Event::Proposed { method, nodes } => {
                    for n in nodes {
                        proposed.insert(n.clone(), format!("{method:?}"));
                    }
                    None
                }
                Event::Reboot { node, .. } => Some(format!("rebooted {node}")),
                Event::CleanedUp { node } => Some(format!("removed the disrupted taint no command holds from {node}")),
                Event::RepairBlocked { node, message, .. } => Some(format!("repair of {node} blocked: {message}")),
            };
            if let Some(what) = what {
                report.decisions.push(Decision { hour, what });
            }
        }
        events_seen = sim.events.len();
        if elapsed.as_secs() % 600 < step.as_secs() {
            report.timeline.push(Sample {
                hour: hours(elapsed),
                nodes: nodes_by_ct,
                nodes_by_instance_type: nodes_by_it,
                pending: sim.pending().len() as u32,
                cost_per_hour: rate,
            });
        }
        if elapsed.as_secs() % 3600 < step.as_secs() {
            report.hours = hours(elapsed);
            progress(&report, i, steps);
        }
    }
    report.hours = hours(total);
    for (ct, cost) in by_ct {
        report.cost_per_hour_by_capacity_type.insert(ct, cost / report.hours.max(1e-9));
    }
    waits.sort_by(f64::total_cmp);
    report.time_to_schedule_seconds = Percentiles {
        p50: percentile(&waits, 0.5),
        p95: percentile(&waits, 0.95),
        max: waits.last().copied().unwrap_or(0.0),
    };
    let c = &sim.runtime.lifecycle.counters;
    report.launches = c.launched;
    report.launch_failures = c.launch_failures;
    report.launch_deferrals = c.launch_deferrals;
    report.pods_evicted = sim.api.lock().evicted.len() as u64;
    report.pending_at_end = sim.pending().len() as u64;
    report
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::due;

    #[test]
    fn each_moment_falls_in_exactly_one_step() {
        let step = Duration::from_secs(30);
        for at in [0, 1, 29, 30, 31, 59, 60, 3600] {
            let at = Duration::from_secs(at);
            let hits = (1..=200).filter(|i| due(at, step * *i, step)).count();
            assert_eq!(hits, 1, "{at:?}");
        }
    }
}
