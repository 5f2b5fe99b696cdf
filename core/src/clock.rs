//! Time as the controllers see it.
//!
//! Every controller takes a [`Clock`]. Production code uses [`SystemClock`]; tests and the simulator use a
//! [`VirtualClock`] that only moves when told to, so nothing ever sleeps to observe a timeout.

use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

/// A source of the current time.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when [`VirtualClock::advance`] or [`VirtualClock::set`] is called.
#[derive(Debug)]
pub struct VirtualClock {
    now: Mutex<Timestamp>,
}

impl VirtualClock {
    /// A virtual clock starting at `start`.
    pub fn new(start: Timestamp) -> Arc<Self> {
        Arc::new(Self { now: Mutex::new(start) })
    }

    /// A virtual clock starting at 2026-01-01T00:00:00Z, a fixed epoch for deterministic tests.
    pub fn at_epoch() -> Arc<Self> {
        Self::new(Timestamp::constant(1_767_225_600, 0))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = add(*now, by);
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: Timestamp) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = to;
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `t + d`, saturating at the largest representable instant.
pub fn add(t: Timestamp, d: Duration) -> Timestamp {
    let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

/// `t - d`, saturating at the smallest representable instant.
pub fn sub(t: Timestamp, d: Duration) -> Timestamp {
    let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    t.checked_sub(d).unwrap_or(Timestamp::MIN)
}

/// The non-negative time from `earlier` to `later` (zero when `later` is before `earlier`).
pub fn since(later: Timestamp, earlier: Timestamp) -> Duration {
    let d = later.duration_since(earlier);
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_when_told() {
        let clock = VirtualClock::at_epoch();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        clock.advance(Duration::from_secs(90));
        assert_eq!(since(clock.now(), t0), Duration::from_secs(90));
        assert_eq!(since(t0, clock.now()), Duration::ZERO);
        assert_eq!(sub(clock.now(), Duration::from_secs(90)), t0);
    }
}
