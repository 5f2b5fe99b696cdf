//! `tenon plan`: what tenon would do to a cluster snapshot, and why.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use jiff::Timestamp;
use serde::Serialize;
use tenon_core::api::NodeSelectorRequirement;
use tenon_core::provisioning::{self, Nominations};
use tenon_core::resources::Resources;
use tenon_core::scheduling::{Launch, Results};
use tenon_core::settings::Settings;
use tenon_core::snapshot::Snapshot;
use tenon_core::state::ClusterState;

/// The `--output json` contract of `tenon plan`.
#[derive(Debug, Serialize)]
pub struct PlanOutput {
    /// What provisioning would do.
    pub provisioning: ProvisioningOutput,
    /// What disruption would do (`null` until computed).
    pub disruption: Option<serde_json::Value>,
}

/// Provisioning's half of the plan.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningOutput {
    /// Claims to create.
    pub node_claims: Vec<ClaimOutput>,
    /// Pods that land on existing nodes.
    pub existing_nodes: Vec<ExistingOutput>,
    /// Pods that land nowhere.
    pub unschedulable: Vec<UnschedulableOutput>,
}

/// One claim to create.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimOutput {
    /// Its NodePool.
    pub node_pool: String,
    /// Its pods.
    pub pods: Vec<String>,
    /// Its instance types, cheapest first.
    pub instance_types: Vec<String>,
    /// Its requirements.
    pub requirements: Vec<NodeSelectorRequirement>,
    /// The offering it would most likely get.
    pub launch: Option<Launch>,
    /// The DaemonSet overhead it reserves.
    pub daemon_overhead: Resources,
}

/// Pods placed on an existing node.
#[derive(Debug, Serialize)]
pub struct ExistingOutput {
    /// The node.
    pub node: String,
    /// The pods.
    pub pods: Vec<String>,
}

/// A pod that lands nowhere.
#[derive(Debug, Serialize)]
pub struct UnschedulableOutput {
    /// The pod.
    pub pod: String,
    /// Why.
    pub reason: String,
}

/// Loads the snapshot and computes the plan.
pub fn compute(files: &[PathBuf], settings: &Settings, now: Timestamp) -> Result<PlanOutput> {
    let snapshot = Snapshot::load_files(files)?;
    let state = ClusterState::from_objects(
        &snapshot.pods,
        &snapshot.nodes,
        &snapshot.node_claims,
        &snapshot.daemon_sets,
        &snapshot.pdbs,
        &snapshot.node_pools,
        now,
    )
    .context("reading the snapshot")?;
    let types = snapshot.instance_types();
    let results = provisioning::schedule(&state, &|_| types.clone(), &Nominations::default(), settings, now);
    Ok(PlanOutput { provisioning: provisioning_output(results), disruption: None })
}

fn provisioning_output(results: Results) -> ProvisioningOutput {
    ProvisioningOutput {
        node_claims: results
            .claims
            .into_iter()
            .map(|c| ClaimOutput {
                requirements: c.node_claim_requirements().to_api(),
                node_pool: c.pool,
                pods: c.pods,
                instance_types: c.instance_types.iter().map(|n| n.to_string()).collect(),
                launch: c.launch,
                daemon_overhead: c.daemon_overhead,
            })
            .collect(),
        existing_nodes: results.existing.into_iter().map(|e| ExistingOutput { node: e.node, pods: e.pods }).collect(),
        unschedulable: results
            .unschedulable
            .into_iter()
            .map(|u| UnschedulableOutput { pod: u.pod, reason: u.reason })
            .collect(),
    }
}

/// Prints the plan for a person.
pub fn print_text(out: &mut impl Write, plan: &PlanOutput) -> std::io::Result<()> {
    let p = &plan.provisioning;
    writeln!(out, "Provisioning")?;
    if p.node_claims.is_empty() && p.existing_nodes.is_empty() && p.unschedulable.is_empty() {
        writeln!(out, "  no pending pods")?;
    }
    for c in &p.node_claims {
        match &c.launch {
            Some(l) => writeln!(
                out,
                "  new NodeClaim from NodePool {}: {} {} in {} at ${:.4}/h ({} pod{}, {} instance type{})",
                c.node_pool,
                l.instance_type,
                l.capacity_type,
                l.zone,
                l.price,
                c.pods.len(),
                if c.pods.len() == 1 { "" } else { "s" },
                c.instance_types.len(),
                if c.instance_types.len() == 1 { "" } else { "s" },
            )?,
            None => writeln!(out, "  new NodeClaim from NodePool {} ({} pods)", c.node_pool, c.pods.len())?,
        }
        writeln!(out, "    pods: {}", c.pods.join(", "))?;
        if !c.daemon_overhead.is_zero() {
            writeln!(out, "    daemon overhead: {}", c.daemon_overhead)?;
        }
    }
    for e in &p.existing_nodes {
        writeln!(out, "  existing node {} takes {}", e.node, e.pods.join(", "))?;
    }
    for u in &p.unschedulable {
        writeln!(out, "  cannot schedule {}: {}", u.pod, u.reason)?;
    }
    writeln!(out, "Disruption")?;
    writeln!(out, "  not computed")?;
    Ok(())
}
