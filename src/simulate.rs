//! `tenon simulate`: a scenario in virtual time, with a cost report.

use std::io::{IsTerminal, Write};
use std::path::Path;

use anyhow::{Context, Result};
use tenon_core::sim::scenario::{self, Report, Scenario};

/// Reads a settings file (`--config`, `--compare`) into `key=value` pairs, checked against the settings.
pub fn settings_file(path: &Path) -> Result<Vec<(String, String)>> {
    let values = tenon_core::settings::file_values(path)?;
    Ok(values.into_iter().map(|(key, value)| (key.to_owned(), value)).collect())
}

/// Prints two runs side by side, with the difference.
pub fn print_comparison(
    out: &mut impl Write,
    a_name: &Path,
    a: &Report,
    b_name: &Path,
    b: &Report,
) -> std::io::Result<()> {
    let name = |p: &Path| p.file_stem().map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into_owned());
    let (an, bn) = (name(a_name), name(b_name));
    writeln!(out, "Scenario {}: {:.1} hours simulated", a.scenario, a.hours)?;
    writeln!(out, "  {:<26} {:>16} {:>16} {:>12}", "", an, bn, "difference")?;
    let row = |out: &mut dyn Write, label: &str, x: f64, y: f64, unit: &str| {
        writeln!(out, "  {label:<26} {:>15.2}{unit} {:>15.2}{unit} {:>+11.2}{unit}", x, y, y - x)
    };
    row(out, "total cost ($)", a.total_cost, b.total_cost, "")?;
    row(out, "node-hours", a.node_hours, b.node_hours, "")?;
    row(out, "p50 time to schedule (s)", a.time_to_schedule_seconds.p50, b.time_to_schedule_seconds.p50, "")?;
    row(out, "p95 time to schedule (s)", a.time_to_schedule_seconds.p95, b.time_to_schedule_seconds.p95, "")?;
    let disruptions = |r: &Report| r.disruptions.values().sum::<u64>() as f64;
    let empty = |r: &Report| r.disruptions.get("Emptiness").copied().unwrap_or(0) as f64;
    row(out, "nodes disrupted", disruptions(a), disruptions(b), "")?;
    row(out, "  empty, deleted", empty(a), empty(b), "")?;
    row(out, "  drained of pods", disruptions(a) - empty(a), disruptions(b) - empty(b), "")?;
    row(out, "pods evicted", a.pods_evicted as f64, b.pods_evicted as f64, "")?;
    row(out, "launches", a.launches as f64, b.launches as f64, "")?;
    Ok(())
}

/// Loads and runs a scenario with `flags` layered over its settings.
pub fn run(path: &Path, flags: &[(String, String)]) -> Result<Report> {
    let scenario = Scenario::load(path)?;
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

/// Prints the summary for a person: one labelled figure a line, the labels in one column.
pub fn print_text(out: &mut impl Write, r: &Report) -> std::io::Result<()> {
    let t = &r.time_to_schedule_seconds;
    let mut rows: Vec<(String, String)> = vec![("total cost".into(), format!("${:.2}", r.total_cost))];
    for (ct, c) in &r.cost_per_hour_by_capacity_type {
        rows.push((format!("cost per hour, {ct}"), format!("${c:.2}")));
    }
    rows.push(("node-hours".into(), format!("{:.1}", r.node_hours)));
    rows.push(("time to schedule".into(), format!("p50 {:.0}s, p95 {:.0}s, max {:.0}s", t.p50, t.p95, t.max)));
    rows.push((
        "launches".into(),
        format!("{} ({} failed, {} deferred)", r.launches, r.launch_failures, r.launch_deferrals),
    ));
    rows.push(("pods evicted".into(), r.pods_evicted.to_string()));
    if r.disruptions.is_empty() {
        rows.push(("disruptions".into(), "none".into()));
    }
    for (reason, n) in &r.disruptions {
        rows.push((format!("disruptions, {reason}"), n.to_string()));
    }
    if r.pending_at_end > 0 {
        rows.push(("pending at the end".into(), r.pending_at_end.to_string()));
    }
    let width = rows.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    writeln!(out, "Scenario {}: {:.1} hours simulated", r.scenario, r.hours)?;
    for (label, value) in rows {
        writeln!(out, "  {label:<width$}  {value}")?;
    }
    Ok(())
}
