//! # tenon-providers
//!
//! tenon's cloud providers, each behind a cargo feature so a binary carries only the SDKs it needs:
//!
//! - `aws`: EC2 through `aws-sdk-ec2` (`EC2NodeClass`, group `karpenter.k8s.aws`);
//! - `gcp`: Compute Engine;
//! - `azure`: Azure Virtual Machines.
//!
//! Each provider implements [`tenon_core::cloud::CloudProvider`] and passes the core's conformance suite
//! in its own tests. `gcp` and `azure` are placeholders until those providers land: enabling one builds,
//! and adds nothing yet.
#![warn(missing_docs)]

#[cfg(feature = "aws")]
pub mod aws;

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
