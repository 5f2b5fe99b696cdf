//! The unavailable-offerings cache: offerings that recently failed to launch, kept out of scheduling for a
//! while so a sold-out market is not hammered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;

use super::types::{CapacityType, InstanceType, LaunchOptions, OfferingKey};

/// How long an offering stays unavailable by default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(180);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    provider: String,
    offering: OfferingKey,
}

/// Offerings marked unavailable, keyed by provider, capacity type, instance type and zone, each with an
/// expiry.
#[derive(Debug, Default)]
pub struct UnavailableOfferings {
    entries: Mutex<HashMap<Key, Timestamp>>,
    generation: AtomicU64,
}

impl UnavailableOfferings {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `offering` of `provider` unavailable until `now + ttl`.
    pub fn mark(&self, provider: &str, offering: &OfferingKey, ttl: Duration, now: Timestamp) {
        let until = crate::clock::add(now, ttl);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let key = Key { provider: provider.to_owned(), offering: offering.clone() };
        let slot = entries.entry(key).or_insert(until);
        *slot = (*slot).max(until);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `offering` is unavailable at `now`.
    pub fn is_unavailable(&self, provider: &str, offering: &OfferingKey, now: Timestamp) -> bool {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let key = Key { provider: provider.to_owned(), offering: offering.clone() };
        entries.get(&key).is_some_and(|until| *until > now)
    }

    /// Drops expired entries.
    pub fn expire(&self, now: Timestamp) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let before = entries.len();
        entries.retain(|_, until| *until > now);
        if entries.len() != before {
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A counter that changes whenever the set of unavailable offerings may have changed; callers caching
    /// derived data compare it to know when to rebuild.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Marks the cached offerings of `types` unavailable, except those of the `ignore`d capacity types.
    pub fn apply(&self, provider: &str, types: &mut [InstanceType], ignore: &[CapacityType], now: Timestamp) {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.is_empty() {
            return;
        }
        for it in types.iter_mut() {
            for o in it.offerings.iter_mut().filter(|o| o.available && !ignore.contains(&o.capacity_type)) {
                let key = Key { provider: provider.to_owned(), offering: o.key(&it.name) };
                if entries.get(&key).is_some_and(|until| *until > now) {
                    o.available = false;
                }
            }
        }
    }

    /// Launch options for `provider`: the live entries, minus those of the `ignore`d capacity types.
    pub fn launch_options(&self, provider: &str, ignore: &[CapacityType], now: Timestamp) -> LaunchOptions {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut unavailable: Vec<OfferingKey> = entries
            .iter()
            .filter(|(k, until)| k.provider == provider && **until > now && !ignore.contains(&k.offering.capacity_type))
            .map(|(k, _)| k.offering.clone())
            .collect();
        unavailable.sort();
        LaunchOptions { unavailable, ignore_unavailable: ignore.to_vec() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::Offering;
    use crate::resources::Resources;

    #[test]
    fn entries_expire_after_their_ttl() {
        let cache = UnavailableOfferings::new();
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let key = OfferingKey::new("g5.2xlarge", "us-east-1a", CapacityType::Spot);
        cache.mark("aws", &key, DEFAULT_TTL, t0);
        assert!(cache.is_unavailable("aws", &key, crate::clock::add(t0, Duration::from_secs(179))));
        assert!(!cache.is_unavailable("aws", &key, crate::clock::add(t0, Duration::from_secs(180))));
        assert!(!cache.is_unavailable("gcp", &key, t0), "keyed by provider");
        let g = cache.generation();
        cache.expire(crate::clock::add(t0, DEFAULT_TTL));
        assert_ne!(cache.generation(), g);
    }

    #[test]
    fn apply_and_launch_options_honour_ignored_capacity_types() {
        let cache = UnavailableOfferings::new();
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let spot = OfferingKey::new("m5.large", "a", CapacityType::Spot);
        let od = OfferingKey::new("m5.large", "a", CapacityType::OnDemand);
        cache.mark("aws", &spot, DEFAULT_TTL, now);
        cache.mark("aws", &od, DEFAULT_TTL, now);
        let mk = || {
            vec![InstanceType {
                name: "m5.large".into(),
                labels: Default::default(),
                capacity: Resources::ZERO,
                overhead: Default::default(),
                offerings: vec![
                    Offering::new("a", CapacityType::Spot, 0.03),
                    Offering::new("a", CapacityType::OnDemand, 0.096),
                ],
            }]
        };
        let mut types = mk();
        cache.apply("aws", &mut types, &[], now);
        assert!(types[0].offerings.iter().all(|o| !o.available));
        let mut types = mk();
        cache.apply("aws", &mut types, &[CapacityType::Spot], now);
        assert!(types[0].offerings[0].available, "spot is probed again");
        assert!(!types[0].offerings[1].available);
        let opts = cache.launch_options("aws", &[CapacityType::Spot], now);
        assert_eq!(opts.unavailable, vec![od]);
        assert_eq!(opts.ignore_unavailable, vec![CapacityType::Spot]);
    }
}
