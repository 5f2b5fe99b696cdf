//! `karpenter.sh/v1` NodePool.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::{self, Condition, ConditionStatus};
use super::duration::{KubeDuration, NillableDuration};
use super::labels;
use super::requirements::NodeSelectorRequirement;

/// The desired state of a NodePool: the claims it may create and how they may be disrupted.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodePool",
    plural = "nodepools",
    shortname = "np",
    derive = "PartialEq",
    status = "NodePoolStatus",
    doc = "A NodePool sets constraints on the nodes tenon creates and the pods that can run on them.",
    printcolumn = r#"{"name":"NodeClass","type":"string","jsonPath":".spec.template.spec.nodeClassRef.name"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".spec.weight","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// The template of the NodeClaims this pool creates.
    #[serde(default)]
    pub template: NodeClaimTemplate,
    /// How nodes of this pool may be disrupted.
    #[serde(default)]
    pub disruption: Disruption,
    /// Ceilings on the total resources of this pool's nodes (`cpu`, `memory`, `nvidia.com/gpu`, `nodes`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    /// Priority among pools: higher weights are tried first (1–100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// For static pools: the number of nodes to keep, whatever the pods need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
}

/// Labels and annotations stamped on every node of the pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct TemplateMetadata {
    /// Labels for the node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl TemplateMetadata {
    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// The NodeClaim template of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct NodeClaimTemplate {
    /// Labels and annotations for the nodes.
    #[serde(default, skip_serializing_if = "TemplateMetadata::is_empty")]
    pub metadata: TemplateMetadata,
    /// The claim spec.
    #[serde(default)]
    pub spec: NodeClaimTemplateSpec,
}

fn default_expire_after() -> NillableDuration {
    NillableDuration::from_secs(720 * 3600)
}

/// What every claim of the pool asks for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplateSpec {
    /// Taints every node carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Taints a node carries while it boots; something else removes them, and the node is not initialized
    /// until they are gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    /// Constraints on the nodes' labels (instance types, zones, capacity types, architectures, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<NodeSelectorRequirement>,
    /// The provider-specific NodeClass; it also routes the pool to its provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_ref: Option<NodeClassRef>,
    /// How long a node lives before it is drained and replaced (default `720h`; `Never` disables).
    #[serde(default = "default_expire_after")]
    pub expire_after: NillableDuration,
    /// How long a draining node may wait for its pods before they are deleted forcefully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<KubeDuration>,
}

impl Default for NodeClaimTemplateSpec {
    fn default() -> Self {
        Self {
            taints: Vec::new(),
            startup_taints: Vec::new(),
            requirements: Vec::new(),
            node_class_ref: None,
            expire_after: default_expire_after(),
            termination_grace_period: None,
        }
    }
}

/// A reference to a NodeClass object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub struct NodeClassRef {
    /// The API group, e.g. `karpenter.k8s.aws`.
    pub group: String,
    /// The kind, e.g. `EC2NodeClass`.
    pub kind: String,
    /// The object's name.
    pub name: String,
}

impl fmt::Display for NodeClassRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} {:?}", self.group, self.kind, self.name)
    }
}

/// Which nodes consolidation may act on.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum ConsolidationPolicy {
    /// Only empty nodes are removed.
    WhenEmpty,
    /// Any node that can be removed or replaced for less.
    #[default]
    WhenEmptyOrUnderutilized,
    /// Moves whose savings outweigh the disruption they cause.
    Balanced,
}

impl fmt::Display for ConsolidationPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::WhenEmpty => "WhenEmpty",
            Self::WhenEmptyOrUnderutilized => "WhenEmptyOrUnderutilized",
            Self::Balanced => "Balanced",
        })
    }
}

/// Why a node is disrupted; budgets may apply to some reasons only.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum DisruptionReason {
    /// Consolidation found a cheaper arrangement.
    Underutilized,
    /// The node runs no pods that cost anything to move.
    Empty,
    /// The node no longer matches its pool or NodeClass.
    Drifted,
    /// Node repair replaces an unhealthy node.
    Unhealthy,
}

impl DisruptionReason {
    /// The reason as Kubernetes writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Underutilized => "Underutilized",
            Self::Empty => "Empty",
            Self::Drifted => "Drifted",
            Self::Unhealthy => "Unhealthy",
        }
    }
}

impl fmt::Display for DisruptionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_budgets() -> Vec<Budget> {
    vec![Budget::default()]
}

fn default_consolidate_after() -> NillableDuration {
    NillableDuration::from_secs(0)
}

/// A pool's disruption settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// Which nodes consolidation may act on.
    #[serde(default)]
    pub consolidation_policy: ConsolidationPolicy,
    /// How long a node must go without pod events before consolidation considers it; `Never` disables it.
    #[serde(default = "default_consolidate_after")]
    pub consolidate_after: NillableDuration,
    /// Rate limits on voluntary disruption (default: one budget of `nodes: 10%`).
    #[serde(default = "default_budgets")]
    pub budgets: Vec<Budget>,
}

impl Default for Disruption {
    fn default() -> Self {
        Self {
            consolidation_policy: ConsolidationPolicy::default(),
            consolidate_after: default_consolidate_after(),
            budgets: default_budgets(),
        }
    }
}

fn default_budget_nodes() -> String {
    "10%".into()
}

/// A disruption budget: at most `nodes` of the pool disrupted at once, for `reasons`, while `schedule` is
/// active.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct Budget {
    /// A count (`"5"`) or a percentage of the pool's nodes (`"20%"`, rounded up).
    #[serde(default = "default_budget_nodes")]
    pub nodes: String,
    /// The reasons the budget applies to; none means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<DisruptionReason>,
    /// A cron schedule (UTC, five fields or `@daily`-style macros) at which the budget becomes active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// How long the budget stays active after each scheduled start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<KubeDuration>,
}

impl Default for Budget {
    fn default() -> Self {
        Self { nodes: default_budget_nodes(), reasons: Vec::new(), schedule: None, duration: None }
    }
}

/// The `nodes` value of a budget, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetNodes {
    /// A fixed count.
    Count(u64),
    /// A percentage of the pool, rounded up.
    Percent(u64),
}

impl FromStr for BudgetNodes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err =
            || format!("invalid value {s:?}: expected a count such as \"5\" or a percentage from \"0%\" to \"100%\"");
        if let Some(p) = s.strip_suffix('%') {
            let pct: u64 = p.parse().map_err(|_| err())?;
            if pct > 100 || p.starts_with('+') {
                return Err(err());
            }
            Ok(Self::Percent(pct))
        } else if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse().map(Self::Count).map_err(|_| err())
        } else {
            Err(err())
        }
    }
}

impl BudgetNodes {
    /// The number of nodes this allows out of `total`: a count as is, a percentage as
    /// `roundup(total × pct)`.
    pub fn of(self, total: u64) -> u64 {
        match self {
            Self::Count(n) => n,
            Self::Percent(p) => (total * p).div_ceil(100),
        }
    }
}

/// Parses a budget schedule: five cron fields or a macro (`@daily`, `@hourly`, …), always UTC.
pub fn parse_schedule(schedule: &str) -> Result<Cron, String> {
    // The macros Karpenter's schema and cron parser accept, written out (`@midnight` is `@daily`).
    let expanded = match schedule.trim() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        other => other,
    };
    let parser = CronParser::builder().seconds(Seconds::Disallowed).year(Year::Disallowed).build();
    parser.parse(expanded).map_err(|e| format!("invalid cron schedule {schedule:?}: {e}"))
}

impl Budget {
    /// Whether the budget applies to `reason` (a budget without reasons applies to all).
    pub fn applies_to(&self, reason: DisruptionReason) -> bool {
        self.reasons.is_empty() || self.reasons.contains(&reason)
    }

    /// Whether the budget is active at `now`: always without a schedule; with one, when a scheduled start
    /// lies within the last `duration`.
    pub fn is_active(&self, now: Timestamp) -> Result<bool, String> {
        let (Some(schedule), Some(duration)) = (&self.schedule, &self.duration) else {
            return Ok(true);
        };
        let cron = parse_schedule(schedule)?;
        let window_start = crate::clock::sub(now, duration.0).to_zoned(TimeZone::UTC);
        match cron.find_next_occurrence(&window_start, false) {
            Ok(next) => Ok(next.timestamp() <= now),
            Err(e) => Err(format!("cron schedule {schedule:?}: {e}")),
        }
    }

    /// The number of disruptions this budget allows out of `total` nodes, before subtracting the ones in
    /// progress.
    pub fn ceiling(&self, total: u64) -> Result<u64, String> {
        Ok(self.nodes.parse::<BudgetNodes>()?.of(total))
    }
}

impl NodePool {
    /// The name of the pool.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// How many more nodes may be disrupted for `reason` at `now`, given the pool's `total` nodes of which
    /// `deleting` are being deleted and `not_ready` are NotReady: the minimum over active budgets of
    /// `ceiling − deleting − not_ready` (NotReady nodes are not subtracted for `Unhealthy`, since they are
    /// what repair replaces). Without an active budget for the reason, every node may be disrupted.
    pub fn allowed_disruptions(
        &self,
        reason: DisruptionReason,
        now: Timestamp,
        total: u64,
        deleting: u64,
        not_ready: u64,
    ) -> Result<u64, String> {
        let in_progress = deleting + if reason == DisruptionReason::Unhealthy { 0 } else { not_ready };
        let mut allowed = total;
        for budget in self.spec.disruption.budgets.iter().filter(|b| b.applies_to(reason)) {
            if budget.is_active(now)? {
                allowed = allowed.min(budget.ceiling(total)?.saturating_sub(in_progress));
            }
        }
        Ok(allowed)
    }

    /// The pool's packing policy annotation, if any.
    pub fn packing_policy(&self) -> Option<&str> {
        self.annotation(labels::NODECLAIM_PACKING_POLICY)
    }

    /// An annotation of the pool.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
    }

    /// The pool's weight (0 when unset).
    pub fn weight(&self) -> i32 {
        self.spec.weight.unwrap_or(0)
    }

    /// A stable hash of the parts of the template whose change makes existing claims drift: labels,
    /// annotations, taints, startup taints, the NodeClass, `expireAfter` and `terminationGracePeriod`.
    /// Requirements are compared value by value instead; behavioural fields (weight, limits, disruption)
    /// never drift.
    pub fn template_hash(&self) -> String {
        let t = &self.spec.template;
        let canonical = serde_json::json!({
            "labels": t.metadata.labels,
            "annotations": t.metadata.annotations,
            "taints": t.spec.taints,
            "startupTaints": t.spec.startup_taints,
            "nodeClassRef": t.spec.node_class_ref,
            "expireAfter": t.spec.expire_after,
            "terminationGracePeriod": t.spec.termination_grace_period,
        });
        stable_hash(&canonical)
    }

    /// The template hash this pool's claims are compared with for drift, and its scheme: the pool's own
    /// `karpenter.sh/nodepool-hash` when another scheme wrote it (Karpenter's controller keeps it current
    /// on the pools it runs), else tenon's hash of the template as it is now.
    pub fn drift_hash(&self) -> (String, String) {
        match (self.annotation(labels::NODEPOOL_HASH), self.annotation(labels::NODEPOOL_HASH_VERSION)) {
            (Some(hash), Some(version)) if version != TEMPLATE_HASH_VERSION => (hash.to_owned(), version.to_owned()),
            _ => (self.template_hash(), TEMPLATE_HASH_VERSION.to_owned()),
        }
    }

    /// Whether `claim`, made from this pool, drifted from its template: its hash differs from the pool's
    /// under the same scheme. A claim hashed under another scheme has not drifted; it is re-hashed
    /// (Karpenter does the same when its scheme changes). A claim with a hash and no scheme was hashed
    /// by an earlier tenon, with tenon's.
    pub fn template_drifted(&self, claim: &super::NodeClaim) -> bool {
        template_drifted_from(claim, &self.drift_hash())
    }

    /// A status condition of the pool.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref().and_then(|s| conditions::find(&s.conditions, type_))
    }

    /// Sets a status condition of the pool.
    pub fn set_condition(&mut self, type_: &str, status: ConditionStatus, reason: &str, message: &str, now: Timestamp) {
        let st = self.status.get_or_insert_with(Default::default);
        conditions::set(&mut st.conditions, type_, status, reason, message, now);
    }
}

/// Whether `claim` drifted from a template whose [`NodePool::drift_hash`] is `pool_hash` (hash, scheme), for
/// callers that check many claims of one pool and compute it once.
pub fn template_drifted_from(claim: &super::NodeClaim, pool_hash: &(String, String)) -> bool {
    let Some(hash) = claim.annotation(labels::NODEPOOL_HASH) else { return false };
    let version = claim.annotation(labels::NODEPOOL_HASH_VERSION).unwrap_or(TEMPLATE_HASH_VERSION);
    version == pool_hash.1 && hash != pool_hash.0
}

/// The scheme tenon writes in `karpenter.sh/nodepool-hash-version`. It is not Karpenter's (`v3`), whose
/// hash is of Go structures: a claim hashed by one is re-hashed by the other, never taken for drifted.
pub const TEMPLATE_HASH_VERSION: &str = "tenon-v1";

/// 64-bit FNV-1a: a stable, dependency-free hash for values stored in annotations.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// A hash of `value`'s JSON text as 16 hex digits (64-bit FNV-1a): the same across builds, platforms and
/// restarts, for values written into annotations, tags and resource names and compared later.
pub fn stable_hash(value: &serde_json::Value) -> String {
    format!("{:016x}", fnv1a(value.to_string().as_bytes()))
}

/// What tenon last observed about a pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// The total resources of the pool's nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Quantity>,
    /// The pool's node count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i64>,
    /// Status conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(budgets: Vec<Budget>) -> NodePool {
        let mut np = NodePool::new("default", NodePoolSpec::default());
        np.spec.disruption.budgets = budgets;
        np
    }

    fn budget(nodes: &str, reasons: &[DisruptionReason]) -> Budget {
        Budget { nodes: nodes.into(), reasons: reasons.to_vec(), ..Budget::default() }
    }

    #[test]
    fn percent_rounds_up() {
        assert_eq!("20%".parse::<BudgetNodes>().unwrap().of(19), 4, "19 × 0.2 = 3.8 rounds up to 4");
        assert_eq!("10%".parse::<BudgetNodes>().unwrap().of(1), 1);
        assert_eq!("10%".parse::<BudgetNodes>().unwrap().of(0), 0);
        assert_eq!("0%".parse::<BudgetNodes>().unwrap().of(50), 0);
        assert_eq!("5".parse::<BudgetNodes>().unwrap().of(3), 5);
        for bad in ["", "101%", "-1", "1.5", "ten", "%", "5 %"] {
            assert!(bad.parse::<BudgetNodes>().is_err(), "{bad:?}");
        }
    }

    /// The three-budget example of the disruption documentation, on a pool of 19 nodes.
    #[test]
    fn documented_nineteen_node_example_allows_four() {
        let np = pool(vec![
            budget("20%", &[DisruptionReason::Empty, DisruptionReason::Drifted]),
            budget("5", &[]),
            Budget {
                nodes: "0".into(),
                reasons: vec![DisruptionReason::Underutilized],
                schedule: Some("@daily".into()),
                duration: Some(KubeDuration::from_secs(600)),
            },
        ]);
        let noon: Timestamp = "2026-03-04T12:00:00Z".parse().unwrap();
        let five_past_midnight: Timestamp = "2026-03-04T00:05:00Z".parse().unwrap();
        let ten_past_midnight: Timestamp = "2026-03-04T00:10:00Z".parse().unwrap();
        let allowed = |reason, now| np.allowed_disruptions(reason, now, 19, 0, 0).unwrap();
        assert_eq!(allowed(DisruptionReason::Empty, noon), 4);
        assert_eq!(allowed(DisruptionReason::Drifted, noon), 4);
        assert_eq!(allowed(DisruptionReason::Underutilized, noon), 5);
        assert_eq!(allowed(DisruptionReason::Underutilized, five_past_midnight), 0);
        assert_eq!(allowed(DisruptionReason::Underutilized, ten_past_midnight), 5, "the window is [00:00, 00:10)");
        assert_eq!(allowed(DisruptionReason::Empty, five_past_midnight), 4);
        // Past 25 nodes the static budget of 5 is the ceiling.
        assert_eq!(np.allowed_disruptions(DisruptionReason::Empty, noon, 30, 0, 0).unwrap(), 5);
    }

    #[test]
    fn deleting_and_not_ready_nodes_consume_the_budget_except_not_ready_for_unhealthy() {
        let np = pool(vec![budget("20%", &[])]);
        let now = Timestamp::UNIX_EPOCH;
        assert_eq!(np.allowed_disruptions(DisruptionReason::Underutilized, now, 19, 1, 2).unwrap(), 1);
        assert_eq!(np.allowed_disruptions(DisruptionReason::Unhealthy, now, 19, 1, 2).unwrap(), 3);
        assert_eq!(np.allowed_disruptions(DisruptionReason::Underutilized, now, 19, 5, 0).unwrap(), 0);
    }

    #[test]
    fn default_budget_is_ten_percent() {
        let np = NodePool::new("default", NodePoolSpec::default());
        assert_eq!(np.spec.disruption.budgets, vec![budget("10%", &[])]);
        assert_eq!(np.allowed_disruptions(DisruptionReason::Empty, Timestamp::UNIX_EPOCH, 25, 0, 0).unwrap(), 3);
    }

    #[test]
    fn cron_schedules_use_five_fields_or_macros() {
        assert!(parse_schedule("@daily").is_ok());
        assert!(parse_schedule("@hourly").is_ok());
        assert!(parse_schedule("0 9 * * mon-fri").is_ok());
        assert!(parse_schedule("*/5 * * * *").is_ok());
        assert!(parse_schedule("0 0 9 * * *").is_err(), "seconds are not allowed");
        assert!(parse_schedule("not a cron").is_err());
        assert!(parse_schedule("61 * * * *").is_err());
    }

    #[test]
    fn template_hash_ignores_behavioural_fields() {
        let mut a = NodePool::new("default", NodePoolSpec::default());
        let h = a.template_hash();
        a.spec.weight = Some(50);
        a.spec.disruption.consolidation_policy = ConsolidationPolicy::WhenEmpty;
        a.spec.limits.insert("cpu".into(), Quantity("100".into()));
        assert_eq!(a.template_hash(), h);
        a.spec.template.metadata.labels.insert("team".into(), "ml".into());
        assert_ne!(a.template_hash(), h);
    }
}
