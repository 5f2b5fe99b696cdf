//! The Karpenter-compatible API: `karpenter.sh/v1` `NodePool` and `NodeClaim`.
//!
//! The types serialize exactly as Karpenter's CRDs do, so existing manifests apply unchanged. Parsing a
//! manifest goes through [`parse_node_pool`] / [`parse_node_claim`], which name the field that failed, and
//! [`NodePool::validate`] checks what the schema alone cannot (cron schedules, percentages, `minValues`).

mod conditions;
mod duration;
pub mod labels;
mod nodeclaim;
mod nodepool;
mod requirements;
mod validation;

pub use conditions::{Condition, ConditionStatus, condition_types, set as set_condition};
pub use duration::{KubeDuration, NillableDuration, format_duration, parse_duration, parse_go_duration};
pub use nodeclaim::{NodeClaim, NodeClaimResources, NodeClaimSpec, NodeClaimStatus};
pub use nodepool::{
    Budget, BudgetNodes, ConsolidationPolicy, Disruption, DisruptionReason, NodeClaimTemplate, NodeClaimTemplateSpec,
    NodeClassRef, NodePool, NodePoolSpec, NodePoolStatus, TEMPLATE_HASH_VERSION, TemplateMetadata, parse_schedule,
    stable_hash, template_drifted_from,
};
pub use requirements::{NodeSelectorRequirement, Operator};
pub use validation::{ValidationError, parse_manifest, parse_node_claim, parse_node_pool};

/// The API group of `NodePool` and `NodeClaim`.
pub const GROUP: &str = "karpenter.sh";
/// The API version of `NodePool` and `NodeClaim`.
pub const VERSION: &str = "v1";

/// The CustomResourceDefinitions of NodePool and NodeClaim, as one multi-document YAML string.
pub fn crds_yaml() -> Result<String, serde_yaml_ng::Error> {
    use kube::CustomResourceExt;
    let docs =
        [NodePool::crd(), NodeClaim::crd()].iter().map(serde_yaml_ng::to_string).collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn crds_describe_both_kinds_in_the_karpenter_group() {
        let yaml = super::crds_yaml().unwrap();
        let docs: Vec<serde_json::Value> = yaml.split("---\n").map(|d| serde_yaml_ng::from_str(d).unwrap()).collect();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["metadata"]["name"], "nodepools.karpenter.sh");
        assert_eq!(docs[1]["metadata"]["name"], "nodeclaims.karpenter.sh");
        for d in &docs {
            assert_eq!(d["spec"]["scope"], "Cluster");
            assert_eq!(d["spec"]["versions"][0]["name"], "v1");
            assert_eq!(d["spec"]["versions"][0]["subresources"]["status"], serde_json::json!({}));
        }
        let disruption = &docs[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["disruption"];
        assert!(disruption["properties"]["consolidationPolicy"]["enum"].as_array().unwrap().len() == 3, "{disruption}");
    }
}
