//! Scheduling simulation: where pods land, and what must be bought for the ones that land nowhere.
//!
//! Provisioning runs it forwards over pending pods; consolidation runs it backwards over the pods of
//! candidate nodes. Kubernetes objects are converted once at the edge ([`PodInfo`], [`Requirements`]);
//! the [`Scheduler`] then places pods on existing nodes, then on claims already opened in the pass, then
//! on new claims from NodePools by weight.

mod daemon;
mod nodes;
mod pod;
mod requirements;
mod scheduler;
pub mod taints;
mod topology;
mod volumes;
pub mod workload;

pub use daemon::{DaemonPod, MAX_REALIZATIONS, daemon_overhead};
pub(crate) use pod::SelectionClasses;
pub use pod::{
    Constraints, HostPort, PodError, PodInfo, Relaxation, Selector, TopologyKind, TopologyTerm, pod_requests,
};
pub use requirements::{Incompatible, Requirement, Requirements};
pub use scheduler::{
    ClaimPlan, ExistingNode, Launch, NodePlacement, Packing, PodGroups, PoolInput, Results, Scheduler,
    SchedulerOptions, StopAt, Stopped, Unschedulable, VolumeRoom, allowed_types, offering_ok, template_requirements,
};
pub use topology::BoundOnNode;
pub use volumes::{VolumeError, VolumePlacement, volume_placement};

#[cfg(test)]
mod tests;
