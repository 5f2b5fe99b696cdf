//! NodePool manifests from the specification texts and Karpenter's documentation round-trip without
//! losing a field, and invalid manifests are rejected with an error that names the field.

use serde_json::Value;
use tenon_core::api::{ConsolidationPolicy, DisruptionReason, NillableDuration, NodePool, parse_node_pool};

const MANIFESTS: [(&str, &str); 5] = [
    ("default.yaml", include_str!("manifests/default.yaml")),
    ("budgets.yaml", include_str!("manifests/budgets.yaml")),
    ("disable-disruption.yaml", include_str!("manifests/disable-disruption.yaml")),
    ("balanced.yaml", include_str!("manifests/balanced.yaml")),
    ("full.yaml", include_str!("manifests/full.yaml")),
];

/// Every leaf path of `input` must exist in `output` with an equivalent value (numbers may come back as
/// strings, durations in canonical form).
fn assert_contains(input: &Value, output: &Value, path: &str) {
    match (input, output) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let child = format!("{path}.{k}");
                let other = b.get(k).unwrap_or_else(|| panic!("{child} was lost in the round trip"));
                assert_contains(v, other, &child);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}: list length changed");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_contains(x, y, &format!("{path}[{i}]"));
            }
        }
        (Value::Number(n), Value::String(s)) => assert_eq!(n.to_string(), *s, "{path}"),
        (Value::String(a), Value::String(b)) if a != b => {
            let da = tenon_core::api::parse_duration(a);
            let db = tenon_core::api::parse_duration(b);
            assert!(da.is_ok() && da == db, "{path}: {a:?} came back as {b:?}");
        }
        (a, b) => assert_eq!(a, b, "{path}"),
    }
}

#[test]
fn spec_manifests_round_trip_without_losing_a_field() {
    for (name, text) in MANIFESTS {
        let pool = parse_node_pool(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let input: Value = serde_yaml_ng::from_str(text).unwrap();
        let output = serde_json::to_value(&pool).unwrap();
        assert_contains(&input, &output, name);
        let again: NodePool = serde_json::from_value(output.clone()).unwrap();
        assert_eq!(again, pool, "{name}: a second round trip changes nothing");
        again.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        let yaml = serde_yaml_ng::to_string(&pool).unwrap();
        assert_eq!(parse_node_pool(&yaml).unwrap(), pool, "{name}: through YAML too");
    }
}

#[test]
fn defaults_are_applied_as_karpenter_applies_them() {
    let pool = parse_node_pool(MANIFESTS[3].1).unwrap();
    assert_eq!(pool.spec.disruption.consolidation_policy, ConsolidationPolicy::Balanced);
    assert_eq!(pool.spec.disruption.consolidate_after, NillableDuration::from_secs(0));
    assert_eq!(pool.spec.disruption.budgets.len(), 1);
    assert_eq!(pool.spec.disruption.budgets[0].nodes, "10%");
    assert_eq!(pool.spec.template.spec.expire_after, NillableDuration::from_secs(720 * 3600));

    let full = parse_node_pool(MANIFESTS[4].1).unwrap();
    assert_eq!(full.spec.template.spec.expire_after, NillableDuration::Never);
    assert_eq!(full.spec.template.spec.requirements[0].min_values, Some(2));
    assert_eq!(full.spec.disruption.budgets[1].reasons, vec![DisruptionReason::Underutilized, DisruptionReason::Empty]);
    assert_eq!(full.packing_policy(), Some("marginal-cost"));
}

fn rejected(edit: &str, from: &str, to: &str) -> String {
    let text = MANIFESTS[4].1;
    assert!(text.contains(from), "{edit}: fixture has no {from:?}");
    let edited = text.replacen(from, to, 1);
    let err = match parse_node_pool(&edited) {
        Ok(_) => panic!("{edit}: the edited manifest was accepted"),
        Err(e) => e,
    };
    err.to_string()
}

#[test]
fn invalid_manifests_are_rejected_naming_the_field() {
    let cases = [
        ("bad duration", "consolidateAfter: 10h5m", "consolidateAfter: 10 hours", "spec.disruption.consolidateAfter"),
        ("bad expireAfter", "expireAfter: Never", "expireAfter: forever", "spec.template.spec.expireAfter"),
        (
            "bad grace period",
            "terminationGracePeriod: 48h",
            "terminationGracePeriod: 2d",
            "spec.template.spec.terminationGracePeriod",
        ),
        ("bad percentage", "- nodes: 10%", "- nodes: 110%", "spec.disruption.budgets[0].nodes"),
        ("bad count", "- nodes: 10%", "- nodes: five", "spec.disruption.budgets[0].nodes"),
        (
            "unknown policy",
            "consolidationPolicy: WhenEmptyOrUnderutilized",
            "consolidationPolicy: WhenIdle",
            "spec.disruption.consolidationPolicy",
        ),
        (
            "bad cron",
            "schedule: \"0 9 * * mon-fri\"",
            "schedule: \"0 25 * * *\"",
            "spec.disruption.budgets[1].schedule",
        ),
        (
            "cron with seconds",
            "schedule: \"0 9 * * mon-fri\"",
            "schedule: \"0 0 9 * * *\"",
            "spec.disruption.budgets[1].schedule",
        ),
        ("schedule without duration", "      duration: 8h\n", "", "spec.disruption.budgets[1].duration"),
        ("minValues above the values", "minValues: 2", "minValues: 4", "spec.template.spec.requirements[0].minValues"),
        (
            "unknown operator",
            "operator: DoesNotExist",
            "operator: Maybe",
            "spec.template.spec.requirements[4].operator",
        ),
        ("Gte needs an integer", "values: [\"1\"]", "values: [\"one\"]", "spec.template.spec.requirements[3].values"),
        ("bad taint effect", "effect: NoSchedule", "effect: Never", "spec.template.spec.taints[0].effect"),
        ("restricted label", "billing-team: ml", "karpenter.sh/nodepool: other", "spec.template.metadata.labels"),
        ("weight out of range", "weight: 10", "weight: 1000", "spec.weight"),
        ("bad limit", "memory: 1000Gi", "memory: lots", "spec.limits[\"memory\"]"),
        ("bad packing policy", "packing-policy: marginal-cost", "packing-policy: cheapest", "nodeclaim-packing-policy"),
        (
            "bad registration timeout",
            "registration-timeout: 25m",
            "registration-timeout: soon",
            "nodeclaim-registration-timeout",
        ),
        ("wrong kind", "kind: NodePool", "kind: NodeClaim", "kind"),
    ];
    for (what, from, to, field) in cases {
        let message = rejected(what, from, to);
        assert!(message.starts_with("NodePool/gpu"), "{what}: {message}");
        assert!(message.contains(field), "{what}: expected the error to name {field}, got: {message}");
    }
}
