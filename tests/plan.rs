//! `tenon plan` on snapshot files: the provisioning half of the JSON contract, and the errors.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too

use std::process::{Command, Output};

use serde_json::Value;

const CATALOG: &str = "examples/catalogs/aws-us-east-1.yaml";

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenon"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .env_remove("CONSOLIDATION_SPLIT_FALLBACK")
        .output()
        .unwrap_or_else(|e| panic!("tenon does not run: {e}"))
}

fn plan(snapshot: &str) -> Value {
    let file = format!("tests/plan/{snapshot}");
    let out = run(&["plan", "--output", "json", "--now", "2026-03-04T12:00:00Z", CATALOG, &file]);
    assert!(out.status.success(), "{snapshot}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{snapshot}: not JSON: {e}"))
}

fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v
}

fn claims(v: &Value) -> &Vec<Value> {
    v["provisioning"]["nodeClaims"].as_array().unwrap()
}

fn launch(claim: &Value) -> (&str, &str, &str, f64) {
    let l = &claim["launch"];
    (
        l["instanceType"].as_str().unwrap(),
        l["zone"].as_str().unwrap(),
        l["capacityType"].as_str().unwrap(),
        l["price"].as_f64().unwrap(),
    )
}

fn requirement<'a>(claim: &'a Value, key: &str) -> Option<&'a Value> {
    claim["requirements"].as_array().unwrap().iter().find(|r| r["key"] == key)
}

#[test]
fn pending_pods_become_one_claim_on_the_cheapest_type() {
    let v = plan("cpu-basic.yaml");
    let c = claims(&v);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0]["nodePool"], "default");
    assert_eq!(c[0]["pods"], serde_json::json!(["shop/web-1", "shop/web-2", "shop/web-3"]));
    assert_eq!(launch(&c[0]), ("c5.large", "us-east-1a", "spot", 0.0357));
    assert_eq!(c[0]["instanceTypes"][0], "c5.large");
    assert!(c[0]["instanceTypes"].as_array().unwrap().iter().all(|t| t.as_str().unwrap().starts_with(['c', 'm'])));
    assert!(requirement(&c[0], "node.kubernetes.io/instance-type").is_some());
    assert_eq!(v["disruption"]["method"], Value::Null, "no nodes, nothing to disrupt");
}

#[test]
fn an_existing_node_with_room_takes_the_pod() {
    let v = plan("existing-node.yaml");
    assert!(claims(&v).is_empty());
    assert_eq!(
        v["provisioning"]["existingNodes"],
        serde_json::json!([{"node": "ip-10-0-0-1", "pods": ["default/pending"]}])
    );
}

#[test]
fn gpu_pods_go_to_the_tainted_gpu_pool_and_the_rest_to_the_cpu_pool() {
    let v = plan("gpu-and-cpu.yaml");
    let c = claims(&v);
    assert_eq!(c.len(), 2);
    let gpu = c.iter().find(|c| c["nodePool"] == "gpu").unwrap();
    assert_eq!(gpu["pods"], serde_json::json!(["ml/trainer"]));
    assert_eq!(launch(gpu), ("g5.2xlarge", "us-east-1a", "spot", 0.509));
    let cpu = c.iter().find(|c| c["nodePool"] == "cpu").unwrap();
    assert_eq!(cpu["pods"], serde_json::json!(["web/api"]));
}

#[test]
fn a_zonal_spread_puts_one_claim_in_each_zone() {
    let v = plan("zonal-spread.yaml");
    let mut zones: Vec<&str> = claims(&v).iter().map(|c| launch(c).1).collect();
    zones.sort();
    assert_eq!(zones, ["us-east-1a", "us-east-1b", "us-east-1c"]);
    for c in claims(&v) {
        assert_eq!(requirement(c, "topology.kubernetes.io/zone").unwrap()["values"].as_array().unwrap().len(), 1);
    }
}

#[test]
fn hostname_anti_affinity_buys_a_node_per_replica() {
    let v = plan("anti-affinity.yaml");
    assert_eq!(claims(&v).len(), 3);
    assert!(claims(&v).iter().all(|c| c["pods"].as_array().unwrap().len() == 1));
}

#[test]
fn limits_stop_the_pool_and_the_pod_says_why() {
    let v = plan("limits.yaml");
    assert_eq!(claims(&v).len(), 2);
    let u = &v["provisioning"]["unschedulable"];
    assert_eq!(u.as_array().unwrap().len(), 1);
    assert_eq!(u[0]["pod"], "default/batch-3");
    assert!(u[0]["reason"].as_str().unwrap().contains("limits"), "{}", u[0]["reason"]);
}

#[test]
fn a_reservation_is_used_up_before_paying_for_spot() {
    let v = plan("reserved.yaml");
    let c = claims(&v);
    assert_eq!(c.len(), 3);
    let reserved: Vec<&Value> = c.iter().filter(|c| c["launch"]["capacityType"] == "reserved").collect();
    assert_eq!(reserved.len(), 2, "the reservation holds two");
    for r in &reserved {
        assert_eq!(requirement(r, "karpenter.sh/reservation-id").unwrap()["values"][0], "cr-0123");
    }
    let rest = c.iter().find(|c| c["launch"]["capacityType"] != "reserved").unwrap();
    assert_eq!(launch(rest), ("g5.12xlarge", "us-east-1a", "spot", 2.3822));
}

#[test]
fn daemon_overhead_is_charged_per_realization() {
    let v = plan("daemonset-heavy.yaml");
    let c = claims(&v);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0]["daemonOverhead"]["cpu"], "700m", "max(200m + 500m, 200m + 300m), not 1000m");
    assert_eq!(launch(&c[0]).0, "m5.large");
}

#[test]
fn unschedulable_pods_name_the_constraint_that_failed() {
    let v = plan("unschedulable.yaml");
    assert!(claims(&v).is_empty());
    let u = v["provisioning"]["unschedulable"].as_array().unwrap();
    let reason = |pod: &str| u.iter().find(|x| x["pod"] == pod).unwrap()["reason"].as_str().unwrap().to_owned();
    let greedy = reason("ml/greedy");
    assert!(greedy.contains("nvidia.com/gpu 16") && greedy.contains("offers 8"), "{greedy}");
    let lost = reason("ml/lost");
    assert!(lost.contains("topology.kubernetes.io/zone In [eu-west-1a]"), "{lost}");
}

#[test]
fn marginal_cost_packing_opens_a_cheaper_claim_than_growing() {
    let v = plan("marginal-cost.yaml");
    let c = claims(&v);
    assert_eq!(c.len(), 2, "{c:?}");
    let batch = c.iter().find(|c| c["pods"] == serde_json::json!(["default/batch"])).unwrap();
    assert_eq!(launch(batch).0, "m5.2xlarge");
    let trainer = c.iter().find(|c| c["pods"] == serde_json::json!(["default/trainer"])).unwrap();
    assert_eq!(launch(trainer).0, "g5.2xlarge");
    // The same snapshot under binpack grows one claim instead, which costs more.
    let text = std::fs::read_to_string("tests/plan/marginal-cost.yaml").unwrap().replace("marginal-cost}", "binpack}");
    let dir = std::env::temp_dir().join(format!("tenon-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("binpack.yaml");
    std::fs::write(&file, text).unwrap();
    let out = run(&["plan", "-o", "json", CATALOG, file.to_str().unwrap()]);
    let binpack: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bc = claims(&binpack);
    assert_eq!(bc.len(), 1);
    assert_eq!(launch(&bc[0]).0, "g5.4xlarge");
    let total = |cs: &Vec<Value>| cs.iter().map(|c| launch(c).3).sum::<f64>();
    assert!(total(c) < total(bc), "{} vs {}", total(c), total(bc));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pods_of_a_node_being_deleted_get_new_capacity() {
    let v = plan("deleting-node.yaml");
    let c = claims(&v);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0]["pods"], serde_json::json!(["default/moving"]));
    assert!(v["provisioning"]["existingNodes"].as_array().unwrap().is_empty(), "not back onto the deleting node");
}

#[test]
fn preferences_are_kept_when_they_can_be_met() {
    let v = plan("preferences.yaml");
    assert_eq!(launch(&claims(&v)[0]).1, "us-east-1b");
}

#[test]
fn text_output_explains_each_decision() {
    let out = run(&["plan", CATALOG, "tests/plan/limits.yaml"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("new NodeClaim from NodePool capped: m5.2xlarge spot"), "{text}");
    assert!(text.contains("cannot schedule default/batch-3: NodePool capped: its limits"), "{text}");
}

#[test]
fn bad_input_names_file_document_object_and_field_and_fails() {
    let dir = std::env::temp_dir().join(format!("tenon-plan-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\nspec: {containers: [{name: c}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: broken, namespace: web}\nspec: {containers: [{name: c, resources: {requests: {cpu: lots}}}]}\n",
    )
    .unwrap();
    let out = run(&["plan", CATALOG, file.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml") && err.contains("document 2") && err.contains("web/broken"), "{err}");
    assert!(err.contains("spec.containers[0].resources.requests.cpu"), "{err}");
    assert!(out.stdout.is_empty(), "nothing half-printed");
    std::fs::remove_dir_all(&dir).unwrap();
    let missing = run(&["plan", "tests/plan/does-not-exist.yaml"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does-not-exist.yaml"));
}

fn plan_env(files: &[&str], env: &[(&str, &str)]) -> Value {
    let mut args = vec!["plan", "--output", "json", "--now", "2026-03-04T12:00:00Z"];
    args.extend_from_slice(files);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenon"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args(&args);
    for spec in tenon_core::settings::SETTINGS {
        cmd.env_remove(spec.env);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{files:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn disruption(snapshot: &str) -> Value {
    plan(snapshot)["disruption"].clone()
}

fn stays<'a>(d: &'a Value, node: &str) -> &'a str {
    d["unconsolidatable"].as_array().unwrap().iter().find(|b| b["node"] == node).unwrap()["reason"].as_str().unwrap()
}

#[test]
fn emptiness_deletes_empty_nodes_within_the_budget() {
    let d = disruption("disrupt-empty.yaml");
    assert_eq!(d["method"], "Emptiness");
    let c = &d["commands"][0];
    assert_eq!(c["decision"], "delete");
    assert_eq!(c["reason"], "Empty");
    assert_eq!(c["candidates"].as_array().unwrap().len(), 1, "10% of 10 nodes");
    assert_eq!(c["candidates"][0]["price"], 0.096);
    assert_eq!(d["unconsolidatable"].as_array().unwrap().len(), 9);
    assert!(stays(&d, "idle-9").contains("budget for Empty in NodePool default"));
}

#[test]
fn drift_replaces_a_node_whose_template_changed() {
    let d = disruption("disrupt-drift.yaml");
    assert_eq!(d["method"], "Drift");
    let c = &d["commands"][0];
    assert_eq!((c["decision"].as_str(), c["reason"].as_str()), (Some("replace"), Some("Drifted")));
    assert_eq!(c["candidates"][0]["nodeClaim"], "default-abcde");
    assert_eq!(c["replacements"][0]["instanceTypes"][0], "m5.large");
}

#[test]
fn karpenter_hashes_drift_only_the_claim_whose_template_changed() {
    let d = disruption("karpenter-hashes.yaml");
    assert_eq!(d["method"], "Drift", "{d}");
    let drifted: Vec<&str> =
        d["commands"].as_array().unwrap().iter().map(|c| c["candidates"][0]["nodeClaim"].as_str().unwrap()).collect();
    assert_eq!(drifted, ["default-bbbbb"], "{d}");
}

#[test]
fn persistent_volumes_pin_their_pods_to_the_volumes_zone() {
    let v = plan("volume-zones.yaml");
    // db-0's volume is in us-east-1b: it takes the room of the node there.
    let existing = &v["provisioning"]["existingNodes"];
    assert_eq!(existing, &serde_json::json!([{"node": "in-b", "pods": ["shop/db-0"]}]), "{v}");
    // db-1 gets a claim in its class's only allowed zone.
    let [claim] = claims(&v).as_slice() else { panic!("one claim: {v}") };
    assert_eq!(claim["pods"], serde_json::json!(["shop/db-1"]));
    assert_eq!(requirement(claim, "topology.kubernetes.io/zone").unwrap()["values"], serde_json::json!(["us-east-1c"]));
    assert_eq!(launch(claim).1, "us-east-1c");
    // db-2 waits for its claim: nothing is bought for it, and it is not unschedulable either.
    assert_eq!(v["provisioning"]["unschedulable"], serde_json::json!([]));
    // `ledger` would fit on in-b, but its volume is in us-east-1a: in-a is not deleted onto it.
    assert!(v["disruption"]["commands"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(stays(&v["disruption"], "in-a"), "can't replace with a lower-priced node");
}

#[test]
fn a_node_out_of_volume_attachments_takes_no_pod_with_a_volume() {
    let v = plan("volume-attach-limit.yaml");
    let existing = &v["provisioning"]["existingNodes"];
    let on_node: Vec<&str> = existing[0]["pods"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert_eq!(existing[0]["node"], "in-b", "{v}");
    assert_eq!(sorted(on_node), ["shop/reader", "shop/web"], "a claim already attached takes no more room: {v}");
    let [claim] = claims(&v).as_slice() else { panic!("one claim: {v}") };
    assert_eq!(claim["pods"], serde_json::json!(["shop/db"]));
    assert_eq!(launch(claim).1, "us-east-1b", "its volume's zone");
}

#[test]
fn any_number_of_extended_resources_schedule_on_the_types_that_have_them() {
    // 25 distinct resource names: more than a vector holds inline.
    let v = plan_env(&["tests/plan/extended-resources.yaml"], &[]);
    let mut placed: Vec<(String, String)> = claims(&v)
        .iter()
        .map(|c| (c["launch"]["instanceType"].as_str().unwrap().to_owned(), c["pods"][0].as_str().unwrap().to_owned()))
        .collect();
    placed.sort();
    assert_eq!(
        placed,
        [("general", "web/fuse"), ("inferentia", "ml/inference"), ("mig-a100", "ml/whole-gpu")]
            .map(|(t, p)| (t.to_owned(), p.to_owned()))
    );
    let existing = &v["provisioning"]["existingNodes"];
    assert_eq!(existing[0]["node"], "mig-node");
    assert_eq!(existing[0]["pods"], serde_json::json!(["ml/small-slice"]), "the existing node has no 7g.80gb slice");
    let unschedulable = v["provisioning"]["unschedulable"].as_array().unwrap();
    assert_eq!(unschedulable.len(), 1, "{unschedulable:?}");
    assert_eq!(unschedulable[0]["pod"], "web/fpga");
    assert!(unschedulable[0]["reason"].as_str().unwrap().contains("example.com/fpga"), "{unschedulable:?}");
}

#[test]
fn an_affinity_namespace_selector_counts_the_namespaces_whose_labels_it_matches() {
    let on = |snapshot: &str| plan_env(&["tests/karpenter/fake-catalog.yaml", &format!("tests/plan/{snapshot}")], &[]);
    let v = on("affinity-namespace-selector-terms.yaml");
    assert!(v["provisioning"]["unschedulable"].as_array().unwrap().is_empty(), "{v}");
    let with_target = claims(&v).iter().find(|c| c["pods"].as_array().unwrap().iter().any(|p| p == "team-data/target"));
    assert!(with_target.unwrap()["pods"].as_array().unwrap().iter().any(|p| p == "default/follower"), "{v}");
    let v = on("affinity-namespace-selector-no-match.yaml");
    let unschedulable = v["provisioning"]["unschedulable"].as_array().unwrap();
    assert_eq!(unschedulable.iter().map(|u| u["pod"].as_str().unwrap()).collect::<Vec<_>>(), ["default/follower"]);
}

#[test]
fn multi_node_consolidation_folds_three_nodes_into_one() {
    let d = disruption("disrupt-multi.yaml");
    assert_eq!(d["method"], "MultiNodeConsolidation");
    let c = &d["commands"][0];
    assert_eq!(c["candidates"].as_array().unwrap().len(), 3);
    assert_eq!(c["replacements"].as_array().unwrap().len(), 1);
    assert_eq!(c["replacements"][0]["capacityTypes"], serde_json::json!(["on-demand"]));
    assert!(c["savingsPerHour"].as_f64().unwrap() > 0.0);
}

#[test]
fn single_node_consolidation_replaces_on_demand_with_spot() {
    let d = disruption("disrupt-single.yaml");
    assert_eq!(d["method"], "SingleNodeConsolidation");
    let c = &d["commands"][0];
    assert_eq!(c["decision"], "replace");
    assert_eq!(c["candidates"][0], serde_json::json!({"node": "gpu-od", "nodeClaim": "gpu-od", "price": 1.212}));
    assert_eq!(c["replacements"][0]["instanceTypes"], serde_json::json!(["g5.2xlarge"]));
    assert_eq!(c["replacements"][0]["capacityTypes"], serde_json::json!(["spot"]));
    assert_eq!(c["replacements"][0]["worstCasePrice"], 0.509);
    assert_eq!(c["savingsPerHour"], 0.703);
}

#[test]
fn the_split_fallback_is_opt_in_and_replaces_one_node_with_two() {
    let off = plan_env(&["tests/plan/disrupt-split.yaml"], &[]);
    assert_eq!(off["disruption"]["method"], Value::Null);
    let on = plan_env(
        &["tests/plan/disrupt-split.yaml"],
        &[("CONSOLIDATION_SPLIT_FALLBACK", "true"), ("MAX_CONSOLIDATION_REPLACEMENTS", "2")],
    );
    let c = &on["disruption"]["commands"][0];
    assert_eq!(c["decision"], "replace");
    let mut prices: Vec<f64> =
        c["replacements"].as_array().unwrap().iter().map(|r| r["worstCasePrice"].as_f64().unwrap()).collect();
    prices.sort_by(f64::total_cmp);
    assert_eq!(prices, [3.0, 11.0]);
    assert_eq!(c["savingsPerHour"], 16.0);
}

#[test]
fn the_on_demand_to_spot_retry_pins_zones_a_to_e() {
    let d = plan_env(&["tests/plan/disrupt-od-to-spot.yaml"], &[])["disruption"].clone();
    let r = &d["commands"][0]["replacements"][0];
    assert_eq!(r["zones"], serde_json::json!(["a", "b", "c", "d", "e"]));
    assert_eq!(r["capacityTypes"], serde_json::json!(["spot"]));
    assert_eq!(r["worstCasePrice"], 0.62);
    assert_eq!(d["commands"][0]["savingsPerHour"], 0.59);
    let off = plan_env(&["tests/plan/disrupt-od-to-spot.yaml"], &[("OD_TO_SPOT_CONSOLIDATION", "false")]);
    assert_eq!(off["disruption"]["method"], Value::Null);
}

#[test]
fn policies_pdbs_and_budgets_leave_nodes_with_readable_reasons() {
    let d = disruption("disrupt-policies.yaml");
    assert_eq!(d["method"], Value::Null);
    assert_eq!(stays(&d, "n-careful"), "consolidationPolicy WhenEmpty only removes empty nodes");
    assert_eq!(stays(&d, "n-web"), "pdb default/web prevents pod evictions");
    assert_eq!(stays(&d, "n-office"), "budget for Underutilized in NodePool office-hours is 0 until 17:00Z");
}

#[test]
fn balanced_explains_a_move_not_worth_its_disruption() {
    let d = plan_env(&["tests/plan/disrupt-balanced.yaml"], &[])["disruption"].clone();
    assert_eq!(d["method"], Value::Null);
    // Each node counts 1 and each pod 1: deleting busy-small (10 of the pool's 12) cannot pass, so it is
    // not simulated at all.
    assert!(
        stays(&d, "busy-small")
            .starts_with("Balanced: even deleting it saves 4.8% of the pool's cost for 83.3% of its disruption"),
        "{d}"
    );
}

#[test]
fn static_drift_replaces_a_drifted_node_of_a_replica_pinned_pool_with_its_template() {
    let d = disruption("disrupt-static-drift.yaml");
    assert_eq!(d["method"], "StaticDrift");
    let c = &d["commands"][0];
    assert_eq!((c["decision"].as_str(), c["reason"].as_str()), (Some("replace"), Some("Drifted")));
    assert_eq!(c["candidates"][0]["nodeClaim"], "pinned-old");
    // The replacement is a node of the pool's template, launched before the drifted one goes.
    assert!(!c["replacements"][0]["instanceTypes"].as_array().unwrap().is_empty(), "{c}");
}

#[test]
fn pods_may_select_on_the_labels_instance_types_define() {
    let v = plan("provider-labels.yaml");
    let c = claims(&v);
    assert_eq!(c.len(), 1, "{v}");
    assert_eq!(c[0]["pods"], serde_json::json!(["jobs/batch"]));
    assert!(c[0]["instanceTypes"].as_array().unwrap().iter().all(|t| t.as_str().unwrap().starts_with("m5.")));
    assert_eq!(launch(&c[0]).0, "m5.large");
    let unschedulable = v["provisioning"]["unschedulable"].as_array().unwrap();
    assert_eq!(unschedulable.len(), 1);
    assert_eq!(unschedulable[0]["pod"], "jobs/custom");
    assert!(unschedulable[0]["reason"].as_str().unwrap().contains("example.com/team"), "{}", unschedulable[0]);
}
