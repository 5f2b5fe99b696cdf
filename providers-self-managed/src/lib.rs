//! # tenon-self-managed
//!
//! tenon's provider for owned bare-metal GPU machines: an inventory of hosts whose Redfish BMCs power them
//! on when pods wait and off when the fleet shrinks, offered to the scheduler as counted `reserved`
//! capacity, with a cloud burst under a lease when the owned fleet is full.
//!
//! The provider lands with its own issue; this crate reserves its place in the workspace.
#![warn(missing_docs)]

/// The NodeClass kind this provider will serve.
pub const NODE_CLASS_KIND: (&str, &str) = ("tenon.dev", "SelfManagedNodeClass");
