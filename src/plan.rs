//! `tenon plan`: what tenon would do to a cluster snapshot, and why.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use jiff::Timestamp;
use serde::Serialize;
use tenon_core::api::NodeSelectorRequirement;
use tenon_core::disruption::{self, Decision, Pass};
use tenon_core::provisioning::{self, Nominations};
use tenon_core::resources::Resources;
use tenon_core::scheduling::{Launch, Results};
use tenon_core::settings::Settings;
use tenon_core::snapshot::Snapshot;
use tenon_core::state::{ClusterState, ReadPods};

/// The `--output json` contract of `tenon plan`.
#[derive(Debug, Serialize)]
pub struct PlanOutput {
    /// What provisioning would do.
    pub provisioning: ProvisioningOutput,
    /// What disruption would do: the first method that acts, its commands, and why the other nodes stay.
    pub disruption: Option<Pass>,
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
    // Pods are reduced to what the state keeps of them as they are read, and the rest of the snapshot goes
    // into the state: a dump of tens of thousands of pods is never held as Kubernetes objects.
    let snapshot = Snapshot::<ReadPods>::read_files(files)?;
    let types: std::sync::Arc<[tenon_core::cloud::InstanceType]> = snapshot.instance_types().into();
    let state = ClusterState::from_read_snapshot(snapshot, now).context("reading the snapshot")?;
    let types_for = |_: &tenon_core::api::NodePool| types.clone();
    let results = provisioning::schedule(&state, &types_for, &Nominations::default(), settings, now);
    // No validation delay: in a plan no time passes between computing a command and checking it.
    let pass = disruption::compute(&disruption::Inputs { state: &state, types_for: &types_for, settings, now });
    Ok(PlanOutput { provisioning: provisioning_output(results), disruption: Some(pass) })
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
    let Some(d) = &plan.disruption else { return Ok(()) };
    match d.method {
        None => writeln!(out, "  nothing to do")?,
        Some(m) => writeln!(out, "  {m:?}")?,
    }
    for c in &d.commands {
        let nodes: Vec<String> = c.candidates.iter().map(|x| format!("{} (${:.4}/h)", x.node, x.price)).collect();
        match c.decision {
            Decision::Delete => {
                writeln!(out, "  delete {} [{}], saving ${:.4}/h", nodes.join(", "), c.reason, c.savings_per_hour)?
            }
            Decision::Replace => {
                let with: Vec<String> = c
                    .replacements
                    .iter()
                    .map(|r| {
                        let types = if r.instance_types.len() > 3 {
                            format!("{} and {} more", r.instance_types[..3].join(", "), r.instance_types.len() - 3)
                        } else {
                            r.instance_types.join(", ")
                        };
                        let cts: Vec<String> = r.capacity_types.iter().map(ToString::to_string).collect();
                        format!(
                            "{types} ({} in {}; worst case ${:.4}/h)",
                            cts.join("/"),
                            r.zones.join(", "),
                            r.worst_case_price
                        )
                    })
                    .collect();
                writeln!(
                    out,
                    "  replace {} with {} [{}], saving ${:.4}/h",
                    nodes.join(", "),
                    with.join(" + "),
                    c.reason,
                    c.savings_per_hour
                )?
            }
        }
        if !c.explanation.is_empty() {
            writeln!(out, "    {}", c.explanation)?;
        }
    }
    for b in &d.unconsolidatable {
        writeln!(out, "  {} stays: {}", b.node, b.reason)?;
    }
    Ok(())
}
