//! The port between controllers and Kubernetes: the writes decisions turn into.
//!
//! Controllers never talk to an API server directly; they call a [`Cluster`]. `tenon run` implements it on
//! kube-rs, `tenon simulate` on its virtual cluster, and tests on [`InMemoryCluster`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::api::{ConditionStatus, DisruptionReason, NodeClaim, condition_types};

/// Why a write failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The object does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The API server refused or failed the write.
    #[error("{object}: {message}")]
    Write {
        /// The object.
        object: String,
        /// What happened.
        message: String,
    },
}

/// How far a claim has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimProgress {
    /// The claim is gone (deleted, or its launch failed for good).
    Missing,
    /// Launched or registering, not yet initialized.
    Pending,
    /// Initialized: Ready, startup taints gone, resources reported.
    Initialized,
}

/// The writes controllers make.
pub trait Cluster {
    /// Adds a taint to a node (idempotent).
    fn taint_node(&mut self, node: &str, taint: Taint) -> Result<(), ClusterError>;
    /// Removes the taint with `key` from a node (idempotent).
    fn untaint_node(&mut self, node: &str, key: &str) -> Result<(), ClusterError>;
    /// Sets (or, with `None`, clears) the `DisruptionReason` condition of a claim.
    fn set_disruption_reason(
        &mut self,
        claim: &str,
        reason: Option<DisruptionReason>,
        now: Timestamp,
    ) -> Result<(), ClusterError>;
    /// Creates a claim.
    fn create_claim(&mut self, claim: NodeClaim) -> Result<(), ClusterError>;
    /// Deletes a claim (its node follows through termination).
    fn delete_claim(&mut self, claim: &str) -> Result<(), ClusterError>;
    /// How far a claim has come.
    fn claim_progress(&self, claim: &str) -> ClaimProgress;
}

/// An in-memory cluster for tests and the simulator.
#[derive(Debug, Default, Clone)]
pub struct InMemoryCluster {
    /// Taints per node.
    pub taints: BTreeMap<String, Vec<Taint>>,
    /// Claims by name (shared: a state built from the cluster shares them; writes copy on write).
    pub claims: BTreeMap<String, Arc<NodeClaim>>,
    /// Claims deleted, in order.
    pub deleted: Vec<String>,
    /// Every write, in order, for assertions on ordering.
    pub log: Vec<String>,
    /// Writes to fail, by claim or node name.
    pub fail_writes: HashMap<String, String>,
    /// Nodes by name (shared, as claims).
    pub nodes: BTreeMap<String, Arc<Node>>,
    /// Pods by `namespace/name` (shared, as claims).
    pub pods: BTreeMap<String, Arc<Pod>>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<PodDisruptionBudget>,
    /// Pods evicted, in order.
    pub evicted: Vec<String>,
    /// The API server's clock, stamped on created objects.
    pub now: Option<Timestamp>,
    /// VolumeAttachments: attachment name → node.
    pub volume_attachments: BTreeMap<String, String>,
}

/// The objects the lifecycle controllers read and write.
pub trait Objects {
    /// Every claim.
    fn claims(&self) -> Vec<NodeClaim>;
    /// One claim.
    fn claim(&self, name: &str) -> Option<NodeClaim>;
    /// Creates or updates a claim (metadata, spec and status).
    fn put_claim(&mut self, claim: NodeClaim);
    /// Removes a claim whose finalizer was released.
    fn remove_claim(&mut self, name: &str);
    /// Every node.
    fn nodes(&self) -> Vec<Node>;
    /// One node, by name.
    fn node(&self, name: &str) -> Option<Node> {
        self.nodes().into_iter().find(|n| n.metadata.name.as_deref() == Some(name))
    }
    /// The nodes whose `spec.providerID` is `provider_id` (more than one is the caller's to report).
    fn nodes_with_provider_id(&self, provider_id: &str) -> Vec<Node> {
        self.nodes().into_iter().filter(|n| node_provider_id(n) == Some(provider_id)).collect()
    }
    /// Whether a node whose `spec.providerID` is `provider_id` is being deleted.
    fn node_being_deleted(&self, provider_id: &str) -> bool {
        self.nodes_with_provider_id(provider_id).iter().any(|n| n.metadata.deletion_timestamp.is_some())
    }
    /// Creates or updates a node.
    fn put_node(&mut self, node: Node);
    /// Removes a node.
    fn remove_node(&mut self, name: &str);
    /// Every pod.
    fn pods(&self) -> Vec<Pod>;
    /// Every running pod that moves with its node, as `(namespace/name, node)`: bound, not finished, not a
    /// DaemonSet's. What the pod-events controller watches.
    fn pod_bindings(&self) -> Vec<(String, String)> {
        self.pods().iter().filter_map(pod_binding).collect()
    }
    /// Calls `f` with the key and node of each binding [`Objects::pod_bindings`] lists, without
    /// building the list (the pod-events controller reads every binding on every pass).
    fn for_each_binding(&self, f: &mut dyn FnMut(&str, &str)) {
        for (pod, node) in self.pod_bindings() {
            f(&pod, &node);
        }
    }
    /// The pods bound to `node` (a field selector on `spec.nodeName` against an API server).
    fn pods_on_node(&self, node: &str) -> Vec<Pod> {
        self.pods().into_iter().filter(|p| pod_node(p) == Some(node)).collect()
    }
    /// PodDisruptionBudgets.
    fn pdbs(&self) -> Vec<PodDisruptionBudget>;
    /// Names of the VolumeAttachments still bound to a node.
    fn volume_attachments(&self, node: &str) -> Vec<String>;
    /// Evicts a pod through the eviction API (the caller has checked its PDBs).
    fn evict_pod(&mut self, key: &str);
    /// Deletes a pod without eviction (forced, after the termination grace period).
    fn delete_pod(&mut self, key: &str);
}

/// A node's `spec.providerID`.
pub fn node_provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref()?.provider_id.as_deref()
}

/// `(namespace/name, node)` for a pod bound to a node, not finished and not owned by a DaemonSet.
pub fn pod_binding(pod: &Pod) -> Option<(String, String)> {
    let node = pod_node(pod)?;
    (!pod_finished(pod) && !owned_by_daemon_set(pod)).then(|| (pod_key(pod), node.to_owned()))
}

/// Whether a pod has finished: its phase is `Succeeded` or `Failed`.
pub fn pod_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Whether a DaemonSet owns the pod.
pub fn owned_by_daemon_set(pod: &Pod) -> bool {
    pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet")
}

/// The node a pod is bound to, from `spec.nodeName`.
pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl Objects for InMemoryCluster {
    fn claims(&self) -> Vec<NodeClaim> {
        self.claims.values().map(|c| NodeClaim::clone(c)).collect()
    }
    fn claim(&self, name: &str) -> Option<NodeClaim> {
        self.claims.get(name).map(|c| NodeClaim::clone(c))
    }
    fn put_claim(&mut self, claim: NodeClaim) {
        self.claims.insert(claim.name().to_owned(), Arc::new(claim));
    }
    fn remove_claim(&mut self, name: &str) {
        if self.claims.remove(name).is_some() {
            self.log.push(format!("removed {name}"));
        }
    }
    fn nodes(&self) -> Vec<Node> {
        self.nodes.values().map(|n| Node::clone(n)).collect()
    }
    fn node(&self, name: &str) -> Option<Node> {
        self.nodes.get(name).map(|n| Node::clone(n))
    }
    fn nodes_with_provider_id(&self, provider_id: &str) -> Vec<Node> {
        self.nodes.values().filter(|n| node_provider_id(n) == Some(provider_id)).map(|n| Node::clone(n)).collect()
    }
    fn node_being_deleted(&self, provider_id: &str) -> bool {
        self.nodes.values().any(|n| node_provider_id(n) == Some(provider_id) && n.metadata.deletion_timestamp.is_some())
    }
    fn put_node(&mut self, node: Node) {
        self.nodes.insert(node.metadata.name.clone().unwrap_or_default(), Arc::new(node));
    }
    fn remove_node(&mut self, name: &str) {
        if self.nodes.remove(name).is_some() {
            self.log.push(format!("removed node {name}"));
        }
    }
    fn pods(&self) -> Vec<Pod> {
        self.pods.values().map(|p| Pod::clone(p)).collect()
    }
    fn pods_on_node(&self, node: &str) -> Vec<Pod> {
        self.pods.values().filter(|p| pod_node(p) == Some(node)).map(|p| Pod::clone(p)).collect()
    }
    fn pod_bindings(&self) -> Vec<(String, String)> {
        self.pods.values().filter_map(|p| pod_binding(p)).collect()
    }
    fn for_each_binding(&self, f: &mut dyn FnMut(&str, &str)) {
        // The map is keyed by `namespace/name`, the key `pod_binding` would build.
        for (key, pod) in &self.pods {
            if let Some(node) = pod_node(pod)
                && !pod_finished(pod)
                && !owned_by_daemon_set(pod)
            {
                f(key, node);
            }
        }
    }
    fn pdbs(&self) -> Vec<PodDisruptionBudget> {
        self.pdbs.clone()
    }
    fn volume_attachments(&self, node: &str) -> Vec<String> {
        self.volume_attachments.iter().filter(|(_, n)| n.as_str() == node).map(|(v, _)| v.clone()).collect()
    }
    fn evict_pod(&mut self, key: &str) {
        if self.pods.remove(key).is_some() {
            self.log.push(format!("evict {key}"));
            self.evicted.push(key.to_owned());
        }
    }
    fn delete_pod(&mut self, key: &str) {
        if self.pods.remove(key).is_some() {
            self.log.push(format!("force-delete {key}"));
        }
    }
}

impl InMemoryCluster {
    /// Marks a claim initialized.
    pub fn initialize(&mut self, claim: &str, now: Timestamp) {
        if let Some(c) = self.claims.get_mut(claim).map(Arc::make_mut) {
            c.set_condition(condition_types::INITIALIZED, ConditionStatus::True, "Initialized", "", now);
        }
    }

    fn check(&self, object: &str) -> Result<(), ClusterError> {
        match self.fail_writes.get(object) {
            Some(message) => Err(ClusterError::Write { object: object.to_owned(), message: message.clone() }),
            None => Ok(()),
        }
    }
}

impl Cluster for InMemoryCluster {
    fn taint_node(&mut self, node: &str, taint: Taint) -> Result<(), ClusterError> {
        self.check(node)?;
        self.log.push(format!("taint {node} {}", taint.key));
        let taints = self.taints.entry(node.to_owned()).or_default();
        if !taints.iter().any(|t| t.key == taint.key && t.effect == taint.effect) {
            taints.push(taint);
        }
        Ok(())
    }

    fn untaint_node(&mut self, node: &str, key: &str) -> Result<(), ClusterError> {
        self.check(node)?;
        self.log.push(format!("untaint {node} {key}"));
        if let Some(t) = self.taints.get_mut(node) {
            t.retain(|t| t.key != key);
        }
        Ok(())
    }

    fn set_disruption_reason(
        &mut self,
        claim: &str,
        reason: Option<DisruptionReason>,
        now: Timestamp,
    ) -> Result<(), ClusterError> {
        self.check(claim)?;
        self.log.push(format!("reason {claim} {}", reason.map(|r| r.as_str()).unwrap_or("-")));
        let Some(c) = self.claims.get_mut(claim).map(Arc::make_mut) else {
            return Err(ClusterError::NotFound(format!("NodeClaim/{claim}")));
        };
        match reason {
            Some(r) => c.set_condition(condition_types::DISRUPTION_REASON, ConditionStatus::True, r.as_str(), "", now),
            None => {
                if let Some(st) = c.status.as_mut() {
                    st.conditions.retain(|x| x.type_ != condition_types::DISRUPTION_REASON);
                }
            }
        }
        Ok(())
    }

    fn create_claim(&mut self, mut claim: NodeClaim) -> Result<(), ClusterError> {
        self.check(claim.name())?;
        self.log.push(format!("create {}", claim.name()));
        // As an API server does: a UID and a creation time.
        claim.metadata.uid.get_or_insert_with(|| format!("uid-{}", claim.metadata.name.as_deref().unwrap_or_default()));
        if let (None, Some(now)) = (&claim.metadata.creation_timestamp, self.now) {
            claim.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        }
        self.claims.insert(claim.name().to_owned(), Arc::new(claim));
        Ok(())
    }

    fn delete_claim(&mut self, claim: &str) -> Result<(), ClusterError> {
        self.check(claim)?;
        self.log.push(format!("delete {claim}"));
        // The termination finalizer holds the object: deletion only sets its timestamp.
        let now = self.now.unwrap_or(Timestamp::UNIX_EPOCH);
        match self.claims.get_mut(claim).map(Arc::make_mut) {
            Some(c) => {
                c.metadata.deletion_timestamp.get_or_insert(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
            }
            None => return Err(ClusterError::NotFound(format!("NodeClaim/{claim}"))),
        }
        self.deleted.push(claim.to_owned());
        Ok(())
    }

    fn claim_progress(&self, claim: &str) -> ClaimProgress {
        match self.claims.get(claim) {
            None => ClaimProgress::Missing,
            Some(c) if c.is_initialized() => ClaimProgress::Initialized,
            Some(_) => ClaimProgress::Pending,
        }
    }
}
