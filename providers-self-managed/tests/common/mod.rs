//! What the self-managed provider's test files share: claims on a SelfManagedNodeClass.

use tenon_core::api::{NodeClaim, NodeClaimSpec, NodeClaimStatus, NodeClassRef};
use tenon_self_managed::inventory::{GROUP, KIND};

/// A reference to the SelfManagedNodeClass `class`.
pub(crate) fn class_ref(class: &str) -> NodeClassRef {
    NodeClassRef { group: GROUP.into(), kind: KIND.into(), name: class.into() }
}

/// An unlaunched claim `name` on `class`, with a UID of its own.
pub(crate) fn claim(class: &str, name: &str) -> NodeClaim {
    let mut c = NodeClaim::new(name, NodeClaimSpec { node_class_ref: Some(class_ref(class)), ..Default::default() });
    c.metadata.uid = Some(format!("uid-{class}-{name}"));
    c
}

/// `c` as launched onto the instance `pid`.
pub(crate) fn launched(mut c: NodeClaim, pid: &str) -> NodeClaim {
    c.status = Some(NodeClaimStatus { provider_id: Some(pid.to_owned()), ..Default::default() });
    c
}
