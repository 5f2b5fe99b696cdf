//! Taints and tolerations, matched the way kube-scheduler matches them.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// Whether `toleration` tolerates `taint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
    if !effect_ok {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    let op = toleration.operator.as_deref().unwrap_or("Equal");
    if key.is_empty() {
        // An empty key with Exists tolerates every taint.
        return op == "Exists";
    }
    if key != taint.key {
        return false;
    }
    match op {
        "Exists" => true,
        _ => toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
    }
}

/// The first taint of `taints` that `tolerations` do not tolerate, ignoring `PreferNoSchedule` taints
/// when `ignore_prefer_no_schedule` is set.
pub fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    ignore_prefer_no_schedule: bool,
) -> Option<&'a Taint> {
    taints.iter().find(|t| {
        !(ignore_prefer_no_schedule && t.effect == "PreferNoSchedule"
            || tolerations.iter().any(|tol| tolerates(tol, t)))
    })
}

/// A taint from its parts.
pub fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint { key: key.to_owned(), value: value.map(str::to_owned), effect: effect.to_owned(), time_added: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tol(key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>) -> Toleration {
        Toleration {
            key: key.map(Into::into),
            operator: Some(op.into()),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        }
    }

    #[test]
    fn matching_rules() {
        let gpu = taint("nvidia.com/gpu", Some("true"), "NoSchedule");
        assert!(tolerates(&tol(Some("nvidia.com/gpu"), "Exists", None, None), &gpu));
        assert!(tolerates(&tol(Some("nvidia.com/gpu"), "Equal", Some("true"), Some("NoSchedule")), &gpu));
        assert!(!tolerates(&tol(Some("nvidia.com/gpu"), "Equal", Some("false"), None), &gpu));
        assert!(!tolerates(&tol(Some("nvidia.com/gpu"), "Exists", None, Some("NoExecute")), &gpu));
        assert!(tolerates(&tol(None, "Exists", None, None), &gpu), "empty key + Exists tolerates everything");
        assert!(!tolerates(&tol(Some("other"), "Exists", None, None), &gpu));
    }

    #[test]
    fn prefer_no_schedule_can_be_relaxed() {
        let taints = [taint("a", None, "PreferNoSchedule"), taint("b", None, "NoExecute")];
        assert_eq!(untolerated(&taints, &[], false).map(|t| t.key.as_str()), Some("a"));
        assert_eq!(untolerated(&taints, &[], true).map(|t| t.key.as_str()), Some("b"));
        assert!(untolerated(&taints, &[tol(Some("b"), "Exists", None, None)], true).is_none());
    }
}
