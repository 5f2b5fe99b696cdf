//! The seam between the provider's state machine and the machines' BMCs.
//!
//! [`Bmc`] is what the provider asks of a baseboard management controller: read the power state, send a
//! reset, set a one-time boot source. [`crate::RedfishClient`] speaks Redfish over HTTP;
//! [`InMemoryBmc`] is a deterministic stand-in driven by tenon's clock, for virtual-time tests.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use tenon_core::clock::{self, SharedClock};

/// The machine a BMC call is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BmcTarget {
    /// The BMC's base URL.
    pub endpoint: String,
    /// The Redfish `ComputerSystem` id.
    pub system_id: String,
    /// The user name.
    pub username: String,
    /// The password.
    pub password: String,
    /// Accepts any TLS certificate.
    pub insecure_skip_tls_verify: bool,
}

impl BmcTarget {
    /// The system's Redfish URL, for messages.
    pub fn system_url(&self) -> String {
        format!("{}/redfish/v1/Systems/{}", self.endpoint.trim_end_matches('/'), self.system_id)
    }
}

/// A system's power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// Powering on (some BMCs report it).
    PoweringOn,
    /// Powering off (some BMCs report it).
    PoweringOff,
}

/// A Redfish `ComputerSystem.Reset` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetType {
    /// Power on.
    On,
    /// Ask the operating system to shut down.
    GracefulShutdown,
    /// Cut the power.
    ForceOff,
    /// Reset without an orderly shutdown.
    ForceRestart,
}

impl ResetType {
    /// The Redfish name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "On",
            Self::GracefulShutdown => "GracefulShutdown",
            Self::ForceOff => "ForceOff",
            Self::ForceRestart => "ForceRestart",
        }
    }
}

/// What went wrong talking to a BMC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BmcErrorKind {
    /// The BMC rejected the credentials (401 or 403).
    Unauthorized(u16),
    /// The BMC does not know the system (404).
    SystemNotFound,
    /// The BMC could not be reached (connection refused, DNS, TLS).
    Unreachable(String),
    /// The BMC did not answer in time.
    Timeout,
    /// The BMC answered with another error status.
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The BMC's message.
        message: String,
    },
    /// The BMC's answer could not be understood.
    BadResponse(String),
}

/// A failed BMC call: what went wrong, and at which URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("BMC {url}: {kind}")]
pub struct BmcError {
    /// The URL called.
    pub url: String,
    /// What went wrong.
    pub kind: BmcErrorKind,
}

impl fmt::Display for BmcErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unauthorized(status) => write!(f, "credentials rejected (HTTP {status})"),
            Self::SystemNotFound => f.write_str("no such system (HTTP 404)"),
            Self::Unreachable(why) => write!(f, "unreachable: {why}"),
            Self::Timeout => f.write_str("timed out"),
            Self::Rejected { status, message } => write!(f, "request rejected (HTTP {status}): {message}"),
            Self::BadResponse(why) => write!(f, "unexpected response: {why}"),
        }
    }
}

/// A baseboard management controller, as the provider drives it.
#[async_trait]
pub trait Bmc: Send + Sync + fmt::Debug + 'static {
    /// The system's current power state.
    async fn power_state(&self, target: &BmcTarget) -> Result<PowerState, BmcError>;

    /// Sends a reset; it returns once the BMC accepted it, not once it took effect.
    async fn reset(&self, target: &BmcTarget, reset: ResetType) -> Result<(), BmcError>;

    /// Boots from the network (PXE) on the next power-on only.
    async fn set_pxe_boot_once(&self, target: &BmcTarget) -> Result<(), BmcError>;
}

#[derive(Debug, Clone)]
struct System {
    power: PowerState,
    pending: Option<(PowerState, Timestamp)>,
    pxe_once: bool,
    resets: Vec<ResetType>,
    pxe_boots: u32,
    never_powers_on: bool,
    ignores_graceful: bool,
    stuck_on: bool,
    unreachable: bool,
}

impl System {
    fn new() -> Self {
        Self {
            power: PowerState::Off,
            pending: None,
            pxe_once: false,
            resets: Vec::new(),
            pxe_boots: 0,
            never_powers_on: false,
            ignores_graceful: false,
            stuck_on: false,
            unreachable: false,
        }
    }

    fn settle(&mut self, now: Timestamp) {
        if let Some((to, at)) = self.pending
            && now >= at
        {
            self.pending = None;
            if to == PowerState::On && self.never_powers_on {
                return;
            }
            if to == PowerState::On && self.pxe_once {
                self.pxe_once = false;
                self.pxe_boots += 1;
            }
            self.power = to;
        }
    }
}

/// An in-memory BMC for every system it is asked about (each starts Off). Power changes take effect
/// `power_delay` after the reset, measured on tenon's clock, so virtual-time tests never sleep. Faults can be
/// scripted per system: a power-on that never takes effect, an unreachable BMC.
#[derive(Debug)]
pub struct InMemoryBmc {
    clock: SharedClock,
    power_delay: Duration,
    systems: Mutex<HashMap<String, System>>,
}

impl InMemoryBmc {
    /// A BMC whose power changes take `power_delay`.
    pub fn new(clock: SharedClock, power_delay: Duration) -> Self {
        Self { clock, power_delay, systems: Mutex::new(HashMap::new()) }
    }

    fn systems(&self) -> MutexGuard<'_, HashMap<String, System>> {
        self.systems.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with<T>(&self, system_id: &str, f: impl FnOnce(&mut System) -> T) -> T {
        let now = self.clock.now();
        let mut systems = self.systems();
        let s = systems.entry(system_id.to_owned()).or_insert_with(System::new);
        s.settle(now);
        f(s)
    }

    /// The system's power state now.
    pub fn power(&self, system_id: &str) -> PowerState {
        self.with(system_id, |s| s.power)
    }

    /// Every reset the system received, in order.
    pub fn resets(&self, system_id: &str) -> Vec<ResetType> {
        self.with(system_id, |s| s.resets.clone())
    }

    /// How many times the system booted from the network.
    pub fn pxe_boots(&self, system_id: &str) -> u32 {
        self.with(system_id, |s| s.pxe_boots)
    }

    /// Makes the system ignore power-on requests (a dead power supply, a stuck BMC).
    pub fn never_power_on(&self, system_id: &str) {
        self.with(system_id, |s| s.never_powers_on = true);
    }

    /// Makes the system's operating system ignore graceful shutdowns (a hung OS); forced ones still work.
    pub fn ignore_graceful_shutdown(&self, system_id: &str) {
        self.with(system_id, |s| s.ignores_graceful = true);
    }

    /// Makes the system stay on whatever it is told (a stuck power controller).
    pub fn stuck_on(&self, system_id: &str) {
        self.with(system_id, |s| s.stuck_on = true);
    }

    /// Makes the system's BMC unreachable, or reachable again.
    pub fn set_unreachable(&self, system_id: &str, unreachable: bool) {
        self.with(system_id, |s| s.unreachable = unreachable);
    }

    fn check(target: &BmcTarget, s: &System) -> Result<(), BmcError> {
        if s.unreachable {
            return Err(BmcError {
                url: target.system_url(),
                kind: BmcErrorKind::Unreachable("connection refused".into()),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Bmc for InMemoryBmc {
    async fn power_state(&self, target: &BmcTarget) -> Result<PowerState, BmcError> {
        self.with(&target.system_id, |s| {
            Self::check(target, s)?;
            Ok(s.power)
        })
    }

    async fn reset(&self, target: &BmcTarget, reset: ResetType) -> Result<(), BmcError> {
        let at = clock::add(self.clock.now(), self.power_delay);
        self.with(&target.system_id, |s| {
            Self::check(target, s)?;
            s.resets.push(reset);
            match reset {
                ResetType::On => {
                    if s.power == PowerState::Off {
                        s.pending = Some((PowerState::On, at));
                    }
                }
                ResetType::GracefulShutdown | ResetType::ForceOff => {
                    let ignored = s.stuck_on || (reset == ResetType::GracefulShutdown && s.ignores_graceful);
                    if s.power == PowerState::On && !ignored {
                        s.pending = Some((PowerState::Off, at));
                    }
                }
                ResetType::ForceRestart => {
                    s.power = PowerState::Off;
                    s.pending = Some((PowerState::On, at));
                }
            }
            Ok(())
        })
    }

    async fn set_pxe_boot_once(&self, target: &BmcTarget) -> Result<(), BmcError> {
        self.with(&target.system_id, |s| {
            Self::check(target, s)?;
            s.pxe_once = true;
            Ok(())
        })
    }
}
