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

pub use conditions::{Condition, ConditionStatus, condition_types};
pub use duration::{KubeDuration, NillableDuration, format_duration, parse_duration};
pub use nodeclaim::{NodeClaim, NodeClaimResources, NodeClaimSpec, NodeClaimStatus};
pub use nodepool::{
    Budget, BudgetNodes, ConsolidationPolicy, Disruption, DisruptionReason, NodeClaimTemplate, NodeClaimTemplateSpec, NodeClassRef,
    NodePool, NodePoolSpec, NodePoolStatus, TemplateMetadata, parse_schedule,
};
pub use requirements::{NodeSelectorRequirement, Operator};
pub use validation::{ValidationError, parse_node_claim, parse_node_pool};

/// The API group of `NodePool` and `NodeClaim`.
pub const GROUP: &str = "karpenter.sh";
/// The API version of `NodePool` and `NodeClaim`.
pub const VERSION: &str = "v1";
