//! Which nodes may be disrupted, and at what cost: the gates of the disruption ladder.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use rustc_hash::FxHashMap;

use crate::api::{ConditionStatus, DisruptionReason, NodePool, condition_types, labels};
use crate::clock;
use crate::cloud::{CapacityType, InstanceType};
use crate::scheduling::{Requirements, Selector, taints};
use crate::state::{ClusterState, StateNode, StatePod};

/// The drift reason a provider's lease reclaim uses.
pub const ON_DEMAND_LEASE_EXPIRED: &str = "OnDemandLeaseExpired";

/// A node that may be disrupted.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Index into [`ClusterState::nodes`].
    pub index: usize,
    /// The node's name.
    pub node: String,
    /// The claim's name.
    pub claim: String,
    /// The NodePool.
    pub pool: String,
    /// The price per hour of its own offering (instance type, zone, capacity type).
    pub price: f64,
    /// Its capacity type.
    pub capacity_type: Option<CapacityType>,
    /// Its instance type.
    pub instance_type: String,
    /// Indexes into [`ClusterState::pods`] of the pods that would have to move.
    pub pods: Vec<usize>,
    /// The cost of moving them (pod count weighted by priority and `karpenter.sh/disruption-cost`, scaled
    /// by the node's remaining lifetime).
    pub disruption_cost: f64,
    /// What disrupting the node costs to the Balanced policy's score: [`reschedule_cost`] of its pods.
    pub reschedule_cost: f64,
    /// Why it drifted, if it did.
    pub drift: Option<String>,
    /// Whether `consolidateAfter` has elapsed since its last pod event.
    pub consolidatable: bool,
    /// Why consolidation may not consider it (policy, `consolidateAfter`), if anything.
    pub consolidation_block: Option<String>,
}

impl Candidate {
    /// Whether no pod would have to move.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Savings per unit of disruption: price ÷ disruption cost.
    pub fn savings_ratio(&self) -> f64 {
        self.price / self.disruption_cost.max(1e-9)
    }

    /// Whether its drift is an expired on-demand lease.
    pub fn lease_expired(&self) -> bool {
        self.drift.as_deref() == Some(ON_DEMAND_LEASE_EXPIRED)
    }
}

/// A node that was considered and left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Blocked {
    /// The node.
    pub node: String,
    /// Why, for a person.
    pub reason: String,
}

/// A pod's eviction cost: 1, plus its `karpenter.sh/disruption-cost` (scaled by 2^-27) and its priority
/// (scaled by 2^-25), clamped to [-10, 10].
pub fn pod_cost(pod: &StatePod) -> f64 {
    eviction_cost(&pod.info.key, &pod.info.annotations, pod.info.priority)
}

/// [`pod_cost`] of a Kubernetes pod.
pub fn kube_pod_cost(pod: &k8s_openapi::api::core::v1::Pod) -> f64 {
    let key = crate::cluster::pod_key(pod);
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    eviction_cost(&key, pod.metadata.annotations.as_ref().unwrap_or(&Default::default()), priority)
}

fn eviction_cost(key: &str, annotations: &std::collections::BTreeMap<String, String>, priority: i32) -> f64 {
    let mut cost = 1.0;
    if let Some(v) = annotations.get(labels::DISRUPTION_COST) {
        match v.trim().parse::<i32>() {
            Ok(c) => cost += f64::from(c) / 2f64.powi(27),
            Err(_) => tracing::warn!(pod = %key, value = %v, "failed parsing disruption cost"),
        }
    }
    cost += f64::from(priority) / 2f64.powi(25);
    cost.clamp(-10.0, 10.0)
}

/// What disrupting a node running `pods` (those that would have to move) costs to the Balanced policy:
/// 1 for the node itself plus each pod's eviction cost where it is positive, as Karpenter weighs it.
pub fn reschedule_cost<'p>(pods: impl IntoIterator<Item = &'p StatePod>) -> f64 {
    1.0 + pods.into_iter().map(|p| pod_cost(p).max(0.0)).sum::<f64>()
}

/// Whether a `karpenter.sh/do-not-disrupt` annotation on the pod holds at `now`
/// ([`crate::cluster::do_not_disrupt_active`]). Finished and terminating pods never hold their node;
/// DaemonSet and mirror pods do, as Karpenter lets them.
pub fn do_not_disrupt(pod: &StatePod, now: Timestamp) -> bool {
    !pod.terminal
        && !pod.terminating
        && crate::cluster::do_not_disrupt_active(&pod.info.annotations, pod.start_time, now)
}

/// How many more pods `pdb` allows to be evicted: its status when present, otherwise computed from its
/// spec against the pods it selects.
pub fn pdb_allowed(pdb: &PodDisruptionBudget, state: &ClusterState) -> i32 {
    let ns = pdb.metadata.namespace.as_deref().unwrap_or("default");
    let selector = Selector::from_label_selector(pdb.spec.as_ref().and_then(|s| s.selector.as_ref()));
    let selected: Vec<&StatePod> = state
        .pods
        .iter()
        .filter(|p| p.info.namespace == ns && !p.terminal && selector.matches(&p.info.labels))
        .collect();
    let expected = selected.len() as i32;
    let healthy = selected.iter().filter(|p| p.pdb_healthy).count() as i32;
    crate::cluster::pdb_disruptions_allowed(pdb, expected, healthy)
}

/// A PDB of a state as [`blocking_pdb`] reads it, worked out once per pass.
#[derive(Debug, Clone)]
pub struct PdbAllowance {
    /// Its index among the state's PDBs.
    pub index: usize,
    /// How many more evictions it allows ([`pdb_allowed`]).
    pub allowed: i32,
    /// Its label selector.
    pub selector: Selector,
}

/// Every PDB of `state` with the evictions it allows and its selector, for [`blocking_pdb`].
pub fn pdb_allowances(state: &ClusterState) -> Vec<PdbAllowance> {
    state
        .pdbs
        .iter()
        .enumerate()
        .map(|(index, p)| PdbAllowance {
            index,
            allowed: pdb_allowed(p, state),
            selector: Selector::from_label_selector(p.spec.as_ref().and_then(|s| s.selector.as_ref())),
        })
        .collect()
}

/// Why a PDB forbids evicting one of `pods` (indexes into the state's pods), if one does, as Karpenter's
/// `CanEvictPods` judges each pod: pods the drain leaves (finished, terminating, mirror pods, those
/// tolerating `karpenter.sh/disrupted`) never block; a pod two PDBs select blocks, as the Eviction API
/// refuses it; a pod one PDB selects blocks when that PDB allows no disruption, unless the PDB's
/// `unhealthyPodEvictionPolicy` is `AlwaysAllow` and the pod is not Ready. DaemonSet pods count.
/// `allowed` holds the PDBs considered ([`pdb_allowances`]).
pub fn blocking_pdb(pods: &[usize], state: &ClusterState, allowed: &[PdbAllowance]) -> Option<String> {
    if allowed.is_empty() {
        return None;
    }
    let disrupted = taints::taint(labels::DISRUPTED_TAINT, None, "NoSchedule");
    let name = |pi: usize| {
        let pdb = &state.pdbs[pi];
        format!(
            "{}/{}",
            pdb.metadata.namespace.as_deref().unwrap_or("default"),
            pdb.metadata.name.as_deref().unwrap_or_default()
        )
    };
    for &i in pods {
        let pod = &state.pods[i];
        if pod.terminal
            || pod.terminating
            || pod.static_pod
            || pod.info.tolerations.iter().any(|t| taints::tolerates(t, &disrupted))
        {
            continue;
        }
        let matching: Vec<(usize, i32)> = allowed
            .iter()
            .filter(|a| {
                let pdb = &state.pdbs[a.index];
                pdb.metadata.namespace.as_deref().unwrap_or("default") == pod.info.namespace
                    && a.selector.matches(&pod.info.labels)
            })
            .map(|a| (a.index, a.allowed))
            .collect();
        match matching.as_slice() {
            [] => {}
            [(pi, left)] => {
                let always_allow =
                    state.pdbs[*pi].spec.as_ref().and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
                        == Some("AlwaysAllow");
                if *left < 1 && !(always_allow && pod.not_ready) {
                    return Some(format!("pdb {} prevents pod evictions", name(*pi)));
                }
            }
            several => {
                let names: Vec<String> = several.iter().map(|(pi, _)| name(*pi)).collect();
                return Some(format!(
                    "pod {} is selected by several PDBs ({}), and eviction does not support multiple PDBs",
                    pod.info.key,
                    names.join(", ")
                ));
            }
        }
    }
    None
}

/// The drift reason of a node whose instance type or offering its provider no longer lists.
pub const INSTANCE_TYPE_NOT_FOUND: &str = "InstanceTypeNotFound";

/// Why a node drifted from its pool, if it did: the claim's `Drifted` condition (set by the provider or a
/// lease expiry), a changed template hash, or requirements the node no longer satisfies. Behavioural
/// fields (weight, limits, disruption) never drift.
pub fn drift_reason(node: &StateNode, pool: &NodePool) -> Option<String> {
    drift_from(node, &Template::of(pool))
}

/// What drift is judged against, read once per pool for all of its nodes.
struct Template {
    /// [`NodePool::drift_hash`].
    hash: (String, String),
    /// The template's requirements.
    requirements: Requirements,
}

impl Template {
    fn of(pool: &NodePool) -> Self {
        Self { hash: pool.drift_hash(), requirements: Requirements::from_api(&pool.spec.template.spec.requirements) }
    }
}

fn drift_from(node: &StateNode, template: &Template) -> Option<String> {
    let claim = node.claim.as_ref()?;
    if let Some(c) = claim.condition(condition_types::DRIFTED)
        && c.status == ConditionStatus::True
    {
        return Some(if c.reason.is_empty() { "Drifted".into() } else { c.reason.clone() });
    }
    if !node.inferred_claim && crate::api::template_drifted_from(claim, &template.hash) {
        return Some("NodePoolDrifted".into());
    }
    for r in template.requirements.iter() {
        let ok = match node.labels.get(r.key()) {
            Some(v) => r.has(v),
            None => r.matches(None) || labels::is_well_known(r.key()),
        };
        if !ok {
            return Some("RequirementsDrifted".into());
        }
    }
    None
}

/// When `consolidateAfter` counts from: the claim's `lastPodEventTime`, else when it became Initialized
/// (as Karpenter counts), else when the claim (or node) was created.
pub fn last_pod_event(node: &StateNode) -> Option<Timestamp> {
    let claim = node.claim.as_ref();
    claim
        .and_then(|c| c.status.as_ref().and_then(|s| s.last_pod_event_time))
        .or_else(|| {
            claim
                .and_then(|c| c.condition(condition_types::INITIALIZED))
                .filter(|c| c.status == ConditionStatus::True)
                .and_then(|c| c.last_transition_time)
        })
        .or_else(|| claim.and_then(|c| c.metadata.creation_timestamp.as_ref().map(|t| t.0)))
        .or_else(|| node.node.as_ref().and_then(|n| n.metadata.creation_timestamp.as_ref().map(|t| t.0)))
}

/// The remaining fraction of a node's life under `expireAfter` (1 when it never expires).
fn lifetime_remaining(node: &StateNode, now: Timestamp) -> f64 {
    node.claim.as_ref().map_or(1.0, |c| claim_lifetime_remaining(c, now))
}

/// The share of a claim's `expireAfter` still ahead of it at `now`, in [0, 1]; 1 when it never expires.
pub fn claim_lifetime_remaining(claim: &crate::api::NodeClaim, now: Timestamp) -> f64 {
    let Some(expire) = claim.spec.expire_after.duration() else { return 1.0 };
    let Some(created) = claim.metadata.creation_timestamp.as_ref().map(|t| t.0) else { return 1.0 };
    let age = clock::since(now, created);
    if expire.is_zero() {
        return 0.0;
    }
    (1.0 - age.as_secs_f64() / expire.as_secs_f64()).clamp(0.0, 1.0)
}

/// Every managed, initialized node with the gates that apply to all methods checked; the rest are
/// returned as blocked with their reason.
pub fn candidates(
    state: &ClusterState,
    types_for: &crate::provisioning::TypesFor<'_>,
    now: Timestamp,
) -> (Vec<Candidate>, Vec<Blocked>) {
    let pdb_allowed = pdb_allowances(state);
    let mut out = Vec::new();
    let mut blocked = Vec::new();
    // Each pool's instance types, with the first of each name by name.
    type ByName = FxHashMap<String, usize>;
    let mut types_cache: std::collections::HashMap<String, (Arc<[InstanceType]>, ByName)> =
        std::collections::HashMap::new();
    let mut templates: std::collections::HashMap<&str, Template> = std::collections::HashMap::new();
    for (index, node) in state.nodes.iter().enumerate() {
        let Some(pool_name) = node.pool.as_deref() else { continue };
        let Some(claim) = node.claim.as_ref() else { continue };
        let block = |reason: String| Blocked { node: node.name.clone(), reason };
        let Some(pool) = state.pool(pool_name) else {
            blocked.push(block(format!("NodePool {pool_name} does not exist")));
            continue;
        };
        if node.deleting {
            continue;
        }
        if !node.initialized {
            blocked.push(block("node is not initialized".into()));
            continue;
        }
        if node.nominated {
            blocked.push(block("node is nominated for a pending pod".into()));
            continue;
        }
        if rebooting(node) {
            blocked.push(block("node is rebooting for repair".into()));
            continue;
        }
        if node
            .node
            .as_ref()
            .and_then(|n| n.metadata.annotations.as_ref())
            .and_then(|a| a.get(labels::DO_NOT_DISRUPT))
            .map(String::as_str)
            == Some("true")
        {
            blocked.push(block(format!("node is annotated {}", labels::DO_NOT_DISRUPT)));
            continue;
        }
        let pods: Vec<usize> = node.pods.iter().copied().filter(|i| state.pods[*i].reschedulable()).collect();
        let drift = drift_from(node, templates.entry(pool_name).or_insert_with(|| Template::of(pool)));
        // A claim with a termination grace period may drift past blocking pods.
        let forceful_drift = drift.is_some() && claim.spec.termination_grace_period.is_some();
        if !forceful_drift {
            // Every pod of the node counts here, DaemonSet and mirror pods too.
            if let Some(p) = node.pods.iter().map(|i| &state.pods[*i]).find(|p| do_not_disrupt(p, now)) {
                blocked.push(block(format!("pod {} has {}", p.info.key, labels::DO_NOT_DISRUPT)));
                continue;
            }
            if let Some(why) = blocking_pdb(&node.pods, state, &pdb_allowed) {
                blocked.push(block(why));
                continue;
            }
        }
        let (types, by_name) = types_cache.entry(pool_name.to_owned()).or_insert_with(|| {
            let types = types_for(pool);
            let mut by_name = FxHashMap::default();
            for (i, t) in types.iter().enumerate() {
                by_name.entry(t.name.clone()).or_insert(i);
            }
            (types, by_name)
        });
        // A node with no known price can still drift and be emptied; only consolidation, which weighs
        // prices, leaves it. One whose instance type or offering its provider no longer lists has drifted
        // (`InstanceTypeNotFound`), as Karpenter has it; with no types at all (the provider could not be
        // read), nothing is known to be gone.
        let price =
            node.label(labels::INSTANCE_TYPE).and_then(|n| by_name.get(n)).and_then(|i| node.price_of_type(&types[*i]));
        let drift = match (&drift, price) {
            (None, None) if !types.is_empty() => Some(INSTANCE_TYPE_NOT_FOUND.to_owned()),
            _ => drift,
        };
        let disruption_cost =
            pods.iter().map(|i| pod_cost(&state.pods[*i])).sum::<f64>() * lifetime_remaining(node, now);
        let timing_block = match pool.spec.disruption.consolidate_after.duration() {
            None => Some("consolidation is disabled for its NodePool (consolidateAfter: Never)".to_owned()),
            Some(after) => match last_pod_event(node) {
                Some(t) if clock::since(now, t) < after => Some(format!(
                    "a pod event {} ago is within consolidateAfter {}",
                    crate::api::format_duration(Duration::from_secs(clock::since(now, t).as_secs())),
                    crate::api::format_duration(after)
                )),
                _ => None,
            },
        };
        out.push(Candidate {
            index,
            node: node.name.clone(),
            claim: claim.name().to_owned(),
            pool: pool_name.to_owned(),
            price: price.unwrap_or(0.0),
            capacity_type: node.capacity_type(),
            instance_type: node.label(labels::INSTANCE_TYPE).unwrap_or_default().to_owned(),
            reschedule_cost: reschedule_cost(pods.iter().map(|i| &state.pods[*i])),
            pods,
            disruption_cost,
            drift,
            consolidatable: timing_block.is_none(),
            consolidation_block: timing_block
                .or_else(|| price.is_none().then(|| "its offering has no known price".into())),
        });
    }
    (out, blocked)
}

/// Whether a repair reboot holds the node (it carries `karpenter.sh/rebooting`).
fn rebooting(node: &StateNode) -> bool {
    node.taints.iter().any(|t| t.key == labels::REBOOTING_TAINT)
}

/// Per-pool disruption allowances for one reason at `now`.
pub fn allowances(
    state: &ClusterState,
    reason: DisruptionReason,
    now: Timestamp,
) -> Vec<(String, u64, Option<String>)> {
    state
        .pools
        .iter()
        .map(|pool| {
            // As Karpenter counts a budget: managed, initialized nodes whose instance is not already
            // terminating. Claims still launching or booting are neither in the total nor NotReady, so
            // disruption does not stall while a pool scales up.
            let nodes: Vec<&StateNode> = state
                .pool_nodes(pool.name())
                .filter(|n| {
                    n.initialized && n.claim.as_ref().is_some_and(|c| !c.is_true(condition_types::INSTANCE_TERMINATING))
                })
                .collect();
            let total = nodes.len() as u64;
            // A node rebooting for repair is being disrupted, as one being deleted is.
            let deleting = nodes.iter().filter(|n| n.deleting || rebooting(n)).count() as u64;
            let not_ready = nodes.iter().filter(|n| !n.ready && !n.deleting).count() as u64;
            let allowed = pool.allowed_disruptions(reason, now, total, deleting, not_ready).unwrap_or(0);
            let until = (allowed == 0).then(|| budget_until(pool, reason, now)).flatten();
            (pool.name().to_owned(), allowed, until)
        })
        .collect()
}

/// When the scheduled budget holding `reason` at zero ends, as `HH:MMZ`.
fn budget_until(pool: &NodePool, reason: DisruptionReason, now: Timestamp) -> Option<String> {
    pool.spec.disruption.budgets.iter().filter(|b| b.applies_to(reason) && b.schedule.is_some()).find_map(|b| {
        let (Some(schedule), Some(duration)) = (&b.schedule, &b.duration) else { return None };
        if !b.is_active(now).unwrap_or(false) {
            return None;
        }
        let cron = crate::api::parse_schedule(schedule).ok()?;
        let start = cron
            .find_previous_occurrence(&clock::add(now, Duration::from_secs(1)).to_zoned(jiff::tz::TimeZone::UTC), true)
            .ok()?;
        let end = clock::add(start.timestamp(), duration.0);
        Some(end.to_zoned(jiff::tz::TimeZone::UTC).strftime("%H:%MZ").to_string())
    })
}
