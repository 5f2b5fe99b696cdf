//! The GCP provider: Compute Engine instances for GKE (and self-managed Kubernetes on GCE), compatible
//! with the community Karpenter provider for GCP.
//!
//! What is here so far:
//! - [`GCENodeClass`] (`karpenter.k8s.gcp/v1alpha1`), with that provider's field names and validation;
//! - [`catalog`]: machine types as instance types, with GPUs counted from their accelerators, the
//!   `karpenter.k8s.gcp/*` labels and GKE's allocatable formulas;
//! - [`pricing`]: the bundled on-demand and spot price table.
//!
//! The Compute Engine client (launch, list, delete, drift, interruption) builds on these.

pub mod catalog;
pub mod nodeclass;
pub mod pricing;

pub use nodeclass::{GCENodeClass, GCENodeClassSpec, GCENodeClassStatus};
