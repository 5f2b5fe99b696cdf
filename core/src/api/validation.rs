//! Parsing and validation of NodePool and NodeClaim manifests, with errors that name the field.

use std::fmt;

use k8s_openapi::api::core::v1::Taint;
use serde::de::DeserializeOwned;

use super::labels;
use super::nodeclaim::NodeClaim;
use super::nodepool::{BudgetNodes, NodePool, parse_schedule};
use super::requirements::{NodeSelectorRequirement, Operator};
use crate::resources::Resources;

/// A manifest that cannot be accepted, naming the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    /// `Kind/name`, or `Kind` when the name is unknown.
    pub object: String,
    /// The path of the offending field, e.g. `spec.disruption.budgets[0].nodes`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.object, self.message)
        } else {
            write!(f, "{}: {}: {}", self.object, self.field, self.message)
        }
    }
}

impl ValidationError {
    fn new(object: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { object: object.to_owned(), field: field.into(), message: message.into() }
    }
}

fn object_name(kind: &str, value: &serde_json::Value) -> String {
    match value.pointer("/metadata/name").and_then(|v| v.as_str()) {
        Some(name) => format!("{kind}/{name}"),
        None => kind.to_owned(),
    }
}

/// Deserializes a Kubernetes object of `kind` from a JSON value, naming the field on error.
pub(crate) fn from_value<T: DeserializeOwned>(kind: &str, value: &serde_json::Value) -> Result<T, ValidationError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        ValidationError::new(
            &object_name(kind, value),
            if field == "." { String::new() } else { field },
            e.into_inner().to_string(),
        )
    })
}

/// Parses one manifest (YAML or JSON) of `api_version` and `kind` into `T`: a document that is not YAML,
/// names another version or kind, or does not fit `T` is an error naming the object and the field. Provider
/// crates read their NodeClasses with it.
pub fn parse_manifest<T: DeserializeOwned>(api_version: &str, kind: &str, text: &str) -> Result<T, ValidationError> {
    let value: serde_json::Value = serde_yaml_ng::from_str(text)
        .map_err(|e| ValidationError::new(kind, "", format!("not a YAML document: {e}")))?;
    let object = object_name(kind, &value);
    let got_version = value.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default();
    if got_version != api_version {
        return Err(ValidationError::new(
            &object,
            "apiVersion",
            format!("expected {api_version:?}, got {got_version:?}"),
        ));
    }
    let got_kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
    if got_kind != kind {
        return Err(ValidationError::new(&object, "kind", format!("expected {kind:?}, got {got_kind:?}")));
    }
    from_value(kind, &value)
}

/// Parses and validates one NodePool manifest (YAML or JSON).
pub fn parse_node_pool(text: &str) -> Result<NodePool, ValidationError> {
    let pool: NodePool = parse_manifest("karpenter.sh/v1", "NodePool", text)?;
    pool.validate()?;
    Ok(pool)
}

/// Parses and validates one NodeClaim manifest (YAML or JSON).
pub fn parse_node_claim(text: &str) -> Result<NodeClaim, ValidationError> {
    let claim: NodeClaim = parse_manifest("karpenter.sh/v1", "NodeClaim", text)?;
    claim.validate()?;
    Ok(claim)
}

/// Whether `key` is a valid qualified label key (`[prefix/]name`).
pub(crate) fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty() && name.len() <= 63 && is_label_value(name);
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

/// Whether `v` is a valid label value (empty, or up to 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends).
pub(crate) fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
            && v.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric))
}

/// Whether `key` is in the `karpenter.sh` label domain, as Karpenter's CRD rules read it (the part
/// before the `/` ends with `karpenter.sh`).
fn in_karpenter_domain(key: &str) -> bool {
    key.split('/').next().is_some_and(|domain| domain.ends_with("karpenter.sh"))
}

/// Which label keys a requirement or template label may use.
#[derive(Clone, Copy)]
enum Keys {
    /// A NodePool's: the `karpenter.sh` domain but `karpenter.sh/capacity-type`, and the hostname.
    Pool,
    /// A NodeClaim's: also `karpenter.sh/nodepool`, which tenon writes, and the reservation id it pins.
    Claim,
}

/// Why `key` is restricted, if it is, as Karpenter's CRD rules restrict it.
fn restricted(key: &str, keys: Keys) -> Option<String> {
    let key = labels::normalize(key);
    if key == labels::HOSTNAME {
        return Some(format!("label {key:?} is restricted"));
    }
    let allowed: &[&str] = match keys {
        Keys::Pool => &[labels::CAPACITY_TYPE],
        Keys::Claim => &[labels::CAPACITY_TYPE, labels::NODE_POOL, labels::RESERVATION_ID],
    };
    (in_karpenter_domain(key) && !allowed.contains(&key)).then(|| match key {
        labels::NODE_POOL => format!("label {key:?} is restricted"),
        _ => "label domain \"karpenter.sh\" is restricted".to_owned(),
    })
}

fn validate_requirements(
    object: &str,
    path: &str,
    reqs: &[NodeSelectorRequirement],
    keys: Keys,
) -> Result<(), ValidationError> {
    for (i, r) in reqs.iter().enumerate() {
        let field = format!("{path}[{i}]");
        if !is_qualified_name(&r.key) {
            return Err(ValidationError::new(object, format!("{field}.key"), format!("invalid label key {:?}", r.key)));
        }
        if let Some(why) = restricted(&r.key, keys) {
            return Err(ValidationError::new(object, format!("{field}.key"), why));
        }
        match r.operator {
            Operator::In | Operator::NotIn if r.values.is_empty() => {
                return Err(ValidationError::new(
                    object,
                    format!("{field}.values"),
                    format!("operator {:?} needs at least one value", r.operator),
                ));
            }
            Operator::Exists | Operator::DoesNotExist if !r.values.is_empty() => {
                return Err(ValidationError::new(
                    object,
                    format!("{field}.values"),
                    format!("operator {:?} takes no values", r.operator),
                ));
            }
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte
                if r.values.len() != 1 || r.values[0].parse::<u64>().is_err() =>
            {
                return Err(ValidationError::new(
                    object,
                    format!("{field}.values"),
                    format!("operator {:?} needs a single non-negative integer value", r.operator),
                ));
            }
            _ => {}
        }
        if let Some(v) = r.values.iter().find(|v| !is_label_value(v)) {
            return Err(ValidationError::new(object, format!("{field}.values"), format!("invalid label value {v:?}")));
        }
        if let Some(min) = r.min_values {
            if !(1..=50).contains(&min) {
                return Err(ValidationError::new(
                    object,
                    format!("{field}.minValues"),
                    format!("must be between 1 and 50, got {min}"),
                ));
            }
            if r.operator == Operator::In && min as usize > r.values.len() {
                return Err(ValidationError::new(
                    object,
                    format!("{field}.minValues"),
                    format!("minValues {min} is larger than the {} value(s) given for {:?}", r.values.len(), r.key),
                ));
            }
        }
    }
    Ok(())
}

fn validate_taints(object: &str, path: &str, taints: &[Taint]) -> Result<(), ValidationError> {
    for (i, t) in taints.iter().enumerate() {
        if !is_qualified_name(&t.key) {
            return Err(ValidationError::new(
                object,
                format!("{path}[{i}].key"),
                format!("invalid taint key {:?}", t.key),
            ));
        }
        if !matches!(t.effect.as_str(), "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(ValidationError::new(
                object,
                format!("{path}[{i}].effect"),
                format!("invalid effect {:?}: expected NoSchedule, PreferNoSchedule or NoExecute", t.effect),
            ));
        }
    }
    Ok(())
}

/// The same key and effect twice across `taints` and `startupTaints` (values aside), as Karpenter's
/// runtime validation rejects it.
fn no_duplicate_taints(object: &str, path: &str, taints: &[Taint], startup: &[Taint]) -> Result<(), ValidationError> {
    let all = taints.iter().map(|t| ("taints", t)).chain(startup.iter().map(|t| ("startupTaints", t)));
    let mut seen: Vec<(&str, &str)> = Vec::new();
    let mut index = [0usize; 2];
    for (list, t) in all {
        let i = &mut index[usize::from(list == "startupTaints")];
        if seen.contains(&(t.key.as_str(), t.effect.as_str())) {
            return Err(ValidationError::new(
                object,
                format!("{path}.{list}[{i}]"),
                format!("duplicate taint Key/Effect pair {}:{}", t.key, t.effect),
            ));
        }
        seen.push((t.key.as_str(), t.effect.as_str()));
        *i += 1;
    }
    Ok(())
}

impl NodePool {
    /// Checks what the schema alone cannot: requirement operators and values, `minValues`, label keys,
    /// taint effects, budget percentages and cron schedules, weight and limits.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let object = format!("NodePool/{}", self.name());
        let object = object.as_str();
        let t = &self.spec.template;
        for (k, v) in &t.metadata.labels {
            let field = format!("spec.template.metadata.labels[{k:?}]");
            if !is_qualified_name(k) {
                return Err(ValidationError::new(object, field, format!("invalid label key {k:?}")));
            }
            if labels::RESTRICTED_LABELS.contains(&labels::normalize(k)) {
                return Err(ValidationError::new(object, field, format!("label {k:?} is restricted: tenon sets it")));
            }
            if let Some(why) = restricted(k, Keys::Pool) {
                return Err(ValidationError::new(object, field, why));
            }
            if !is_label_value(v) {
                return Err(ValidationError::new(object, field, format!("invalid label value {v:?}")));
            }
        }
        validate_requirements(object, "spec.template.spec.requirements", &t.spec.requirements, Keys::Pool)?;
        validate_taints(object, "spec.template.spec.taints", &t.spec.taints)?;
        validate_taints(object, "spec.template.spec.startupTaints", &t.spec.startup_taints)?;
        no_duplicate_taints(object, "spec.template.spec", &t.spec.taints, &t.spec.startup_taints)?;
        if let Some(r) = &t.spec.node_class_ref {
            for (field, v) in [("group", &r.group), ("kind", &r.kind), ("name", &r.name)] {
                if v.is_empty() {
                    return Err(ValidationError::new(
                        object,
                        format!("spec.template.spec.nodeClassRef.{field}"),
                        "must not be empty",
                    ));
                }
            }
        }
        for (i, b) in self.spec.disruption.budgets.iter().enumerate() {
            let field = format!("spec.disruption.budgets[{i}]");
            b.nodes.parse::<BudgetNodes>().map_err(|e| ValidationError::new(object, format!("{field}.nodes"), e))?;
            match (&b.schedule, &b.duration) {
                (Some(s), Some(_)) => {
                    parse_schedule(s).map_err(|e| ValidationError::new(object, format!("{field}.schedule"), e))?;
                }
                (Some(_), None) => {
                    return Err(ValidationError::new(
                        object,
                        format!("{field}.duration"),
                        "a schedule needs a duration",
                    ));
                }
                (None, Some(_)) => {
                    return Err(ValidationError::new(
                        object,
                        format!("{field}.schedule"),
                        "a duration needs a schedule",
                    ));
                }
                (None, None) => {}
            }
        }
        if let Some(w) = self.spec.weight
            && !(1..=100).contains(&w)
        {
            return Err(ValidationError::new(object, "spec.weight", format!("must be between 1 and 100, got {w}")));
        }
        for (k, q) in &self.spec.limits {
            if k != "nodes" {
                Resources::parse_quantity(k, &q.0)
                    .map_err(|e| ValidationError::new(object, format!("spec.limits[{k:?}]"), e.to_string()))?;
            } else if q.0.parse::<u64>().is_err() {
                return Err(ValidationError::new(
                    object,
                    "spec.limits[\"nodes\"]",
                    format!("invalid node count {:?}", q.0),
                ));
            }
        }
        if let Some(timeout) = self.annotation(labels::NODECLAIM_REGISTRATION_TIMEOUT) {
            super::duration::parse_duration(timeout).map_err(|e| {
                ValidationError::new(
                    object,
                    format!("metadata.annotations[{:?}]", labels::NODECLAIM_REGISTRATION_TIMEOUT),
                    e,
                )
            })?;
        }
        if let Some(policy) = self.packing_policy()
            && !matches!(policy, "binpack" | "marginal-cost")
        {
            return Err(ValidationError::new(
                object,
                format!("metadata.annotations[{:?}]", labels::NODECLAIM_PACKING_POLICY),
                format!("unknown packing policy {policy:?}: expected \"binpack\" or \"marginal-cost\""),
            ));
        }
        Ok(())
    }
}

impl NodeClaim {
    /// Checks the claim's requirements, taints and resource requests.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let object = format!("NodeClaim/{}", self.name());
        validate_requirements(&object, "spec.requirements", &self.spec.requirements, Keys::Claim)?;
        validate_taints(&object, "spec.taints", &self.spec.taints)?;
        validate_taints(&object, "spec.startupTaints", &self.spec.startup_taints)?;
        no_duplicate_taints(&object, "spec", &self.spec.taints, &self.spec.startup_taints)?;
        Resources::from_resource_list(&self.spec.resources.requests)
            .map_err(|e| ValidationError::new(&object, "spec.resources.requests", e.to_string()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_syntax() {
        assert!(is_qualified_name("karpenter.k8s.aws/instance-family"));
        assert!(is_qualified_name("team"));
        assert!(!is_qualified_name("Bad_Prefix/x"));
        assert!(!is_qualified_name("a/"));
        assert!(is_label_value("us-east-1a"));
        assert!(!is_label_value("-x"));
    }

    fn pool(spec: serde_json::Value) -> NodePool {
        let mut v = serde_json::json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
            "spec": {"template": {"spec": {"requirements": []}}}});
        crate::testing::merge(&mut v, serde_json::json!({"spec": spec}));
        serde_json::from_value(v).unwrap()
    }

    fn error(p: &NodePool) -> String {
        p.validate().map(|()| String::new()).unwrap_or_else(|e| e.to_string())
    }

    /// The rules of Karpenter's CRDs and runtime validation that tenon checks itself.
    #[test]
    fn karpenter_crd_rules() {
        let labels = |k: &str| pool(serde_json::json!({"template": {"metadata": {"labels": {k: "x"}}}}));
        assert!(error(&labels("karpenter.sh/team")).contains("label domain \"karpenter.sh\" is restricted"));
        assert!(error(&labels("sub.karpenter.sh/team")).contains("label domain \"karpenter.sh\" is restricted"));
        assert!(error(&labels("karpenter.sh/nodepool")).contains("restricted"));
        assert_eq!(error(&labels("karpenter.sh/capacity-type")), "");
        assert_eq!(error(&labels("kubernetes.io/team")), "", "only the hostname is restricted there");
        let req = |key: &str, op: &str, values: serde_json::Value| {
            pool(
                serde_json::json!({"template": {"spec": {"requirements": [{"key": key, "operator": op, "values": values}]}}}),
            )
        };
        let e = error(&req("karpenter.sh/nodepool", "In", serde_json::json!(["a"])));
        assert!(e.contains("spec.template.spec.requirements[0].key") && e.contains("restricted"), "{e}");
        assert!(error(&req("karpenter.sh/unknown", "Exists", serde_json::json!([]))).contains("label domain"));
        assert!(error(&req("example.com/gen", "Gt", serde_json::json!(["-1"]))).contains("non-negative integer"));
        assert_eq!(error(&req("example.com/gen", "Gt", serde_json::json!(["0"]))), "");
        // A claim may carry its pool, which tenon writes.
        let mut claim = NodeClaim::new("c", Default::default());
        claim.spec.requirements = vec![NodeSelectorRequirement::new(labels::NODE_POOL, Operator::In, ["p"])];
        assert!(claim.validate().is_ok());
        claim.spec.requirements = vec![NodeSelectorRequirement::new("karpenter.sh/other", Operator::In, ["p"])];
        assert!(claim.validate().is_err());
        // One key and effect twice across taints and startup taints, values aside.
        let taints = pool(serde_json::json!({"template": {"spec": {
            "taints": [{"key": "gpu", "value": "a", "effect": "NoSchedule"}],
            "startupTaints": [{"key": "ready", "effect": "NoSchedule"}, {"key": "gpu", "value": "b", "effect": "NoSchedule"}]}}}));
        let e = error(&taints);
        assert!(
            e.contains("spec.template.spec.startupTaints[1]")
                && e.contains("duplicate taint Key/Effect pair gpu:NoSchedule"),
            "{e}"
        );
        // Cron macros, as Karpenter's schema and parser accept them.
        for schedule in ["@midnight", "@daily", "@hourly", "@weekly", "@monthly", "@yearly", "@annually"] {
            let p = pool(
                serde_json::json!({"disruption": {"budgets": [{"nodes": "0", "schedule": schedule, "duration": "10m"}]}}),
            );
            assert_eq!(error(&p), "", "{schedule}");
        }
        let midnight = pool(
            serde_json::json!({"disruption": {"budgets": [{"nodes": "0", "schedule": "@midnight", "duration": "10m"}]}}),
        );
        let b = &midnight.spec.disruption.budgets[0];
        assert_eq!(b.is_active("2026-03-04T00:05:00Z".parse().unwrap()), Ok(true));
        assert_eq!(b.is_active("2026-03-04T00:15:00Z".parse().unwrap()), Ok(false));
    }
}
