//! # tenon-core
//!
//! The cloud-agnostic core of tenon, a Kubernetes node autoscaler that speaks Karpenter's `karpenter.sh/v1`
//! API. This crate holds everything that does not depend on a particular cloud:
//!
//! - [`api`]: the `NodePool` and `NodeClaim` custom resources, their validation, durations and disruption
//!   budgets, and the well-known `karpenter.sh/*` keys;
//! - [`cloud`]: the [`cloud::CloudProvider`] trait every provider implements, its data model
//!   ([`cloud::InstanceType`], [`cloud::Offering`], [`cloud::Instance`], [`cloud::Lease`]), the one error enum
//!   the core matches on ([`cloud::CloudError`]), the [`cloud::ProviderRegistry`] that routes NodePools to
//!   providers, the unavailable-offerings cache, the in-memory [`cloud::fake::FakeCloud`] and (behind the
//!   `conformance` feature) the public conformance suite;
//! - [`scheduling`]: the scheduling simulation (requirements algebra, taints, topology, DaemonSet
//!   overhead, packing) shared by provisioning and consolidation;
//! - [`resources`]: compact resource vectors (millicores, bytes, pods and extended resources);
//! - [`cluster`]: the one port between the controllers and Kubernetes: a consistent [`cluster::Snapshot`]
//!   to read, async fallible writes ([`cluster::Cluster`]), and an API server in memory
//!   ([`cluster::InMemoryApi`]) with resourceVersions, finalizers and injectable faults;
//! - [`runtime`]: the controller loop shared by `tenon run` and `tenon simulate`: which controller runs
//!   when, on a clock, and what a restarted process rebuilds;
//! - [`clock`]: the clock every controller takes, real or virtual;
//! - [`sim`]: the simulated world (kube-scheduler, kubelets, DaemonSets, workloads) that drives the
//!   runtime in virtual time;
//! - [`settings`]: the operator's settings, layered defaults < file < environment < flags.
//! - [`state`]: the cluster mirror every decision reads;
//! - [`disruption`]: the disruption ladder (emptiness, drift, multi- and single-node consolidation) and
//!   its command queue;
//! - [`lifecycle`]: a claim's life (launch, registration, initialization, timeouts, leases) and garbage
//!   collection;
//! - [`repair`]: node auto repair (reboot or replace unhealthy nodes);
//! - [`termination`]: draining nodes that are going away;
//! - [`provisioning`]: pending pods into NodeClaims (batching, one scheduling pass, nominations);
//! - [`snapshot`]: cluster snapshots (Kubernetes objects and instance catalogs) read from YAML files.
//!
//! ## Cargo features
//!
//! - `conformance`: exposes `cloud::conformance`, the checks a provider crate runs from its own tests.
#![warn(missing_docs)]

pub mod api;
pub mod clock;
pub mod cloud;
pub mod cluster;
pub mod disruption;
pub mod lifecycle;
pub mod provisioning;
pub mod repair;
pub mod resources;
pub mod runtime;
pub mod scheduling;
pub mod settings;
pub mod sim;
pub mod snapshot;
pub mod state;
pub mod termination;

#[cfg(test)]
mod testing;
