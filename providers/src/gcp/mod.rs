//! The GCP provider: Compute Engine instances for GKE (and self-managed Kubernetes on GCE), compatible
//! with the community Karpenter provider for GCP.
//!
//! - [`GCENodeClass`] (`karpenter.k8s.gcp/v1alpha1`), with that provider's field names and validation;
//! - [`catalog`]: machine types as instance types, with GPUs counted from their accelerators, the
//!   `karpenter.k8s.gcp/*` labels and GKE's allocatable formulas;
//! - [`pricing`]: the bundled on-demand and spot price table;
//! - [`GcpProvider`]: launches (`instances.insert`, its zone operation polled), list, get, delete, drift
//!   and spot preemption, with every error code classified in [`errors`].
//!
//! - [`bootstrap`]: the GKE node bootstrap, copied from a node pool's instance template.
//!
//! - [`images`]: what the class's image terms resolve to (GKE's node images by family and version).

pub mod bootstrap;
pub mod catalog;
pub mod errors;
pub mod images;
pub mod nodeclass;
pub mod pricing;
mod provider;
pub mod status;

pub use nodeclass::{GCENodeClass, GCENodeClassSpec, GCENodeClassStatus};
pub use provider::{
    GcpProvider, GcpSettings, LABEL_CLUSTER, LABEL_HASH, LABEL_LOCATION, LABEL_NODE_CLAIM, LABEL_NODE_CLASS,
    LABEL_NODE_POOL, NAME, label_value, parse_provider_id, provider_id, region_of, shape_of,
};
