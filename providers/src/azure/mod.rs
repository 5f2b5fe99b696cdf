//! The Azure provider: VMs for AKS (and self-managed Kubernetes on Azure), compatible with
//! karpenter-provider-azure.
//!
//! - [`AKSNodeClass`] (`karpenter.azure.com/v1beta1`), with that provider's field names and validation;
//! - [`catalog`]: VM sizes from Resource SKUs as instance types, with GPUs, zones net of restrictions,
//!   the `karpenter.azure.com/sku-*` labels and AKS's reservations;
//! - [`pricing`]: the Retail Prices API, with the bundled on-demand table as the fallback;
//! - [`images`]: AKS's node images in its community galleries;
//! - [`bootstrap`]: the custom data nodes join with;
//! - [`AzureProvider`]: launches (a NIC, then the VM), list, get, delete, drift, repair and
//!   interruptions ([`interruption`]), with ARM's errors classified in [`errors`].
//!
//! # Why a client of its own
//!
//! Resource Manager is called through [`arm`], a small typed client on `reqwest`, with tokens from
//! `azure_identity` 1.x ([`identity`]), rather than through `azure_mgmt_compute`. That crate's 0.21 is the
//! last release of the unofficial generated line and is frozen on `azure_core` 0.21, whose identity
//! crates are no longer maintained; the official `azure_core` / `azure_identity` 1.x have no compute or
//! network management client yet. The provider needs eight ARM operations (Resource SKUs, community
//! gallery image versions, NIC and VM create/get/delete, VM list and restart, disk delete) and ARM's
//! long-running-operation protocol; a client of its own for those keeps the dependency tree current and
//! small, shares `reqwest` and `rustls` with the rest of tenon, and lets the credential chain be the
//! supported one. Request and answer shapes are checked in the tests against Microsoft's published
//! models (PyPI's `azure-mgmt-compute` and `azure-mgmt-network`), see `providers/tests/azure/fake.rs`.

pub mod arm;
pub mod bootstrap;
pub mod catalog;
pub mod errors;
pub mod identity;
pub mod images;
pub mod interruption;
pub mod nodeclass;
pub mod pricing;
mod provider;
pub mod status;

pub use nodeclass::{AKSNodeClass, AKSNodeClassSpec, AKSNodeClassStatus};
pub use provider::{
    AzureProvider, AzureSettings, DISKS_API, GALLERY_API, NAME, NIC_API, SKUS_API, TAG_BILLING, TAG_CLUSTER, TAG_HASH,
    TAG_NODE_CLAIM, TAG_NODE_CLASS, TAG_NODE_POOL, VM_API, parse_subnet_id, parse_version, provider_id, vm_name,
};
