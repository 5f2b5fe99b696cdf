//! Provisioning: pending pods into NodeClaims.
//!
//! A [`Batcher`] opens a window on the first pending pod and closes it after a second without new ones
//! (or ten seconds at most); one scheduling pass then runs over the pending pods plus the pods of nodes
//! being deleted, against existing nodes, claims in flight and the NodePools. Its new claims become
//! [`NodeClaim`]s, and the pods are nominated to the capacity so the next batch does not buy it twice.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use jiff::Timestamp;

use crate::api::{NodeClaim, NodeClaimResources, NodeClaimSpec, NodePool, labels};
use crate::clock;
use crate::cloud::InstanceType;
use crate::resources::Resources;
use crate::scheduling::{ClaimPlan, PoolInput, Results, Scheduler, SchedulerOptions};
use crate::settings::{PreferencePolicy, Settings};
use crate::state::ClusterState;

/// Groups pod events into batches: a window opens on the first event and closes after `idle` without a
/// new one, or `max` after it opened.
#[derive(Debug, Clone)]
pub struct Batcher {
    idle: Duration,
    max: Duration,
    opened: Option<Timestamp>,
    last: Option<Timestamp>,
}

impl Batcher {
    /// A batcher with the given windows.
    pub fn new(idle: Duration, max: Duration) -> Self {
        Self { idle, max, opened: None, last: None }
    }

    /// A batcher with the settings' `batch-idle-duration` and `batch-max-duration`.
    pub fn from_settings(s: &Settings) -> Self {
        Self::new(s.batch_idle_duration, s.batch_max_duration)
    }

    /// Records a pending-pod event.
    pub fn trigger(&mut self, now: Timestamp) {
        self.opened.get_or_insert(now);
        self.last = Some(now);
    }

    /// Whether a window is open.
    pub fn is_open(&self) -> bool {
        self.opened.is_some()
    }

    /// When the open window closes, if nothing else arrives.
    pub fn deadline(&self) -> Option<Timestamp> {
        let (opened, last) = (self.opened?, self.last?);
        Some(clock::add(last, self.idle).min(clock::add(opened, self.max)))
    }

    /// Whether the open window has closed at `now`.
    pub fn ready(&self, now: Timestamp) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }

    /// Closes the window after its batch was taken.
    pub fn reset(&mut self) {
        self.opened = None;
        self.last = None;
    }
}

/// Pods nominated to capacity that is on its way, so they are not provisioned twice.
#[derive(Debug, Clone, Default)]
pub struct Nominations {
    until: HashMap<String, (String, Timestamp)>,
}

impl Nominations {
    /// How long a nomination holds: twice the batch maximum, at least ten seconds.
    pub fn window(settings: &Settings) -> Duration {
        (settings.batch_max_duration * 2).max(Duration::from_secs(10))
    }

    /// Nominates `pod` to `target` until `until`.
    pub fn nominate(&mut self, pod: &str, target: &str, until: Timestamp) {
        self.until.insert(pod.to_owned(), (target.to_owned(), until));
    }

    /// Where `pod` is nominated at `now`.
    pub fn target(&self, pod: &str, now: Timestamp) -> Option<&str> {
        self.until.get(pod).filter(|(_, until)| *until > now).map(|(t, _)| t.as_str())
    }

    /// The targets (node or claim names) pods are nominated to at `now`.
    pub fn targets(&self, now: Timestamp) -> impl Iterator<Item = &str> {
        self.until.values().filter(move |(_, until)| *until > now).map(|(t, _)| t.as_str())
    }

    /// Drops the nominations to `target` (a claim whose create failed).
    pub fn release(&mut self, target: &str) {
        self.until.retain(|_, (t, _)| t != target);
    }

    /// Drops nominations that have run out, and those to targets that no longer exist.
    pub fn expire(&mut self, now: Timestamp, exists: impl Fn(&str) -> bool) {
        self.until.retain(|_, (target, until)| *until > now && exists(target));
    }
}

/// Each NodePool's instance types as the decisions read them, with the unavailable offerings applied. The
/// caller keeps them behind one `Arc` per pool while they are unchanged, so a pass copies none of them.
pub type TypesFor<'a> = dyn Fn(&NodePool) -> std::sync::Arc<[InstanceType]> + 'a;

/// The scheduler's view of the pools: each with its instance types and what it already holds.
pub fn pool_inputs(state: &ClusterState, types_for: &TypesFor<'_>) -> Vec<PoolInput> {
    state
        .pools
        .iter()
        .filter(|p| p.spec.replicas.is_none() && p.metadata.deletion_timestamp.is_none())
        .map(|pool| {
            let nodes: Vec<_> = state.pool_nodes(pool.name()).filter(|n| !n.deleting).collect();
            let in_use =
                nodes.iter().fold(Resources::ZERO, |acc, n| acc.add(n.capacity.as_ref().unwrap_or(&n.allocatable)));
            PoolInput { pool: pool.clone(), instance_types: types_for(pool), in_use, nodes_in_use: nodes.len() as u64 }
        })
        .collect()
}

/// The claim a static NodePool (`spec.replicas`) adds to keep its count: its template's requirements, and
/// the instance types of `types` they allow, cheapest first (at most `max_types`). `None` when no type
/// is allowed.
pub fn static_claim_plan(pool: &NodePool, types: &[InstanceType], max_types: usize) -> Option<ClaimPlan> {
    use crate::scheduling::{Launch, allowed_types, offering_ok, template_requirements};
    let reqs = template_requirements(pool);
    let mut priced: Vec<(f64, &InstanceType)> = allowed_types(&reqs, types)
        .into_iter()
        .filter_map(|it| {
            let cheapest =
                it.offerings.iter().filter(|o| offering_ok(o, &reqs)).map(|o| o.price).min_by(f64::total_cmp);
            cheapest.map(|p| (p, it))
        })
        .collect();
    priced.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
    priced.truncate(max_types.max(1));
    let (_, first) = priced.first()?;
    let launch = first.offerings.iter().filter(|o| offering_ok(o, &reqs)).min_by(|a, b| a.price.total_cmp(&b.price));
    let worst = priced
        .iter()
        .flat_map(|(_, it)| it.offerings.iter().filter(|o| offering_ok(o, &reqs)).map(|o| o.price))
        .fold(0.0_f64, f64::max);
    Some(ClaimPlan {
        pool: pool.name().to_owned(),
        pods: Vec::new(),
        instance_types: priced.iter().map(|(_, it)| std::sync::Arc::from(it.name.as_str())).collect(),
        types: priced.iter().map(|(_, it)| std::sync::Arc::new((*it).clone())).collect(),
        requirements: reqs.clone(),
        requests: Resources::ZERO,
        daemon_overhead: Resources::ZERO,
        launch: launch.map(|o| Launch {
            instance_type: first.name.clone(),
            zone: o.zone.clone(),
            capacity_type: o.capacity_type,
            price: o.price,
        }),
        worst_case_price: worst,
        min_values_relaxed: false,
    })
}

/// Scheduler options from the settings.
pub fn scheduler_options(settings: &Settings) -> SchedulerOptions {
    SchedulerOptions {
        max_instance_types: settings.max_instance_types as usize,
        ignore_preferences: settings.preference_policy == PreferencePolicy::Ignore,
        price_ceiling: None,
        marginal_cost_packing: settings.marginal_cost_packing,
        min_values_best_effort: settings.min_values_best_effort,
    }
}

/// One provisioning pass: the pending pods and the pods of deleting nodes, minus those nominated at `now`,
/// against the cluster and its pools.
pub fn schedule(
    state: &ClusterState,
    types_for: &TypesFor<'_>,
    nominations: &Nominations,
    settings: &Settings,
    now: Timestamp,
) -> Results {
    let pods = state
        .pods_to_place()
        .filter(|p| nominations.target(&p.info.key, now).is_none())
        .map(|p| std::sync::Arc::clone(&p.info))
        .collect();
    let nodes = state.nodes.iter().map(|n| n.as_existing()).collect();
    Scheduler::with_bound_on_nodes(
        pool_inputs(state, types_for),
        nodes,
        &state.bound_on_nodes(),
        &state.daemons,
        scheduler_options(settings),
    )
    .solve_shared(pods)
}

/// What one provisioning pass decided: the NodeClaims to create, and the scheduling results behind them.
#[derive(Debug, Clone)]
pub struct Provisioned {
    /// NodeClaims to create, one per planned claim, in order.
    pub claims: Vec<NodeClaim>,
    /// The pass's results.
    pub results: Results,
}

/// Runs one provisioning pass and turns its plans into NodeClaims named by `name_for(pool)`, nominating
/// every placed pod (to its new claim or existing node) so the next batch does not buy for it again.
pub fn provision(
    state: &ClusterState,
    types_for: &TypesFor<'_>,
    nominations: &mut Nominations,
    settings: &Settings,
    now: Timestamp,
    name_for: &mut dyn FnMut(&str) -> String,
) -> Provisioned {
    let results = schedule(state, types_for, nominations, settings, now);
    let until = clock::add(now, Nominations::window(settings));
    let mut claims = Vec::with_capacity(results.claims.len());
    for plan in &results.claims {
        let Some(pool) = state.pool(&plan.pool) else { continue };
        let name = name_for(pool.name());
        for pod in &plan.pods {
            nominations.nominate(pod, &name, until);
        }
        claims.push(node_claim(plan, pool, &name));
    }
    for placed in &results.existing {
        for pod in &placed.pods {
            nominations.nominate(pod, &placed.node, until);
        }
    }
    Provisioned { claims, results }
}

/// The NodeClaim to create for a planned claim of `pool`.
pub fn node_claim(plan: &ClaimPlan, pool: &NodePool, name: &str) -> NodeClaim {
    let template = &pool.spec.template;
    let requests = plan.requests.add(&plan.daemon_overhead);
    let mut claim = NodeClaim::new(
        name,
        NodeClaimSpec {
            taints: template.spec.taints.clone(),
            startup_taints: template.spec.startup_taints.clone(),
            requirements: plan.node_claim_requirements().to_api(),
            resources: NodeClaimResources { requests: requests.to_resource_list() },
            node_class_ref: template.spec.node_class_ref.clone(),
            expire_after: template.spec.expire_after,
            termination_grace_period: template.spec.termination_grace_period,
        },
    );
    let mut claim_labels: BTreeMap<String, String> = template.metadata.labels.clone();
    claim_labels.insert(labels::NODE_POOL.to_owned(), pool.name().to_owned());
    claim.metadata.labels = Some(claim_labels);
    let mut annotations = template.metadata.annotations.clone();
    annotations.insert(labels::NODEPOOL_HASH.to_owned(), pool.template_hash());
    annotations.insert(labels::NODEPOOL_HASH_VERSION.to_owned(), crate::api::TEMPLATE_HASH_VERSION.to_owned());
    if plan.min_values_relaxed {
        annotations.insert(labels::NODECLAIM_MIN_VALUES_RELAXED.to_owned(), "true".to_owned());
    }
    claim.metadata.annotations = Some(annotations);
    claim.metadata.finalizers = Some(vec![labels::TERMINATION_FINALIZER.to_owned()]);
    // Owned by its pool, so deleting the pool cascades to its claims (a pool read from a file has no UID).
    if let Some(uid) = &pool.metadata.uid {
        claim.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "karpenter.sh/v1".into(),
            kind: "NodePool".into(),
            name: pool.name().to_owned(),
            uid: uid.clone(),
            block_owner_deletion: Some(true),
            controller: None,
        }]);
    }
    claim
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Timestamp {
        clock::add(Timestamp::UNIX_EPOCH, Duration::from_secs(secs))
    }

    #[test]
    fn batch_window_closes_after_idle_or_max() {
        let mut b = Batcher::new(Duration::from_secs(1), Duration::from_secs(10));
        assert!(!b.ready(at(100)));
        b.trigger(at(0));
        assert!(!b.ready(at(0)));
        assert!(b.ready(at(1)), "one idle second closes it");
        // A steady stream keeps it open until the maximum.
        let mut b = Batcher::new(Duration::from_secs(1), Duration::from_secs(10));
        for t in 0..20 {
            b.trigger(clock::add(at(0), Duration::from_millis(t * 500)));
            if b.ready(clock::add(at(0), Duration::from_millis(t * 500 + 1))) {
                assert_eq!(t, 20);
            }
        }
        assert_eq!(b.deadline(), Some(at(10)), "ten seconds after the first pod at most");
        b.reset();
        assert!(!b.is_open());
    }

    #[test]
    fn nominated_pods_are_not_bought_for_twice() {
        use crate::api::{NodePoolSpec, labels};
        use crate::cloud::fake::FakeCloud;
        use k8s_openapi::api::core::v1::Pod;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
        }))
        .unwrap();
        let pool = NodePool::new("default", NodePoolSpec::default());
        let state = ClusterState::from_objects(&[pod], &[], &[], &[], &[], &[pool], at(0)).unwrap();
        let settings = Settings::default();
        let mut nominations = Nominations::default();
        let mut n = 0;
        let mut name = |pool: &str| {
            n += 1;
            format!("{pool}-{n}")
        };
        let types = |_: &NodePool| FakeCloud::default_catalog().into();
        let first = provision(&state, &types, &mut nominations, &settings, at(0), &mut name);
        assert_eq!(first.claims.len(), 1);
        let claim = &first.claims[0];
        assert_eq!(claim.name(), "default-1");
        assert_eq!(claim.node_pool(), Some("default"));
        assert!(claim.spec.requirements.iter().any(|r| r.key == labels::INSTANCE_TYPE));
        assert!(claim.annotation(labels::NODEPOOL_HASH).is_some());
        // The next batch, while the claim boots, sees the pod nominated and buys nothing.
        let second = provision(&state, &types, &mut nominations, &settings, at(5), &mut name);
        assert!(second.claims.is_empty());
        // Once the nomination runs out, the still-pending pod is provisioned again.
        let third = provision(&state, &types, &mut nominations, &settings, at(25), &mut name);
        assert_eq!(third.claims.len(), 1);
    }

    #[test]
    fn nominations_expire() {
        let mut n = Nominations::default();
        n.nominate("default/a", "claim-1", at(20));
        assert_eq!(n.target("default/a", at(19)), Some("claim-1"));
        assert_eq!(n.target("default/a", at(20)), None);
        n.expire(at(5), |t| t != "claim-1");
        assert_eq!(n.target("default/a", at(6)), None, "its claim is gone");
        assert_eq!(Nominations::window(&Settings::default()), Duration::from_secs(20));
    }
}
