//! # tenon-self-managed
//!
//! tenon's provider for owned bare-metal GPU machines. An inventory of hosts (a [`SelfManagedNodeClass`])
//! is offered to the scheduler as counted `reserved` capacity, one offering per machine class and topology
//! domain. Machines are powered on when pods wait and off when the fleet shrinks, through their Redfish
//! BMCs; when the owned fleet is full, claims burst into a cloud provider under a lease, and the lease path
//! reclaims the cloud node once an owned machine frees up.
//!
//! - [`inventory`]: the NodeClass and its machines, parsed from YAML with errors naming the field.
//! - [`SelfManagedProvider`]: the state machine behind [`tenon_core::cloud::CloudProvider`]; its inventory
//!   can be replaced while it runs ([`SelfManagedProvider::reload`]).
//! - [`Bmc`]: the seam to the machines' BMCs: [`RedfishClient`] over HTTP(S), [`InMemoryBmc`] for
//!   virtual-time tests.
#![warn(missing_docs)]

mod bmc;
pub mod inventory;
mod provider;
mod redfish;

pub use bmc::{Bmc, BmcError, BmcErrorKind, BmcTarget, InMemoryBmc, PowerState, ResetType};
pub use inventory::{SelfManagedNodeClass, SelfManagedNodeClassSpec, parse_node_class};
pub use provider::{
    Adopted, BURST_LEASE_REASON, Credentials, MachinePhase, MachineStatus, PROVIDER_ID_SCHEME, PROVIDER_NAME, Reloaded,
    SelfManagedProvider, SelfManagedProviderBuilder, provider_id,
};
pub use redfish::{DEFAULT_REQUEST_TIMEOUT, RedfishClient};

/// The NodeClass kind this provider serves: (group, kind).
pub const NODE_CLASS_KIND: (&str, &str) = (inventory::GROUP, inventory::KIND);
