//! Executing disruption commands safely: the validation window, the queue's ordering, waiting for
//! replacements to initialize, and rollback.
//!
//! Starting a command does four things, in this order: taint the candidates `karpenter.sh/disrupted` and
//! record their disruption reason; create the replacement claims; mark the candidates for deletion; nominate
//! their pods to the replacements. Creating replacements before marking is what keeps provisioning from
//! buying capacity for the same pods twice: by the time the candidates' pods look evictable, they are
//! already nominated to capacity on its way. Candidates are deleted only once every replacement is
//! initialized; a replacement that disappears, or does not initialize before the deadline (which grows with
//! the queue), rolls the command back.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;

use super::{Command, Decision, Inputs, Method, Simulator, allowances, candidates};
use crate::api::labels;
use crate::clock;
use crate::cluster::{ApiError, ApiErrorKind, ClaimProgress, Cluster, ClusterEvent, EventType, node_has_taint};
use crate::provisioning::{self, Nominations};
use crate::scheduling::taints;
use crate::settings::Settings;
use crate::state::ClusterState;

/// The shortest a command may wait for its replacements.
pub const MIN_RETRY: Duration = Duration::from_secs(600);
/// The longest a command may wait for its replacements.
pub const MAX_RETRY: Duration = Duration::from_secs(3600);
/// How much each queued command adds to the wait.
pub const RETRY_SCALE: Duration = Duration::from_millis(80);

/// How long a command may wait for its replacements with `depth` commands queued.
pub fn retry_duration(depth: usize) -> Duration {
    (RETRY_SCALE * depth as u32).clamp(MIN_RETRY, MAX_RETRY)
}

#[derive(Debug, Clone)]
struct Item {
    command: Command,
    replacements: Vec<String>,
    deadline: Timestamp,
}

/// What became of a queued command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every replacement initialized and the candidates' claims were deleted.
    Completed {
        /// The candidates' claims.
        claims: Vec<String>,
        /// The replacement claims, all initialized.
        replacements: Vec<String>,
    },
    /// The command failed and was undone.
    RolledBack {
        /// The candidates' nodes.
        nodes: Vec<String>,
        /// Why.
        reason: String,
    },
}

/// The disruption queue.
#[derive(Debug, Default)]
pub struct Queue {
    items: Vec<Item>,
    marked: BTreeSet<String>,
    /// Commands that failed and were rolled back (`DisruptionQueueFailuresTotal`).
    pub failures_total: u64,
    /// Commands that completed.
    pub completed_total: u64,
}

impl Queue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a node is marked for deletion by a queued command.
    pub fn is_marked(&self, node: &str) -> bool {
        self.marked.contains(node)
    }

    /// Whether any queued command still holds nodes marked for deletion.
    pub fn has_marked(&self) -> bool {
        !self.marked.is_empty()
    }

    /// How many commands are in flight.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no command is in flight.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Marks the queue's candidates as deleting in a state snapshot, so provisioning reschedules their pods.
    pub fn apply(&self, state: &mut ClusterState) {
        for n in state.nodes.iter_mut().filter(|n| self.marked.contains(&n.name)) {
            n.deleting = true;
        }
    }

    /// The nodes queued commands hold.
    pub fn marked(&self) -> impl Iterator<Item = &str> {
        self.marked.iter().map(String::as_str)
    }

    /// Starts a command: taint and record the reason, create replacements, mark for deletion, nominate.
    /// Anything half-done is undone if a write fails: the taints and reasons written are removed and the
    /// replacements already created are deleted.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        &mut self,
        command: Command,
        state: &ClusterState,
        cluster: &dyn Cluster,
        nominations: &mut Nominations,
        settings: &Settings,
        now: Timestamp,
        name_for: &mut dyn FnMut(&str) -> String,
    ) -> Result<(), ApiError> {
        if let Some(c) = command.candidates.iter().find(|c| self.marked.contains(&c.node)) {
            return Err(ApiError::new(
                ApiErrorKind::Conflict,
                format!("Node/{}", c.node),
                "already in a disruption command",
            ));
        }
        // 1. Taint the candidates and record why.
        for c in &command.candidates {
            let step = async {
                taint(cluster, &c.node).await?;
                set_reason(cluster, &c.node_claim, Some(command.reason), now).await
            };
            if let Err(e) = step.await {
                self.undo(&command, &[], cluster, now).await;
                return Err(e);
            }
        }
        // 2. Create the replacements before anything looks deleted.
        let mut created = Vec::new();
        for r in &command.replacements {
            let Some(pool) = state.pool(&r.plan.pool) else { continue };
            let name = name_for(pool.name());
            if let Err(e) = cluster.create_claim(&provisioning::node_claim(&r.plan, pool, &name)).await {
                // A create whose answer was lost may have landed: it is deleted with the others.
                if e.kind == ApiErrorKind::Unavailable {
                    created.push(name);
                }
                self.undo(&command, &created, cluster, now).await;
                return Err(e);
            }
            let message = format!("Launching NodeClaim: {} replacing {}", command.reason, nodes_of(&command));
            cluster.publish(ClusterEvent::claim(&name, EventType::Normal, "DisruptionLaunching", message)).await;
            created.push(name);
        }
        for c in &command.candidates {
            let message = format!("Disrupting Node: {}", command.reason);
            cluster.publish(ClusterEvent::node(&c.node, EventType::Normal, "DisruptionTerminating", message)).await;
        }
        // 3. Mark the candidates for deletion.
        for c in &command.candidates {
            self.marked.insert(c.node.clone());
        }
        // 4. Nominate the pods to the capacity on its way. Replacements get at least as long as their pool
        // gives a node to register: bare metal that boots in twenty minutes is not a failed replacement.
        let boot = command
            .replacements
            .iter()
            .filter_map(|r| state.pool(&r.plan.pool)?.annotation(labels::NODECLAIM_REGISTRATION_TIMEOUT))
            .filter_map(|t| crate::api::parse_go_duration(t).ok())
            .max()
            .unwrap_or_default();
        let wait = retry_duration(self.items.len() + 1).max(boot);
        let until = clock::add(now, provisioning::Nominations::window(settings).max(wait));
        for (r, name) in command.replacements.iter().zip(&created) {
            for pod in &r.plan.pods {
                nominations.nominate(pod, name, until);
            }
        }
        let deadline = clock::add(now, wait);
        self.items.push(Item { command, replacements: created, deadline });
        Ok(())
    }

    /// Undoes a command: deletes the replacements it created, removes its taints and reasons, unmarks
    /// its candidates. Best effort: a write that fails here leaves a taint the next pass's clean-up
    /// ([`Queue::orphaned`]) removes.
    async fn undo(&mut self, command: &Command, replacements: &[String], cluster: &dyn Cluster, now: Timestamp) {
        for r in replacements {
            match cluster.delete_claim(r).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(claim = %r, error = %e, "could not delete a replacement while undoing"),
            }
        }
        for c in &command.candidates {
            if let Err(e) = untaint(cluster, &c.node).await {
                tracing::warn!(node = %c.node, error = %e, "could not remove the disrupted taint; retried later");
            }
            if let Err(e) = set_reason(cluster, &c.node_claim, None, now).await {
                tracing::warn!(claim = %c.node_claim, error = %e, "could not clear the disruption reason");
            }
            self.marked.remove(&c.node);
        }
    }

    /// Advances every queued command: delete candidates whose replacements all initialized, roll back
    /// those whose replacements vanished or ran out of time.
    pub async fn reconcile(&mut self, cluster: &dyn Cluster, now: Timestamp) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        let items = std::mem::take(&mut self.items);
        for item in items {
            let snapshot = cluster.snapshot();
            let progress: Vec<ClaimProgress> = item.replacements.iter().map(|r| snapshot.claim_progress(r)).collect();
            let failure = if progress.contains(&ClaimProgress::Missing) {
                Some("a replacement was deleted before it initialized".to_owned())
            } else if now >= item.deadline && !progress.iter().all(|p| *p == ClaimProgress::Initialized) {
                Some("replacements did not initialize in time".to_owned())
            } else {
                None
            };
            if let Some(reason) = failure {
                // Replacements still booting are left to run: they are ordinary capacity now.
                self.undo(&item.command, &[], cluster, now).await;
                self.failures_total += 1;
                outcomes.push(Outcome::RolledBack {
                    nodes: item.command.candidates.iter().map(|c| c.node.clone()).collect(),
                    reason,
                });
                continue;
            }
            if progress.iter().all(|p| *p == ClaimProgress::Initialized) {
                let claims: Vec<String> = item.command.candidates.iter().map(|c| c.node_claim.clone()).collect();
                let mut failed = false;
                for c in &claims {
                    if let Some(grace) = item.command.termination_grace
                        && let Err(e) = bound_termination(cluster, c, clock::add(now, grace)).await
                        && !e.is_not_found()
                    {
                        failed = true;
                        continue;
                    }
                    // A claim already gone is as good as deleted.
                    match cluster.delete_claim(c).await {
                        Ok(()) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(_) => failed = true,
                    }
                }
                if failed {
                    // Transient: try the deletes again next time.
                    self.items.push(item);
                    continue;
                }
                for c in &item.command.candidates {
                    self.marked.remove(&c.node);
                }
                self.completed_total += 1;
                outcomes.push(Outcome::Completed { claims, replacements: item.replacements.clone() });
                continue;
            }
            self.items.push(item);
        }
        outcomes
    }

    /// Nodes tainted `karpenter.sh/disrupted`, and claims carrying a disruption reason, that no queued
    /// command holds and that are not being deleted: what a restart, or an undo whose write failed, leaves
    /// behind. Karpenter removes the same leftovers before every pass.
    pub fn orphaned(&self, snapshot: &crate::cluster::Snapshot) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for claim in snapshot.claims.values() {
            if claim.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let node_name =
                claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| claim.name().to_owned());
            if self.marked.contains(&node_name) {
                continue;
            }
            let node = snapshot.node(&node_name).filter(|n| n.metadata.deletion_timestamp.is_none());
            let tainted = node.is_some_and(|n| node_has_taint(n, labels::DISRUPTED_TAINT));
            let reason = claim.condition(crate::api::condition_types::DISRUPTION_REASON).is_some();
            if tainted || reason {
                out.push((node_name, claim.name().to_owned()));
            }
        }
        out
    }

    /// Removes the leftovers [`Queue::orphaned`] finds. Returns the nodes cleaned.
    pub async fn clean_up(&mut self, cluster: &dyn Cluster, now: Timestamp) -> Vec<String> {
        let mut cleaned = Vec::new();
        for (node, claim) in self.orphaned(&cluster.snapshot()) {
            let untainted = untaint(cluster, &node).await;
            let cleared = set_reason(cluster, &claim, None, now).await;
            match (untainted, cleared) {
                (Ok(()), Ok(())) => cleaned.push(node),
                (Err(e), _) | (_, Err(e)) => tracing::debug!(node = %node, error = %e, "clean-up retried next pass"),
            }
        }
        cleaned
    }
}

fn nodes_of(command: &Command) -> String {
    command.candidates.iter().map(|c| c.node.as_str()).collect::<Vec<_>>().join(", ")
}

/// Adds the `karpenter.sh/disrupted:NoSchedule` taint to a node (idempotent).
async fn taint(cluster: &dyn Cluster, node: &str) -> Result<(), ApiError> {
    let snapshot = cluster.snapshot();
    let Some(n) = snapshot.node(node) else { return Err(ApiError::not_found(format!("Node/{node}"))) };
    if node_has_taint(n, labels::DISRUPTED_TAINT) {
        return Ok(());
    }
    let mut n = k8s_openapi::api::core::v1::Node::clone(n);
    let taints = n.spec.get_or_insert_with(Default::default).taints.get_or_insert_with(Vec::new);
    taints.push(taints::taint(labels::DISRUPTED_TAINT, None, "NoSchedule"));
    cluster.patch_node(&n).await.map(|_| ())
}

/// Removes the disrupted taint from a node (idempotent; a node already gone needs nothing).
async fn untaint(cluster: &dyn Cluster, node: &str) -> Result<(), ApiError> {
    let snapshot = cluster.snapshot();
    let Some(n) = snapshot.node(node).filter(|n| node_has_taint(n, labels::DISRUPTED_TAINT)) else { return Ok(()) };
    let mut n = k8s_openapi::api::core::v1::Node::clone(n);
    if let Some(t) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        t.retain(|t| t.key != labels::DISRUPTED_TAINT);
    }
    match cluster.patch_node(&n).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sets (or, with `None`, clears) a claim's `DisruptionReason` condition (a claim already gone needs
/// nothing cleared).
/// Writes `karpenter.sh/nodeclaim-termination-timestamp` on a claim about to be deleted, unless it already
/// holds an earlier deadline: its drain ends by `deadline`, whatever its `terminationGracePeriod`.
/// Sets `claim`'s termination deadline (`karpenter.sh/nodeclaim-termination-timestamp`) to `deadline`,
/// unless it already has an earlier one.
pub(crate) async fn bound_termination(cluster: &dyn Cluster, claim: &str, deadline: Timestamp) -> Result<(), ApiError> {
    let snapshot = cluster.snapshot();
    let Some(c) = snapshot.claim(claim) else { return Err(ApiError::not_found(format!("NodeClaim/{claim}"))) };
    if c.termination_deadline().is_some_and(|d| d <= deadline) {
        return Ok(());
    }
    let mut c = crate::api::NodeClaim::clone(c);
    let stamp = deadline.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    c.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(labels::NODECLAIM_TERMINATION_TIMESTAMP.to_owned(), stamp);
    cluster.patch_claim(&c).await.map(|_| ())
}

async fn set_reason(
    cluster: &dyn Cluster,
    claim: &str,
    reason: Option<crate::api::DisruptionReason>,
    now: Timestamp,
) -> Result<(), ApiError> {
    use crate::api::{ConditionStatus, condition_types};
    let snapshot = cluster.snapshot();
    let Some(c) = snapshot.claim(claim) else {
        return match reason {
            Some(_) => Err(ApiError::not_found(format!("NodeClaim/{claim}"))),
            None => Ok(()),
        };
    };
    let mut c = crate::api::NodeClaim::clone(c);
    let before = c.status.clone();
    match reason {
        Some(r) => c.set_condition(condition_types::DISRUPTION_REASON, ConditionStatus::True, r.as_str(), "", now),
        None => {
            if let Some(st) = c.status.as_mut() {
                st.conditions.retain(|x| x.type_ != condition_types::DISRUPTION_REASON);
            }
        }
    }
    if c.status == before {
        return Ok(());
    }
    match cluster.patch_claim_status(&c).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() && reason.is_none() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Re-checks a command against live state after the validation window: every candidate must still be a
/// candidate within budget, and the simulation must reproduce the decision. Returns the fresh command, or
/// why it is stale.
pub fn validate(command: &Command, method: Method, inputs: &Inputs<'_>) -> Result<Command, String> {
    validate_with_candidates(command, method, inputs, &std::cell::OnceCell::new())
}

/// As [`validate`], with the candidates of `inputs` found once (in `found`) for every command validated
/// against them.
fn validate_with_candidates(
    command: &Command,
    method: Method,
    inputs: &Inputs<'_>,
    found: &std::cell::OnceCell<(Vec<super::Candidate>, Vec<super::Blocked>)>,
) -> Result<Command, String> {
    if method == Method::NodeRepair {
        // Repair ignores PDBs and do-not-disrupt; the node only has to still be there.
        return match command
            .candidates
            .iter()
            .find(|c| !inputs.state.nodes.iter().any(|n| n.name == c.node && !n.deleting))
        {
            Some(c) => Err(format!("{} is gone or being deleted", c.node)),
            None => Ok(command.clone()),
        };
    }
    let (cands, blocked) = found.get_or_init(|| candidates(inputs.state, inputs.types_for, inputs.now));
    let mut chosen = Vec::new();
    for c in &command.candidates {
        if let Some(b) = blocked.iter().find(|b| b.node == c.node) {
            return Err(format!("{}: {}", c.node, b.reason));
        }
        match cands.iter().find(|x| x.node == c.node) {
            Some(x) => chosen.push(x),
            None => return Err(format!("{} is gone or being deleted", c.node)),
        }
    }
    for (pool, allowed, _) in allowances(inputs.state, command.reason, inputs.now) {
        let wanted = chosen.iter().filter(|c| c.pool == pool).count() as u64;
        if wanted > allowed {
            return Err(format!("the {} budget of NodePool {pool} now allows {allowed}", command.reason));
        }
    }
    match method {
        Method::Emptiness => match chosen.iter().find(|c| !c.is_empty()) {
            Some(c) => Err(format!("{} is no longer empty", c.node)),
            None => Ok(command.clone()),
        },
        Method::Drift | Method::StaticDrift => match chosen.iter().find(|c| c.drift.is_none()) {
            Some(c) => Err(format!("{} no longer drifts", c.node)),
            None => Ok(command.clone()),
        },
        Method::NodeRepair => Ok(command.clone()),
        Method::MultiNodeConsolidation | Method::SingleNodeConsolidation => {
            let mut sim = Simulator::new(inputs, cands);
            let fresh = sim.consolidate(&chosen, method == Method::MultiNodeConsolidation)?;
            if fresh.decision != command.decision
                || fresh.replacements.len() != command.replacements.len()
                || (fresh.decision == Decision::Replace && fresh.savings_per_hour <= 0.0)
            {
                return Err(format!(
                    "the simulation no longer reproduces the command (now {:?} with {} replacement(s))",
                    fresh.decision,
                    fresh.replacements.len()
                ));
            }
            Ok(fresh)
        }
    }
}

/// Something the disruption controller did, for events and logs.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A command was computed and waits out the validation window.
    Proposed {
        /// The method.
        method: Method,
        /// The candidates' nodes.
        nodes: Vec<String>,
    },
    /// A command failed validation and was dropped.
    Rejected {
        /// The candidates' nodes.
        nodes: Vec<String>,
        /// Why.
        reason: String,
    },
    /// A command entered the queue.
    Started {
        /// The candidates' nodes.
        nodes: Vec<String>,
        /// The method that computed it.
        method: Method,
        /// Delete or replace.
        decision: super::Decision,
        /// Why.
        reason: crate::api::DisruptionReason,
        /// For a person: the method, decision, reason and estimated saving.
        why: String,
    },
    /// A queued command finished or was undone.
    Finished(Outcome),
    /// A node's disrupted taint or its claim's reason was left with no command holding it, and removed.
    CleanedUp {
        /// The node.
        node: String,
    },
    /// Repair asks the executor to reboot a node in place.
    Reboot {
        /// The node.
        node: String,
        /// Its claim.
        claim: String,
    },
    /// Repair is blocked for a node (`DisruptionBlocked`, `NodeRepairBlocked`).
    RepairBlocked {
        /// The node.
        node: String,
        /// The event reason.
        event: &'static str,
        /// Why.
        message: String,
    },
}

#[derive(Debug, Clone)]
struct Proposal {
    command: Command,
    method: Method,
    ready_at: Timestamp,
}

/// The disruption controller: a pass every `disruption-poll-period`, commands held for the validation
/// window, then queued.
#[derive(Debug, Default)]
pub struct Controller {
    /// The queue of commands in flight.
    pub queue: Queue,
    /// Node repair and its reboot history.
    pub repairer: crate::repair::Repairer,
    /// The provider's repair policies (repair runs only with the `NodeRepair` gate on).
    pub repair_policies: Vec<crate::cloud::RepairPolicy>,
    /// Whether the provider can reboot in place.
    pub reboot_supported: bool,
    proposals: Vec<Proposal>,
    next_pass: Option<Timestamp>,
    /// The digest of the last pass that found nothing, and when it ran.
    quiet: Option<(u64, Timestamp)>,
    /// What the digests are made with.
    digests: super::DigestState,
    /// What the last pass left alone and why, and what it measured, until taken
    /// ([`Controller::take_pass_report`]).
    report: Option<(Notes, super::PassStats)>,
    /// The pools the last single-node sweep ran out of time before reaching: the next pass takes them
    /// first.
    unseen_pools: std::collections::BTreeSet<String>,
}

/// A node a disruption pass left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The node.
    pub node: String,
    /// Why, for a person.
    pub reason: String,
    /// Whether the node was no candidate at all (`DisruptionBlocked`), rather than a candidate a method
    /// examined and left (`Unconsolidatable`); see [`super::Pass::blocked`].
    pub blocked: bool,
}

/// The nodes a disruption pass left alone.
pub type Notes = Vec<Note>;

impl Controller {
    /// A controller with an empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// What the last pass computed since the previous call left alone (and why), and what it measured;
    /// `None` when no pass ran.
    pub fn take_pass_report(&mut self) -> Option<(Notes, super::PassStats)> {
        self.report.take()
    }

    /// When the controller next has something to do on its own (a proposal's validation window ending,
    /// the next pass), if it knows; queued commands also move on changes to their replacements.
    pub fn next_wake(&self) -> Option<Timestamp> {
        let ready = self.proposals.first().map(|p| p.ready_at);
        match (ready, self.next_pass) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Advances the controller to `inputs.now`. `inputs.state` should already carry the queue's marks
    /// ([`Queue::apply`]). `unread` names the nodes whose reason for staying nobody will read this pass
    /// ([`super::compute_with`]).
    pub async fn tick(
        &mut self,
        inputs: &Inputs<'_>,
        cluster: &dyn Cluster,
        nominations: &mut Nominations,
        name_for: &mut dyn FnMut(&str) -> String,
        unread: &dyn Fn(&str) -> bool,
    ) -> Vec<Event> {
        let now = inputs.now;
        let mut events: Vec<Event> =
            self.queue.reconcile(cluster, now).await.into_iter().map(Event::Finished).collect();
        if !self.proposals.is_empty() {
            if now < self.proposals[0].ready_at {
                return events;
            }
            // Every proposal is checked against the same state: its candidates are found once.
            let found = std::cell::OnceCell::new();
            for p in std::mem::take(&mut self.proposals) {
                let nodes: Vec<String> = p.command.candidates.iter().map(|c| c.node.clone()).collect();
                let c = &p.command;
                let (method, decision, reason) = (p.method, c.decision, c.reason);
                let mut why =
                    format!("{:?}, {:?} ({}), saves ${:.3}/h", p.method, c.decision, c.reason, c.savings_per_hour);
                if !c.explanation.is_empty() {
                    why = format!("{why}; {}", c.explanation);
                }
                match validate_with_candidates(&p.command, p.method, inputs, &found) {
                    Ok(fresh) => match self
                        .queue
                        .start(fresh, inputs.state, cluster, nominations, inputs.settings, now, name_for)
                        .await
                    {
                        Ok(()) => events.push(Event::Started { nodes, method, decision, reason, why }),
                        Err(e) => events.push(Event::Rejected { nodes, reason: e.to_string() }),
                    },
                    Err(reason) => events.push(Event::Rejected { nodes, reason }),
                }
            }
            return events;
        }
        if self.next_pass.is_some_and(|t| now < t) {
            return events;
        }
        self.next_pass = Some(clock::add(now, inputs.settings.disruption_poll_period));
        // Taints and reasons no command holds (a restart, an undo whose write failed) go first.
        for node in self.queue.clean_up(cluster, now).await {
            events.push(Event::CleanedUp { node });
        }
        // Repair first, when enabled.
        let ready_at = clock::add(now, inputs.settings.command_validation_delay);
        for d in self.repairer.decide(inputs, &self.repair_policies, self.reboot_supported) {
            match d {
                crate::repair::RepairDecision::Replace(command) => {
                    let nodes = command.candidates.iter().map(|c| c.node.clone()).collect();
                    events.push(Event::Proposed { method: Method::NodeRepair, nodes });
                    self.proposals.push(Proposal { command, method: Method::NodeRepair, ready_at });
                }
                crate::repair::RepairDecision::Reboot { node, claim } => {
                    self.repairer.rebooted(&node, now);
                    events.push(Event::Reboot { node, claim });
                }
                crate::repair::RepairDecision::Blocked { node, event, message } => {
                    events.push(Event::RepairBlocked { node, event, message });
                }
            }
        }
        if !self.proposals.is_empty() {
            return events;
        }
        // Nothing changed since a pass that found nothing: skip the simulations, as an unchanged cluster
        // cannot be consolidated now if it could not be then. Re-examined at least every QUIET_RECHECK.
        let (cands, blocked) = super::candidates(inputs.state, inputs.types_for, inputs.now);
        let digest = super::digest(inputs, &cands, &self.digests);
        if self.quiet.is_some_and(|(d, at)| d == digest && clock::since(now, at) < super::QUIET_RECHECK) {
            return events;
        }
        let pass = super::compute_with(inputs, cands, blocked, &self.unseen_pools, unread);
        if let Some(unseen) = &pass.unseen_pools {
            self.unseen_pools.clone_from(unseen);
        }
        self.quiet = pass.method.is_none().then_some((digest, now));
        let notes = pass
            .unconsolidatable
            .iter()
            .map(|b| Note { node: b.node.clone(), reason: b.reason.clone(), blocked: pass.blocked.contains(&b.node) })
            .collect();
        self.report = Some((notes, pass.stats.clone()));
        if let Some(method) = pass.method {
            let ready_at = clock::add(now, inputs.settings.command_validation_delay);
            for command in pass.commands {
                let nodes = command.candidates.iter().map(|c| c.node.clone()).collect();
                events.push(Event::Proposed { method, nodes });
                self.proposals.push(Proposal { command, method, ready_at });
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodeClaim, NodePool, condition_types};
    use crate::cloud::{CapacityType, InstanceType, Offering};
    use crate::cluster::{Cluster, InMemoryApi};
    use crate::resources::{ResourceName, Resources};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::json;

    fn t(secs: u64) -> Timestamp {
        clock::add("2026-03-04T12:00:00Z".parse().unwrap(), Duration::from_secs(secs))
    }

    fn catalog() -> Vec<InstanceType> {
        vec![InstanceType {
            name: "g5.2xlarge".into(),
            labels: Default::default(),
            capacity: Resources::cpu_memory(8000, 32 << 30)
                .with(ResourceName::PODS, 58)
                .with(ResourceName::NVIDIA_GPU, 1),
            overhead: Default::default(),
            offerings: vec![
                Offering::new("a", CapacityType::OnDemand, 1.21),
                Offering::new("a", CapacityType::Spot, 0.51),
            ],
        }]
    }

    fn objects(extra_pod_annotations: serde_json::Value) -> (Vec<Pod>, Vec<Node>, Vec<NodePool>) {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "od", "labels": {labels::NODE_POOL: "gpu", labels::INSTANCE_TYPE: "g5.2xlarge",
                labels::ZONE: "a", labels::CAPACITY_TYPE: "on-demand", labels::INITIALIZED: "true"}},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "58", "nvidia.com/gpu": "1"},
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "inference", "namespace": "ml", "annotations": extra_pod_annotations},
            "spec": {"nodeName": "od", "containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let pool: NodePool = serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "gpu"}, "spec": {}}))
        .unwrap();
        (vec![pod], vec![node], vec![pool])
    }

    struct World {
        api: InMemoryApi,
        types: Vec<InstanceType>,
        settings: Settings,
        nominations: Nominations,
        controller: Controller,
        seq: usize,
    }

    impl World {
        fn new() -> Self {
            let (pods, nodes, pools) = objects(json!({}));
            let api = InMemoryApi::new(t(0));
            {
                let mut o = api.lock();
                o.put_claim(crate::state::infer_claim(&nodes[0], t(0)));
                for n in nodes {
                    o.put_node(n);
                }
                for p in pods {
                    o.put_pod(p);
                }
                o.set_pools(pools);
            }
            Self {
                api,
                types: catalog(),
                settings: Settings::default(),
                nominations: Nominations::default(),
                controller: Controller::new(),
                seq: 0,
            }
        }

        fn state(&self, now: Timestamp) -> ClusterState {
            let snap = self.api.snapshot();
            let mut s = ClusterState::from_shared(
                snap.pods.values(),
                snap.nodes.values(),
                snap.claims.values(),
                &[],
                &[],
                &snap.pools,
                now,
                &mut Default::default(),
            )
            .unwrap();
            self.controller.queue.apply(&mut s);
            s
        }

        async fn tick(&mut self, now: Timestamp) -> Vec<Event> {
            self.api.set_now(now);
            let state = self.state(now);
            let types = self.types.clone();
            let types_for = move |_: &NodePool| types.clone().into();
            let inputs = Inputs { state: &state, types_for: &types_for, settings: &self.settings, now };
            let seq = &mut self.seq;
            let mut name_for = |pool: &str| {
                *seq += 1;
                format!("{pool}-r{seq}")
            };
            self.controller.tick(&inputs, &self.api, &mut self.nominations, &mut name_for, &|_| false).await
        }

        fn provision(&mut self, nominations: &mut Nominations, now: Timestamp) -> usize {
            let state = self.state(now);
            let types = self.types.clone();
            let types_for = move |_: &NodePool| types.clone().into();
            provisioning::schedule(&state, &types_for, nominations, &self.settings, now).claims.len()
        }

        fn log(&self) -> Vec<String> {
            self.api.lock().log.clone()
        }

        fn tainted(&self, node: &str) -> bool {
            node_has_taint(&self.api.snapshot().nodes[node], labels::DISRUPTED_TAINT)
        }

        fn reason(&self, claim: &str) -> bool {
            self.api.snapshot().claims[claim].condition(condition_types::DISRUPTION_REASON).is_some()
        }

        fn initialize(&self, claim: &str, now: Timestamp) {
            self.api.lock().update_claim(claim, |c| {
                c.set_condition(
                    condition_types::INITIALIZED,
                    crate::api::ConditionStatus::True,
                    "Initialized",
                    "",
                    now,
                );
            });
        }
    }

    #[tokio::test]
    async fn a_command_waits_for_validation_then_replaces_before_it_deletes() {
        let mut w = World::new();
        let events = w.tick(t(0)).await;
        assert!(matches!(&events[..], [Event::Proposed { method: Method::SingleNodeConsolidation, .. }]), "{events:?}");
        assert!(w.tick(t(10)).await.is_empty(), "nothing happens inside the 15 s window");
        assert!(w.log().is_empty());
        let events = w.tick(t(15)).await;
        assert!(
            matches!(&events[..], [Event::Started { nodes, why, .. }] if nodes == &["od"] && why.contains("Replace")),
            "{events:?}"
        );
        // The spec's order: taint and reason first, then the replacement.
        assert_eq!(w.log(), ["patch node od", "patch status od", "create gpu-r1"]);
        assert!(w.tainted("od") && w.reason("od"));
        assert!(w.controller.queue.is_marked("od"));
        // The pods of the marked node are nominated to the replacement: provisioning buys nothing for them.
        let mut nominations = w.nominations.clone();
        assert_eq!(w.provision(&mut nominations, t(16)), 0, "no double launch");
        // Even a provisioning pass whose snapshot does not show the replacement yet buys nothing: the pods
        // are nominated to it. Without the nominations that pass would buy for them a second time.
        let replacement = w.api.lock().remove_claim("gpu-r1").unwrap();
        let mut nominations = w.nominations.clone();
        assert_eq!(w.provision(&mut nominations, t(16)), 0, "no double launch on a lagging snapshot");
        assert_eq!(w.provision(&mut Nominations::default(), t(16)), 1);
        w.api.lock().put_claim(NodeClaim::clone(&replacement));
        // The candidate is only deleted once the replacement is initialized.
        assert!(w.tick(t(30)).await.is_empty());
        assert!(w.api.lock().deleted.is_empty());
        w.initialize("gpu-r1", t(90));
        let events = w.tick(t(91)).await;
        assert_eq!(
            events,
            [Event::Finished(Outcome::Completed { claims: vec!["od".into()], replacements: vec!["gpu-r1".into()] })]
        );
        assert_eq!(w.api.lock().deleted, ["od"]);
        assert_eq!(w.controller.queue.completed_total, 1);
    }

    #[tokio::test]
    async fn a_replacement_that_never_initializes_rolls_everything_back() {
        let mut w = World::new();
        w.tick(t(0)).await;
        w.tick(t(15)).await;
        assert!(w.tainted("od"));
        assert!(w.reason("od"));
        assert!(w.tick(t(15 + 599)).await.is_empty(), "the deadline is 10 minutes with one command queued");
        let events = w.tick(t(15 + 600)).await;
        assert!(
            matches!(&events[..], [Event::Finished(Outcome::RolledBack { reason, .. })] if reason.contains("in time")),
            "{events:?}"
        );
        assert!(!w.tainted("od"), "untainted");
        assert!(!w.reason("od"), "reason cleared");
        assert!(!w.controller.queue.is_marked("od"), "unmarked, so a later pass can re-evaluate it");
        assert_eq!(w.controller.queue.failures_total, 1);
        assert!(w.api.lock().deleted.is_empty(), "the on-demand node stays");
    }

    #[tokio::test]
    async fn replacements_get_their_pools_registration_timeout() {
        let mut w = World::new();
        {
            let mut o = w.api.lock();
            let mut pools = o.pools.to_vec();
            pools[0].metadata.annotations =
                Some([(labels::NODECLAIM_REGISTRATION_TIMEOUT.to_owned(), "25m".to_owned())].into());
            o.set_pools(pools);
        }
        w.tick(t(0)).await;
        w.tick(t(15)).await;
        assert!(
            w.tick(t(15 + 600)).await.is_empty(),
            "a slow-booting pool's replacement is not rolled back at 10 minutes"
        );
        assert!(w.tick(t(15 + 1499)).await.is_empty());
        let events = w.tick(t(15 + 1500)).await;
        assert!(
            matches!(&events[..], [Event::Finished(Outcome::RolledBack { reason, .. })] if reason.contains("in time")),
            "{events:?}"
        );
    }

    #[tokio::test]
    async fn a_deleted_replacement_fails_the_command_at_once() {
        let mut w = World::new();
        w.tick(t(0)).await;
        w.tick(t(15)).await;
        w.api.lock().remove_claim("gpu-r1");
        let events = w.tick(t(20)).await;
        assert!(
            matches!(&events[..], [Event::Finished(Outcome::RolledBack { reason, .. })] if reason.contains("deleted"))
        );
        assert_eq!(w.controller.queue.failures_total, 1);
    }

    #[tokio::test]
    async fn a_stale_command_is_rejected_with_a_reason_and_nothing_is_written() {
        let mut w = World::new();
        w.tick(t(0)).await;
        // Inside the window, the pod becomes protected.
        let (pods, _, _) = objects(json!({labels::DO_NOT_DISRUPT: "true"}));
        for p in pods {
            w.api.lock().put_pod(p);
        }
        let events = w.tick(t(15)).await;
        assert!(
            matches!(&events[..], [Event::Rejected { reason, .. }] if reason.contains("do-not-disrupt")),
            "{events:?}"
        );
        assert!(w.log().is_empty());
        assert!(!w.controller.queue.is_marked("od"));
    }

    /// A candidate whose claim is already gone when its replacements initialize counts as deleted: the
    /// command completes instead of being retried forever.
    #[tokio::test]
    async fn a_candidate_already_gone_completes_the_command() {
        let mut w = World::new();
        w.tick(t(0)).await;
        w.tick(t(15)).await;
        w.initialize("gpu-r1", t(20));
        // Someone removed the candidate's claim, finalizer and all.
        w.api.lock().remove_claim("od");
        let events = w.tick(t(21)).await;
        assert!(matches!(&events[..], [Event::Finished(Outcome::Completed { .. })]), "{events:?}");
        assert!(w.controller.queue.is_empty(), "nothing left to retry");
        assert!(!w.controller.queue.has_marked());
    }

    /// A replacement create that fails after others succeeded undoes them: the replacements already
    /// created are deleted, the taint and reason removed.
    #[tokio::test]
    async fn a_failed_replacement_create_deletes_the_replacements_already_created() {
        let mut w = World::new();
        w.tick(t(0)).await;
        // A command with two replacements, the second of which fails to create.
        let state = w.state(t(15));
        let mut command = w.controller.proposals[0].command.clone();
        command.replacements.push(command.replacements[0].clone());
        w.controller.proposals.clear();
        let first = w.api.lock().log.len();
        // Let the first create through, fail the second.
        let mut calls = 0;
        let mut name_for = |pool: &str| {
            calls += 1;
            format!("{pool}-x{calls}")
        };
        w.api.lock().fail_object("gpu-x2", ApiErrorKind::Forbidden);
        let err = w
            .controller
            .queue
            .start(command, &state, &w.api, &mut w.nominations, &w.settings, t(15), &mut name_for)
            .await
            .unwrap_err();
        assert_eq!(err.kind, ApiErrorKind::Forbidden);
        let log: Vec<String> = w.api.lock().log[first..].to_vec();
        assert!(log.contains(&"create gpu-x1".to_owned()), "{log:?}");
        assert!(log.contains(&"delete gpu-x1".to_owned()), "the first replacement is deleted again: {log:?}");
        assert!(w.api.snapshot().claims["gpu-x1"].metadata.deletion_timestamp.is_some());
        assert!(!w.tainted("od") && !w.reason("od"), "taint and reason removed");
        assert!(!w.controller.queue.is_marked("od"));
    }

    /// A command bounding its candidates' drain (repair's policy) writes the deadline on each claim as it
    /// deletes it; a claim already holding an earlier one keeps it.
    #[tokio::test]
    async fn a_bounded_command_writes_the_termination_deadline_before_it_deletes() {
        let mut w = World::new();
        {
            // The claim is kept by its finalizer once deleted, for the test to read.
            let mut api = w.api.lock();
            let mut claim = NodeClaim::clone(&api.claims["od"]);
            claim.metadata.finalizers = Some(vec![labels::TERMINATION_FINALIZER.to_owned()]);
            api.put_claim(claim);
        }
        w.tick(t(0)).await;
        let state = w.state(t(15));
        let mut command = w.controller.proposals[0].command.clone();
        command.termination_grace = Some(Duration::from_secs(30 * 60));
        w.controller.proposals.clear();
        let mut name_for = |pool: &str| format!("{pool}-b1");
        w.controller
            .queue
            .start(command, &state, &w.api, &mut w.nominations, &w.settings, t(15), &mut name_for)
            .await
            .unwrap();
        w.initialize("gpu-b1", t(90));
        let events = w.tick(t(100)).await;
        assert!(matches!(&events[..], [Event::Finished(Outcome::Completed { .. })]), "{events:?}");
        let claim = w.api.snapshot().claims["od"].clone();
        assert!(claim.metadata.deletion_timestamp.is_some());
        let stamp = &claim.metadata.annotations.as_ref().unwrap()[labels::NODECLAIM_TERMINATION_TIMESTAMP];
        assert_eq!(stamp, "2026-03-04T12:31:40Z", "100 s after the start of the test clock, plus 30 minutes");
        assert_eq!(claim.termination_deadline(), Some(t(100 + 30 * 60)));
        let log = w.log();
        let patched = log.iter().position(|l| l == "patch metadata od").unwrap_or_else(|| panic!("{log:?}"));
        assert!(log[patched..].contains(&"delete od".to_owned()), "annotated, then deleted: {log:?}");
    }

    /// A restart forgets the queue: what it had tainted is found and cleaned up before the next pass.
    #[tokio::test]
    async fn taints_no_command_holds_are_removed_before_a_pass() {
        let mut w = World::new();
        w.tick(t(0)).await;
        w.tick(t(15)).await;
        assert!(w.tainted("od") && w.reason("od"));
        // The process restarts.
        w.controller = Controller::new();
        let events = w.tick(t(30)).await;
        assert!(events.iter().any(|e| matches!(e, Event::CleanedUp { node } if node == "od")), "{events:?}");
        assert!(!w.tainted("od") && !w.reason("od"));
    }

    #[test]
    fn retry_duration_scales_with_queue_depth() {
        assert_eq!(retry_duration(1), MIN_RETRY);
        assert_eq!(retry_duration(10_000), Duration::from_secs(800));
        assert_eq!(retry_duration(100_000), MAX_RETRY);
    }
}
