//! Draining a node that is going away: taint it, evict its pods through the eviction API group by group
//! (respecting PDBs and `karpenter.sh/do-not-disrupt`), and force what is left once the claim's
//! `terminationGracePeriod` runs out.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use crate::api::labels;
use crate::cluster::{ApiErrorKind, Cluster, Snapshot, pod_key};
use crate::scheduling::{Selector, taints};

/// Drain order: non-critical pods before critical ones, and within each, workloads before DaemonSet pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DrainGroup {
    /// Ordinary workload pods.
    NonCritical,
    /// DaemonSet pods that are not critical.
    NonCriticalDaemon,
    /// `system-cluster-critical` / `system-node-critical` workload pods.
    Critical,
    /// Critical DaemonSet pods.
    CriticalDaemon,
}

/// Where a drain stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainStatus {
    /// Whether nothing drainable is left.
    pub done: bool,
    /// Pods evicted in this step.
    pub evicted: Vec<String>,
    /// Pods forcibly deleted in this step (grace period over).
    pub forced: Vec<String>,
    /// Pods that must wait, with why.
    pub waiting: Vec<(String, String)>,
}

fn group(pod: &Pod) -> DrainGroup {
    let critical = matches!(
        pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()),
        Some("system-cluster-critical" | "system-node-critical")
    );
    let daemon = crate::cluster::owned_by_daemon_set(pod);
    match (critical, daemon) {
        (false, false) => DrainGroup::NonCritical,
        (false, true) => DrainGroup::NonCriticalDaemon,
        (true, false) => DrainGroup::Critical,
        (true, true) => DrainGroup::CriticalDaemon,
    }
}

/// How long past its deletion timestamp (its grace period's end) a terminating pod is awaited; after that
/// it is stuck, as Karpenter judges, and no longer holds the drain.
pub const STUCK_TERMINATING: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the pod is drained at all: not finished, not a static pod, not tolerating the disruption
/// taint, and not stuck terminating (deleted, and a minute past its deletion timestamp).
pub fn drainable(pod: &Pod, now: Timestamp) -> bool {
    let stuck = pod
        .metadata
        .deletion_timestamp
        .as_ref()
        .is_some_and(|t| now > t.0 && crate::clock::since(now, t.0) > STUCK_TERMINATING);
    !stuck && drained_at_all(pod)
}

fn drained_at_all(pod: &Pod) -> bool {
    let static_pod = pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "Node");
    let disrupted = taints::taint(labels::DISRUPTED_TAINT, None, "NoSchedule");
    let tolerates = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|t| t.iter().any(|t| taints::tolerates(t, &disrupted)));
    !crate::cluster::pod_finished(pod) && !static_pod && !tolerates
}

fn do_not_disrupt(pod: &Pod, now: Timestamp) -> bool {
    let Some(annotations) = pod.metadata.annotations.as_ref() else { return false };
    let started = pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
    crate::cluster::do_not_disrupt_active(annotations, started, now)
}

/// One drain step for `node`, read from `snapshot` and written through `cluster`. Evicts the pods of the
/// first group that still has any, as far as their PDBs allow; DaemonSet and critical pods go last. Once
/// `grace_deadline` has passed, whatever is left is deleted. An eviction the API refuses (a PDB's 429, a
/// failed call) leaves the pod waiting for the next step; a pod already gone counts as drained.
pub async fn drain(
    cluster: &dyn Cluster,
    snapshot: &Snapshot,
    node: &str,
    grace_deadline: Option<Timestamp>,
    now: Timestamp,
) -> DrainStatus {
    let on_node: Vec<&Arc<Pod>> = snapshot.pods_on_node(node).collect();
    drain_pods(cluster, snapshot, &on_node, grace_deadline, now).await
}

/// As [`drain`], given the pods of `snapshot` bound to the node ([`Snapshot::pods_on_node`]), in key order.
pub async fn drain_pods(
    cluster: &dyn Cluster,
    snapshot: &Snapshot,
    on_node: &[&Arc<Pod>],
    grace_deadline: Option<Timestamp>,
    now: Timestamp,
) -> DrainStatus {
    DrainPlan::new(snapshot, on_node, grace_deadline, now).run(cluster).await
}

/// One drain step as read from a snapshot ([`DrainPlan::new`]), to be carried out through the API
/// ([`DrainPlan::run`]). It holds nothing of the snapshot: a caller may let go of it first, so that the
/// evictions' writes need not copy a pod map it still shares.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainPlan {
    step: Step,
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// Nothing drainable is left.
    Done,
    /// The grace period is over: these pods are deleted.
    Force(Vec<String>),
    /// The pods of the first group that has any, each to evict or to wait; with each PDB's namespace and
    /// how many more evictions it allows at the start of the step.
    Evict { pods: Vec<(String, Eviction)>, allowed: Vec<(String, i32)> },
}

#[derive(Debug, Clone, PartialEq)]
enum Eviction {
    /// Waits, for this reason.
    Wait(String),
    /// Evicted unless one of these PDBs (by index) allows no more by then.
    Evict(Vec<usize>),
}

impl DrainPlan {
    /// The step for `on_node`, the pods of `snapshot` bound to the node, in key order: the PDB allowances
    /// are counted over every pod of the snapshot, once per step, and spent as the step evicts.
    pub fn new(snapshot: &Snapshot, on_node: &[&Arc<Pod>], grace_deadline: Option<Timestamp>, now: Timestamp) -> Self {
        let mut on_node: Vec<&Pod> = on_node.iter().map(|p| p.as_ref()).filter(|p| drainable(p, now)).collect();
        if on_node.is_empty() {
            return Self { step: Step::Done };
        }
        if grace_deadline.is_some_and(|d| now >= d) {
            return Self { step: Step::Force(on_node.into_iter().map(pod_key).collect()) };
        }
        on_node.sort_by_key(|p| group(p));
        let first = group(on_node[0]);
        let mut allowed = Vec::with_capacity(snapshot.pdbs.len());
        let mut selectors = Vec::with_capacity(snapshot.pdbs.len());
        for pdb in snapshot.pdbs.iter() {
            let ns = pdb.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            let sel = Selector::from_label_selector(pdb.spec.as_ref().and_then(|s| s.selector.as_ref()));
            let matching: Vec<&Pod> = snapshot
                .pods
                .values()
                .map(|p| &**p)
                .filter(|p| {
                    p.metadata.namespace.as_deref().unwrap_or("default") == ns
                        && sel.matches(&p.metadata.labels.clone().unwrap_or_default())
                })
                .collect();
            let expected = matching.iter().filter(|p| !crate::cluster::pod_finished(p)).count() as i32;
            let healthy = matching.iter().filter(|p| crate::cluster::pdb_healthy(p)).count() as i32;
            allowed.push((ns.clone(), crate::cluster::pdb_disruptions_allowed(pdb, expected, healthy)));
            selectors.push((ns, sel));
        }
        let pods = on_node
            .into_iter()
            .filter(|p| group(p) == first)
            .map(|p| {
                let key = pod_key(p);
                if do_not_disrupt(p, now) {
                    return (key, Eviction::Wait(format!("{} is set", labels::DO_NOT_DISRUPT)));
                }
                let ns = p.metadata.namespace.as_deref().unwrap_or("default");
                let pod_labels = p.metadata.labels.clone().unwrap_or_default();
                let blocking = selectors
                    .iter()
                    .enumerate()
                    .filter(|(_, (pns, sel))| pns == ns && sel.matches(&pod_labels))
                    .map(|(i, _)| i)
                    .collect();
                (key, Eviction::Evict(blocking))
            })
            .collect();
        Self { step: Step::Evict { pods, allowed } }
    }

    /// Carries the step out through `cluster`: an eviction the API refuses (a PDB's 429, a failed call)
    /// leaves the pod waiting for the next step; a pod already gone counts as drained.
    pub async fn run(self, cluster: &dyn Cluster) -> DrainStatus {
        let mut status = DrainStatus::default();
        match self.step {
            Step::Done => status.done = true,
            Step::Force(keys) => {
                let mut left = false;
                for key in keys {
                    match cluster.delete_pod(&key).await {
                        Ok(()) => status.forced.push(key),
                        Err(e) if e.is_not_found() => {}
                        Err(e) => {
                            left = true;
                            status.waiting.push((key, e.to_string()));
                        }
                    }
                }
                status.done = !left;
            }
            Step::Evict { pods, mut allowed } => {
                for (key, eviction) in pods {
                    let blocking = match eviction {
                        Eviction::Wait(why) => {
                            status.waiting.push((key, why));
                            continue;
                        }
                        Eviction::Evict(blocking) => blocking,
                    };
                    if let Some(i) = blocking.iter().find(|i| allowed[**i].1 < 1) {
                        status.waiting.push((key, format!("a PDB in {} allows no more evictions", allowed[*i].0)));
                        continue;
                    }
                    match cluster.evict_pod(&key).await {
                        Ok(()) => {
                            for i in blocking {
                                allowed[i].1 -= 1;
                            }
                            status.evicted.push(key);
                        }
                        Err(e) if e.is_not_found() => {}
                        Err(e) if e.kind == ApiErrorKind::TooManyRequests => {
                            status
                                .waiting
                                .push((key, "the eviction API refused: a PodDisruptionBudget allows no more".into()));
                        }
                        Err(e) => status.waiting.push((key, e.to_string())),
                    }
                }
            }
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::InMemoryApi;
    use crate::cluster::memory::{Fault, Write};
    use serde_json::json;

    fn pod(name: &str, extra: serde_json::Value) -> Pod {
        let mut v = json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}});
        crate::testing::merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn cluster(pods: Vec<Pod>) -> InMemoryApi {
        let c = InMemoryApi::default();
        for p in pods {
            c.lock().put_pod(p);
        }
        c
    }

    async fn step(c: &InMemoryApi, deadline: Option<Timestamp>, now: Timestamp) -> DrainStatus {
        drain(c, &c.snapshot(), "n1", deadline, now).await
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_767_225_600 + s).unwrap()
    }

    /// A pod stuck terminating (a minute past its deletion timestamp) no longer holds the drain, as
    /// Karpenter judges; one still inside its grace period does.
    #[tokio::test]
    async fn pods_stuck_terminating_do_not_block_the_drain() {
        let deleted_at = |at: i64| json!({"metadata": {"deletionTimestamp": serde_json::to_value(t(at)).unwrap(), "finalizers": ["example.com/hold"]}});
        let s = step(&cluster(vec![pod("stuck", deleted_at(0))]), None, t(30)).await;
        assert!(!s.done, "inside the minute it is awaited");
        let s = step(&cluster(vec![pod("stuck", deleted_at(0))]), None, t(61)).await;
        assert!(s.done, "{s:?}");
        assert!(s.evicted.is_empty() && s.forced.is_empty(), "nothing is asked of it: {s:?}");
    }

    #[tokio::test]
    async fn drains_non_critical_pods_first_and_daemons_last() {
        let daemon = json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "1"}]}});
        let critical = json!({"spec": {"priorityClassName": "system-cluster-critical"}});
        let c = cluster(vec![pod("web", json!({})), pod("agent", daemon), pod("dns", critical)]);
        assert_eq!(step(&c, None, t(0)).await.evicted, ["default/web"]);
        assert_eq!(step(&c, None, t(1)).await.evicted, ["default/agent"]);
        assert_eq!(step(&c, None, t(2)).await.evicted, ["default/dns"]);
        assert!(step(&c, None, t(3)).await.done);
    }

    #[tokio::test]
    async fn skips_static_finished_and_tolerating_pods() {
        let static_pod =
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "1"}]}});
        let done = json!({"status": {"phase": "Succeeded"}});
        let tolerant = json!({"spec": {"tolerations": [{"key": labels::DISRUPTED_TAINT, "operator": "Exists"}]}});
        let c = cluster(vec![pod("mirror", static_pod), pod("finished", done), pod("stays", tolerant)]);
        let s = step(&c, None, t(0)).await;
        assert!(s.done && s.evicted.is_empty());
    }

    #[tokio::test]
    async fn pdbs_and_do_not_disrupt_hold_pods_until_the_grace_period_ends() {
        let c = cluster(vec![
            pod("web-1", json!({"metadata": {"labels": {"app": "web"}}})),
            pod("web-2", json!({"metadata": {"labels": {"app": "web"}}})),
            pod("train", json!({"metadata": {"annotations": {labels::DO_NOT_DISRUPT: "true"}}})),
        ]);
        c.lock().add_pdb(
            serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "default"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}}))
            .unwrap(),
        );
        let s = step(&c, Some(t(600)), t(0)).await;
        assert_eq!(s.evicted.len(), 1, "the PDB allows one eviction at a time");
        assert_eq!(s.waiting.len(), 2);
        assert!(!s.done);
        let s = step(&c, Some(t(600)), t(600)).await;
        assert_eq!(s.forced.len(), 2, "past the termination grace period the rest is deleted");
        assert!(s.done);
    }

    /// The drain and the disruption candidates count a PDB's healthy pods alike: a pod that is not Ready
    /// is not healthy, so `minAvailable: 2` over three pods, one of them not Ready, allows no eviction.
    #[tokio::test]
    async fn a_pdb_counts_only_ready_pods_healthy_as_the_candidates_do() {
        let not_ready = json!({"metadata": {"labels": {"app": "web"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}});
        let c = cluster(vec![
            pod("web-1", json!({"metadata": {"labels": {"app": "web"}}})),
            pod("web-2", json!({"metadata": {"labels": {"app": "web"}}})),
            pod("web-3", not_ready),
        ]);
        let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget =
            serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "default"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}}))
            .unwrap();
        c.lock().add_pdb(pdb.clone());
        let s = step(&c, None, t(0)).await;
        assert!(s.evicted.is_empty(), "{s:?}");
        assert_eq!(s.waiting.len(), 3);
        let snapshot = c.snapshot();
        let state = crate::state::ClusterState::from_snapshot(&snapshot, t(0), &mut Default::default()).unwrap();
        assert_eq!(crate::disruption::pdb_allowed(&pdb, &state), 0, "the candidates agree");
    }

    #[tokio::test]
    async fn an_eviction_the_api_refuses_waits_and_is_tried_again() {
        let c = cluster(vec![pod("web", json!({}))]);
        c.lock().inject(Write::EvictPod, Fault::fail(ApiErrorKind::TooManyRequests), 1);
        let s = step(&c, None, t(0)).await;
        assert!(s.evicted.is_empty() && !s.done);
        assert!(s.waiting[0].1.contains("PodDisruptionBudget"), "{:?}", s.waiting);
        c.lock().inject(Write::EvictPod, Fault::fail(ApiErrorKind::Unavailable), 1);
        assert!(step(&c, None, t(1)).await.evicted.is_empty());
        assert_eq!(step(&c, None, t(2)).await.evicted, ["default/web"]);
        assert!(step(&c, None, t(3)).await.done);
    }
}
