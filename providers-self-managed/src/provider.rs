//! [`SelfManagedProvider`]: the inventory's state machine behind tenon's [`CloudProvider`] trait.
//!
//! Each machine is `Free`, held by one claim (`Launching` → `Running` → `Stopping`), or `Quarantined`.
//! Calls never wait for a machine: `create` claims a machine and sends one power action, and later `get`,
//! `list` and `delete` calls read the BMC's power state and move the machine on, measuring every deadline
//! (boot budget, graceful → forced power-off) on tenon's clock.
//!
//! The inventory is live: [`SelfManagedProvider::reload`] replaces the machines, the NodeClasses'
//! policies and the BMC credentials. A held machine keeps its spec until its claim releases it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{StreamExt, stream};
use jiff::Timestamp;
use tenon_core::api::{NodeClaim, NodeClassRef, NodePool, NodeSelectorRequirement, labels};
use tenon_core::clock::{self, SharedClock, SystemClock};
use tenon_core::cloud::{
    CapacityType, CloudError, CloudProvider, DriftReason, DynCloudProvider, Instance, InstanceState, InstanceType,
    LaunchOptions, Lease, NodeClassKind, Offering, OfferingKey, ProviderDescriptor, RepairPolicy,
    default_repair_policies,
};
use tenon_core::lifecycle::{LEASE_EXPIRES_AT, LEASE_REASON};
use tenon_core::resources::Resources;

use crate::bmc::{Bmc, BmcError, BmcErrorKind, BmcTarget, PowerState, ResetType};
use crate::inventory::{
    self, GPU_COUNT_LABEL, GPU_MODEL_LABEL, GROUP, InventoryError, KIND, Machine, Policy, SelfManagedNodeClass,
};

/// The provider's name.
pub const PROVIDER_NAME: &str = "self-managed";
/// The scheme of the provider ids of owned machines: `self-managed://<node class>/<machine>`.
pub const PROVIDER_ID_SCHEME: &str = "self-managed://";

/// How many BMCs [`SelfManagedProvider`]'s `list` reads at once.
const CONCURRENT_BMC_READS: usize = 16;

/// The lease reason of a burst node.
pub const BURST_LEASE_REASON: &str = "owned fleet full";

/// What [`SelfManagedProvider::adopt`] took back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Owned machines held again by their claims.
    pub machines: usize,
    /// Burst instances known again, with their leases.
    pub burst: usize,
}

/// A machine's phase, as [`SelfManagedProvider::machines`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachinePhase {
    /// Off and in the pool.
    Free,
    /// Powering on for a claim.
    Launching,
    /// On, serving a claim.
    Running,
    /// Powering off after its claim was deleted.
    Stopping,
    /// Out of the pool until an operator releases it.
    Quarantined {
        /// Why.
        reason: String,
    },
}

/// One machine's state, for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineStatus {
    /// The NodeClass.
    pub node_class: String,
    /// The machine.
    pub name: String,
    /// The topology domain.
    pub domain: String,
    /// The phase.
    pub phase: MachinePhase,
    /// The claim holding it, if any.
    pub claim: Option<String>,
    /// Failures counted against it.
    pub failures: u32,
    /// The provider id it has while held.
    pub provider_id: String,
}

/// Basic-auth credentials for BMCs, by the name machines refer to them with.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password.
    pub password: String,
}

impl Credentials {
    /// Credentials logging in as `username` with `password`.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self { username: username.into(), password: password.into() }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

/// What [`SelfManagedProvider::reload`] changed. Machines are named by their inventory name, in
/// inventory order (removed ones in the order the provider had them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Machines new to the inventory; they joined the pool free.
    pub added: Vec<String>,
    /// Free or quarantined machines no longer in the inventory; they were dropped.
    pub removed: Vec<String>,
    /// Free or quarantined machines whose spec changed; the new spec applies now (a quarantined machine
    /// stays quarantined).
    pub updated: Vec<String>,
    /// Machines held by a claim whose pending change this reload set or altered: a new spec, a removal,
    /// or a return to the spec they run with. It takes effect when the claim releases the machine.
    pub deferred: Vec<String>,
    /// NodeClasses added, removed, or whose policies (timeouts, failures, PXE, reimage, burst) changed.
    pub node_classes: Vec<String>,
    /// Names of BMC credentials added, removed or changed.
    pub credentials: Vec<String>,
}

impl Reloaded {
    /// Whether the reload changed nothing.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.updated.is_empty()
            && self.deferred.is_empty()
            && self.node_classes.is_empty()
            && self.credentials.is_empty()
    }
}

/// A one-line summary, e.g. `added: m5; deferred until release: m2`; `no change` when empty.
impl fmt::Display for Reloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            ("added", &self.added),
            ("removed", &self.removed),
            ("updated", &self.updated),
            ("deferred until release", &self.deferred),
            ("NodeClasses changed", &self.node_classes),
            ("credentials changed", &self.credentials),
        ];
        let mut first = true;
        for (what, names) in parts.into_iter().filter(|(_, names)| !names.is_empty()) {
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(f, "{what}: {}", names.join(", "))?;
        }
        if first {
            f.write_str("no change")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Power {
    /// A power-on (or restart) was requested at this time.
    Starting {
        requested_at: Timestamp,
    },
    Running,
    Stopping {
        since: Timestamp,
        starting_since: Option<Timestamp>,
        graceful_sent: Option<Timestamp>,
        forced: Option<Timestamp>,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct Hold {
    uid: String,
    claim: String,
    node_pool: Option<String>,
    launched_at: Timestamp,
    power: Power,
    /// The credentials the machine logged in with when a reload stopped giving them; it keeps using them
    /// until released.
    kept_credentials: Option<Credentials>,
}

impl Hold {
    fn new(claim: &NodeClaim, launched_at: Timestamp, power: Power) -> Self {
        Self {
            uid: claim_uid(claim),
            claim: claim.name().to_owned(),
            node_pool: claim.node_pool().map(str::to_owned),
            launched_at,
            power,
            kept_credentials: None,
        }
    }
}

/// What identifies a claim across retries of its launch: its UID, or its name when it has none.
fn claim_uid(claim: &NodeClaim) -> String {
    claim.metadata.uid.clone().unwrap_or_else(|| claim.name().to_owned())
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Free,
    Held(Hold),
    Quarantined(String),
}

/// What happens to a held machine when its claim releases it, after a reload changed it.
#[derive(Debug, Clone, PartialEq)]
enum Pending {
    /// It takes this spec.
    Spec(Box<Machine>),
    /// It is dropped: it is no longer in the inventory.
    Removal,
}

#[derive(Debug)]
struct Slot {
    machine: Machine,
    phase: Phase,
    failures: u32,
    quarantine_on_release: bool,
    /// Set only while the machine is held.
    pending: Option<Pending>,
}

impl Slot {
    fn free(machine: Machine) -> Self {
        Self { machine, phase: Phase::Free, failures: 0, quarantine_on_release: false, pending: None }
    }

    /// The spec the machine has once its claim releases it; `None` when it is then dropped.
    fn returns_as(&self) -> Option<&Machine> {
        match &self.pending {
            None => Some(&self.machine),
            Some(Pending::Spec(m)) => Some(m),
            Some(Pending::Removal) => None,
        }
    }

    /// Whether the machine is held and powering off, and returns to the pool in the same offering.
    fn coming_back(&self) -> bool {
        let offering = |m: &Machine| (m.node_class.clone(), m.class.clone(), m.domain.clone());
        matches!(&self.phase, Phase::Held(h) if matches!(h.power, Power::Stopping { .. }))
            && self.returns_as().is_some_and(|m| offering(m) == offering(&self.machine))
    }
}

#[derive(Debug, Clone)]
struct BurstHold {
    uid: String,
    node_class: String,
    lease: Lease,
}

#[derive(Debug, Default)]
struct State {
    slots: Vec<Slot>,
    burst: HashMap<String, BurstHold>,
}

impl State {
    /// The slot of the machine named `machine`. Slots move when the inventory is reloaded, so a call
    /// that let go of the lock finds its machine again by name.
    fn index_of(&self, machine: &str) -> Option<usize> {
        self.slots.iter().position(|s| s.machine.name == machine)
    }
}

/// The inventory's live policies and credentials, replaced as a whole by a reload.
#[derive(Debug, Default)]
struct Config {
    /// The policies of the NodeClasses served, by name.
    policies: BTreeMap<String, Policy>,
    /// The last policies of NodeClasses no longer served whose machines or burst instances are still
    /// held, so those keep working until released.
    retired: BTreeMap<String, Policy>,
    /// BMC credentials by name.
    credentials: HashMap<String, Credentials>,
}

impl Config {
    fn policy(&self, node_class: &str) -> Option<&Policy> {
        self.policies.get(node_class).or_else(|| self.retired.get(node_class))
    }
}

/// A validated inventory: its machines, in order, and the policy of each NodeClass.
struct Inventory {
    machines: Vec<Machine>,
    policies: BTreeMap<String, Policy>,
}

/// Validates `classes` as one inventory: each class on its own ([`SelfManagedNodeClass::resolve`]), no
/// NodeClass listed twice, no machine in two NodeClasses, and every `spec.burst` served by `burst`.
fn validate(classes: &[SelfManagedNodeClass], burst: Option<&DynCloudProvider>) -> Result<Inventory, InventoryError> {
    let err =
        |object: String, field: &str, message: String| InventoryError { object, field: field.to_owned(), message };
    let mut policies = BTreeMap::new();
    let mut machines: Vec<Machine> = Vec::new();
    let mut names = BTreeSet::new();
    for class in classes {
        let object = format!("{KIND}/{}", class.class_name());
        let resolved = class.resolve()?;
        let policy = class.policy();
        if let Some((r, _)) = &policy.burst {
            let served = burst.is_some_and(|b| {
                b.descriptor().node_classes.contains(&NodeClassKind::new(r.group.clone(), r.kind.clone()))
            });
            if !served {
                return Err(err(
                    object,
                    "spec.burst.nodeClassRef",
                    format!("no burst provider serving {}/{} was configured", r.group, r.kind),
                ));
            }
        }
        if policies.insert(class.class_name().to_owned(), policy).is_some() {
            return Err(err(object, "metadata.name", "the NodeClass is listed twice".into()));
        }
        for m in resolved {
            if !names.insert(m.name.clone()) {
                return Err(err(object, "spec.machines", format!("machine {:?} is in two NodeClasses", m.name)));
            }
            machines.push(m);
        }
    }
    Ok(Inventory { machines, policies })
}

/// Builds a [`SelfManagedProvider`].
#[derive(Debug)]
pub struct SelfManagedProviderBuilder {
    classes: Vec<SelfManagedNodeClass>,
    credentials: HashMap<String, Credentials>,
    bmc: Option<Arc<dyn Bmc>>,
    clock: SharedClock,
    burst: Option<DynCloudProvider>,
}

impl SelfManagedProviderBuilder {
    /// Adds a NodeClass and its machines.
    pub fn node_class(mut self, class: SelfManagedNodeClass) -> Self {
        self.classes.push(class);
        self
    }

    /// Adds BMC credentials under `name` (a machine's `bmc.credentialsRef`).
    pub fn credentials(mut self, name: &str, username: &str, password: &str) -> Self {
        self.credentials.insert(name.to_owned(), Credentials::new(username, password));
        self
    }

    /// The BMC client (default: none, which [`SelfManagedProviderBuilder::build`] rejects).
    pub fn bmc(mut self, bmc: Arc<dyn Bmc>) -> Self {
        self.bmc = Some(bmc);
        self
    }

    /// The clock deadlines are measured on (default the system clock).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The cloud provider that serves the NodeClasses' `burst.nodeClassRef`.
    pub fn burst(mut self, provider: DynCloudProvider) -> Self {
        self.burst = Some(provider);
        self
    }

    /// Validates the inventory and builds the provider.
    pub fn build(self) -> Result<SelfManagedProvider, InventoryError> {
        let Some(bmc) = self.bmc else {
            return Err(InventoryError {
                object: KIND.into(),
                field: String::new(),
                message: "the provider needs a BMC client".into(),
            });
        };
        let Inventory { machines, policies } = validate(&self.classes, self.burst.as_ref())?;
        let config = Config { policies, credentials: self.credentials, ..Config::default() };
        Ok(SelfManagedProvider {
            bmc,
            clock: self.clock,
            burst: self.burst,
            config: RwLock::new(Arc::new(config)),
            state: Mutex::new(State { slots: machines.into_iter().map(Slot::free).collect(), burst: HashMap::new() }),
        })
    }
}

/// Owned bare-metal machines, powered on and off through their BMCs, offered as `reserved` capacity, with
/// an optional cloud burst under a lease.
#[derive(Debug)]
pub struct SelfManagedProvider {
    bmc: Arc<dyn Bmc>,
    clock: SharedClock,
    burst: Option<DynCloudProvider>,
    /// The live policies and credentials. Lock order: `state`, then `config`; `config` is only held to
    /// read or swap the `Arc`.
    config: RwLock<Arc<Config>>,
    state: Mutex<State>,
}

/// The provider id of a machine.
pub fn provider_id(node_class: &str, machine: &str) -> String {
    format!("{PROVIDER_ID_SCHEME}{node_class}/{machine}")
}

/// What a delete poll does next.
enum Step {
    Wait,
    Send(ResetType),
    Release,
    Quarantine(String),
}

impl SelfManagedProvider {
    /// A builder.
    pub fn builder() -> SelfManagedProviderBuilder {
        SelfManagedProviderBuilder {
            classes: Vec::new(),
            credentials: HashMap::new(),
            bmc: None,
            clock: Arc::new(SystemClock),
            burst: None,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The current policies and credentials.
    fn config(&self) -> Arc<Config> {
        self.config.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The current policy of `node_class` (the last one of a class no longer served whose machines are
    /// still held); the defaults for a class the provider does not know.
    fn policy(&self, node_class: &str) -> Policy {
        static DEFAULT: Policy = Policy {
            boot_budget: inventory::DEFAULT_BOOT_BUDGET,
            graceful_shutdown_timeout: inventory::DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT,
            forced_shutdown_timeout: inventory::DEFAULT_FORCED_SHUTDOWN_TIMEOUT,
            max_failures: inventory::DEFAULT_MAX_FAILURES,
            pxe_boot: false,
            reimage_on_release: false,
            burst: None,
        };
        self.config().policy(node_class).unwrap_or(&DEFAULT).clone()
    }

    /// Every machine's state.
    pub fn machines(&self) -> Vec<MachineStatus> {
        self.state()
            .slots
            .iter()
            .map(|s| {
                let (phase, claim) = match &s.phase {
                    Phase::Free => (MachinePhase::Free, None),
                    Phase::Quarantined(r) => (MachinePhase::Quarantined { reason: r.clone() }, None),
                    Phase::Held(h) => (
                        match h.power {
                            Power::Starting { .. } => MachinePhase::Launching,
                            Power::Running => MachinePhase::Running,
                            Power::Stopping { .. } => MachinePhase::Stopping,
                        },
                        Some(h.claim.clone()),
                    ),
                };
                MachineStatus {
                    node_class: s.machine.node_class.clone(),
                    name: s.machine.name.clone(),
                    domain: s.machine.domain.clone(),
                    phase,
                    claim,
                    failures: s.failures,
                    provider_id: provider_id(&s.machine.node_class, &s.machine.name),
                }
            })
            .collect()
    }

    /// Takes a free machine out of the pool (maintenance); `false` when it is unknown or held by a claim.
    pub fn quarantine(&self, machine: &str, reason: &str) -> bool {
        let mut st = self.state();
        match st.slots.iter_mut().find(|s| s.machine.name == machine) {
            Some(s) if matches!(s.phase, Phase::Free | Phase::Quarantined(_)) => {
                s.phase = Phase::Quarantined(reason.to_owned());
                true
            }
            _ => false,
        }
    }

    /// Takes back what `claims` hold, after a restart: which claim holds which machine lives in memory,
    /// so an operator starting up hands the provider the NodeClaims it finds before anything else runs.
    /// A launched claim naming a free machine of this provider holds it again, as running (the next read
    /// of its BMC corrects that: a machine found off is released, and its claim's instance is gone); a
    /// launched claim on this provider's NodeClass naming a cloud instance is its burst again, under the
    /// lease its annotations record. Claims already known, not launched, or naming machines this provider
    /// does not have are left alone.
    pub fn adopt(&self, claims: &[NodeClaim]) -> Adopted {
        let now = self.now();
        let mut adopted = Adopted::default();
        let mut st = self.state();
        for claim in claims {
            let Some(pid) = claim.provider_id() else { continue };
            if pid.starts_with(PROVIDER_ID_SCHEME) {
                let Some(i) = Self::slot_index(&st, pid) else { continue };
                let slot = &mut st.slots[i];
                if slot.phase != Phase::Free {
                    continue;
                }
                tracing::info!(machine = %slot.machine.name, claim = claim.name(), "adopted a held machine");
                let launched_at = claim.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
                slot.phase = Phase::Held(Hold::new(claim, launched_at, Power::Running));
                adopted.machines += 1;
                continue;
            }
            let ours = claim.spec.node_class_ref.as_ref().filter(|r| r.group == GROUP && r.kind == KIND);
            let lease = claim.annotation(LEASE_EXPIRES_AT).and_then(|t| t.parse::<Timestamp>().ok());
            if let (Some(r), Some(expires_at)) = (ours, lease)
                && self.burst.is_some()
                && !st.burst.contains_key(pid)
            {
                let reason = claim.annotation(LEASE_REASON).unwrap_or(BURST_LEASE_REASON).to_owned();
                let hold = BurstHold {
                    uid: claim_uid(claim),
                    node_class: r.name.clone(),
                    lease: Lease { expires_at, reason },
                };
                st.burst.insert(pid.to_owned(), hold);
                adopted.burst += 1;
            }
        }
        adopted
    }

    /// Returns a quarantined machine to the pool and forgets its failures; `false` when it is not
    /// quarantined.
    pub fn release_quarantine(&self, machine: &str) -> bool {
        let mut st = self.state();
        match st.slots.iter_mut().find(|s| s.machine.name == machine) {
            Some(s) if matches!(s.phase, Phase::Quarantined(_)) => {
                s.phase = Phase::Free;
                s.failures = 0;
                s.quarantine_on_release = false;
                true
            }
            _ => false,
        }
    }

    /// Replaces the inventory with `classes` and the BMC credentials with `credentials` (keyed by a
    /// machine's `bmc.credentialsRef`, as [`SelfManagedProviderBuilder::credentials`] takes them), without
    /// a restart.
    ///
    /// The new inventory is validated as [`SelfManagedProviderBuilder::build`] validates it, against the
    /// burst provider given to the builder; on an error nothing changes. Machines are matched by name:
    ///
    /// - a free or quarantined machine takes its new spec at once (a quarantined one stays
    ///   quarantined), and is dropped at once when it left the inventory;
    /// - a machine held by a claim (launching, running or powering off) keeps its spec and state until
    ///   the claim releases it; then its new spec applies, or, when it left the inventory, it is dropped
    ///   instead of returning to the pool;
    /// - a new machine joins the pool free.
    ///
    /// The NodeClasses' policies and the credentials are replaced at once, for held machines too. A
    /// NodeClass no longer listed is no longer served for new launches; its held machines and burst
    /// instances keep its last policy, and held machines keep credentials no longer given, until they are
    /// released. Instance types and offerings follow the new inventory from the next call.
    pub fn reload(
        &self,
        classes: Vec<SelfManagedNodeClass>,
        credentials: HashMap<String, Credentials>,
    ) -> Result<Reloaded, InventoryError> {
        let Inventory { machines, policies } = validate(&classes, self.burst.as_ref())?;
        let mut reloaded = Reloaded::default();
        let mut st = self.state();

        let order: Vec<String> = st.slots.iter().map(|s| s.machine.name.clone()).collect();
        let mut old: HashMap<String, Slot> = st.slots.drain(..).map(|s| (s.machine.name.clone(), s)).collect();
        let mut slots = Vec::with_capacity(machines.len());
        for m in machines {
            let Some(mut slot) = old.remove(&m.name) else {
                reloaded.added.push(m.name.clone());
                slots.push(Slot::free(m));
                continue;
            };
            if matches!(slot.phase, Phase::Held(_)) {
                let pending = (slot.machine != m).then(|| Pending::Spec(Box::new(m)));
                if slot.pending != pending {
                    reloaded.deferred.push(slot.machine.name.clone());
                    slot.pending = pending;
                }
            } else if slot.machine != m {
                reloaded.updated.push(m.name.clone());
                slot.machine = m;
            }
            slots.push(slot);
        }
        // What left the inventory: dropped now, or when its claim releases it.
        for name in order {
            let Some(mut slot) = old.remove(&name) else { continue };
            if matches!(slot.phase, Phase::Held(_)) {
                if slot.pending != Some(Pending::Removal) {
                    reloaded.deferred.push(name);
                    slot.pending = Some(Pending::Removal);
                }
                slots.push(slot);
            } else {
                reloaded.removed.push(name);
            }
        }
        st.slots = slots;

        let previous = self.config();
        let classes: BTreeSet<&String> = previous.policies.keys().chain(policies.keys()).collect();
        reloaded.node_classes =
            classes.into_iter().filter(|c| previous.policies.get(*c) != policies.get(*c)).cloned().collect();
        let names: BTreeSet<&String> = previous.credentials.keys().chain(credentials.keys()).collect();
        reloaded.credentials =
            names.into_iter().filter(|n| previous.credentials.get(*n) != credentials.get(*n)).cloned().collect();
        // What held machines and burst instances still need of what is gone.
        let held = st.slots.iter().filter(|s| matches!(s.phase, Phase::Held(_))).map(|s| s.machine.node_class.as_str());
        let in_use: BTreeSet<&str> = held.chain(st.burst.values().map(|b| b.node_class.as_str())).collect();
        let retired = in_use
            .into_iter()
            .filter(|c| !policies.contains_key(*c))
            .filter_map(|c| previous.policy(c).map(|p| (c.to_owned(), p.clone())))
            .collect();
        for slot in &mut st.slots {
            if let Phase::Held(h) = &mut slot.phase {
                let name = &slot.machine.bmc.credentials_ref;
                h.kept_credentials = if credentials.contains_key(name) {
                    None
                } else {
                    previous.credentials.get(name).cloned().or_else(|| h.kept_credentials.take())
                };
            }
        }
        *self.config.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Config { policies, retired, credentials });
        drop(st);

        if !reloaded.is_empty() {
            tracing::info!("inventory reloaded: {reloaded}");
        }
        Ok(reloaded)
    }

    /// How to reach `m`'s BMC: with the credentials its `credentialsRef` names, or, for a held machine
    /// whose credentials a reload stopped giving, with those its hold `kept`.
    fn target(&self, m: &Machine, kept: Option<&Credentials>) -> Result<BmcTarget, CloudError> {
        let config = self.config();
        let c = config.credentials.get(&m.bmc.credentials_ref).or(kept).ok_or_else(|| {
            CloudError::NodeClassNotReady(format!(
                "{KIND}/{}: machine {}: BMC credentials {:?} are not available",
                m.node_class, m.name, m.bmc.credentials_ref
            ))
        })?;
        Ok(BmcTarget {
            endpoint: m.bmc.endpoint.clone(),
            system_id: m.bmc.system_id.clone(),
            username: c.username.clone(),
            password: c.password.clone(),
            insecure_skip_tls_verify: m.bmc.insecure_skip_tls_verify,
        })
    }

    /// A BMC failure as a [`CloudError`] naming the machine and the URL.
    fn bmc_error(m: &Machine, e: &BmcError, launching: bool) -> CloudError {
        let message = format!("machine {} ({KIND}/{}): {e}", m.name, m.node_class);
        match &e.kind {
            BmcErrorKind::Unauthorized(_) => CloudError::Unauthorized(message),
            _ if launching => {
                let reason = match e.kind {
                    BmcErrorKind::SystemNotFound => "BmcSystemNotFound",
                    BmcErrorKind::Unreachable(_) => "BmcUnreachable",
                    BmcErrorKind::Timeout => "BmcTimeout",
                    BmcErrorKind::Rejected { .. } => "BmcRejected",
                    _ => "BmcBadResponse",
                };
                CloudError::Create { reason: reason.into(), message }
            }
            _ => CloudError::message(PROVIDER_NAME, message),
        }
    }

    fn instance(m: &Machine, h: &Hold) -> Instance {
        let state = match h.power {
            Power::Starting { .. } => InstanceState::Pending,
            Power::Running => InstanceState::Running,
            Power::Stopping { .. } => InstanceState::Stopping,
        };
        Instance {
            provider_id: provider_id(&m.node_class, &m.name),
            instance_type: m.class.clone(),
            zone: m.domain.clone(),
            capacity_type: CapacityType::Reserved,
            state,
            launch_time: h.launched_at,
            capacity: m.capacity.clone(),
            allocatable: m.capacity.clone(),
            image_id: None,
            labels: m.node_labels(),
            lease: None,
            node_pool: h.node_pool.clone(),
            node_claim: Some(h.claim.clone()),
            price: Some(m.price),
        }
    }

    /// The NodeClass a claim or pool names, or the only one.
    fn node_class_for(&self, r: Option<&NodeClassRef>, object: &str) -> Result<String, CloudError> {
        match r {
            Some(r) if r.group == GROUP && r.kind == KIND => {
                if self.config().policies.contains_key(&r.name) {
                    Ok(r.name.clone())
                } else {
                    Err(CloudError::NodeClassNotReady(format!("{object}: {KIND}/{} is not in the inventory", r.name)))
                }
            }
            Some(r) => Err(CloudError::NodeClassNotReady(format!(
                "{object}: provider {PROVIDER_NAME} does not serve {}/{}",
                r.group, r.kind
            ))),
            None => match self.config().policies.keys().collect::<Vec<_>>().as_slice() {
                [only] => Ok((*only).clone()),
                _ => Err(CloudError::NodeClassNotReady(format!("{object}: names no {KIND} and several exist"))),
            },
        }
    }

    fn slot_index(st: &State, pid: &str) -> Option<usize> {
        let rest = pid.strip_prefix(PROVIDER_ID_SCHEME)?;
        let (class, name) = rest.split_once('/')?;
        st.slots.iter().position(|s| s.machine.node_class == class && s.machine.name == name)
    }

    /// Returns the machine in slot `index` to the pool, or quarantines it when it failed too often. A
    /// change a reload left pending applies now: the machine takes its new spec, or, when it is no longer
    /// in the inventory, it is dropped.
    fn release(&self, st: &mut State, index: usize, reason: Option<String>) {
        let Some(slot) = st.slots.get_mut(index) else { return };
        let policy = self.policy(&slot.machine.node_class);
        if let Some(r) = reason {
            tracing::warn!(machine = %slot.machine.name, reason = %r, "quarantining machine");
            slot.phase = Phase::Quarantined(r);
        } else if slot.quarantine_on_release || slot.failures >= policy.max_failures {
            let r = format!("failed {} times (maxFailures {})", slot.failures, policy.max_failures);
            tracing::warn!(machine = %slot.machine.name, reason = %r, "quarantining machine");
            slot.phase = Phase::Quarantined(r);
        } else {
            slot.phase = Phase::Free;
        }
        match slot.pending.take() {
            None => {}
            Some(Pending::Spec(m)) => {
                tracing::info!(machine = %slot.machine.name, "released: its new spec applies");
                slot.machine = *m;
            }
            Some(Pending::Removal) => {
                tracing::info!(machine = %slot.machine.name, "released: dropped, as it left the inventory");
                st.slots.remove(index);
            }
        }
    }

    /// Reads a held machine's power state and moves it on. `None` when the claim lost the machine (a boot
    /// past its budget, a machine that went dark).
    async fn observe(&self, name: String) -> Option<Instance> {
        let (machine, hold) = {
            let st = self.state();
            let slot = st.slots.get(st.index_of(&name)?)?;
            match &slot.phase {
                Phase::Held(h) => (slot.machine.clone(), h.clone()),
                _ => return None,
            }
        };
        if matches!(hold.power, Power::Stopping { .. }) {
            return Some(Self::instance(&machine, &hold));
        }
        let read = match self.target(&machine, hold.kept_credentials.as_ref()) {
            Ok(t) => self.bmc.power_state(&t).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let now = self.now();
        let policy = self.policy(&machine.node_class);
        let mut st = self.state();
        let index = st.index_of(&name)?;
        let slot = st.slots.get_mut(index)?;
        let Phase::Held(h) = &mut slot.phase else { return None };
        if h.uid != hold.uid || h.power != hold.power {
            // Another call moved it on meanwhile.
            return Some(Self::instance(&slot.machine, h));
        }
        match (h.power, read) {
            (Power::Starting { .. }, Ok(PowerState::On)) => h.power = Power::Running,
            (Power::Starting { requested_at }, read) if clock::since(now, requested_at) >= policy.boot_budget => {
                let seen = match read {
                    Ok(p) => format!("{p:?}"),
                    Err(e) => e,
                };
                let reason = format!(
                    "not on {} after the power-on request (boot budget {:?}); last seen: {seen}",
                    humanize(clock::since(now, requested_at)),
                    policy.boot_budget
                );
                tracing::warn!(machine = %slot.machine.name, claim = %h.claim, %reason, "boot failed");
                slot.failures += 1;
                self.release(&mut st, index, Some(reason));
                return None;
            }
            (Power::Running, Ok(PowerState::Off)) => {
                tracing::warn!(machine = %slot.machine.name, claim = %h.claim, "machine lost power");
                slot.failures += 1;
                self.release(&mut st, index, None);
                return None;
            }
            (Power::Running, Err(e)) => {
                tracing::warn!(machine = %slot.machine.name, error = %e, "BMC unreachable; reporting last state");
            }
            _ => {}
        }
        let Phase::Held(h) = &slot.phase else { return None };
        Some(Self::instance(&slot.machine, h))
    }

    fn burst_claim(&self, claim: &NodeClaim, r: &NodeClassRef) -> NodeClaim {
        let mut c = claim.clone();
        c.spec.node_class_ref = Some(r.clone());
        c
    }

    fn burst_pool(pool: &NodePool, r: &NodeClassRef) -> NodePool {
        let mut p = pool.clone();
        p.spec.template.spec.node_class_ref = Some(r.clone());
        p
    }

    /// Whether `claim` on `node_class` could use the machine `m`, whatever its state.
    fn fits(m: &Machine, node_class: &str, claim: &NodeClaim, requests: &Resources) -> bool {
        if m.node_class != node_class || !requests.fits(&m.capacity) {
            return false;
        }
        // The machine's own labels count: a claim asking for `rack In [r1]` must not get a machine
        // labelled `rack: r2` just because its class leaves the rack open.
        let it = InstanceType {
            name: m.class.clone(),
            labels: m.node_labels(),
            capacity: m.capacity.clone(),
            overhead: Default::default(),
            offerings: Vec::new(),
        };
        let mut offering = Offering::new(m.domain.clone(), CapacityType::Reserved, 0.0);
        offering.reservation_id = Some(crate::inventory::reservation_id(&m.node_class, &m.class, &m.domain));
        it.offering_meets(&offering, &claim.spec.requirements)
    }

    /// Owned offerings `claim` could use, whatever their machines' state.
    fn owned_candidates<'a>(
        st: &'a State,
        node_class: &str,
        claim: &NodeClaim,
        requests: &Resources,
    ) -> Vec<(usize, &'a Slot)> {
        st.slots.iter().enumerate().filter(|(_, s)| Self::fits(&s.machine, node_class, claim, requests)).collect()
    }

    async fn create_burst(
        &self,
        claim: &NodeClaim,
        options: &LaunchOptions,
        node_class: &str,
        owned: Vec<OfferingKey>,
    ) -> Result<Instance, CloudError> {
        let policy = self.policy(node_class);
        let (Some(burst), Some((r, lease))) = (&self.burst, &policy.burst) else {
            return Err(CloudError::InsufficientCapacity {
                offerings: owned,
                message: format!("NodeClaim/{}: no free owned machine and no burst configured", claim.name()),
            });
        };
        let allows_on_demand = claim
            .spec
            .requirements
            .iter()
            .filter(|q| labels::normalize(&q.key) == labels::CAPACITY_TYPE)
            .all(|q| q.matches(Some(labels::CAPACITY_TYPE_ON_DEMAND)));
        if !allows_on_demand {
            return Err(CloudError::InsufficientCapacity {
                offerings: owned,
                message: format!(
                    "NodeClaim/{}: no free owned machine, and the claim rules out on-demand burst",
                    claim.name()
                ),
            });
        }
        // Bursting buys on-demand capacity only.
        let mut burst_claim = self.burst_claim(claim, r);
        burst_claim.spec.requirements.push(NodeSelectorRequirement::new(
            labels::CAPACITY_TYPE,
            tenon_core::api::Operator::In,
            [labels::CAPACITY_TYPE_ON_DEMAND],
        ));
        match burst.create(&burst_claim, options).await {
            Ok(mut instance) => {
                let lease = Lease {
                    expires_at: clock::add(self.now(), *lease),
                    reason: format!("{BURST_LEASE_REASON}: standing in for {KIND}/{node_class}"),
                };
                instance.lease = Some(lease.clone());
                let uid = claim_uid(claim);
                self.state()
                    .burst
                    .insert(instance.provider_id.clone(), BurstHold { uid, node_class: node_class.to_owned(), lease });
                tracing::info!(claim = claim.name(), instance = %instance.provider_id, "burst to the cloud under a lease");
                Ok(instance)
            }
            Err(CloudError::InsufficientCapacity { mut offerings, message }) => {
                offerings.extend(owned);
                Err(CloudError::InsufficientCapacity {
                    offerings,
                    message: format!("no free owned machine, and the burst failed: {message}"),
                })
            }
            Err(e) => Err(e),
        }
    }

    fn burst_for(&self, pid: &str) -> Option<(DynCloudProvider, NodeClassRef, Option<BurstHold>)> {
        let burst = self.burst.clone()?;
        let hold = self.state().burst.get(pid).cloned();
        let class = hold.as_ref().map(|h| h.node_class.clone());
        let config = self.config();
        let r = class
            .as_deref()
            .and_then(|c| config.policy(c))
            .or_else(|| config.policies.values().find(|p| p.burst.is_some()))
            .and_then(|p| p.burst.clone())
            .map(|(r, _)| r)?;
        Some((burst, r, hold))
    }
}

/// What `create` found for a claim.
enum Claimed {
    /// The claim already holds a machine.
    Existing(Instance),
    /// The claim already burst to this cloud instance.
    Burst(String),
    /// A free machine was claimed.
    Machine(Machine),
    /// No machine is free, but some are powering off.
    Deferred { coming: usize, left: Duration },
    /// Nothing free or coming; the owned offerings the claim could use.
    Exhausted(Vec<OfferingKey>),
}

impl SelfManagedProvider {
    #[allow(clippy::too_many_arguments)]
    fn claim_machine(
        st: &mut State,
        this: &Self,
        claim: &NodeClaim,
        options: &LaunchOptions,
        node_class: &str,
        uid: &str,
        requests: &Resources,
        now: Timestamp,
    ) -> Claimed {
        if let Some(s) = st.slots.iter().find(|s| matches!(&s.phase, Phase::Held(h) if h.uid == uid))
            && let Phase::Held(h) = &s.phase
        {
            return Claimed::Existing(Self::instance(&s.machine, h));
        }
        if let Some(pid) = st.burst.iter().find(|(_, h)| h.uid == uid).map(|(pid, _)| pid.clone()) {
            return Claimed::Burst(pid);
        }
        let candidates = Self::owned_candidates(st, node_class, claim, requests);
        let key =
            |s: &Slot| OfferingKey::new(s.machine.class.clone(), s.machine.domain.clone(), CapacityType::Reserved);
        let mut owned: Vec<OfferingKey> = candidates.iter().map(|(_, s)| key(s)).collect();
        owned.sort();
        owned.dedup();
        let free = candidates
            .iter()
            .filter(|(_, s)| s.phase == Phase::Free && !options.is_unavailable(&key(s)))
            .min_by(|a, b| a.1.machine.price.total_cmp(&b.1.machine.price).then(a.0.cmp(&b.0)))
            .map(|(i, _)| *i);
        if let Some(i) = free {
            let slot = &mut st.slots[i];
            slot.phase = Phase::Held(Hold::new(claim, now, Power::Starting { requested_at: now }));
            return Claimed::Machine(slot.machine.clone());
        }
        // Machines powering off will be free shortly: "not yet", not a failure. Each counts as the spec it
        // returns to the pool with; one leaving the inventory does not come back.
        let coming: Vec<Duration> = st
            .slots
            .iter()
            .filter(|s| s.returns_as().is_some_and(|m| Self::fits(m, node_class, claim, requests)))
            .filter_map(|s| match &s.phase {
                Phase::Held(Hold { power: Power::Stopping { since, .. }, .. }) => {
                    let p = this.policy(&s.machine.node_class);
                    let deadline = p.graceful_shutdown_timeout + p.forced_shutdown_timeout;
                    Some(deadline.saturating_sub(clock::since(now, *since)))
                }
                _ => None,
            })
            .collect();
        match coming.iter().min() {
            Some(left) => Claimed::Deferred { coming: coming.len(), left: *left },
            None => Claimed::Exhausted(owned),
        }
    }
}

fn humanize(d: Duration) -> String {
    tenon_core::api::format_duration(Duration::from_secs(d.as_secs()))
}

#[async_trait]
impl CloudProvider for SelfManagedProvider {
    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    /// The runtime's restart hook: [`SelfManagedProvider::adopt`].
    async fn adopt(&self, claims: &[NodeClaim]) -> Result<(), CloudError> {
        let adopted = SelfManagedProvider::adopt(self, claims);
        if adopted != Adopted::default() {
            tracing::info!(machines = adopted.machines, burst = adopted.burst, "took back what the claims hold");
        }
        Ok(())
    }

    fn descriptor(&self) -> ProviderDescriptor {
        ProviderDescriptor {
            node_classes: vec![NodeClassKind::new(GROUP, KIND)],
            well_known_labels: vec![GPU_MODEL_LABEL.to_owned(), GPU_COUNT_LABEL.to_owned()],
        }
    }

    async fn instance_types(&self, pool: &NodePool) -> Result<Vec<InstanceType>, CloudError> {
        let object = format!("NodePool/{}", pool.name());
        let node_class = self.node_class_for(pool.spec.template.spec.node_class_ref.as_ref(), &object)?;
        let mut types = {
            let st = self.state();
            inventory::instance_types(
                st.slots
                    .iter()
                    .filter(|s| s.machine.node_class == node_class)
                    .map(|s| (&s.machine, s.phase == Phase::Free, s.coming_back())),
            )
        };
        let policy = self.policy(&node_class);
        if let (Some(burst), Some((r, _))) = (&self.burst, &policy.burst) {
            match burst.instance_types(&Self::burst_pool(pool, r)).await {
                Ok(cloud) => {
                    for mut it in cloud {
                        if types.iter().any(|t| t.name == it.name) {
                            continue;
                        }
                        // Bursting buys on-demand capacity only.
                        it.offerings.retain(|o| o.capacity_type == CapacityType::OnDemand);
                        if !it.offerings.is_empty() {
                            types.push(it);
                        }
                    }
                }
                Err(e) => tracing::warn!(%object, error = %e, "burst provider's instance types unavailable"),
            }
        }
        Ok(types)
    }

    async fn create(&self, claim: &NodeClaim, options: &LaunchOptions) -> Result<Instance, CloudError> {
        let object = format!("NodeClaim/{}", claim.name());
        let node_class = self.node_class_for(claim.spec.node_class_ref.as_ref(), &object)?;
        let policy = self.policy(&node_class);
        let uid = claim_uid(claim);
        let requests = Resources::from_resource_list(&claim.spec.resources.requests)
            .map_err(|e| CloudError::Create { reason: "InvalidRequests".into(), message: format!("{object}: {e}") })?;
        let now = self.now();

        // Claim a machine atomically, fenced on the claim's UID.
        let decision = {
            let mut st = self.state();
            Self::claim_machine(&mut st, self, claim, options, &node_class, &uid, &requests, now)
        };
        let machine = match decision {
            Claimed::Existing(i) => return Ok(i),
            // Already burst for this claim: the instance as `get` reports a burst instance.
            Claimed::Burst(pid) => return self.get(&pid).await,
            Claimed::Deferred { coming, left } => {
                let retry_after = left.clamp(Duration::from_secs(5), Duration::from_secs(30));
                return Err(CloudError::LaunchDeferred {
                    retry_after,
                    reason: format!("{object}: no free machine in {KIND}/{node_class}; {coming} powering off"),
                });
            }
            Claimed::Exhausted(owned) => return self.create_burst(claim, options, &node_class, owned).await,
            Claimed::Machine(machine) => machine,
        };

        // One-time PXE boot, then power on; progress is observed by later calls.
        let result = async {
            let target = self.target(&machine, None)?;
            if policy.pxe_boot {
                self.bmc.set_pxe_boot_once(&target).await.map_err(|e| Self::bmc_error(&machine, &e, true))?;
            }
            self.bmc.reset(&target, ResetType::On).await.map_err(|e| Self::bmc_error(&machine, &e, true))
        }
        .await;
        let mut st = self.state();
        let held = st.index_of(&machine.name).filter(|&i| matches!(&st.slots[i].phase, Phase::Held(h) if h.uid == uid));
        match result {
            Ok(()) => {
                tracing::info!(claim = claim.name(), machine = %machine.name, "powering on");
                match held.map(|i| &st.slots[i]) {
                    Some(Slot { machine, phase: Phase::Held(h), .. }) => Ok(Self::instance(machine, h)),
                    _ => Err(CloudError::Create {
                        reason: "MachineLost".into(),
                        message: format!("{object}: machine {} was released while powering on", machine.name),
                    }),
                }
            }
            Err(e) => {
                if let Some(index) = held {
                    if !matches!(e, CloudError::NodeClassNotReady(_)) {
                        st.slots[index].failures += 1;
                    }
                    self.release(&mut st, index, None);
                }
                Err(e)
            }
        }
    }

    async fn delete(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id().map(str::to_owned) else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        if !pid.starts_with(PROVIDER_ID_SCHEME) {
            let Some((burst, r, _)) = self.burst_for(&pid) else { return Err(CloudError::NotFound(pid)) };
            let result = burst.delete(&self.burst_claim(claim, &r)).await;
            if result.as_ref().is_err_and(CloudError::is_not_found) {
                self.state().burst.remove(&pid);
            }
            return result;
        }
        let now = self.now();
        let (machine, power, kept) = {
            let mut st = self.state();
            let Some(index) = Self::slot_index(&st, &pid) else { return Err(CloudError::NotFound(pid)) };
            let slot = &mut st.slots[index];
            let Phase::Held(h) = &mut slot.phase else { return Err(CloudError::NotFound(pid)) };
            // Fenced: a stale claim never powers off a machine another claim holds.
            if claim.metadata.uid.as_ref().is_some_and(|u| *u != h.uid) {
                return Err(CloudError::NotFound(pid));
            }
            match h.power {
                Power::Stopping { .. } => {}
                Power::Starting { requested_at } => {
                    h.power = Power::Stopping {
                        since: now,
                        starting_since: Some(requested_at),
                        graceful_sent: None,
                        forced: None,
                    }
                }
                Power::Running => {
                    h.power = Power::Stopping { since: now, starting_since: None, graceful_sent: None, forced: None }
                }
            }
            (slot.machine.clone(), h.power, h.kept_credentials.clone())
        };
        let Power::Stopping { since, starting_since, graceful_sent, forced } = power else { return Ok(()) };
        let policy = self.policy(&machine.node_class);
        let target = self.target(&machine, kept.as_ref())?;
        let read = self.bmc.power_state(&target).await;
        let step = match &read {
            Err(e) => {
                let limit = policy.graceful_shutdown_timeout
                    + policy.forced_shutdown_timeout
                    + starting_since.map_or(Duration::ZERO, |_| policy.boot_budget);
                if clock::since(now, since) >= limit {
                    Step::Quarantine(format!("BMC failed while powering off for {}: {e}", humanize(limit)))
                } else {
                    return Err(Self::bmc_error(&machine, e, false));
                }
            }
            Ok(PowerState::Off) => match (graceful_sent, starting_since) {
                // A power-on may still be pending: wait for it, then shut down properly.
                (None, Some(requested)) if clock::since(now, requested) < policy.boot_budget => Step::Wait,
                _ => Step::Release,
            },
            Ok(PowerState::On) => match (graceful_sent, forced) {
                (None, _) => Step::Send(ResetType::GracefulShutdown),
                (Some(sent), None) if clock::since(now, sent) >= policy.graceful_shutdown_timeout => {
                    Step::Send(ResetType::ForceOff)
                }
                (_, Some(f)) if clock::since(now, f) >= policy.forced_shutdown_timeout => {
                    Step::Quarantine(format!("still on {} after a forced power-off", humanize(clock::since(now, f))))
                }
                _ => Step::Wait,
            },
            Ok(PowerState::PoweringOn | PowerState::PoweringOff) => Step::Wait,
        };
        match step {
            Step::Wait => Ok(()),
            Step::Send(reset) => {
                self.bmc.reset(&target, reset).await.map_err(|e| Self::bmc_error(&machine, &e, false))?;
                tracing::info!(machine = %machine.name, reset = reset.as_str(), "powering off");
                let mut st = self.state();
                if let Some(index) = st.index_of(&machine.name)
                    && let Phase::Held(h) = &mut st.slots[index].phase
                    && let Power::Stopping { graceful_sent, forced, .. } = &mut h.power
                {
                    match reset {
                        ResetType::ForceOff => *forced = Some(now),
                        _ => *graceful_sent = Some(now),
                    }
                }
                Ok(())
            }
            Step::Release | Step::Quarantine(_) => {
                let mut reason = match step {
                    Step::Quarantine(r) => Some(r),
                    _ => None,
                };
                if reason.is_none() && policy.reimage_on_release {
                    // The next boot reimages the machine.
                    if let Err(e) = self.bmc.set_pxe_boot_once(&target).await {
                        reason = Some(format!("could not set the reimage boot: {e}"));
                    }
                }
                let mut st = self.state();
                if let Some(index) = st.index_of(&machine.name)
                    && matches!(&st.slots[index].phase, Phase::Held(h) if matches!(h.power, Power::Stopping { .. }))
                {
                    let slot = &mut st.slots[index];
                    if reason.is_some() {
                        slot.failures += 1;
                    }
                    if starting_since.is_some() && graceful_sent.is_none() && reason.is_none() {
                        // It never came on within its boot budget.
                        slot.failures += 1;
                    }
                    tracing::info!(machine = %machine.name, "returned to the pool");
                    self.release(&mut st, index, reason);
                }
                Err(CloudError::NotFound(pid))
            }
        }
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, CloudError> {
        if !provider_id.starts_with(PROVIDER_ID_SCHEME) {
            let Some((burst, _, hold)) = self.burst_for(provider_id) else {
                return Err(CloudError::NotFound(provider_id.to_owned()));
            };
            let mut i = burst.get(provider_id).await?;
            i.lease = hold.map(|h| h.lease);
            return Ok(i);
        }
        let name = {
            let st = self.state();
            Self::slot_index(&st, provider_id).map(|i| st.slots[i].machine.name.clone())
        };
        match name {
            Some(name) => self.observe(name).await.ok_or_else(|| CloudError::NotFound(provider_id.to_owned())),
            None => Err(CloudError::NotFound(provider_id.to_owned())),
        }
    }

    async fn list(&self) -> Result<Vec<Instance>, CloudError> {
        let (held, burst): (Vec<String>, Vec<String>) = {
            let st = self.state();
            (
                st.slots.iter().filter(|s| matches!(s.phase, Phase::Held(_))).map(|s| s.machine.name.clone()).collect(),
                st.burst.keys().cloned().collect(),
            )
        };
        // The BMCs are read side by side, a few at a time: one that does not answer costs its timeout
        // once, not once per machine behind it.
        let observed: Vec<Option<Instance>> =
            stream::iter(held).map(|name| self.observe(name)).buffered(CONCURRENT_BMC_READS).collect().await;
        let mut out: Vec<Instance> = observed.into_iter().flatten().collect();
        for pid in burst {
            match self.get(&pid).await {
                Ok(i) => out.push(i),
                Err(e) if e.is_not_found() => {
                    self.state().burst.remove(&pid);
                }
                Err(e) => tracing::warn!(instance = %pid, error = %e, "burst instance unavailable"),
            }
        }
        Ok(out)
    }

    async fn is_drifted(&self, claim: &NodeClaim) -> Result<Option<DriftReason>, CloudError> {
        match claim.provider_id() {
            Some(pid) if !pid.starts_with(PROVIDER_ID_SCHEME) => match self.burst_for(pid) {
                Some((burst, r, _)) => burst.is_drifted(&self.burst_claim(claim, &r)).await,
                None => Ok(None),
            },
            _ => Ok(None),
        }
    }

    fn repair_policies(&self) -> Vec<RepairPolicy> {
        default_repair_policies()
    }

    async fn reboot(&self, claim: &NodeClaim) -> Result<(), CloudError> {
        let Some(pid) = claim.provider_id().map(str::to_owned) else {
            return Err(CloudError::NotFound(format!("NodeClaim/{} has no provider id", claim.name())));
        };
        if !pid.starts_with(PROVIDER_ID_SCHEME) {
            let Some((burst, r, _)) = self.burst_for(&pid) else { return Err(CloudError::NotFound(pid)) };
            return burst.reboot(&self.burst_claim(claim, &r)).await;
        }
        let now = self.now();
        let (machine, kept) = {
            let mut st = self.state();
            let Some(index) = Self::slot_index(&st, &pid) else { return Err(CloudError::NotFound(pid)) };
            let slot = &mut st.slots[index];
            let max = self.policy(&slot.machine.node_class).max_failures;
            let Phase::Held(h) = &mut slot.phase else { return Err(CloudError::NotFound(pid)) };
            if claim.metadata.uid.as_ref().is_some_and(|u| *u != h.uid) || matches!(h.power, Power::Stopping { .. }) {
                return Err(CloudError::NotFound(pid));
            }
            slot.failures += 1;
            if slot.failures >= max {
                // Repeated trouble: the node is replaced instead, and the machine leaves the pool.
                slot.quarantine_on_release = true;
                return Err(CloudError::message(
                    PROVIDER_NAME,
                    format!(
                        "machine {} failed {} times (maxFailures {max}): not rebooting; it is quarantined when released",
                        slot.machine.name, slot.failures
                    ),
                ));
            }
            h.power = Power::Starting { requested_at: now };
            (slot.machine.clone(), h.kept_credentials.clone())
        };
        let target = self.target(&machine, kept.as_ref())?;
        self.bmc.reset(&target, ResetType::ForceRestart).await.map_err(|e| Self::bmc_error(&machine, &e, false))?;
        tracing::info!(machine = %machine.name, claim = claim.name(), "rebooting for repair");
        Ok(())
    }
}

#[cfg(test)]
mod tests;
