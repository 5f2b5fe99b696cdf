//! `tenon simulate`: scenarios run deterministically, report what they cost, and bad scenarios are
//! refused before anything runs.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too

use std::path::Path;
use std::process::Command;

use tenon_core::sim::scenario::{self, Scenario};

fn report(path: &str) -> scenario::Report {
    let s = Scenario::load(Path::new(path)).unwrap();
    let settings = s.settings(&[]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(scenario::run(&s, settings, &mut |_, _, _| {}))
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let a = serde_json::to_string(&report("tests/scenarios/short.yaml")).unwrap();
    let b = serde_json::to_string(&report("tests/scenarios/short.yaml")).unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_run_schedules_everything_and_accounts_for_its_cost() {
    let r = report("tests/scenarios/short.yaml");
    assert_eq!(r.hours, 3.0);
    assert!(r.total_cost > 0.0);
    assert!(r.launches > 0);
    assert_eq!(r.pending_at_end, 0, "every pod runs by the end");
    let by_type: f64 = r.cost_per_hour_by_capacity_type.values().sum::<f64>() * r.hours;
    assert!((by_type - r.total_cost).abs() < 1e-6, "{by_type} vs {}", r.total_cost);
    assert!(r.pods_evicted > 0, "the spot interruption moved pods");
    assert_eq!(r.timeline.len(), 18, "a sample every 10 minutes");
}

/// The short scenario's text with its catalog path made absolute, to be edited and written elsewhere.
fn short_text() -> String {
    std::fs::read_to_string("tests/scenarios/short.yaml").unwrap().replace(
        "../../examples/catalogs/aws-us-east-1.yaml",
        &format!("{}/examples/catalogs/aws-us-east-1.yaml", env!("CARGO_MANIFEST_DIR")),
    )
}

/// Runs the short scenario with `from` replaced by `to`.
fn edited(name: &str, from: &str, to: &str) -> scenario::Report {
    edited_all(name, &[(from, to)])
}

/// Runs the short scenario with each `from` replaced by its `to`.
fn edited_all(name: &str, edits: &[(&str, &str)]) -> scenario::Report {
    let mut text = short_text();
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    let file = std::env::temp_dir().join(format!("tenon-sim-{name}-{}.yaml", std::process::id()));
    std::fs::write(&file, text).unwrap();
    let r = report(file.to_str().unwrap());
    std::fs::remove_file(&file).unwrap();
    r
}

#[test]
fn spot_price_changes_reach_scheduling_and_the_bill() {
    let base = report("tests/scenarios/short.yaml");
    // Spot triples at the start: the fleet turns to on-demand, and costs more than before.
    let dear = edited("dear", "  events:\n", "  events:\n  - {at: 0s, spotPrice: {factor: 3}}\n");
    assert!(dear.total_cost > base.total_cost, "{} vs {}", dear.total_cost, base.total_cost);
    assert!(
        dear.cost_per_hour_by_capacity_type.get("on-demand").copied().unwrap_or(0.0)
            > base.cost_per_hour_by_capacity_type.get("on-demand").copied().unwrap_or(0.0)
    );
    // Halving it saves money.
    let cheap = edited("cheap", "  events:\n", "  events:\n  - {at: 0s, spotPrice: {factor: 0.5}}\n");
    assert!(cheap.total_cost < base.total_cost, "{} vs {}", cheap.total_cost, base.total_cost);
}

#[test]
fn slow_families_register_later() {
    let base = report("tests/scenarios/short.yaml");
    let slow = edited("slow", "  workloads:\n", "  kubelet: {registrationDelayByFamily: {g5: 12m}}\n  workloads:\n");
    assert!(base.time_to_schedule_seconds.max < 720.0);
    assert!(slow.time_to_schedule_seconds.max >= 720.0, "{:?}", slow.time_to_schedule_seconds);
}

#[test]
fn bad_scenarios_name_the_field_and_fail_before_running() {
    let dir = std::env::temp_dir().join(format!("tenon-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = short_text();
    for (from, to, field) in [
        ("duration: 3h", "duration: three hours", "spec.duration"),
        ("every: 40m", "every: 40", "spec.workloads[0]"),
        ("cpu: 500m, zoneSpread", "cpu: 500m, zoneSpreed", "spec.workloads[1]"),
        ("spotInterruptions: 0.5", "spotInterruptions: 5", "spec.events[0].spotInterruptions"),
        ("{nodes: \"20%\"}", "{nodes: \"20%\"}", ""),
        ("operator: In, values: [g5]", "operator: Maybe, values: [g5]", "spec.nodePools[0]"),
        ("  workloads:\n", "  workloads:\n  - daemonSet: {name: agent, cpu: lots}\n", "spec.workloads[0].daemonSet"),
        ("  events:\n", "  events:\n  - {at: 1h, spotPrice: {factor: -1}}\n", "spec.events[0].spotPrice.factor"),
        (
            "  events:\n",
            "  events:\n  - {at: 1h, registrationFailures: {share: 2, duration: 1h}}\n",
            "spec.events[0].registrationFailures.share",
        ),
        // Quantities and pod specs are checked before anything runs (they used to be dropped silently).
        ("cpu: 500m, zoneSpread", "cpu: lots, zoneSpread", "spec.workloads[1].deployment: cpu"),
        ("memory: 64Gi", "memory: 64 gigs", "spec.workloads[0].jobs: memory"),
        (
            "podSpec: {tolerations: [{key: nvidia.com/gpu, operator: Exists}]}",
            "podSpec: {tolerations: {key: nvidia.com/gpu}}",
            "spec.workloads[0].jobs: podSpec.tolerations",
        ),
        (
            "replicas: {steps: [{at: 0s, replicas: 6}, {at: 1h, replicas: 16}, {at: 2h, replicas: 3}]}",
            "replicas: {diurnal: {min: 10, max: 2}}",
            "spec.workloads[1].deployment.replicas.diurnal",
        ),
        (
            "replicas: {steps: [{at: 0s, replicas: 6}, {at: 1h, replicas: 16}, {at: 2h, replicas: 3}]}",
            "replicas: {diurnal: {min: 1, max: 2, peakHour: 30}}",
            "spec.workloads[1].deployment.replicas.diurnal.peakHour",
        ),
        (
            "replicas: {steps: [{at: 0s, replicas: 6}, {at: 1h, replicas: 16}, {at: 2h, replicas: 3}]}",
            "replicas: {steps: [{at: 2h, replicas: 6}, {at: 1h, replicas: 16}]}",
            "spec.workloads[1].deployment.replicas.steps[1].at",
        ),
        ("every: 40m", "every: 0s", "spec.workloads[0].jobs.every"),
        // Two workloads of one name would share pods.
        ("deployment: {name: api,", "deployment: {name: train,", "spec.workloads[1].deployment.name"),
        (
            "replicas: {steps: [{at: 0s, replicas: 6}, {at: 1h, replicas: 16}, {at: 2h, replicas: 3}]}",
            "replicas: {diurnal: {min: 1, max: 2, peekHour: 3}}",
            "spec.workloads[1]",
        ),
    ] {
        if from == to {
            continue;
        }
        let file = dir.join("bad.yaml");
        std::fs::write(&file, good.replace(from, to)).unwrap();
        let out =
            Command::new(env!("CARGO_BIN_EXE_tenon")).args(["simulate", file.to_str().unwrap()]).output().unwrap();
        assert!(!out.status.success(), "{to}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("bad.yaml") && err.contains(field), "{to}: {err}");
        assert!(out.stdout.is_empty());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_html_report_is_self_contained_and_charts_the_run() {
    let file = std::env::temp_dir().join(format!("tenon-report-{}.html", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tenon"))
        .args(["simulate", "tests/scenarios/short.yaml", "--report", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(html.starts_with("<!doctype html>") && html.trim_end().ends_with("</html>"));
    assert_eq!(html.matches("<svg").count(), 5, "cost, rate, nodes by capacity and instance type, pending");
    for external in ["http:", "https:", "<script", "<link", "src="] {
        assert!(!html.contains(external), "the report must open offline, found {external}");
    }
    let r = report("tests/scenarios/short.yaml");
    assert!(html.contains(&format!("${:.2}", r.total_cost)), "the headline cost matches the run");
    assert!(html.matches("<tr><td>").count() >= r.decisions.len());
}

/// The GPU scenario under upstream.yaml and fleet-pricing.yaml, with `extra` arguments for both runs.
fn compare_gpu_training(extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tenon"))
        .args([
            "simulate",
            "examples/scenarios/gpu-training.yaml",
            "-o",
            "json",
            "--compare",
            "examples/settings/upstream.yaml",
            "examples/settings/fleet-pricing.yaml",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn nodes_disrupted(run: &serde_json::Value) -> u64 {
    run["report"]["disruptions"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum()
}

#[test]
fn with_the_same_packing_fleet_pricing_consolidation_costs_less() {
    // Packing held equal (the pool's marginal-cost annotation honoured in both runs), the fleet-pricing
    // consolidation alone costs less. (It disrupts more on this scenario: the README gives the figures.)
    let runs = compare_gpu_training(&["--set", "marginal-cost-packing=true"]);
    let cost = |i: usize| runs[i]["report"]["totalCost"].as_f64().unwrap();
    assert!(cost(1) < cost(0), "fleet pricing ${:.2} vs upstream consolidation ${:.2}", cost(1), cost(0));
    for i in 0..2 {
        assert_eq!(runs[i]["report"]["pendingAtEnd"], 0, "both schedule every pod");
    }
}

#[test]
fn fleet_pricing_consolidation_costs_less_than_upstream_defaults() {
    let runs = compare_gpu_training(&[]);
    let cost = |i: usize| runs[i]["report"]["totalCost"].as_f64().unwrap();
    let (upstream, fleet) = (cost(0), cost(1));
    assert!(fleet < upstream * 0.98, "fleet pricing ${fleet:.2} vs upstream ${upstream:.2}");
    // Both consolidate nodes with pods on them, so the comparison means something. (Fleet pricing drains
    // more of them on this scenario; the README gives the figures.)
    let drained = |i: usize| -> u64 {
        let by_method = runs[i]["report"]["disruptions"].as_object().unwrap();
        by_method.iter().filter(|(m, _)| m.as_str() != "Emptiness").map(|(_, n)| n.as_u64().unwrap()).sum()
    };
    assert!(drained(0) > 0 && drained(1) > 0, "both consolidate: {} and {}", drained(0), drained(1));
    for i in 0..2 {
        assert_eq!(runs[i]["report"]["pendingAtEnd"], 0, "both schedule every pod");
    }
    // No delete → relaunch cycle: consolidation must not count room promised to pending pods, which once
    // made fleet pricing launch six times as many nodes as upstream.
    let launches = |i: usize| runs[i]["report"]["launches"].as_u64().unwrap();
    assert!(launches(1) <= 3 * launches(0), "{} launches against {}", launches(1), launches(0));
    // Disruptions are counted when their command completes: one per node replaced or deleted, none for
    // proposals rejected on validation or commands rolled back.
    for i in 0..2 {
        let report = &runs[i]["report"];
        let counted = nodes_disrupted(&runs[i]);
        let done: usize = report["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|d| d["what"].as_str()?.strip_prefix("replaced "))
            .map(|w| w.split(" with ").next().unwrap().split(", ").count())
            .sum();
        assert_eq!(counted, done as u64, "run {i}");
    }
}

#[test]
fn compare_refuses_a_bad_settings_file() {
    let file = std::env::temp_dir().join(format!("tenon-bad-settings-{}.yaml", std::process::id()));
    std::fs::write(&file, "max-consolidation-replacements: many\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenon"))
        .args(["simulate", "tests/scenarios/short.yaml", "--compare", "examples/settings/upstream.yaml"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max-consolidation-replacements"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn every_example_scenario_loads() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir("examples/scenarios").unwrap() {
        let path = entry.unwrap().path();
        let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        s.settings(&[]).unwrap();
        names.push(s.name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "aks-batch",
            "diurnal-web",
            "fleet-scale",
            "gke-inference",
            "gpu-fleet-large",
            "gpu-training",
            "large-web",
            "mixed-accelerators",
            "self-managed-burst"
        ]
    );
}

#[test]
fn the_azure_like_scenario_runs_on_its_catalog() {
    // The bundled eastus catalog: pools select on its `karpenter.azure.com/sku-*` labels, every pod runs,
    // and the marginal-cost A100 pool buys the 1-GPU size for 1-GPU jobs rather than a 4-GPU machine.
    let r = report("examples/scenarios/aks-batch.yaml");
    assert_eq!(r.pending_at_end, 0);
    let seen: std::collections::BTreeSet<&str> =
        r.timeline.iter().flat_map(|s| s.nodes_by_instance_type.keys().map(String::as_str)).collect();
    assert!(seen.contains("Standard_NC24ads_A100_v4"), "{seen:?}");
    assert!(!seen.contains("Standard_NC96ads_A100_v4"), "{seen:?}");
    assert!(seen.iter().any(|t| t.contains("_T4_")), "{seen:?}");
    assert!(r.cost_per_hour_by_capacity_type.get("spot").is_some_and(|c| *c > 0.0));
}

#[test]
fn deferred_launches_failed_registrations_and_on_demand_leases_play_out() {
    let base = report("tests/scenarios/short.yaml");
    assert_eq!(base.launch_deferrals, 0);

    let deferred =
        edited("defer", "  events:\n", "  events:\n  - {at: 0s, deferLaunches: {count: 2, retryAfter: 1m}}\n");
    assert_eq!(deferred.launch_deferrals, 2);
    assert_eq!(deferred.pending_at_end, 0);

    // Nothing launched in the first 20 minutes registers: those claims time out at 15 minutes and are
    // replaced, so the first pods wait longer, but everything runs in the end.
    let unregistered =
        edited("noreg", "  events:\n", "  events:\n  - {at: 0s, registrationFailures: {share: 1, duration: 20m}}\n");
    assert!(unregistered.time_to_schedule_seconds.max >= 900.0, "{:?}", unregistered.time_to_schedule_seconds);
    assert!(unregistered.launches > base.launches);
    assert_eq!(unregistered.pending_at_end, 0);

    // Spot runs out for the first hour; on-demand bought under 30-minute leases is reclaimed as drifted.
    let leased = edited(
        "lease",
        "  events:\n",
        "  events:\n  - {at: 0s, onDemandLeases: 30m}\n  - {at: 0s, ice: {capacityType: spot, duration: 1h}}\n",
    );
    assert!(leased.disruptions.get("Drift").copied().unwrap_or(0) > 0, "{:?}", leased.disruptions);
    assert!(leased.cost_per_hour_by_capacity_type.get("on-demand").copied().unwrap_or(0.0) > 0.0);
    assert_eq!(leased.pending_at_end, 0);

    // Nodes of the first 20 minutes register but never turn Ready: with the opt-in initialization timeout
    // they are deleted after 10 minutes and replaced, and everything runs in the end.
    let not_ready = edited_all(
        "notready",
        &[
            ("  events:\n", "  events:\n  - {at: 0s, readinessFailures: {share: 1, duration: 20m}}\n"),
            ("  workloads:\n", "  settings: {nodeclaim-initialization-timeout: 10m}\n  workloads:\n"),
        ],
    );
    assert!(not_ready.launches > base.launches);
    assert!(not_ready.time_to_schedule_seconds.max >= 600.0, "{:?}", not_ready.time_to_schedule_seconds);
    assert_eq!(not_ready.pending_at_end, 0);
}

#[test]
fn the_mixed_accelerator_scenario_places_every_pod() {
    // Its A100 pods select `karpenter.k8s.aws/instance-gpu-name`, a label only the instance types define.
    let out = Command::new(env!("CARGO_BIN_EXE_tenon"))
        .args(["simulate", "examples/scenarios/mixed-accelerators.yaml", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pendingAtEnd"], 0);
    let a100 = report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["nodesByInstanceType"].as_object().unwrap().keys().any(|t| t.starts_with("p4d.")));
    assert!(a100, "A100 (p4d) nodes were launched");
}

#[test]
fn simulate_reads_its_config_file() {
    // A settings file passed with --config is layered over the scenario: a bad value in it is refused,
    // and a good one changes the run exactly as the same --set would.
    let dir = std::env::temp_dir();
    let bad = dir.join(format!("tenon-sim-config-bad-{}.yaml", std::process::id()));
    std::fs::write(&bad, "max-consolidation-replacements: many\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenon"))
        .args(["simulate", "tests/scenarios/short.yaml", "-o", "json", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    std::fs::remove_file(&bad).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max-consolidation-replacements"));
    assert!(out.stdout.is_empty());

    let good = dir.join(format!("tenon-sim-config-good-{}.toml", std::process::id()));
    std::fs::write(&good, "batch-max-duration = \"5m\"\nbatch-idle-duration = \"5m\"\n").unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tenon"))
            .args(["simulate", "tests/scenarios/short.yaml", "-o", "json"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let from_file = run(&["--config", good.to_str().unwrap()]);
    std::fs::remove_file(&good).unwrap();
    let from_flags = run(&["--set", "batch-max-duration=5m", "--set", "batch-idle-duration=5m"]);
    assert_eq!(from_file, from_flags);
    assert_ne!(from_file, run(&[]), "the file's settings change the run");
}
