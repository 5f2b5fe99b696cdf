//! # tenon-providers
//!
//! tenon's cloud providers, each behind a cargo feature so a binary carries only the SDKs it needs:
//!
//! - `aws`: EC2 through `aws-sdk-ec2` (`EC2NodeClass`, group `karpenter.k8s.aws`);
//! - `gcp`: Compute Engine through `google-cloud-compute-v1` (`GCENodeClass`, group `karpenter.k8s.gcp`),
//!   (docs/gcp.md);
//! - `azure`: Azure VMs through Resource Manager (`AKSNodeClass`, group `karpenter.azure.com`).
//!
//! Each provider implements [`tenon_core::cloud::CloudProvider`] and passes the core's conformance suite
//! in its own tests. [`kubelet`] is the kubelet configuration the AWS and GCP NodeClasses share.
#![warn(missing_docs)]

#[cfg(any(feature = "aws", feature = "gcp"))]
pub mod alias;
#[cfg(feature = "aws")]
pub mod aws;
#[cfg(feature = "azure")]
pub mod azure;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub mod classes;
#[cfg(feature = "gcp")]
pub mod gcp;
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
pub mod kubelet;

/// The providers compiled into this build, by name.
pub fn enabled() -> Vec<&'static str> {
    let mut names = Vec::new();
    if cfg!(feature = "aws") {
        names.push("aws");
    }
    if cfg!(feature = "gcp") {
        names.push("gcp");
    }
    if cfg!(feature = "azure") {
        names.push("azure");
    }
    names
}
