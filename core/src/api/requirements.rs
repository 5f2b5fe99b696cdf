//! Node selector requirements as they appear in NodePools and NodeClaims.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A requirement operator: Kubernetes' six plus Karpenter's inclusive `Gte` and `Lte`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub enum Operator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label's integer value is greater than the one value.
    Gt,
    /// The label's integer value is less than the one value.
    Lt,
    /// The label's integer value is at least the one value.
    Gte,
    /// The label's integer value is at most the one value.
    Lte,
}

/// One requirement: `key operator values`, with Karpenter's optional `minValues` flexibility floor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirement {
    /// The label key.
    pub key: String,
    /// How the label relates to `values`.
    pub operator: Operator,
    /// The values the operator compares against.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// The minimum number of distinct values of `key` a launch must keep open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_values: Option<i32>,
}

impl NodeSelectorRequirement {
    /// A requirement without `minValues`.
    pub fn new(
        key: impl Into<String>,
        operator: Operator,
        values: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self { key: key.into(), operator, values: values.into_iter().map(Into::into).collect(), min_values: None }
    }

    /// Whether a node whose label `key` has `value` (`None`: the label is absent) satisfies this requirement.
    pub fn matches(&self, value: Option<&str>) -> bool {
        let bound = || self.values.first().and_then(|v| v.parse::<i64>().ok());
        let number = || value.and_then(|v| v.parse::<i64>().ok());
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.iter().any(|x| x == v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt => matches!((number(), bound()), (Some(n), Some(b)) if n > b),
            Operator::Lt => matches!((number(), bound()), (Some(n), Some(b)) if n < b),
            Operator::Gte => matches!((number(), bound()), (Some(n), Some(b)) if n >= b),
            Operator::Lte => matches!((number(), bound()), (Some(n), Some(b)) if n <= b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_match_single_values() {
        let r = |op, vals: &[&str]| NodeSelectorRequirement::new("k", op, vals.iter().copied());
        assert!(r(Operator::In, &["a", "b"]).matches(Some("b")));
        assert!(!r(Operator::In, &["a"]).matches(None));
        assert!(r(Operator::NotIn, &["a"]).matches(None));
        assert!(!r(Operator::NotIn, &["a"]).matches(Some("a")));
        assert!(r(Operator::Exists, &[]).matches(Some("")));
        assert!(r(Operator::DoesNotExist, &[]).matches(None));
        assert!(r(Operator::Gt, &["2"]).matches(Some("3")));
        assert!(!r(Operator::Gt, &["2"]).matches(Some("2")));
        assert!(r(Operator::Gte, &["2"]).matches(Some("2")));
        assert!(r(Operator::Lt, &["2"]).matches(Some("1")));
        assert!(r(Operator::Lte, &["2"]).matches(Some("2")));
        assert!(!r(Operator::Lte, &["2"]).matches(Some("x")));
    }
}
