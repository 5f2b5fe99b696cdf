//! Cases ported from Karpenter's own test suites (kubernetes-sigs/karpenter: the scheduling suites under
//! `pkg/controllers/provisioning/scheduling` and the disruption suites under `pkg/controllers/disruption`).
//! Each case is a snapshot under `tests/karpenter/` run through `tenon plan`, asserting the outcome
//! Karpenter's test asserts. A case where tenon decides otherwise still asserts Karpenter's outcome and is
//! ignored with the difference; `tests/karpenter-cases.md` lists every case with its source and status.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too

use std::collections::BTreeMap;
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

/// The instance types of Karpenter's fake cloud provider, the scheduling suite's default catalog.
const FAKE: &str = "fake-catalog.yaml";
/// Karpenter's `fake.InstanceTypes(5)`.
const FAKE5: &str = "fake-5-catalog.yaml";
/// Karpenter's `fake.InstanceTypesAssorted()` folded by shape, the disruption suite's catalog.
const ASSORTED: &str = "assorted-catalog.yaml";
/// Karpenter's consolidation suite runs with spot-to-spot consolidation turned on.
const SPOT_TO_SPOT: &[&str] = &["feature-gates=SpotToSpotConsolidation=true"];

/// What `tenon plan --output json` prints for `files` (paths under `tests/karpenter/`), with `--set` overrides
/// and no settings from the environment.
fn plan_with(files: &[&str], sets: &[&str]) -> Plan {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenon"));
    cmd.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/karpenter"))
        .args(["plan", "--output", "json", "--now", "2026-03-04T12:00:00Z"])
        .args(files);
    for set in sets {
        cmd.args(["--set", set]);
    }
    for spec in tenon_core::settings::SETTINGS {
        cmd.env_remove(spec.env);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("tenon does not run: {e}"));
    assert!(out.status.success(), "{files:?}: {}", String::from_utf8_lossy(&out.stderr));
    Plan(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{files:?}: not JSON: {e}")))
}

/// The plan for a snapshot against a catalog.
fn plan(catalog: &str, snapshot: &str) -> Plan {
    plan_with(&[catalog, snapshot], &[])
}

/// A plan's JSON, with accessors for what Karpenter's tests look at.
struct Plan(Value);

/// A topology domain of a new node.
#[derive(Clone, Copy)]
enum Domain {
    Zone,
    CapacityType,
    Hostname,
    /// A label the node's NodePool gives it (its requirements' single value for the key).
    Label(&'static str),
}

impl Plan {
    fn claims(&self) -> &[Value] {
        self.0["provisioning"]["nodeClaims"].as_array().unwrap()
    }

    /// The new node a pod (a name in namespace `default`) lands on.
    fn claim_of(&self, pod: &str) -> &Value {
        self.claims()
            .iter()
            .find(|c| pods(c).contains(&pod))
            .unwrap_or_else(|| panic!("{pod} gets no new node: {}", self.0))
    }

    /// The pods that land nowhere.
    fn unschedulable(&self) -> Vec<&str> {
        let u = self.0["provisioning"]["unschedulable"].as_array().unwrap();
        sorted(u.iter().map(|u| short(u["pod"].as_str().unwrap())).collect())
    }

    /// The pods placed on existing nodes, by node.
    fn existing(&self) -> BTreeMap<&str, Vec<&str>> {
        let e = self.0["provisioning"]["existingNodes"].as_array().unwrap();
        e.iter().map(|e| (e["node"].as_str().unwrap(), sorted(names(&e["pods"])))).collect()
    }

    /// Every pod that gets a place, on a new or an existing node.
    fn scheduled(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self.claims().iter().flat_map(pods).collect();
        all.extend(self.existing().into_values().flatten());
        sorted(all)
    }

    /// Pods per domain of the new nodes, on top of `base` (pods already running per domain), largest first:
    /// what Karpenter's `ExpectSkew` compares.
    fn skew(&self, domain: Domain, base: &[(&str, usize)]) -> Vec<usize> {
        let mut counts: BTreeMap<String, usize> = base.iter().map(|(d, n)| ((*d).to_owned(), *n)).collect();
        for (i, c) in self.claims().iter().enumerate() {
            let key = match domain {
                Domain::Zone => zone(c).to_owned(),
                Domain::CapacityType => capacity_type(c).to_owned(),
                Domain::Hostname => format!("claim-{i}"),
                Domain::Label(key) => label(c, key).unwrap_or_else(|| panic!("no {key} on {c}")).to_owned(),
            };
            *counts.entry(key).or_default() += pods(c).len();
        }
        let mut skew: Vec<usize> = counts.into_values().filter(|n| *n > 0).collect();
        skew.sort_unstable_by(|a, b| b.cmp(a));
        skew
    }

    fn disruption(&self) -> &Value {
        &self.0["disruption"]
    }

    /// The disruption method that acts, if any.
    fn method(&self) -> Option<&str> {
        self.disruption()["method"].as_str()
    }

    fn commands(&self) -> &[Value] {
        self.disruption()["commands"].as_array().unwrap()
    }

    /// The single command of the pass.
    fn command(&self) -> &Value {
        let c = self.commands();
        assert_eq!(c.len(), 1, "one command: {}", self.disruption());
        &c[0]
    }

    /// The nodes the pass's commands disrupt.
    fn disrupted(&self) -> Vec<&str> {
        sorted(self.commands().iter().flat_map(candidates).collect())
    }

    /// Why `node` is left alone.
    fn stays(&self, node: &str) -> &str {
        let u = self.disruption()["unconsolidatable"].as_array().unwrap();
        let b = u
            .iter()
            .find(|b| b["node"] == node)
            .unwrap_or_else(|| panic!("{node} is not left alone: {}", self.disruption()));
        b["reason"].as_str().unwrap()
    }
}

fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v
}

/// A pod name without its namespace when that is `default`.
fn short(pod: &str) -> &str {
    pod.strip_prefix("default/").unwrap_or(pod)
}

fn names(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|p| short(p.as_str().unwrap())).collect()
}

/// A new node's pods.
fn pods(claim: &Value) -> Vec<&str> {
    names(&claim["pods"])
}

/// The instance type a new node launches as (the node's `node.kubernetes.io/instance-type` label).
fn instance_type(claim: &Value) -> &str {
    claim["launch"]["instanceType"].as_str().unwrap()
}

/// The zone a new node launches in.
fn zone(claim: &Value) -> &str {
    claim["launch"]["zone"].as_str().unwrap()
}

/// The capacity type a new node launches as.
fn capacity_type(claim: &Value) -> &str {
    claim["launch"]["capacityType"].as_str().unwrap()
}

/// The instance types a new node may launch as.
fn instance_types(claim: &Value) -> Vec<&str> {
    claim["instanceTypes"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect()
}

/// The value a new node's requirements give `key` (an `In` with one value), as its label will read.
fn label<'a>(claim: &'a Value, key: &str) -> Option<&'a str> {
    let reqs = claim["requirements"].as_array().unwrap();
    let r = reqs.iter().find(|r| r["key"] == key)?;
    let values = r["values"].as_array()?;
    (r["operator"] == "In" && values.len() == 1).then(|| values[0].as_str().unwrap())
}

/// The nodes a disruption command removes.
fn candidates(command: &Value) -> Vec<&str> {
    command["candidates"].as_array().unwrap().iter().map(|c| c["node"].as_str().unwrap()).collect()
}

fn replacements(command: &Value) -> &[Value] {
    command["replacements"].as_array().unwrap()
}

fn replacement_types(replacement: &Value) -> Vec<&str> {
    replacement["instanceTypes"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect()
}

/// pkg/controllers/provisioning/scheduling/suite_test.go
mod scheduling_suite {
    use super::*;

    /// A single pod that schedules to a new node; the node.
    fn only_claim(p: &Plan, pod: &str) -> Value {
        assert!(p.unschedulable().is_empty(), "{}", p.0);
        assert_eq!(p.claims().len(), 1, "{}", p.0);
        p.claim_of(pod).clone()
    }

    /// Nothing schedules and nothing is bought.
    fn not_scheduled(p: &Plan, pods: &[&str]) {
        assert!(p.claims().is_empty(), "{}", p.0);
        assert!(p.existing().is_empty(), "{}", p.0);
        assert_eq!(p.unschedulable(), pods);
    }

    fn fake(snapshot: &str) -> Plan {
        plan(FAKE, &format!("scheduling/{snapshot}"))
    }

    #[test]
    fn should_schedule_unconstrained_pods_that_dont_have_matching_node_selectors() {
        let c = only_claim(&fake("pool-labels-unconstrained.yaml"), "unconstrained");
        assert_eq!(label(&c, "test-key"), Some("test-value"));
    }

    #[test]
    fn should_not_schedule_pods_that_have_conflicting_node_selectors() {
        not_scheduled(&fake("pool-labels-conflicting-selector.yaml"), &["conflicting"]);
    }

    #[test]
    fn should_not_schedule_pods_that_have_node_selectors_with_undefined_key() {
        not_scheduled(&fake("selector-undefined-key.yaml"), &["undefined"]);
    }

    #[test]
    fn should_schedule_pods_that_have_matching_requirements() {
        let c = only_claim(&fake("pool-labels-matching-requirements.yaml"), "matching");
        assert_eq!(label(&c, "test-key"), Some("test-value"));
    }

    #[test]
    fn should_not_schedule_pods_that_have_conflicting_requirements() {
        not_scheduled(&fake("pool-labels-conflicting-requirements.yaml"), &["conflicting"]);
    }

    #[test]
    fn should_use_nodepool_constraints() {
        assert_eq!(zone(&only_claim(&fake("zone-from-pool.yaml"), "plain")), "test-zone-2");
    }

    #[test]
    fn should_use_node_selectors() {
        assert_eq!(zone(&only_claim(&fake("zone-from-node-selector.yaml"), "zone-2")), "test-zone-2");
    }

    #[test]
    fn should_not_schedule_nodes_with_a_hostname_selector() {
        not_scheduled(&fake("hostname-selector.yaml"), &["red"]);
    }

    #[test]
    fn should_not_schedule_the_pod_if_nodeselector_unknown() {
        not_scheduled(&fake("zone-selector-unknown.yaml"), &["lost"]);
    }

    #[test]
    fn should_not_schedule_if_node_selector_outside_of_nodepool_constraints() {
        not_scheduled(&fake("zone-selector-outside-pool.yaml"), &["elsewhere"]);
    }

    #[test]
    fn should_schedule_compatible_requirements_with_operator_in() {
        assert_eq!(zone(&only_claim(&fake("op-in.yaml"), "zone-3")), "test-zone-3");
    }

    // The fake's `integer` label is the type's CPU count: 16 is arm-instance-type, 2 small-instance-type.
    #[test]
    fn should_schedule_compatible_requirements_with_operator_gt() {
        assert_eq!(instance_type(&only_claim(&fake("op-gt.yaml"), "plain")), "arm-instance-type");
    }

    #[test]
    fn should_schedule_compatible_requirements_with_operator_lt() {
        assert_eq!(instance_type(&only_claim(&fake("op-lt.yaml"), "plain")), "small-instance-type");
    }

    #[test]
    fn should_schedule_compatible_requirements_with_operator_gte() {
        assert_eq!(instance_type(&only_claim(&fake("op-gte.yaml"), "plain")), "arm-instance-type");
    }

    #[test]
    fn should_schedule_compatible_requirements_with_operator_lte() {
        assert_eq!(instance_type(&only_claim(&fake("op-lte.yaml"), "plain")), "small-instance-type");
    }

    #[test]
    fn should_not_schedule_incompatible_preferences_and_requirements_with_operator_in() {
        not_scheduled(&fake("op-in-unknown.yaml"), &["lost"]);
    }

    #[test]
    fn should_schedule_compatible_requirements_with_operator_notin() {
        assert_eq!(zone(&only_claim(&fake("op-notin.yaml"), "zone-3")), "test-zone-3");
    }

    #[test]
    fn should_not_schedule_incompatible_preferences_and_requirements_with_operator_notin() {
        not_scheduled(&fake("op-notin-all.yaml"), &["lost"]);
    }

    #[test]
    fn should_schedule_compatible_preferences_and_requirements_with_operator_in() {
        assert_eq!(zone(&only_claim(&fake("pref-in-compatible.yaml"), "likes-2")), "test-zone-2");
    }

    #[test]
    fn should_schedule_incompatible_preferences_and_requirements_with_operator_in() {
        only_claim(&fake("pref-in-incompatible.yaml"), "likes-unknown");
    }

    #[test]
    fn should_schedule_compatible_preferences_and_requirements_with_operator_notin() {
        assert_eq!(zone(&only_claim(&fake("pref-notin-compatible.yaml"), "likes-2")), "test-zone-2");
    }

    #[test]
    fn should_schedule_incompatible_preferences_and_requirements_with_operator_notin() {
        only_claim(&fake("pref-notin-incompatible.yaml"), "likes-none");
    }

    #[test]
    fn should_schedule_compatible_node_selectors_preferences_and_requirements() {
        assert_eq!(zone(&only_claim(&fake("selector-preference-requirement.yaml"), "zone-3")), "test-zone-3");
    }

    #[test]
    fn should_combine_multidimensional_node_selectors_preferences_and_requirements() {
        let c = only_claim(&fake("multidimensional.yaml"), "narrowed");
        assert_eq!((zone(&c), instance_type(&c)), ("test-zone-3", "arm-instance-type"));
    }

    #[test]
    fn should_not_schedule_pods_that_have_node_selectors_with_restricted_labels() {
        assert!(fake("restricted-labels.yaml").unschedulable().contains(&"hostname"));
    }

    #[test]
    fn should_not_schedule_pods_that_have_node_selectors_with_restricted_domains() {
        assert!(fake("restricted-labels.yaml").unschedulable().contains(&"karpenter-domain"));
    }

    #[test]
    fn should_schedule_pods_that_have_node_selectors_with_label_in_the_kubernetes_domains() {
        let c = only_claim(&fake("kubernetes-domain-labels.yaml"), "plain");
        assert_eq!(label(&c, "kubernetes.io/test"), Some("test-value"));
        assert_eq!(label(&c, "k8s.io/test"), Some("test-value"));
    }

    #[test]
    fn should_schedule_pods_that_have_node_selectors_with_label_in_subdomain_from_kubernetes_domains() {
        let c = only_claim(&fake("kubernetes-subdomain-labels.yaml"), "plain");
        assert_eq!(label(&c, "subdomain.kubernetes.io/test"), Some("test-value"));
        assert_eq!(label(&c, "subdomain.k8s.io/test"), Some("test-value"));
    }

    #[test]
    fn should_schedule_pods_that_have_node_selectors_with_label_in_wellknown_label_list() {
        let p = fake("well-known-labels.yaml");
        assert!(p.unschedulable().is_empty(), "{}", p.0);
        assert_eq!(p.scheduled(), ["arch", "capacity-type", "instance-type", "os", "zone"]);
    }

    #[test]
    fn should_not_schedule_pods_that_have_node_selectors_with_in_operator_and_undefined_key() {
        not_scheduled(&fake("logic-in-undefined-key.yaml"), &["undefined"]);
    }

    #[test]
    fn should_schedule_pods_that_have_node_selectors_with_notin_operator_and_undefined_key() {
        let c = only_claim(&fake("logic-notin-undefined-key.yaml"), "undefined");
        assert_ne!(label(&c, "test-key"), Some("test-value"));
    }

    #[test]
    fn should_not_schedule_pods_that_have_node_selectors_with_exists_operator_and_undefined_key() {
        not_scheduled(&fake("logic-exists-undefined-key.yaml"), &["undefined"]);
    }

    #[test]
    fn should_schedule_pods_that_with_doesnotexists_operator_and_undefined_key() {
        let c = only_claim(&fake("logic-doesnotexist-undefined-key.yaml"), "undefined");
        assert_eq!(label(&c, "test-key"), None);
    }

    /// The Scheduling Logic context's case of the same name: the pool requires the label instead of setting it.
    #[test]
    fn should_schedule_unconstrained_pods_that_dont_have_matching_node_selectors_pool_requirement() {
        let c = only_claim(&fake("logic-pool-requirement-unconstrained.yaml"), "plain");
        assert_eq!(label(&c, "test-key"), Some("test-value"));
    }

    #[test]
    fn should_schedule_pods_that_have_node_selectors_with_matching_value_and_in_operator() {
        let c = only_claim(&fake("logic-in-matching-value.yaml"), "matching");
        assert_eq!(label(&c, "test-key"), Some("test-value"));
    }

    #[test]
    fn should_not_schedule_pods_that_have_node_selectors_with_matching_value_and_notin_operator() {
        not_scheduled(&fake("logic-notin-matching-value.yaml"), &["excluding"]);
    }

    #[test]
    fn should_schedule_the_pod_with_exists_operator_and_defined_key() {
        only_claim(&fake("logic-exists-defined-key.yaml"), "exists");
    }

    #[test]
    fn should_not_schedule_the_pod_with_doesnotexists_operator_and_defined_key() {
        not_scheduled(&fake("logic-doesnotexist-defined-key.yaml"), &["absent"]);
    }

    #[test]
    fn should_not_schedule_pods_that_have_node_selectors_with_different_value_and_in_operator() {
        not_scheduled(&fake("logic-in-different-value.yaml"), &["other"]);
    }

    #[test]
    fn should_schedule_pods_that_have_node_selectors_with_different_value_and_notin_operator() {
        let c = only_claim(&fake("logic-notin-different-value.yaml"), "not-other");
        assert_eq!(label(&c, "test-key"), Some("test-value"));
    }

    #[test]
    fn should_schedule_compatible_pods_to_the_same_node() {
        let c = only_claim(&fake("logic-compatible-pods-same-node.yaml"), "in-test");
        assert_eq!(pods(&c), ["in-test", "notin-another"]);
        assert_eq!(label(&c, "test-key"), Some("test-value"));
    }

    #[test]
    fn should_schedule_incompatible_pods_to_the_different_node() {
        let p = fake("logic-incompatible-pods-different-nodes.yaml");
        assert_eq!(p.claims().len(), 2);
        assert_eq!(label(p.claim_of("in-test"), "test-key"), Some("test-value"));
        assert_eq!(label(p.claim_of("in-another"), "test-key"), Some("another-value"));
    }

    #[test]
    fn exists_operator_should_not_overwrite_the_existing_value() {
        not_scheduled(&fake("logic-exists-does-not-overwrite.yaml"), &["lost"]);
    }

    #[test]
    fn should_not_relax_the_final_term() {
        not_scheduled(&fake("fallback-required-final-term.yaml"), &["stuck"]);
    }

    #[test]
    fn should_relax_multiple_terms() {
        assert_eq!(zone(&only_claim(&fake("fallback-required-multiple-terms.yaml"), "terms")), "test-zone-1");
    }

    #[test]
    fn should_relax_all_terms() {
        only_claim(&fake("fallback-preferred-relax-all.yaml"), "picky");
    }

    #[test]
    fn should_relax_to_use_lighter_weights() {
        assert_eq!(zone(&only_claim(&fake("fallback-preferred-lighter-weights.yaml"), "weighted")), "test-zone-2");
    }

    #[test]
    fn should_schedule_even_if_preference_is_conflicting_with_requirement() {
        assert_eq!(zone(&only_claim(&fake("fallback-preference-conflicts-requirement.yaml"), "torn")), "test-zone-3");
    }

    #[test]
    fn should_schedule_even_if_preference_requirements_are_conflicting() {
        only_claim(&fake("fallback-preference-requirements-conflict.yaml"), "contradictory");
    }

    #[test]
    fn should_not_schedule_if_requesting_more_resources_than_any_instance_type_has() {
        not_scheduled(&fake("too-large-for-any-type.yaml"), &["huge"]);
    }

    /// Both pods schedule, each to a node of its own.
    fn one_node_each(p: &Plan, a: &str, b: &str) {
        assert!(p.unschedulable().is_empty(), "{}", p.0);
        assert_eq!(p.claims().len(), 2, "{}", p.0);
        assert_eq!(pods(p.claim_of(a)), [a]);
        assert_eq!(pods(p.claim_of(b)), [b]);
    }

    #[test]
    fn should_launch_pods_with_different_archs_on_different_instances() {
        one_node_each(&fake("different-archs.yaml"), "amd", "arm");
    }

    #[test]
    fn should_exclude_instance_types_that_are_not_supported_by_the_pod_constraints_node_affinity_instance_type() {
        not_scheduled(&fake("pool-arch-excludes-instance-type.yaml"), &["arm-only"]);
    }

    #[test]
    fn should_exclude_instance_types_that_are_not_supported_by_the_provider_constraints_arch() {
        not_scheduled(&fake("pool-arch-excludes-large-type.yaml"), &["big"]);
    }

    #[test]
    fn should_launch_pods_with_different_instance_type_node_selectors_on_different_instances() {
        let p = fake("different-instance-type-selectors.yaml");
        one_node_each(&p, "small", "default");
        assert_eq!(instance_type(p.claim_of("small")), "small-instance-type");
    }

    #[test]
    fn should_launch_pods_with_different_zone_selectors_on_different_instances() {
        one_node_each(&fake("different-zone-selectors.yaml"), "one", "two");
    }

    #[test]
    fn should_launch_pods_with_resources_that_arent_on_any_single_instance_type_on_different_instances() {
        one_node_each(&plan(FAKE5, "scheduling/resources-on-different-types.yaml"), "great", "better");
    }

    #[test]
    fn should_fail_to_schedule_a_pod_with_resources_requests_that_arent_on_a_single_instance_type() {
        not_scheduled(&plan(FAKE5, "scheduling/resources-on-no-single-type.yaml"), &["both"]);
    }

    #[test]
    fn should_filter_instance_types_that_match_labels() {
        let p = plan(FAKE5, "scheduling/provider-labels-filter.yaml");
        assert_eq!(instance_type(p.claim_of("large")), "fake-it-4");
        assert_eq!(instance_type(p.claim_of("small")), "fake-it-0");
    }

    #[test]
    fn should_not_schedule_with_incompatible_labels() {
        not_scheduled(&plan(FAKE5, "scheduling/provider-labels-incompatible.yaml"), &["large-0", "small-4"]);
    }

    #[test]
    fn should_schedule_optional_labels() {
        let c = only_claim(&plan(FAKE5, "scheduling/provider-labels-optional.yaml"), "special");
        assert_eq!(instance_type(&c), "fake-it-4", "the only type with the label");
    }

    #[test]
    fn should_schedule_without_optional_labels_if_disallowed() {
        let c = only_claim(&plan(FAKE5, "scheduling/provider-labels-optional-disallowed.yaml"), "ordinary");
        assert!(!instance_types(&c).contains(&"fake-it-4"), "{c}");
    }

    #[test]
    fn should_schedule_a_small_pod_on_the_smallest_instance() {
        assert_eq!(instance_type(&only_claim(&fake("binpack-small-pod.yaml"), "small")), "small-instance-type");
    }

    #[test]
    fn should_schedule_a_small_pod_on_the_smallest_possible_instance_type() {
        let c = only_claim(&fake("binpack-smallest-possible.yaml"), "almost-2g");
        assert_eq!(instance_type(&c), "small-instance-type");
    }

    /// Every pod schedules, to `nodes` new nodes all launched as `instance`.
    fn packed(p: &Plan, nodes: usize, instance: &str) {
        assert!(p.unschedulable().is_empty(), "{}", p.0);
        assert_eq!(p.claims().len(), nodes, "{}", p.0);
        assert!(p.claims().iter().all(|c| instance_type(c) == instance), "{}", p.0);
    }

    #[test]
    fn should_schedule_multiple_small_pods_on_the_smallest_possible_instance_type() {
        let p = fake("binpack-multiple-small-pods.yaml");
        packed(&p, 1, "small-instance-type");
        assert_eq!(pods(&p.claims()[0]).len(), 5);
    }

    #[test]
    fn should_create_new_nodes_when_a_node_is_at_capacity() {
        let p = fake("binpack-new-nodes-at-capacity.yaml");
        packed(&p, 20, "default-instance-type");
        assert_eq!(p.scheduled().len(), 40);
    }

    #[test]
    fn should_pack_small_and_large_pods_together() {
        let p = fake("binpack-small-and-large.yaml");
        packed(&p, 20, "default-instance-type");
        assert_eq!(p.scheduled().len(), 60);
    }

    #[test]
    fn should_pack_nodes_tightly() {
        let p = plan(FAKE5, "scheduling/binpack-tightly.yaml");
        assert_eq!(p.claims().len(), 2);
        assert_ne!(instance_type(p.claim_of("big")), instance_type(p.claim_of("small")));
    }

    #[test]
    fn should_handle_zero_quantity_resource_requests() {
        only_claim(&fake("binpack-zero-quantity.yaml"), "weird");
    }

    #[test]
    fn should_not_schedule_pods_that_exceed_every_instance_types_capacity() {
        not_scheduled(&fake("binpack-exceeds-every-type.yaml"), &["huge"]);
    }

    #[test]
    fn should_create_new_nodes_when_a_node_is_at_capacity_due_to_pod_limits_per_node() {
        let p = fake("binpack-pod-limit-per-node.yaml");
        packed(&p, 5, "small-instance-type");
        assert_eq!(p.scheduled().len(), 25);
    }

    #[test]
    fn should_take_into_account_init_container_resource_requests_when_binpacking() {
        assert_eq!(instance_type(&only_claim(&fake("binpack-init-container.yaml"), "init")), "default-instance-type");
    }

    #[test]
    fn should_not_schedule_pods_when_init_container_resource_requests_are_greater_than_available_instance_types() {
        not_scheduled(&fake("binpack-init-container-too-large.yaml"), &["init"]);
    }

    #[test]
    fn should_select_for_valid_instance_types_regardless_of_price() {
        let c = only_claim(&plan_with(&["instance-selection/valid-regardless-of-price.yaml"], &[]), "tiny");
        assert_eq!(instance_type(&c), "large");
        assert_eq!(sorted(instance_types(&c)), ["large", "medium", "small"]);
    }

    fn inflight(snapshot: &str) -> Plan {
        plan(FAKE, &format!("inflight/{snapshot}"))
    }

    /// The pod goes to the existing node `node`, nothing is bought.
    fn joins(p: &Plan, node: &str, pod: &str) {
        assert!(p.claims().is_empty(), "{}", p.0);
        assert_eq!(p.existing(), BTreeMap::from([(node, vec![pod])]));
    }

    /// The pod gets a new node of its own.
    fn new_node(p: &Plan, pod: &str) {
        assert!(p.existing().is_empty(), "{}", p.0);
        assert_eq!(p.claims().len(), 1, "{}", p.0);
        assert_eq!(pods(p.claim_of(pod)), [pod]);
    }

    #[test]
    fn should_not_launch_a_second_node_if_there_is_an_in_flight_node_that_can_support_the_pod() {
        joins(&inflight("supports-pod.yaml"), "inflight", "second");
    }

    #[test]
    fn should_not_launch_a_second_node_if_there_is_an_in_flight_node_that_can_support_the_pod_node_selectors() {
        let p = inflight("supports-pod-node-selectors.yaml");
        assert_eq!(p.existing(), BTreeMap::from([("inflight", vec!["second"])]));
        assert_eq!(p.claims().len(), 1);
        assert_eq!(pods(p.claim_of("third")), ["third"]);
    }

    #[test]
    fn should_launch_a_second_node_if_a_pod_wont_fit_on_the_existing_nodes_node() {
        new_node(&inflight("pod-wont-fit.yaml"), "second");
    }

    #[test]
    fn should_launch_a_second_node_if_a_pod_isnt_compatible_with_the_existing_nodes_node_node_selector() {
        new_node(&inflight("pod-incompatible-selector.yaml"), "second");
    }

    #[test]
    fn should_launch_a_second_node_if_an_in_flight_node_is_terminating() {
        new_node(&inflight("terminating-node.yaml"), "second");
    }

    #[test]
    fn should_assume_pod_will_schedule_to_a_node_with_ephemeral_taint_not_ready_when_the_node_is_uninitialized() {
        joins(&inflight("not-ready-taint-uninitialized.yaml"), "inflight", "second");
        new_node(&inflight("not-ready-taint-initialized.yaml"), "third");
    }

    #[test]
    fn should_not_assume_pod_will_schedule_to_a_tainted_node() {
        new_node(&inflight("tainted-node.yaml"), "second");
    }

    #[test]
    fn should_assume_pod_will_schedule_to_a_tainted_node_with_a_custom_startup_taint() {
        joins(&inflight("startup-taint.yaml"), "starting", "second");
    }

    #[test]
    fn should_not_assume_pod_will_schedule_to_a_node_with_startup_taints_after_initialization() {
        new_node(&inflight("startup-taint-after-initialization.yaml"), "second");
    }

    #[test]
    fn should_consider_a_tainted_not_ready_node_as_in_flight_even_if_initialized() {
        joins(&inflight("tainted-not-ready-initialized.yaml"), "flaky", "second");
    }

    fn existing(snapshot: &str) -> Plan {
        plan(FAKE, &format!("existing/{snapshot}"))
    }

    #[test]
    fn should_track_daemonset_usage_separately_so_we_know_how_many_ds_resources_are_remaining_to_be_scheduled() {
        joins(&existing("daemonset-usage-tracked.yaml"), "big", "second");
    }

    #[test]
    fn should_schedule_pods_with_the_same_host_port_to_different_nodes() {
        one_node_each(&existing("same-host-port.yaml"), "port-1", "port-2");
    }

    #[test]
    fn should_schedule_a_pod_to_an_existing_node_unowned_by_karpenter() {
        joins(&existing("unowned-node.yaml"), "unowned", "small");
    }

    #[test]
    fn should_schedule_multiple_pods_to_an_existing_node_unowned_by_karpenter() {
        let p = existing("unowned-node-many-pods.yaml");
        assert!(p.claims().is_empty() && p.unschedulable().is_empty(), "{}", p.0);
        assert_eq!(p.existing()["unowned"].len(), 100);
    }

    #[test]
    fn should_consider_a_pod_incompatible_with_an_existing_node_but_compatible_with_nodepool() {
        not_scheduled(&existing("incompatible-existing-node-no-pool.yaml"), &["zonal"]);
        new_node(&existing("incompatible-existing-node.yaml"), "zonal");
    }

    #[test]
    fn should_not_subtract_daemonset_overhead_that_is_not_strictly_compatible_with_an_existing_node() {
        let p = existing("daemonset-incompatible-with-existing-node.yaml");
        assert!(p.claims().is_empty(), "{}", p.0);
        let on_node = &p.existing()["zoneless"];
        assert_eq!(on_node.len(), 1, "one of the two pods takes the existing node");
        assert_eq!(p.unschedulable().len(), 1, "the other fits no node that must also hold the DaemonSet");
    }

    #[test]
    fn should_re_schedule_pods_from_a_deleting_node_when_pods_are_active() {
        let p = existing("deleting-node-active-pod.yaml");
        new_node(&p, "active");
        assert_eq!(instance_type(p.claim_of("active")), "small-instance-type", "the size of the node it leaves");
    }

    /// No new node is bought.
    fn nothing_bought(p: &Plan) {
        assert!(p.claims().is_empty(), "{}", p.0);
    }

    #[test]
    fn should_not_re_schedule_pods_from_a_deleting_node_when_pods_are_not_active() {
        nothing_bought(&existing("deleting-node-terminating-pod.yaml"));
    }

    #[test]
    fn should_not_re_schedule_pods_from_a_deleting_node_when_pods_are_owned_by_a_daemonset() {
        nothing_bought(&existing("deleting-node-daemonset-pod.yaml"));
    }

    #[test]
    fn should_not_reschedule_pods_from_a_deleting_node_when_pods_are_not_active_and_they_are_owned_by_a_replicaset() {
        nothing_bought(&existing("deleting-node-replicaset-pod.yaml"));
    }

    #[test]
    fn should_reschedule_pods_from_a_deleting_node_when_pods_are_not_active_and_they_are_owned_by_a_statefulset() {
        let p = existing("deleting-node-statefulset-pod.yaml");
        new_node(&p, "stateful-0");
        assert_eq!(instance_type(p.claim_of("stateful-0")), "small-instance-type");
    }
}

/// pkg/controllers/provisioning/scheduling/topology_test.go
mod topology {
    use super::*;

    fn fake(snapshot: &str) -> Plan {
        plan(FAKE, &format!("topology/{snapshot}"))
    }

    /// Every pod schedules and the new nodes spread them as `expected` (pods per domain, largest first).
    fn spreads(snapshot: &str, domain: Domain, expected: &[usize]) {
        let p = fake(snapshot);
        assert!(p.unschedulable().is_empty(), "{}", p.0);
        assert_eq!(p.skew(domain, &[]), expected, "{}", p.0);
    }

    #[test]
    fn should_ignore_unknown_topology_keys() {
        let p = fake("unknown-topology-key.yaml");
        assert_eq!(p.unschedulable(), ["unknown-key"]);
        assert_eq!(p.scheduled(), ["plain"]);
    }

    #[test]
    fn should_not_spread_when_a_nil_label_selector_is_defined() {
        spreads("nil-label-selector.yaml", Domain::Zone, &[2]);
    }

    #[test]
    fn should_balance_pods_across_zones_match_labels() {
        spreads("zonal-match-labels.yaml", Domain::Zone, &[2, 1, 1]);
    }

    #[test]
    fn should_balance_pods_across_zones_match_expressions() {
        spreads("zonal-match-expressions.yaml", Domain::Zone, &[2, 1, 1]);
    }

    #[test]
    fn should_respect_nodepool_zonal_constraints() {
        spreads("zonal-pool-constraints.yaml", Domain::Zone, &[2, 1, 1]);
    }

    #[test]
    fn should_respect_nodepool_zonal_constraints_subset_with_requirements() {
        spreads("zonal-pool-subset-requirements.yaml", Domain::Zone, &[2, 2]);
    }

    #[test]
    fn should_respect_nodepool_zonal_constraints_subset_with_labels() {
        spreads("zonal-pool-subset-labels.yaml", Domain::Zone, &[4]);
    }

    #[test]
    fn should_respect_nodepool_zonal_constraints_subset_with_requirements_and_labels() {
        spreads("zonal-pool-subset-requirements-and-labels.yaml", Domain::Zone, &[4]);
    }

    #[test]
    fn should_respect_nodepool_zonal_constraints_subset_with_labels_across_nodepools() {
        spreads("zonal-pool-subset-labels-across-pools.yaml", Domain::Zone, &[2, 2]);
    }

    /// The spread over the new nodes and the pods already running (`base`), and how many pods stay pending.
    fn spreads_over(snapshot: &str, domain: Domain, base: &[(&str, usize)], expected: &[usize], pending: usize) {
        let p = fake(snapshot);
        assert_eq!(p.skew(domain, base), expected, "{}", p.0);
        assert_eq!(p.unschedulable().len(), pending, "{}", p.0);
    }

    #[test]
    fn should_respect_nodepool_zonal_constraints_existing_pod() {
        spreads_over("zonal-existing-pod.yaml", Domain::Zone, &[("test-zone-3", 1)], &[2, 2, 1], 2);
    }

    #[test]
    fn should_schedule_to_the_non_minimum_domain_if_its_all_thats_available() {
        let base = [("test-zone-1", 1), ("test-zone-2", 1)];
        spreads_over("zonal-non-minimum-domain.yaml", Domain::Zone, &base, &[6, 1, 1], 4);
    }

    #[test]
    fn should_not_violate_max_skew_when_unsat_do_not_schedule() {
        spreads_over("zonal-max-skew-do-not-schedule.yaml", Domain::Zone, &[("test-zone-1", 1)], &[2, 2, 1], 6);
    }

    #[test]
    fn should_only_count_running_scheduled_pods_with_matching_labels_scheduled_to_nodes_with_a_corresponding_domain() {
        let base = [("test-zone-1", 2), ("test-zone-2", 1)];
        spreads_over("zonal-count-only-running-matching-pods.yaml", Domain::Zone, &base, &[2, 2, 1], 0);
    }

    #[test]
    fn should_handle_interdependent_selectors() {
        spreads("zonal-interdependent-selectors.yaml", Domain::Hostname, &[5]);
    }

    #[test]
    fn should_respect_min_domains_constraints() {
        spreads_over("zonal-min-domains.yaml", Domain::Zone, &[], &[1, 1], 1);
    }

    #[test]
    fn satisfied_min_domains_constraints_equal_should_allow_expected_pod_scheduling() {
        spreads("zonal-min-domains-equal.yaml", Domain::Zone, &[4, 4, 3]);
    }

    #[test]
    fn satisfied_min_domains_constraints_greater_than_minimum_should_allow_expected_pod_scheduling() {
        spreads("zonal-min-domains-greater.yaml", Domain::Zone, &[4, 4, 3]);
    }

    #[test]
    fn should_balance_pods_across_nodes() {
        spreads("hostname-balance.yaml", Domain::Hostname, &[1, 1, 1, 1]);
    }

    #[test]
    fn should_balance_pods_on_the_same_hostname_up_to_maxskew() {
        spreads("hostname-max-skew.yaml", Domain::Hostname, &[4]);
    }

    #[test]
    fn balance_multiple_deployments_with_hostname_topology_spread() {
        spreads("hostname-multiple-deployments.yaml", Domain::Hostname, &[2, 2]);
    }

    #[test]
    fn balance_multiple_deployments_with_hostname_topology_spread_and_varying_arch() {
        spreads("hostname-multiple-deployments-arch.yaml", Domain::Hostname, &[1, 1, 1, 1]);
    }

    #[test]
    fn should_balance_pods_across_capacity_types() {
        spreads("capacity-type-balance.yaml", Domain::CapacityType, &[2, 2]);
    }

    #[test]
    fn should_respect_nodepool_capacity_type_constraints() {
        spreads("capacity-type-pool-constraints.yaml", Domain::CapacityType, &[2, 2]);
    }

    #[test]
    fn should_not_violate_max_skew_when_unsat_do_not_schedule_capacity_type() {
        let p = fake("capacity-type-max-skew-do-not-schedule.yaml");
        assert_eq!(p.skew(Domain::CapacityType, &[("spot", 1)]), [2, 1], "{}", p.0);
        assert!(p.claims().iter().all(|c| capacity_type(c) == "on-demand"));
        assert_eq!(p.unschedulable().len(), 3);
    }

    #[test]
    fn should_balance_pods_across_a_label_node_taints_policy_ignore() {
        spreads_over("spread-taints-policy-ignore.yaml", Domain::Label("fake-label"), &[], &[1], 4);
    }

    #[test]
    fn should_balance_pods_across_a_label_node_taints_policy_honor() {
        spreads("spread-taints-policy-honor.yaml", Domain::Label("fake-label"), &[5]);
    }

    #[test]
    fn should_balance_pods_across_a_label_when_discovered_from_the_nodepool_node_taints_policy_ignore() {
        spreads_over("spread-taints-policy-ignore-pool-domains.yaml", Domain::Label("fake-label"), &[], &[1], 1);
    }

    #[test]
    fn should_balance_pods_across_a_label_when_discovered_from_the_nodepool_node_taints_policy_honor() {
        spreads("spread-taints-policy-honor-pool-domains.yaml", Domain::Label("fake-label"), &[2]);
    }

    #[test]
    fn should_balance_pods_across_a_label_when_mutually_exclusive_nodepools_by_taints_share_domains_node_taints_policy_honor()
     {
        spreads("spread-taints-policy-honor-exclusive-pools.yaml", Domain::Label("fake-label"), &[3, 2, 1]);
    }

    #[test]
    fn should_balance_pods_across_a_label_node_affinity_policy_ignore() {
        spreads_over("spread-affinity-policy-ignore.yaml", Domain::Label("fake-label"), &[], &[1], 4);
    }

    #[test]
    fn should_balance_pods_across_a_label_node_affinity_policy_honor() {
        spreads("spread-affinity-policy-honor.yaml", Domain::Label("fake-label"), &[5]);
    }

    /// A snapshot's nodes (name to labels) and how many pods run on each.
    fn running(snapshot: &str) -> (BTreeMap<String, BTreeMap<String, String>>, BTreeMap<String, usize>) {
        let path = format!("{}/tests/karpenter/topology/{snapshot}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let (mut nodes, mut pods) = (BTreeMap::new(), BTreeMap::new());
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap();
            let items = if v["kind"] == "List" { v["items"].as_array().unwrap().clone() } else { vec![v] };
            for o in items {
                match o["kind"].as_str() {
                    Some("Node") => {
                        let labels = serde_json::from_value(o["metadata"]["labels"].clone()).unwrap_or_default();
                        nodes.insert(o["metadata"]["name"].as_str().unwrap().to_owned(), labels);
                    }
                    Some("Pod") => {
                        if let Some(node) = o["spec"]["nodeName"].as_str() {
                            *pods.entry(node.to_owned()).or_default() += 1;
                        }
                    }
                    _ => {}
                }
            }
        }
        (nodes, pods)
    }

    /// Pods per domain across the cluster once the plan is carried out (largest first): those the snapshot
    /// already runs, those the plan puts on existing nodes and those of its new nodes, what Karpenter's
    /// `ExpectSkew` counts after a batch. Every pod of these snapshots carries the spread's labels.
    fn cluster_skew(p: &Plan, snapshot: &str, domain: Domain) -> Vec<usize> {
        let (nodes, mut pods) = running(snapshot);
        for (node, placed) in p.existing() {
            *pods.entry(node.to_owned()).or_default() += placed.len();
        }
        let mut base: BTreeMap<String, usize> = BTreeMap::new();
        for (node, n) in pods {
            let key = match domain {
                Domain::Zone => "topology.kubernetes.io/zone",
                Domain::CapacityType => "karpenter.sh/capacity-type",
                Domain::Hostname => "kubernetes.io/hostname",
                Domain::Label(key) => key,
            };
            let labels = &nodes[&node];
            let d = labels.get(key).cloned().or_else(|| matches!(domain, Domain::Hostname).then(|| node.clone()));
            *base.entry(d.unwrap_or_else(|| panic!("{node} has no {key}"))).or_default() += n;
        }
        let base: Vec<(&str, usize)> = base.iter().map(|(d, n)| (d.as_str(), *n)).collect();
        p.skew(domain, &base)
    }

    /// Karpenter's `ExpectMaxSkew`: the fullest domain's pods less the emptiest's, among domains with pods.
    fn max_skew(counts: &[usize]) -> usize {
        counts.first().copied().unwrap_or(0) - counts.last().copied().unwrap_or(0)
    }

    #[test]
    fn should_spread_pods_while_respecting_both_constraints_zonal_and_capacity_type() {
        // Four batches; after each, no capacity type holds more than the first bound, no zone more than the second.
        for (batch, (types, zones)) in [(1, 1), (3, 2), (5, 4), (11, 7)].into_iter().enumerate() {
            let snapshot = format!("zonal-capacity-type-batch-{}.yaml", batch + 1);
            let p = fake(&snapshot);
            let by_type = cluster_skew(&p, &snapshot, Domain::CapacityType);
            let by_zone = cluster_skew(&p, &snapshot, Domain::Zone);
            assert!(by_type.iter().all(|n| *n <= types), "{snapshot}: {by_type:?} {}", p.0);
            assert!(by_zone.iter().all(|n| *n <= zones), "{snapshot}: {by_zone:?} {}", p.0);
        }
    }

    #[test]
    fn should_spread_pods_while_respecting_all_constraints() {
        // Fourteen batches of 1 to 14 pods, each placed in full within every constraint's skew.
        for batch in 1..=14 {
            let snapshot = format!("hostname-zonal-capacity-type-batch-{batch}.yaml");
            let p = plan(ASSORTED, &format!("topology/{snapshot}"));
            assert!(p.unschedulable().is_empty(), "{snapshot}: {}", p.0);
            assert!(max_skew(&cluster_skew(&p, &snapshot, Domain::CapacityType)) <= 1, "{snapshot}: {}", p.0);
            assert!(max_skew(&cluster_skew(&p, &snapshot, Domain::Zone)) <= 2, "{snapshot}: {}", p.0);
            assert!(max_skew(&cluster_skew(&p, &snapshot, Domain::Hostname)) <= 3, "{snapshot}: {}", p.0);
        }
    }

    #[test]
    fn should_limit_spread_options_by_node_selector_zonal() {
        spreads("zonal-node-selector.yaml", Domain::Zone, &[10, 5]);
    }

    #[test]
    fn should_limit_spread_options_by_node_requirements() {
        spreads("zonal-node-requirements.yaml", Domain::Zone, &[5, 5]);
    }

    /// The spread after each batch of a case in successive snapshots.
    fn batches(snapshots: &[&str], domain: Domain, expected: &[&[usize]]) {
        for (snapshot, expected) in snapshots.iter().zip(expected) {
            let p = fake(snapshot);
            assert_eq!(cluster_skew(&p, snapshot, domain), *expected, "{snapshot}: {}", p.0);
        }
    }

    #[test]
    fn should_limit_spread_options_by_required_node_affinity() {
        let snapshots = [
            "zonal-required-affinity-batch-1.yaml",
            "zonal-required-affinity-batch-2.yaml",
            "zonal-required-affinity-batch-3.yaml",
        ];
        batches(&snapshots, Domain::Zone, &[&[3, 3], &[3, 3, 1], &[4, 4, 4]]);
    }

    #[test]
    fn should_not_limit_spread_options_by_preferred_node_affinity() {
        spreads("zonal-preferred-affinity.yaml", Domain::Zone, &[2, 2, 2]);
    }

    #[test]
    fn should_limit_spread_options_by_node_selector_capacity_type() {
        spreads("capacity-type-node-selector.yaml", Domain::CapacityType, &[5, 5]);
    }

    #[test]
    fn should_limit_spread_options_by_node_affinity_capacity_type() {
        let snapshots = [
            "capacity-type-node-affinity-batch-1.yaml",
            "capacity-type-node-affinity-batch-2.yaml",
            "capacity-type-node-affinity-batch-3.yaml",
        ];
        batches(&snapshots, Domain::CapacityType, &[&[3], &[3, 1], &[5, 4]]);
    }

    #[test]
    fn should_schedule_a_pod_with_empty_pod_affinity_and_anti_affinity() {
        assert_eq!(fake("empty-pod-affinity.yaml").scheduled(), ["plain"]);
    }

    #[test]
    fn should_respect_pod_affinity_hostname() {
        let p = fake("pod-affinity-hostname.yaml");
        assert!(pods(p.claim_of("target")).contains(&"follower"), "{}", p.0);
    }

    #[test]
    fn should_respect_pod_affinity_arch() {
        let p = fake("pod-affinity-arch.yaml");
        let (target, follower) = (p.claim_of("target"), p.claim_of("follower"));
        assert_eq!(label(target, "kubernetes.io/arch"), label(follower, "kubernetes.io/arch"));
        assert_eq!(instance_type(target), instance_type(follower), "the only arm64 type");
        assert_eq!(pods(target), ["target"], "the spread keeps them apart");
    }

    #[test]
    fn should_respect_self_pod_affinity_hostname() {
        spreads("self-pod-affinity-hostname.yaml", Domain::Hostname, &[3]);
    }

    #[test]
    fn should_respect_self_pod_affinity_for_first_empty_topology_domain_only_hostname() {
        let p = fake("self-pod-affinity-first-domain-only.yaml");
        assert_eq!(p.skew(Domain::Hostname, &[]), [5], "a node holds five pods");
        assert_eq!(p.unschedulable().len(), 5);
    }

    #[test]
    fn should_respect_self_pod_affinity_zone() {
        spreads("self-pod-affinity-zone.yaml", Domain::Hostname, &[3]);
    }

    #[test]
    fn should_allow_violation_of_preferred_pod_affinity() {
        assert!(fake("preferred-pod-affinity-violated.yaml").scheduled().contains(&"hopeful"));
    }

    #[test]
    fn should_allow_violation_of_preferred_pod_anti_affinity() {
        let p = fake("preferred-pod-anti-affinity-violated.yaml");
        let shy = p.scheduled().into_iter().filter(|n| n.starts_with("shy-")).count();
        assert_eq!(shy, 10, "{}", p.0);
    }

    #[test]
    fn should_separate_nodes_using_simple_pod_anti_affinity_on_hostname() {
        let p = fake("pod-anti-affinity-hostname.yaml");
        assert_eq!(p.claims().len(), 2);
        assert_eq!(pods(p.claim_of("avoider")), ["avoider"]);
    }

    #[test]
    fn should_not_violate_pod_anti_affinity_on_zone() {
        let p = fake("pod-anti-affinity-zone.yaml");
        assert_eq!(p.scheduled(), ["zone-1", "zone-2", "zone-3"]);
        assert_eq!(p.unschedulable(), ["avoider"]);
    }

    /// The zone requirement a new node keeps: the zones it may still land in.
    fn zones_open(claim: &Value) -> Vec<&str> {
        let reqs = claim["requirements"].as_array().unwrap();
        let zone = reqs.iter().find(|r| r["key"] == "topology.kubernetes.io/zone").unwrap();
        assert_eq!(zone["operator"], "In", "{claim}");
        names(&zone["values"])
    }

    #[test]
    fn should_not_violate_pod_anti_affinity_on_zone_other_schedules_first() {
        let p = fake("pod-anti-affinity-zone-other-first.yaml");
        assert_eq!(p.scheduled(), ["target"]);
        assert_eq!(p.unschedulable(), ["avoider"]);
    }

    #[test]
    fn should_not_violate_pod_anti_affinity_on_zone_schrodinger() {
        let p = fake("pod-anti-affinity-zone-schrodinger.yaml");
        assert_eq!(p.scheduled(), ["zone-anywhere"]);
        // Late committal: the node stays open to every empty zone, so the labelled pod cannot be placed yet.
        assert_eq!(zones_open(p.claim_of("zone-anywhere")), ["test-zone-1", "test-zone-2", "test-zone-3"]);
        assert_eq!(p.unschedulable(), ["labelled"]);
        // The next batch, once the node came up in test-zone-2.
        let next = fake("pod-anti-affinity-zone-schrodinger-second-batch.yaml");
        assert!(next.existing().is_empty(), "{}", next.0);
        let c = next.claim_of("labelled");
        assert_ne!(zone(c), "test-zone-2");
        assert!(next.unschedulable().is_empty());
    }

    #[test]
    fn should_support_pod_anti_affinity_with_a_zone_topology() {
        // One pod per batch, each batch seeing the previous ones running in the zone their node came up in.
        let first = fake("self-pod-anti-affinity-zone-batch-1.yaml");
        assert_eq!(first.skew(Domain::Zone, &[]), [1]);
        assert_eq!(zones_open(first.claim_of("first-1")), ["test-zone-1", "test-zone-2", "test-zone-3"]);
        assert_eq!(first.unschedulable(), ["first-2", "first-3"]);
        let second = fake("self-pod-anti-affinity-zone-batch-2.yaml");
        assert_eq!(second.skew(Domain::Zone, &[("test-zone-1", 1)]), [1, 1]);
        assert_eq!(zones_open(&second.claims()[0]), ["test-zone-2", "test-zone-3"]);
        let third = fake("self-pod-anti-affinity-zone-batch-3.yaml");
        assert_eq!(third.skew(Domain::Zone, &[("test-zone-1", 1), ("test-zone-2", 1)]), [1, 1, 1]);
        assert_eq!(zones_open(&third.claims()[0]), ["test-zone-3"]);
        let last = fake("self-pod-anti-affinity-zone-batch-4.yaml");
        assert!(last.scheduled().is_empty(), "{}", last.0);
        assert_eq!(last.unschedulable().len(), 3);
    }

    /// Whether the follower shares the target's new node.
    fn follows(p: &Plan) -> bool {
        let c = p.claims().iter().find(|c| pods(c).iter().any(|x| x.ends_with("target"))).unwrap();
        pods(c).contains(&"follower")
    }

    #[test]
    fn should_filter_pod_affinity_topologies_by_namespace_no_matching_pods() {
        let p = fake("affinity-namespace-no-match.yaml");
        assert_eq!(p.claims().len(), 10);
        assert_eq!(p.unschedulable(), ["follower"]);
    }

    #[test]
    fn should_filter_pod_affinity_topologies_by_namespace_matching_pods_namespace_list() {
        let p = fake("affinity-namespace-list.yaml");
        assert!(p.unschedulable().is_empty(), "{}", p.0);
        assert!(follows(&p), "{}", p.0);
    }

    #[test]
    fn should_filter_pod_affinity_topologies_by_namespace_empty_namespace_selector() {
        let p = fake("affinity-namespace-empty-selector.yaml");
        assert!(p.unschedulable().is_empty(), "{}", p.0);
        assert!(follows(&p), "{}", p.0);
    }

    #[test]
    fn should_not_schedule_pods_with_affinity_to_a_non_existent_pod() {
        let p = fake("pod-affinity-non-existent-pod.yaml");
        assert!(p.claims().is_empty());
        assert_eq!(p.unschedulable().len(), 10);
    }

    #[test]
    fn should_support_pod_affinity_with_zone_topology_unconstrained_target() {
        let first = fake("pod-affinity-zone-unconstrained-target.yaml");
        assert_eq!(first.scheduled(), ["target"], "the followers wait for the target's zone");
        assert_eq!(first.unschedulable().len(), 10);
        let second = fake("pod-affinity-zone-target-scheduled.yaml");
        assert!(second.unschedulable().is_empty(), "{}", second.0);
        assert_eq!(second.skew(Domain::Zone, &[("test-zone-2", 1)]), [11]);
    }

    #[test]
    fn should_schedule_pods_that_tolerate_nodepool_constraints() {
        let p = plan(FAKE, "taints/tolerate-pool-taints.yaml");
        assert_eq!(p.scheduled(), ["equal", "exists"]);
        assert_eq!(p.unschedulable(), ["none", "other-key", "wrong-value"]);
    }

    #[test]
    fn should_provision_nodes_with_taints_and_schedule_pods_if_the_taint_is_only_a_startup_taint() {
        assert_eq!(plan(FAKE, "taints/startup-taint-only.yaml").scheduled(), ["plain"]);
    }
}

/// pkg/controllers/provisioning/scheduling/instance_selection_test.go
mod instance_selection {
    use super::*;

    #[test]
    fn should_schedule_on_cheaper_on_demand_instance_even_when_spot_price_ordering_would_place_others_first() {
        let p = plan_with(&["instance-selection/cheaper-on-demand.yaml"], &[]);
        let c = p.claim_of("plain");
        assert_eq!((instance_type(c), capacity_type(c)), ("test-instance1", "on-demand"));
    }

    #[test]
    fn should_schedule_respecting_the_min_values_from_instance_type_requirements() {
        let p = plan_with(&["instance-selection/min-values-instance-type.yaml"], &[]);
        assert_eq!(p.claims().len(), 2, "the two pods on different nodes: {}", p.0);
        assert!(p.claims().iter().all(|c| instance_types(c).len() >= 2), "{}", p.0);
    }

    #[test]
    fn schedule_should_fail_if_minimum_number_of_instance_types_is_not_met_as_per_the_min_values_in_the_requirement() {
        let p = plan(FAKE5, "instance-selection/min-values-not-met.yaml");
        assert!(p.claims().is_empty());
        assert_eq!(p.unschedulable(), ["plain"]);
    }
}

/// Runs a disruption snapshot against the assorted catalog.
fn disrupt(snapshot: &str, sets: &[&str]) -> Plan {
    plan_with(&[ASSORTED, &format!("disruption/{snapshot}")], sets)
}

/// The pass deletes exactly `nodes`, with no replacement.
fn deletes(p: &Plan, nodes: &[&str]) {
    assert!(p.commands().iter().all(|c| c["decision"] == "delete" && replacements(c).is_empty()), "{}", p.disruption());
    assert_eq!(p.disrupted(), nodes, "{}", p.disruption());
}

/// The pass replaces exactly `node`, and returns its replacements.
fn replaces<'a>(p: &'a Plan, node: &str) -> &'a [Value] {
    let c = p.command();
    assert_eq!(c["decision"], "replace", "{}", p.disruption());
    assert_eq!(candidates(c), [node]);
    replacements(c)
}

/// The pass does nothing.
fn leaves_alone(p: &Plan) {
    assert_eq!(p.method(), None, "{}", p.disruption());
    assert!(p.commands().is_empty());
}

/// pkg/controllers/disruption/emptiness_test.go
mod emptiness {
    use super::*;

    #[test]
    fn can_delete_empty_nodes() {
        let p = disrupt("emptiness-delete-empty-node.yaml", &[]);
        assert_eq!(p.method(), Some("Emptiness"));
        deletes(&p, &["empty"]);
    }

    #[test]
    fn can_delete_empty_and_drifted_nodes() {
        let p = disrupt("emptiness-empty-and-drifted.yaml", &[]);
        assert_eq!(p.method(), Some("Drift"), "drift runs first and claims the node");
        deletes(&p, &["empty"]);
    }

    #[test]
    fn should_ignore_nodes_with_the_karpenter_sh_do_not_disrupt_annotation() {
        let p = disrupt("emptiness-do-not-disrupt-node.yaml", &[]);
        leaves_alone(&p);
        assert!(p.stays("protected").contains("do-not-disrupt"));
    }

    #[test]
    fn should_delete_nodes_with_the_karpenter_sh_do_not_disrupt_annotation_set_to_false() {
        deletes(&disrupt("emptiness-do-not-disrupt-false.yaml", &[]), &["unprotected"]);
    }

    #[test]
    fn should_ignore_nodes_that_have_pods() {
        leaves_alone(&disrupt("emptiness-node-with-pods.yaml", &[]));
    }

    #[test]
    fn can_delete_multiple_empty_nodes() {
        let p = disrupt("emptiness-multiple-empty-nodes.yaml", &[]);
        assert_eq!(candidates(p.command()), ["empty-1", "empty-2"]);
        deletes(&p, &["empty-1", "empty-2"]);
    }

    #[test]
    fn will_consider_a_node_with_a_daemonset_pod_as_empty() {
        deletes(&disrupt("emptiness-daemonset-pod.yaml", &[]), &["daemons-only"]);
    }

    #[test]
    fn will_consider_a_node_with_terminating_deployment_pods_as_empty() {
        deletes(&disrupt("emptiness-terminating-deployment-pods.yaml", &[]), &["draining"]);
    }

    #[test]
    fn will_not_consider_a_node_with_a_terminating_statefulset_pod_as_empty() {
        leaves_alone(&disrupt("emptiness-terminating-statefulset-pod.yaml", &[]));
    }

    fn ten(prefix: &str) -> Vec<String> {
        (0..10).map(|i| format!("{prefix}-{i}")).collect()
    }

    #[test]
    fn should_allow_all_empty_nodes_to_be_disrupted() {
        let p = disrupt("emptiness-budget-all.yaml", &[]);
        let all = ten("empty");
        deletes(&p, &all.iter().map(String::as_str).collect::<Vec<_>>());
    }

    #[test]
    fn should_allow_no_empty_nodes_to_be_disrupted() {
        let p = disrupt("emptiness-budget-none.yaml", &[]);
        leaves_alone(&p);
        assert!(p.stays("empty-0").contains("budget"), "{}", p.stays("empty-0"));
    }

    #[test]
    fn should_only_allow_3_empty_nodes_to_be_disrupted() {
        assert_eq!(disrupt("emptiness-budget-three.yaml", &[]).disrupted().len(), 3);
    }

    #[test]
    fn should_allow_2_nodes_from_each_nodepool_to_be_deleted() {
        let p = disrupt("emptiness-budget-two-per-pool.yaml", &[]);
        let deleted = p.disrupted();
        assert_eq!(deleted.len(), 20);
        for pool in 0..10 {
            let prefix = format!("pool-{pool}-");
            assert_eq!(deleted.iter().filter(|n| n.starts_with(&prefix)).count(), 2, "{deleted:?}");
        }
    }
}

/// pkg/controllers/disruption/consolidation_test.go
mod consolidation {
    use super::*;

    fn consolidate(snapshot: &str) -> Plan {
        disrupt(snapshot, SPOT_TO_SPOT)
    }

    #[test]
    fn can_delete_nodes() {
        deletes(&consolidate("consolidation-delete-node.yaml"), &["node-1"]);
    }

    #[test]
    fn can_delete_nodes_when_non_karpenter_capacity_can_fit_pods() {
        deletes(&consolidate("consolidation-delete-onto-unmanaged-node.yaml"), &["node-0"]);
    }

    #[test]
    fn can_delete_nodes_considers_pdb() {
        let p = consolidate("consolidation-delete-considers-pdb.yaml");
        deletes(&p, &["node-0"]);
        assert!(p.stays("node-1").contains("pdb default/pdb"));
    }

    #[test]
    fn can_delete_nodes_considers_karpenter_sh_do_not_disrupt_set_to_true_on_nodes() {
        deletes(&consolidate("consolidation-delete-do-not-disrupt-node.yaml"), &["node-0"]);
    }

    #[test]
    fn can_delete_nodes_considers_karpenter_sh_do_not_disrupt_set_to_true_on_pods() {
        deletes(&consolidate("consolidation-delete-do-not-disrupt-pod.yaml"), &["node-0"]);
    }

    #[test]
    fn can_delete_nodes_with_a_permanently_pending_pod() {
        let p = consolidate("consolidation-delete-with-pending-pod.yaml");
        deletes(&p, &["node-1"]);
        assert_eq!(p.unschedulable(), ["pending"]);
    }

    #[test]
    fn wont_delete_nodes_if_it_would_make_a_non_pending_pod_go_pending() {
        leaves_alone(&consolidate("consolidation-delete-would-strand-pod.yaml"));
    }

    #[test]
    fn wont_delete_node_if_it_would_violate_pod_anti_affinity() {
        leaves_alone(&consolidate("consolidation-anti-affinity-blocks-delete.yaml"));
    }

    #[test]
    fn can_replace_node_maintaining_zonal_topology_spread() {
        let p = consolidate("consolidation-replace-keeps-zonal-spread.yaml");
        let r = replaces(&p, "zone-2");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0]["zones"], serde_json::json!(["test-zone-2"]), "the zone of the node it replaces");
    }

    /// One cheaper replacement that cannot be the most expensive type again.
    fn cheaper_replacement(p: &Plan, node: &str) {
        let r = replaces(p, node);
        assert_eq!(r.len(), 1);
        assert!(!replacement_types(&r[0]).contains(&"64-cpu-128-mem"), "{}", r[0]);
        assert!(p.command()["savingsPerHour"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn can_replace_node_if_the_candidate_is_on_demand_node() {
        cheaper_replacement(&consolidate("consolidation-replace-on-demand.yaml"), "dear");
    }

    #[test]
    fn can_replace_node_if_the_candidate_is_spot_node() {
        cheaper_replacement(&consolidate("consolidation-replace-spot.yaml"), "dear");
    }

    /// The three nodes go for one new node.
    fn merged(p: &Plan) {
        let c = p.command();
        assert_eq!(candidates(c), ["node-0", "node-1", "node-2"], "{}", p.disruption());
        assert_eq!(replacements(c).len(), 1);
    }

    #[test]
    fn can_merge_3_nodes_into_1_if_the_candidate_is_on_demand_node() {
        merged(&consolidate("consolidation-merge-three-on-demand.yaml"));
    }

    #[test]
    fn can_merge_3_nodes_into_1_if_the_candidate_is_spot_node() {
        merged(&consolidate("consolidation-merge-three-spot.yaml"));
    }

    #[test]
    fn can_merge_3_nodes_into_1_if_the_candidates_have_both_spot_and_on_demand() {
        merged(&consolidate("consolidation-merge-three-mixed.yaml"));
    }

    // Karpenter's table builds spot nodes for its "on-demand" entry and on-demand nodes for its "spot" entry;
    // the snapshots follow the nodes it builds.
    #[test]
    fn wont_merge_2_nodes_into_1_of_the_same_type_if_the_candidate_is_on_demand_node() {
        deletes(&consolidate("consolidation-no-merge-into-same-type-spot.yaml"), &["node-0"]);
    }

    #[test]
    fn wont_merge_2_nodes_into_1_of_the_same_type_if_the_candidate_is_spot_node() {
        deletes(&consolidate("consolidation-no-merge-into-same-type-on-demand.yaml"), &["node-0"]);
    }

    /// With the on-demand → spot retry off. The retry, a fleet-pricing setting on by default, deliberately
    /// replaces this node in the zones where spot beats its price.
    #[test]
    fn wont_replace_node_if_any_spot_replacement_is_more_expensive() {
        let file = "disruption/consolidation-no-replace-if-spot-dearer.yaml";
        let sets = ["feature-gates=SpotToSpotConsolidation=true", "od-to-spot-consolidation=false"];
        leaves_alone(&plan_with(&[file], &sets));
        let retried = plan_with(&[file], SPOT_TO_SPOT);
        assert_eq!(retried.0["disruption"]["commands"][0]["decision"], "replace", "{}", retried.0);
    }

    #[test]
    fn wont_replace_on_demand_node_if_on_demand_replacement_is_more_expensive() {
        let p = plan_with(&["disruption/consolidation-no-replace-if-on-demand-dearer.yaml"], SPOT_TO_SPOT);
        leaves_alone(&p);
        assert!(p.stays("current").contains("lower-priced"), "{}", p.stays("current"));
    }

    #[test]
    fn should_only_allow_3_nodes_to_be_deleted_in_multi_node_consolidation_delete() {
        let p = consolidate("consolidation-budget-multi-node.yaml");
        assert!(p.commands().iter().all(|c| c["decision"] == "delete"), "{}", p.disruption());
        assert_eq!(p.disrupted().len(), 3);
    }

    #[test]
    fn should_only_allow_3_nodes_to_be_deleted_in_single_node_consolidation_delete() {
        let p = consolidate("consolidation-budget-single-node.yaml");
        assert!(p.commands().iter().all(|c| c["decision"] == "delete"), "{}", p.disruption());
        assert_eq!(p.disrupted().len(), 3);
    }
}

/// pkg/controllers/disruption/drift_test.go
mod drift {
    use super::*;

    #[test]
    fn should_replace_drifted_nodes() {
        let p = disrupt("drift-replace.yaml", &[]);
        assert_eq!(p.method(), Some("Drift"));
        assert_eq!(replaces(&p, "old").len(), 1);
    }

    #[test]
    fn should_delete_drifted_nodes() {
        let p = disrupt("drift-delete.yaml", &[]);
        assert_eq!(p.method(), Some("Drift"));
        deletes(&p, &["old"]);
    }

    #[test]
    fn should_ignore_nodes_with_the_karpenter_sh_do_not_disrupt_annotation_set_to_true() {
        let p = disrupt("drift-do-not-disrupt-node.yaml", &[]);
        leaves_alone(&p);
        assert!(p.stays("old").contains("do-not-disrupt"));
    }

    #[test]
    fn should_delete_drifted_nodes_with_the_karpenter_sh_do_not_disrupt_annotation_set_to_false() {
        let p = disrupt("drift-do-not-disrupt-false.yaml", &[]);
        assert_eq!(p.method(), Some("Drift"));
        deletes(&p, &["old"]);
    }

    #[test]
    fn should_delete_drifted_nodes_when_they_are_empty_and_consolidation_is_disabled() {
        let p = disrupt("drift-empty-consolidation-disabled.yaml", &[]);
        assert_eq!(p.method(), Some("Drift"));
        deletes(&p, &["old"]);
    }

    #[test]
    fn should_drift_empty_nodes_before_non_empty_nodes() {
        deletes(&disrupt("drift-empty-before-non-empty.yaml", &[]), &["empty"]);
    }

    #[test]
    fn should_continue_to_the_next_drifted_node_if_the_first_cannot_reschedule_all_pods() {
        let p = disrupt("drift-continue-past-unreschedulable.yaml", &[]);
        assert_eq!(replaces(&p, "movable").len(), 1);
        assert!(p.stays("stuck").contains("cannot be rescheduled"), "{}", p.stays("stuck"));
    }

    #[test]
    fn should_only_consider_3_nodes_allowed_to_be_disrupted_because_of_budgets() {
        let p = disrupt("drift-budget.yaml", &[]);
        assert_eq!(p.method(), Some("Drift"));
        assert_eq!(p.disrupted().len(), 3);
    }

    #[test]
    fn can_replace_drifted_nodes_with_multiple_nodes() {
        let p = plan_with(&["disruption/drift-replace-with-multiple-nodes.yaml"], &[]);
        let r = replaces(&p, "old");
        assert_eq!(r.len(), 3, "one 2-CPU pod per 3-CPU replacement");
        assert!(r.iter().all(|r| replacement_types(r) == ["replacement-on-demand"]));
    }
}

/// pkg/controllers/disruption/suite_test.go (Candidate Filtering)
mod disruption_suite {
    use super::*;

    fn candidates_plan(snapshot: &str) -> Plan {
        plan(ASSORTED, &format!("candidates/{snapshot}"))
    }

    /// The node is not a disruption candidate, for a reason naming `why`.
    fn not_a_candidate(snapshot: &str, why: &str) {
        let p = candidates_plan(snapshot);
        leaves_alone(&p);
        assert!(p.stays("node").contains(why), "{}", p.stays("node"));
    }

    /// The node is a candidate: the pass disrupts it.
    fn a_candidate(snapshot: &str) {
        let p = candidates_plan(snapshot);
        assert_eq!(p.disrupted(), ["node"], "{}", p.disruption());
    }

    #[test]
    fn should_not_consider_candidates_that_have_do_not_disrupt_pods_scheduled_and_no_termination_grace_period() {
        not_a_candidate("do-not-disrupt-pod.yaml", "pod default/keep has karpenter.sh/do-not-disrupt");
    }

    #[test]
    fn should_not_consider_candidates_that_have_do_not_disrupt_daemonset_pods_scheduled() {
        not_a_candidate("do-not-disrupt-daemonset-pod.yaml", "pod default/ds-pod has karpenter.sh/do-not-disrupt");
    }

    #[test]
    fn should_consider_candidates_that_have_do_not_disrupt_terminating_pods() {
        a_candidate("do-not-disrupt-terminating-pod.yaml");
    }

    #[test]
    fn should_consider_candidates_that_have_do_not_disrupt_terminal_pods() {
        a_candidate("do-not-disrupt-terminal-pod.yaml");
    }

    #[test]
    fn should_not_consider_candidates_that_have_multiple_pdbs_on_the_same_pod() {
        let p = candidates_plan("multiple-pdbs.yaml");
        leaves_alone(&p);
        let why = p.stays("node");
        assert!(why.contains("eviction does not support multiple PDBs"), "{why}");
        assert!(why.contains("default/pdb1") && why.contains("default/pdb2"), "{why}");
    }

    #[test]
    fn should_not_consider_candidates_that_have_fully_blocking_pdbs() {
        not_a_candidate("blocking-pdb.yaml", "pdb default/pdb prevents pod evictions");
    }

    #[test]
    fn should_not_consider_candidates_that_arent_yet_initialized() {
        not_a_candidate("not-initialized.yaml", "not initialized");
    }

    #[test]
    fn should_not_consider_candidates_that_are_have_a_non_existent_nodepool() {
        not_a_candidate("missing-nodepool.yaml", "NodePool missing does not exist");
    }
}
