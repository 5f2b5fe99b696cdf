//! The scheduling view of a pod: requests, node requirements, tolerations, host ports, topology spread and
//! pod (anti-)affinity, converted once from the Kubernetes object.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Container, NodeSelectorTerm, Pod, PodAffinityTerm, PodSpec, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::requirements::{Requirement, Requirements};
use crate::api::{Operator, labels};
use crate::resources::{ResourceError, ResourceName, Resources};

/// A label selector, compiled.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Selector {
    match_labels: Vec<(String, String)>,
    expressions: Vec<(String, Operator, Vec<String>)>,
    /// A nil selector matches nothing (Kubernetes semantics for affinity terms).
    nothing: bool,
}

impl Selector {
    /// Compiles a Kubernetes label selector (`None` selects nothing).
    pub fn from_label_selector(sel: Option<&LabelSelector>) -> Self {
        let Some(sel) = sel else {
            return Self { nothing: true, ..Self::default() };
        };
        let mut match_labels: Vec<(String, String)> =
            sel.match_labels.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
        match_labels.sort();
        let mut expressions: Vec<(String, Operator, Vec<String>)> = sel
            .match_expressions
            .iter()
            .flatten()
            .map(|e| {
                let op = match e.operator.as_str() {
                    "In" => Operator::In,
                    "NotIn" => Operator::NotIn,
                    "Exists" => Operator::Exists,
                    _ => Operator::DoesNotExist,
                };
                let mut values = e.values.clone().unwrap_or_default();
                values.sort();
                (e.key.clone(), op, values)
            })
            .collect();
        expressions.sort();
        Self { match_labels, expressions, nothing: false }
    }

    /// A selector matching exactly these labels.
    pub fn labels(pairs: &[(&str, &str)]) -> Self {
        let mut match_labels: Vec<(String, String)> = pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        match_labels.sort();
        Self { match_labels, expressions: Vec::new(), nothing: false }
    }

    /// Label pairs of which every label set the selector matches holds at least one, for indexing selectors
    /// by the labels they name: a `matchLabels` pair, else the values of an `In` expression. `None` when
    /// the selector names no such pair (it matches label sets without any: `{}`, `NotIn`, `Exists`…); an
    /// empty list when it matches nothing.
    pub(crate) fn anchors(&self) -> Option<Vec<(&str, &str)>> {
        if self.nothing {
            return Some(Vec::new());
        }
        if let Some((k, v)) = self.match_labels.first() {
            return Some(vec![(k.as_str(), v.as_str())]);
        }
        self.expressions
            .iter()
            .find(|(_, op, _)| *op == Operator::In)
            .map(|(k, _, values)| values.iter().map(|v| (k.as_str(), v.as_str())).collect())
    }

    /// Whether the selector matches `pod_labels`.
    pub fn matches(&self, pod_labels: &BTreeMap<String, String>) -> bool {
        if self.nothing {
            return false;
        }
        self.match_labels.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
            && self.expressions.iter().all(|(k, op, values)| {
                let v = pod_labels.get(k);
                match op {
                    Operator::In => v.is_some_and(|v| values.contains(v)),
                    Operator::NotIn => v.is_none_or(|v| !values.contains(v)),
                    Operator::Exists => v.is_some(),
                    _ => v.is_none(),
                }
            })
    }
}

/// Which kind of topology constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TopologyKind {
    /// `topologySpreadConstraints`.
    Spread,
    /// Pod affinity: land where matching pods are.
    Affinity,
    /// Pod anti-affinity: land where matching pods are not.
    AntiAffinity,
}

/// One topology constraint of a pod, in a form shared by every pod with the same constraint.
///
/// Equal terms share one group in a scheduling pass, found by hashing the term. The hash leaves out
/// `node_filter`, whose requirement sets are the costly part to hash and almost never tell two terms of the
/// same selector apart; equality still compares every field. A term is looked up many times over its pod's
/// life (every pass registers the pods it may move), so it keeps its hash once computed, and, once a pass
/// found it equal to the term of a group, a token shared with that term: the next pass finds it equal to
/// the same group's term without comparing their fields.
#[derive(Debug, Clone)]
pub struct TopologyTerm {
    /// Spread, affinity or anti-affinity.
    pub kind: TopologyKind,
    /// The topology key (`topology.kubernetes.io/zone`, `kubernetes.io/hostname`, …).
    pub key: String,
    /// Which pods are counted.
    pub selector: Selector,
    /// The namespaces whose pods are counted; `None` for every namespace (an affinity term's
    /// `namespaceSelector: {}`).
    pub namespaces: Option<Vec<String>>,
    /// An affinity term's `namespaceSelector` with terms, until it is resolved against the Namespace
    /// objects ([`PodInfo::with_namespaces`]): the namespaces it matches join `namespaces`. Unresolved, only
    /// the listed namespaces count.
    pub namespace_selector: Option<Selector>,
    /// Spread: the largest allowed difference between domains.
    pub max_skew: i32,
    /// Spread: below this many domains the global minimum is taken as zero.
    pub min_domains: Option<i32>,
    /// Spread with `nodeAffinityPolicy: Honor` (the default): the pod's node requirement alternatives
    /// (its nodeSelector ∩ each required node-affinity term); only nodes and claims compatible with one of
    /// them count and give domains. `None`: every node counts (`Ignore`, and affinity terms).
    pub node_filter: Option<Arc<[Requirements]>>,
    /// Spread with `nodeTaintsPolicy: Honor`: the pod's tolerations (as JSON, so equal constraints share a
    /// group); pods on nodes whose taints they do not tolerate are not counted.
    pub honor_taints: Option<String>,
    /// The term's hash and equality token, kept once worked out. The fields above are set when the term is
    /// built and not changed after it is first hashed or compared (resolving a `namespaceSelector` starts the
    /// cache afresh).
    pub(crate) cache: TermCache,
}

/// What a [`TopologyTerm`] keeps of itself once worked out. Not part of the term's value.
#[derive(Debug, Clone, Default)]
pub(crate) struct TermCache {
    hash: std::sync::OnceLock<u64>,
    /// Held (the same allocation) by terms known to be equal: the copies of one term, and the terms found
    /// equal to it ([`TopologyTerm::found_equal_to`]). Terms holding the same token are equal without
    /// comparing their fields.
    same: std::sync::OnceLock<Arc<()>>,
}

/// A [`TopologyTerm`]'s value, field by field: every field but the cache.
type TermValue<'a> = (
    &'a TopologyKind,
    &'a String,
    &'a Selector,
    &'a Option<Vec<String>>,
    &'a Option<Selector>,
    &'a i32,
    &'a Option<i32>,
    &'a Option<Arc<[Requirements]>>,
    &'a Option<String>,
);

impl TopologyTerm {
    /// The fields equality compares; a field added to the term must be added here (the pattern says so).
    fn value(&self) -> TermValue<'_> {
        let Self {
            kind,
            key,
            selector,
            namespaces,
            namespace_selector,
            max_skew,
            min_domains,
            node_filter,
            honor_taints,
            cache: _,
        } = self;
        (kind, key, selector, namespaces, namespace_selector, max_skew, min_domains, node_filter, honor_taints)
    }
}

impl PartialEq for TopologyTerm {
    fn eq(&self, other: &Self) -> bool {
        if let (Some(a), Some(b)) = (self.cache.same.get(), other.cache.same.get())
            && Arc::ptr_eq(a, b)
        {
            return true;
        }
        self.value() == other.value()
    }
}

impl Eq for TopologyTerm {}

/// A host port a pod binds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// Host IP (`0.0.0.0` when unset).
    pub ip: String,
    /// Port.
    pub port: i32,
    /// Protocol (`TCP` when unset).
    pub protocol: String,
}

impl HostPort {
    /// Whether two bindings collide (same port and protocol, and the same IP or a wildcard).
    pub fn conflicts(&self, other: &Self) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

/// Everything the scheduler needs to know about one pod.
#[derive(Debug, Clone)]
pub struct PodInfo {
    /// `namespace/name`.
    pub key: String,
    /// The namespace.
    pub namespace: String,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
    /// The pod's annotations.
    pub annotations: BTreeMap<String, String>,
    /// Resource requests, computed the way the kubelet does, with `pods: 1`.
    pub requests: Resources,
    /// `nodeSelector`.
    pub node_selector: Requirements,
    /// Required node affinity: OR-ed terms (empty: none).
    pub required_terms: Vec<Requirements>,
    /// Preferred node affinity terms, heaviest first.
    pub preferred_terms: Vec<(i32, Requirements)>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
    /// Hard constraints: `DoNotSchedule` spreads and required (anti-)affinity.
    pub topology: Vec<TopologyTerm>,
    /// `ScheduleAnyway` spreads, relaxed one at a time.
    pub soft_spreads: Vec<TopologyTerm>,
    /// Preferred pod affinity, heaviest first.
    pub preferred_affinity: Vec<(i32, TopologyTerm)>,
    /// Preferred pod anti-affinity, heaviest first.
    pub preferred_anti_affinity: Vec<(i32, TopologyTerm)>,
    /// Pod priority.
    pub priority: i32,
    /// The node the pod is bound to, if any.
    pub node_name: Option<String>,
    /// Whether a DaemonSet owns the pod.
    pub daemon: bool,
    /// The volume attachments its persistent volumes take on its node: each one's CSI driver and claim
    /// (`namespace/name`). Read from the cluster's storage when the state is built, not from the pod
    /// alone: empty from [`PodInfo::from_pod`].
    pub volumes: Vec<(String, String)>,
    /// What is worked out of `namespace` and `labels` on first use ([`PodInfo::label_pairs`],
    /// [`PodInfo::selected_alike`]).
    pub(crate) label_cache: LabelCache,
}

/// What a pod's namespace and labels give, kept once worked out: they are read by every pass's topology
/// indexes and counts over the pod's whole life. Set when first read; the namespace and labels must not
/// change after that. A copy starts without it, so a copy may change its labels first.
#[derive(Default)]
pub(crate) struct LabelCache {
    /// The hash of each label pair ([`label_pair`]).
    pairs: std::sync::OnceLock<Box<[u64]>>,
    /// The pod's selection class ([`SelectionClasses`]): held (the same allocation) by every pod with the
    /// same namespace and labels that the same classes saw. Pods holding one are selected alike without
    /// comparing their labels, and topology counts tell them apart without reading them.
    class: std::sync::OnceLock<Arc<()>>,
}

/// Gives the pods read into a cluster's state their selection class: one token per namespace and labels,
/// shared by every pod that has them (the replicas of one owner). Counting a topology group over tens of
/// thousands of bound pods then asks whether the group selects a pod only when its class differs from the
/// last pod's, without reading the pod at all (see [`PodInfo::class_id`]).
#[derive(Debug, Default)]
pub(crate) struct SelectionClasses {
    /// Classes by a hash of their namespace and label pairs; each entry's namespace and labels are
    /// compared before a pod joins it.
    by_hash: rustc_hash::FxHashMap<u64, Vec<SelectionClass>>,
}

/// A selection class: its namespace and labels, and the token its pods hold.
#[derive(Debug)]
struct SelectionClass {
    namespace: String,
    labels: BTreeMap<String, String>,
    token: Arc<()>,
}

impl SelectionClasses {
    /// Reads `pod` ([`PodInfo::from_pod`]) and gives it its class.
    pub(crate) fn read(&mut self, pod: &Pod) -> Result<PodInfo, PodError> {
        let info = PodInfo::from_pod(pod)?;
        self.assign(&info);
        Ok(info)
    }

    /// Gives `pod` its class, new or known, unless it has one. Its namespace and labels must not change
    /// after.
    pub(crate) fn assign(&mut self, pod: &PodInfo) {
        if pod.label_cache.class.get().is_some() {
            return;
        }
        let entries = self.by_hash.entry(pod.selection_hash()).or_default();
        let token = match entries.iter().find(|c| c.namespace == pod.namespace && c.labels == pod.labels) {
            Some(class) => Arc::clone(&class.token),
            None => {
                let token = Arc::new(());
                let (namespace, labels) = (pod.namespace.clone(), pod.labels.clone());
                entries.push(SelectionClass { namespace, labels, token: Arc::clone(&token) });
                token
            }
        };
        let _ = pod.label_cache.class.set(token);
    }

    /// Forgets the classes no pod holds any more.
    pub(crate) fn sweep(&mut self) {
        self.by_hash.retain(|_, entries| {
            entries.retain(|c| Arc::strong_count(&c.token) > 1);
            !entries.is_empty()
        });
    }
}

/// Shows nothing: what is worked out is not part of the pod's value (two pods read alike print alike
/// whatever each has worked out so far).
impl std::fmt::Debug for LabelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabelCache").finish_non_exhaustive()
    }
}

impl Clone for LabelCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

/// The hash standing for the label `key=value` in topology's indexes: two pairs may share one, so an index
/// keyed by it is a superset of the entries reached through a pair, checked by whoever reads it.
pub(crate) fn label_pair(key: &str, value: &str) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one((key, value))
}

/// A pod that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Pod {pod}: {field}: {message}")]
pub struct PodError {
    /// `namespace/name`.
    pub pod: String,
    /// The offending field.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn container_requests(c: &Container) -> Result<Resources, ResourceError> {
    let reqs = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    let mut out = Resources::ZERO;
    // Limits stand in for unset requests, as the API server defaults them.
    for (name, q) in limits.into_iter().flatten() {
        let (slot, v) = Resources::parse_quantity(name, &q.0)?;
        out.set(slot, v);
    }
    for (name, q) in reqs.into_iter().flatten() {
        let (slot, v) = Resources::parse_quantity(name, &q.0)?;
        out.set(slot, v);
    }
    Ok(out)
}

/// Requests the way the kubelet computes them: the larger of the containers' sum (plus sidecars) and the
/// peak of the init sequence, plus the pod overhead.
pub fn pod_requests(spec: &PodSpec) -> Result<Resources, (String, ResourceError)> {
    let mut sum = Resources::ZERO;
    for (i, c) in spec.containers.iter().enumerate() {
        sum.add_assign(&container_requests(c).map_err(|e| (format!("spec.containers[{i}].resources"), e))?);
    }
    let mut sidecars = Resources::ZERO;
    let mut init_peak = Resources::ZERO;
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let r = container_requests(c).map_err(|e| (format!("spec.initContainers[{i}].resources"), e))?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.add_assign(&r);
            init_peak.max_assign(&sidecars);
        } else {
            init_peak.max_assign(&r.add(&sidecars));
        }
    }
    let mut total = sum.add(&sidecars).max(&init_peak);
    for (name, q) in spec.overhead.iter().flatten() {
        let (slot, v) = Resources::parse_quantity(name, &q.0).map_err(|e| ("spec.overhead".to_owned(), e))?;
        total.set(slot, total.get(slot) + v);
    }
    total.set(ResourceName::PODS, 1);
    Ok(total)
}

/// A node selector operator as Kubernetes writes it; an unknown one selects no node.
pub(crate) fn parse_operator(op: &str) -> Operator {
    match op {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" => Operator::Gt,
        "Lt" => Operator::Lt,
        "Gte" => Operator::Gte,
        "Lte" => Operator::Lte,
        _ => Operator::DoesNotExist,
    }
}

fn term_requirements(term: &NodeSelectorTerm) -> Requirements {
    let mut reqs = Requirements::new();
    for e in term.match_expressions.iter().flatten() {
        reqs.add(Requirement::new(&e.key, parse_operator(&e.operator), e.values.as_deref().unwrap_or_default()));
    }
    reqs
}

fn affinity_term(kind: TopologyKind, namespace: &str, t: &PodAffinityTerm) -> TopologyTerm {
    let mut listed = t.namespaces.clone().unwrap_or_default();
    listed.sort();
    listed.dedup();
    // As kube-scheduler reads a term: the listed namespaces and those `namespaceSelector` matches (`{}`
    // matching every one); with neither, the pod's own.
    let (namespaces, namespace_selector) = match t.namespace_selector.as_ref() {
        Some(s)
            if s.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && s.match_expressions.as_ref().is_none_or(|e| e.is_empty()) =>
        {
            (None, None)
        }
        Some(s) => (Some(listed), Some(Selector::from_label_selector(Some(s)))),
        None if listed.is_empty() => (Some(vec![namespace.to_owned()]), None),
        None => (Some(listed), None),
    };
    TopologyTerm {
        kind,
        key: labels::normalize(&t.topology_key).to_owned(),
        selector: Selector::from_label_selector(t.label_selector.as_ref()),
        namespaces,
        namespace_selector,
        max_skew: 1,
        min_domains: None,
        node_filter: None,
        honor_taints: None,
        cache: TermCache::default(),
    }
}

fn spread_term(
    namespace: &str,
    c: &TopologySpreadConstraint,
    tolerations: &[Toleration],
    pod_labels: &BTreeMap<String, String>,
    node_alternatives: &Arc<[Requirements]>,
) -> TopologyTerm {
    // `matchLabelKeys`: the pod's own values of those keys narrow the selector (a key it lacks is
    // ignored), so each revision of a Deployment spreads on its own.
    let mut selector = c.label_selector.clone();
    for key in c.match_label_keys.iter().flatten() {
        let Some(value) = pod_labels.get(key) else { continue };
        let s = selector.get_or_insert_with(Default::default);
        s.match_expressions.get_or_insert_with(Vec::new).push(LabelSelectorRequirement {
            key: key.clone(),
            operator: "In".into(),
            values: Some(vec![value.clone()]),
        });
    }
    TopologyTerm {
        kind: TopologyKind::Spread,
        key: labels::normalize(&c.topology_key).to_owned(),
        selector: Selector::from_label_selector(selector.as_ref()),
        namespaces: Some(vec![namespace.to_owned()]),
        namespace_selector: None,
        max_skew: c.max_skew.max(1),
        min_domains: c.min_domains,
        // A pod with no node requirements admits every node: no filter to check.
        node_filter: (c.node_affinity_policy.as_deref() != Some("Ignore")
            && node_alternatives.iter().any(|r| !r.is_empty()))
        .then(|| Arc::clone(node_alternatives)),
        honor_taints: (c.node_taints_policy.as_deref() == Some("Honor"))
            .then(|| serde_json::to_string(tolerations).unwrap_or_default()),
        cache: TermCache::default(),
    }
}

impl std::hash::Hash for TopologyTerm {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        use std::hash::Hasher as _;
        // Every field of the value but `node_filter`: terms equal under `Eq` hash alike.
        let digest = self.cache.hash.get_or_init(|| {
            let (kind, key, selector, namespaces, namespace_selector, max_skew, min_domains, _, honor_taints) =
                self.value();
            let mut h = rustc_hash::FxHasher::default();
            (kind, key, selector, namespaces, namespace_selector, max_skew, min_domains, honor_taints).hash(&mut h);
            h.finish()
        });
        state.write_u64(*digest);
    }
}

impl TopologyTerm {
    /// Gives the term an equality token, when it has none, before it is copied: its copies hold the same.
    pub(crate) fn share_equality(&self) {
        self.cache.same.get_or_init(|| Arc::new(()));
    }

    /// Records that the term was found equal to `known` (it must be): it takes `known`'s token when it holds
    /// none yet, so the next comparison between them, or with `known`'s copies, is a pointer comparison.
    pub(crate) fn found_equal_to(&self, known: &TopologyTerm) {
        if let Some(token) = known.cache.same.get() {
            let _ = self.cache.same.set(Arc::clone(token));
        }
    }

    /// Resolves a `namespaceSelector` with terms against `namespaces` (name → labels).
    fn resolve_namespaces(&mut self, namespaces: &BTreeMap<String, BTreeMap<String, String>>) {
        let Some(selector) = self.namespace_selector.take() else { return };
        let mut names = self.namespaces.take().unwrap_or_default();
        names.extend(namespaces.iter().filter(|(_, l)| selector.matches(l)).map(|(n, _)| n.clone()));
        names.sort();
        names.dedup();
        self.namespaces = Some(names);
        self.cache = TermCache::default();
    }
}

impl PodInfo {
    /// Whether an affinity term's `namespaceSelector` waits on the Namespace objects'
    /// labels ([`PodInfo::with_namespaces`]).
    pub fn needs_namespaces(&self) -> bool {
        let terms = self.topology.iter().chain(self.preferred_affinity.iter().map(|(_, t)| t));
        terms.chain(self.preferred_anti_affinity.iter().map(|(_, t)| t)).any(|t| t.namespace_selector.is_some())
    }

    /// A copy with every affinity term's `namespaceSelector` resolved against `namespaces` (each
    /// Namespace's name and labels): its terms then count the pods of the namespaces it matches.
    pub fn with_namespaces(&self, namespaces: &BTreeMap<String, BTreeMap<String, String>>) -> Self {
        let mut out = self.clone();
        for t in &mut out.topology {
            t.resolve_namespaces(namespaces);
        }
        for (_, t) in out.preferred_affinity.iter_mut().chain(out.preferred_anti_affinity.iter_mut()) {
            t.resolve_namespaces(namespaces);
        }
        out
    }

    /// Converts a Kubernetes pod.
    pub fn from_pod(pod: &Pod) -> Result<Self, PodError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let key = format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or(""));
        let default_spec = PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&default_spec);
        let requests =
            pod_requests(spec).map_err(|(field, e)| PodError { pod: key.clone(), field, message: e.to_string() })?;
        let node_selector = spec
            .node_selector
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::is_in(k, [v.clone()]))
            .collect::<Requirements>();
        let node_affinity = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
        let required_terms: Vec<Requirements> = node_affinity
            .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|r| r.node_selector_terms.iter().map(term_requirements).collect())
            .unwrap_or_default();
        let mut preferred_terms: Vec<(i32, Requirements)> = node_affinity
            .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
            .map(|p| p.iter().map(|t| (t.weight, term_requirements(&t.preference))).collect())
            .unwrap_or_default();
        preferred_terms.sort_by_key(|t| std::cmp::Reverse(t.0));

        let mut topology = Vec::new();
        let mut soft_spreads = Vec::new();
        let tolerations = spec.tolerations.clone().unwrap_or_default();
        let pod_labels = pod.metadata.labels.clone().unwrap_or_default();
        let node_alternatives: Arc<[Requirements]> = if required_terms.is_empty() {
            Arc::from([node_selector.clone()])
        } else {
            required_terms
                .iter()
                .map(|t| {
                    let mut r = node_selector.clone();
                    r.add_all(t);
                    r
                })
                .collect()
        };
        for c in spec.topology_spread_constraints.iter().flatten() {
            let term = spread_term(&namespace, c, &tolerations, &pod_labels, &node_alternatives);
            if c.when_unsatisfiable == "ScheduleAnyway" {
                soft_spreads.push(term);
            } else {
                topology.push(term);
            }
        }
        let pod_affinity = spec.affinity.as_ref().and_then(|a| a.pod_affinity.as_ref());
        let pod_anti = spec.affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref());
        for t in pod_affinity
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .into_iter()
            .flatten()
        {
            topology.push(affinity_term(TopologyKind::Affinity, &namespace, t));
        }
        for t in
            pod_anti.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()).into_iter().flatten()
        {
            topology.push(affinity_term(TopologyKind::AntiAffinity, &namespace, t));
        }
        let mut preferred_affinity: Vec<(i32, TopologyTerm)> = pod_affinity
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
            .into_iter()
            .flatten()
            .map(|w| (w.weight, affinity_term(TopologyKind::Affinity, &namespace, &w.pod_affinity_term)))
            .collect();
        preferred_affinity.sort_by_key(|t| std::cmp::Reverse(t.0));
        let mut preferred_anti_affinity: Vec<(i32, TopologyTerm)> = pod_anti
            .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
            .into_iter()
            .flatten()
            .map(|w| (w.weight, affinity_term(TopologyKind::AntiAffinity, &namespace, &w.pod_affinity_term)))
            .collect();
        preferred_anti_affinity.sort_by_key(|t| std::cmp::Reverse(t.0));

        let mut host_ports = Vec::new();
        for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
            for p in c.ports.iter().flatten() {
                if let Some(hp) = p.host_port.filter(|p| *p > 0) {
                    host_ports.push(HostPort {
                        ip: p.host_ip.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "0.0.0.0".into()),
                        port: hp,
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    });
                }
            }
        }
        let daemon = crate::cluster::owned_by_daemon_set(pod);
        Ok(Self {
            key,
            namespace,
            labels: pod_labels,
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            requests,
            node_selector,
            required_terms,
            preferred_terms,
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            host_ports,
            topology,
            soft_spreads,
            preferred_affinity,
            preferred_anti_affinity,
            priority: spec.priority.unwrap_or(0),
            node_name: spec.node_name.clone().filter(|n| !n.is_empty()),
            daemon,
            volumes: Vec::new(),
            label_cache: LabelCache::default(),
        })
    }

    /// Whether every label selector and namespace list selects `other` exactly when it selects this pod:
    /// the two have the same namespace and labels (the replicas of one owner, most often).
    pub(crate) fn selected_alike(&self, other: &PodInfo) -> bool {
        let same = self.class_id().is_some_and(|c| Some(c) == other.class_id());
        same || self.namespace == other.namespace && self.labels == other.labels
    }

    /// The pod's selection class, when [`SelectionClasses`] gave it one: pods of the same class have the
    /// same namespace and labels. An identity to compare while the pods are held (their class lives as long
    /// as they do), not to keep.
    pub(crate) fn class_id(&self) -> Option<std::num::NonZeroUsize> {
        self.label_cache.class.get().and_then(|t| std::num::NonZeroUsize::new(Arc::as_ptr(t) as usize))
    }

    /// A key to find the pods selected alike to this one by: its class token when it has one
    /// ([`PodInfo::class_id`]), its [`PodInfo::selection_hash`] otherwise. Pods under one key may still
    /// differ (a token and a hash may collide), so a lookup by it checks [`PodInfo::selected_alike`].
    pub(crate) fn selection_key(&self) -> u64 {
        self.class_id().map_or_else(|| self.selection_hash(), |c| c.get() as u64)
    }

    /// A hash of the pod's namespace and labels: equal for pods [selected alike](PodInfo::selected_alike).
    pub(crate) fn selection_hash(&self) -> u64 {
        use std::hash::BuildHasher;
        rustc_hash::FxBuildHasher.hash_one((&self.namespace, self.label_pairs()))
    }

    /// The hash of each of the pod's label pairs, in the labels' order ([`label_pair`]).
    pub(crate) fn label_pairs(&self) -> &[u64] {
        self.label_cache.pairs.get_or_init(|| self.labels.iter().map(|(k, v)| label_pair(k, v)).collect())
    }

    /// Every topology term the pod may be scheduled under, hard or preferred.
    pub fn all_terms(&self) -> impl Iterator<Item = &TopologyTerm> {
        self.topology
            .iter()
            .chain(&self.soft_spreads)
            .chain(self.preferred_affinity.iter().map(|(_, t)| t))
            .chain(self.preferred_anti_affinity.iter().map(|(_, t)| t))
    }

    /// Every OR-term of the pod's node requirements (nodeSelector ∩ each required term), for checks that
    /// must consider any term (DaemonSet compatibility).
    pub fn requirement_alternatives(&self) -> Vec<Requirements> {
        if self.required_terms.is_empty() {
            return vec![self.node_selector.clone()];
        }
        self.required_terms
            .iter()
            .map(|t| {
                let mut r = self.node_selector.clone();
                r.add_all(t);
                r
            })
            .collect()
    }
}

/// How far a pod's preferences have been relaxed, in the order Karpenter relaxes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Relaxation {
    required_terms_dropped: usize,
    preferred_affinity_dropped: usize,
    preferred_anti_affinity_dropped: usize,
    preferred_terms_dropped: usize,
    soft_spreads_dropped: usize,
    /// Whether `PreferNoSchedule` taints are tolerated.
    pub tolerate_prefer_no_schedule: bool,
}

/// The constraints a pod is scheduled under at one relaxation level.
#[derive(Debug, Clone)]
pub struct Constraints {
    /// Node requirements: nodeSelector ∩ the first remaining required term ∩ the heaviest remaining
    /// preferred term.
    pub requirements: Requirements,
    /// The same without the preferred term: what topology weighs domains against, as Karpenter's
    /// `StrictRequirements` (a preference must not hide a domain from a spread's minimum).
    pub strict: Requirements,
    /// Whether `PreferNoSchedule` taints are tolerated.
    pub tolerate_prefer_no_schedule: bool,
}

impl Relaxation {
    /// The constraints of `pod` at this level.
    pub fn constraints(&self, pod: &PodInfo) -> Constraints {
        let mut requirements = pod.node_selector.clone();
        if let Some(term) = pod.required_terms.get(self.required_terms_dropped) {
            requirements.add_all(term);
        }
        let strict = requirements.clone();
        if let Some((_, term)) = pod.preferred_terms.get(self.preferred_terms_dropped) {
            requirements.add_all(term);
        }
        Constraints { requirements, strict, tolerate_prefer_no_schedule: self.tolerate_prefer_no_schedule }
    }

    /// The topology terms of `pod` in force at this level, as positions in [`PodInfo::all_terms`], in that
    /// order: every required term, then the spreads, preferred affinities and preferred anti-affinities not
    /// yet relaxed.
    pub fn terms_in_force(&self, pod: &PodInfo) -> impl Iterator<Item = usize> + use<> {
        let required = pod.topology.len();
        let soft = required + pod.soft_spreads.len();
        let affinity = soft + pod.preferred_affinity.len();
        let anti_affinity = affinity + pod.preferred_anti_affinity.len();
        (0..required)
            .chain(required + self.soft_spreads_dropped..soft)
            .chain(soft + self.preferred_affinity_dropped..affinity)
            .chain(affinity + self.preferred_anti_affinity_dropped..anti_affinity)
    }

    /// Relaxes one more preference, in order: an OR term of required node affinity, the heaviest preferred
    /// pod affinity, the heaviest preferred anti-affinity, the heaviest preferred node affinity, a
    /// `ScheduleAnyway` spread, then `PreferNoSchedule` taints. Returns what was relaxed, or `None` when
    /// nothing is left.
    pub fn relax(&mut self, pod: &PodInfo, prefer_no_schedule_possible: bool) -> Option<&'static str> {
        if self.required_terms_dropped + 1 < pod.required_terms.len() {
            self.required_terms_dropped += 1;
            Some("a required node affinity term")
        } else if self.preferred_affinity_dropped < pod.preferred_affinity.len() {
            self.preferred_affinity_dropped += 1;
            Some("a preferred pod affinity term")
        } else if self.preferred_anti_affinity_dropped < pod.preferred_anti_affinity.len() {
            self.preferred_anti_affinity_dropped += 1;
            Some("a preferred pod anti-affinity term")
        } else if self.preferred_terms_dropped < pod.preferred_terms.len() {
            self.preferred_terms_dropped += 1;
            Some("a preferred node affinity term")
        } else if self.soft_spreads_dropped < pod.soft_spreads.len() {
            self.soft_spreads_dropped += 1;
            Some("a ScheduleAnyway topology spread")
        } else if prefer_no_schedule_possible && !self.tolerate_prefer_no_schedule {
            self.tolerate_prefer_no_schedule = true;
            Some("PreferNoSchedule taints")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> PodInfo {
        let p: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})).unwrap();
        PodInfo::from_pod(&p).unwrap()
    }

    #[test]
    fn selection_classes_join_only_pods_alike() {
        let with = |ns: &str, app: &str| {
            let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": ns,
                "labels": {"app": app}}, "spec": {"containers": []}}))
            .unwrap();
            PodInfo::from_pod(&p).unwrap()
        };
        let (a, b, c) = (with("ns", "web"), with("ns", "web"), with("ns", "web"));
        let (other_app, other_ns) = (with("ns", "api"), with("other", "web"));
        // Unclassed pods compare their namespaces and labels.
        assert!(a.selected_alike(&b) && !a.selected_alike(&other_app) && a.class_id().is_none());
        let mut classes = SelectionClasses::default();
        for p in [&a, &b, &other_app, &other_ns] {
            classes.assign(p);
        }
        // One class for the two alike, one each for the others; a pod without one still compares.
        assert!(a.class_id().is_some() && a.class_id() == b.class_id());
        assert!(a.class_id() != other_app.class_id() && a.class_id() != other_ns.class_id());
        assert!(other_app.class_id() != other_ns.class_id());
        assert!(a.selected_alike(&b) && a.selected_alike(&c) && c.selected_alike(&b));
        for p in [&a, &b, &c] {
            assert!(!p.selected_alike(&other_app) && !other_app.selected_alike(p));
            assert!(!p.selected_alike(&other_ns) && !other_ns.selected_alike(p));
        }
        // A copy holds no class, so it may change its labels first; classed, it joins its new labels' class.
        let mut copy = a.clone();
        copy.labels.insert("app".into(), "api".into());
        assert!(copy.class_id().is_none() && !copy.selected_alike(&a) && copy.selected_alike(&other_app));
        classes.assign(&copy);
        assert_eq!(copy.class_id(), other_app.class_id());
        // Classes no pod holds are forgotten; those held stay.
        drop((other_ns, copy, other_app));
        classes.sweep();
        assert_eq!(classes.by_hash.values().map(Vec::len).sum::<usize>(), 1);
        classes.assign(&c);
        assert_eq!(c.class_id(), a.class_id());
    }

    #[test]
    fn requests_follow_the_kubelet_rules() {
        // Sum of containers (1 + 0.5 cpu) plus a sidecar (0.25) beats the biggest init container (1.5).
        let p = pod(json!({
            "initContainers": [
                {"name": "init", "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}},
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}}
            ],
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}},
                {"name": "b", "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}
            ],
            "overhead": {"cpu": "100m"}
        }));
        assert_eq!(p.requests.get(ResourceName::CPU), 1750 + 100);
        assert_eq!(p.requests.get(ResourceName::MEMORY), 1 << 30, "the init container's memory peak wins");
        assert_eq!(p.requests.get(ResourceName::NVIDIA_GPU), 1);
        assert_eq!(p.requests.get(ResourceName::PODS), 1);
    }

    #[test]
    fn bad_quantities_name_the_field() {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "lots"}}}]}}))
        .unwrap();
        let e = PodInfo::from_pod(&p).unwrap_err();
        assert_eq!(e.field, "spec.containers[0].resources");
        assert!(e.to_string().contains("default/p"));
    }

    #[test]
    fn constraints_relax_in_order() {
        let p = pod(json!({
            "containers": [{"name": "a"}],
            "nodeSelector": {"kubernetes.io/arch": "amd64"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]},
                        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]}
                    ]},
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "preference": {"matchExpressions": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}},
                        {"weight": 50, "preference": {"matchExpressions": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}}
                    ]
                },
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}}
                ]}
            },
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "web"}}}
            ]
        }));
        let mut relax = Relaxation::default();
        let c = relax.constraints(&p);
        assert_eq!(c.requirements.get(labels::ZONE).unwrap().values(), ["a"]);
        assert_eq!(c.requirements.get(labels::CAPACITY_TYPE).unwrap().values(), ["spot"], "heaviest preference first");
        let terms: Vec<&TopologyTerm> = p.all_terms().collect();
        let in_force: Vec<&TopologyTerm> = relax.terms_in_force(&p).map(|i| terms[i]).collect();
        assert_eq!(in_force, [&p.soft_spreads[0], &p.preferred_anti_affinity[0].1]);
        let mut partly = relax;
        partly.relax(&p, true);
        partly.relax(&p, true);
        let in_force: Vec<&TopologyTerm> = partly.terms_in_force(&p).map(|i| terms[i]).collect();
        assert_eq!(in_force, [&p.soft_spreads[0]], "the anti-affinity term is relaxed before the spread");
        let steps: Vec<&str> = std::iter::from_fn(|| relax.relax(&p, true)).collect();
        assert_eq!(
            steps,
            [
                "a required node affinity term",
                "a preferred pod anti-affinity term",
                "a preferred node affinity term",
                "a preferred node affinity term",
                "a ScheduleAnyway topology spread",
                "PreferNoSchedule taints"
            ]
        );
        let c = relax.constraints(&p);
        assert_eq!(c.requirements.get(labels::ZONE).unwrap().values(), ["b"]);
        assert!(c.requirements.get(labels::CAPACITY_TYPE).is_none());
        assert_eq!(relax.terms_in_force(&p).count(), 0);
        assert!(c.tolerate_prefer_no_schedule);
    }

    #[test]
    fn selectors_and_host_ports() {
        let p = pod(json!({"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}));
        assert_eq!(p.host_ports, vec![HostPort { ip: "0.0.0.0".into(), port: 8080, protocol: "TCP".into() }]);
        assert!(p.host_ports[0].conflicts(&HostPort { ip: "10.0.0.1".into(), port: 8080, protocol: "TCP".into() }));
        assert!(!p.host_ports[0].conflicts(&HostPort { ip: "0.0.0.0".into(), port: 8080, protocol: "UDP".into() }));
        let mut l = BTreeMap::new();
        l.insert("app".to_owned(), "web".to_owned());
        assert!(Selector::labels(&[("app", "web")]).matches(&l));
        assert!(!Selector::from_label_selector(None).matches(&l));
    }
}
