//! `tenon simulate`: a scenario in virtual time, with a cost report.

use std::io::{IsTerminal, Write};
use std::path::Path;

use anyhow::{Context, Result};
use tenon_core::settings::Settings;
use tenon_core::sim::scenario::{self, Report, Scenario};

/// Loads and runs a scenario with `flags` layered over its settings.
pub fn run(path: &Path, base: &Settings, flags: &[(String, String)]) -> Result<Report> {
    let scenario = Scenario::load(path)?;
    let _ = base;
    let settings = scenario.settings(flags).with_context(|| format!("{}: spec.settings", path.display()))?;
    let interactive = std::io::stderr().is_terminal();
    let runtime = tokio::runtime::Builder::new_current_thread().build().context("starting the runtime")?;
    let report = runtime.block_on(scenario::run(&scenario, settings, &mut |r, i, n| {
        if interactive {
            let nodes: u32 = r.timeline.last().map(|s| s.nodes.values().sum()).unwrap_or(0);
            let pending = r.timeline.last().map(|s| s.pending).unwrap_or(0);
            eprint!(
                "\r  {:>5.1}h of {} ({:>3}%)  nodes {:>4}  pending {:>4}  cost ${:>10.2}",
                r.hours,
                scenario.spec.duration,
                100 * i / n.max(1),
                nodes,
                pending,
                r.total_cost
            );
        }
    }));
    if interactive {
        eprintln!();
    }
    Ok(report)
}

/// Prints the summary for a person.
pub fn print_text(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    writeln!(out, "Scenario {}: {:.1} hours simulated", r.scenario, r.hours)?;
    writeln!(out, "  total cost            ${:.2}", r.total_cost)?;
    for (ct, c) in &r.cost_per_hour_by_capacity_type {
        writeln!(out, "  cost per hour, {ct:<9} ${c:.2}")?;
    }
    writeln!(out, "  node-hours            {:.1}", r.node_hours)?;
    let t = &r.time_to_schedule_seconds;
    writeln!(out, "  time to schedule      p50 {:.0}s, p95 {:.0}s, max {:.0}s", t.p50, t.p95, t.max)?;
    writeln!(
        out,
        "  launches              {} ({} failed, {} deferred)",
        r.launches, r.launch_failures, r.launch_deferrals
    )?;
    writeln!(out, "  pods evicted          {}", r.pods_evicted)?;
    if r.disruptions.is_empty() {
        writeln!(out, "  disruptions           none")?;
    }
    for (reason, n) in &r.disruptions {
        writeln!(out, "  disruptions, {reason:<22} {n}")?;
    }
    if r.pending_at_end > 0 {
        writeln!(out, "  pending at the end    {}", r.pending_at_end)?;
    }
    Ok(())
}
