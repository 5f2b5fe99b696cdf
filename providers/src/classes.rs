//! The NodeClasses a provider was fed and what each resolved to, as every provider keeps them: a changed
//! spec drops its resolution, an unchanged one keeps it until it is stale.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tenon_core::clock;

/// NodeClasses of kind `C` by name, each with its resolution `S` (a status) and when it was made.
#[derive(Debug)]
pub struct ClassStore<C, S> {
    classes: HashMap<String, Arc<C>>,
    resolved: HashMap<String, (Timestamp, Arc<S>)>,
}

impl<C, S> Default for ClassStore<C, S> {
    fn default() -> Self {
        Self { classes: HashMap::new(), resolved: HashMap::new() }
    }
}

impl<C, S> ClassStore<C, S> {
    /// Adds or replaces class `name`; its resolution goes unless `same` says the old and new specs match.
    pub fn apply(&mut self, name: String, class: C, same: impl Fn(&C, &C) -> bool) {
        if self.classes.get(&name).is_none_or(|old| !same(old, &class)) {
            self.resolved.remove(&name);
        }
        self.classes.insert(name, Arc::new(class));
    }

    /// Forgets class `name` and its resolution.
    pub fn forget(&mut self, name: &str) {
        self.classes.remove(name);
        self.resolved.remove(name);
    }

    /// Class `name`.
    pub fn get(&self, name: &str) -> Option<Arc<C>> {
        self.classes.get(name).cloned()
    }

    /// Class `name`'s resolution, if made less than `ttl` before `now`.
    pub fn fresh(&self, name: &str, now: Timestamp, ttl: Duration) -> Option<Arc<S>> {
        let (at, status) = self.resolved.get(name)?;
        (clock::since(now, *at) < ttl).then(|| status.clone())
    }

    /// Class `name`'s last resolution, however old.
    pub fn last(&self, name: &str) -> Option<Arc<S>> {
        self.resolved.get(name).map(|(_, s)| s.clone())
    }

    /// Drops every resolution (what they followed changed), keeping the last ones readable by
    /// [`Self::last`] until each class resolves again.
    pub fn expire_all(&mut self) {
        for (at, _) in self.resolved.values_mut() {
            *at = Timestamp::MIN;
        }
    }

    /// Records class `name`'s resolution, made `at`.
    pub fn remember(&mut self, name: &str, at: Timestamp, status: Arc<S>) {
        self.resolved.insert(name.to_owned(), (at, status));
    }
}

/// The name of the class `r` refers to, when it is a `group`/`kind` one; `NodeClassNotReady` naming
/// `object` (the pool or claim) otherwise.
pub fn referenced<'a>(
    r: Option<&'a tenon_core::api::NodeClassRef>,
    group: &str,
    kind: &str,
    object: &str,
) -> Result<&'a str, tenon_core::cloud::CloudError> {
    use tenon_core::cloud::CloudError;
    let article = if kind.starts_with(['A', 'E', 'I', 'O', 'U']) { "an" } else { "a" };
    match r {
        Some(r) if r.group == group && r.kind == kind => Ok(&r.name),
        Some(r) => Err(CloudError::NodeClassNotReady(format!("{object}: nodeClassRef {r} is not {article} {kind}"))),
        None => Err(CloudError::NodeClassNotReady(format!("{object}: no nodeClassRef to {article} {kind}"))),
    }
}

/// The reason of a false `ValidationSucceeded`.
pub const REASON_VALIDATION_FAILED: &str = "ValidationFailed";
/// The reason of a false `Ready`.
pub const REASON_NOT_READY: &str = "NotReady";

/// A NodeClass's conditions as one status pass writes them: `ValidationSucceeded`, each resolution's
/// condition, and `Ready` (true when every other is). A condition keeps its transition time while its
/// status stays.
#[derive(Debug)]
pub struct Readiness {
    conditions: Vec<tenon_core::api::Condition>,
    now: Timestamp,
    unready: Vec<&'static str>,
}

impl Readiness {
    /// Starts from the class's `previous` conditions, at `now`.
    pub fn new(previous: Vec<tenon_core::api::Condition>, now: Timestamp) -> Self {
        Self { conditions: previous, now, unready: Vec::new() }
    }

    /// The class failed validation (`message` names the field): `ValidationSucceeded` and `Ready` false,
    /// the other conditions as they were.
    pub fn invalid(mut self, message: &str) -> Vec<tenon_core::api::Condition> {
        use tenon_core::api::condition_types::VALIDATION_SUCCEEDED;
        self.set(VALIDATION_SUCCEEDED, Err(message.to_owned()), REASON_VALIDATION_FAILED);
        self.finish()
    }

    /// Sets condition `type_`: true when `result` is, else false with `reason` and the error's message.
    pub fn set(&mut self, type_: &'static str, result: Result<(), String>, reason: &str) {
        use tenon_core::api::{ConditionStatus, set_condition};
        match result {
            Ok(()) => set_condition(&mut self.conditions, type_, ConditionStatus::True, type_, "", self.now),
            Err(m) => {
                self.unready.push(type_);
                set_condition(&mut self.conditions, type_, ConditionStatus::False, reason, &m, self.now);
            }
        }
    }

    /// The conditions, with `Ready`.
    pub fn finish(mut self) -> Vec<tenon_core::api::Condition> {
        use tenon_core::api::{ConditionStatus, set_condition};
        const READY: &str = "Ready";
        if self.unready.is_empty() {
            set_condition(&mut self.conditions, READY, ConditionStatus::True, READY, "", self.now);
        } else {
            let verb = if self.unready == [tenon_core::api::condition_types::VALIDATION_SUCCEEDED] {
                "is False".to_owned()
            } else {
                "not ready".to_owned()
            };
            let message = format!("{} {verb}", self.unready.join(", "));
            set_condition(&mut self.conditions, READY, ConditionStatus::False, REASON_NOT_READY, &message, self.now);
        }
        self.conditions
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_changed_spec_drops_its_resolution_and_a_stale_one_is_not_fresh() {
        let mut store: ClassStore<(String, u32), &str> = ClassStore::default();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let same = |a: &(String, u32), b: &(String, u32)| a.1 == b.1;
        store.apply("a".into(), ("a".into(), 1), same);
        store.remember("a", t0, Arc::new("resolved"));
        assert_eq!(store.fresh("a", t0, Duration::from_secs(60)).as_deref(), Some(&"resolved"));
        assert!(store.fresh("a", clock::add(t0, Duration::from_secs(61)), Duration::from_secs(60)).is_none());
        assert_eq!(store.last("a").as_deref(), Some(&"resolved"), "the last, however old");
        store.apply("a".into(), ("a".into(), 1), same);
        assert!(store.last("a").is_some(), "an unchanged spec keeps it");
        store.apply("a".into(), ("a".into(), 2), same);
        assert!(store.last("a").is_none(), "a changed spec drops it");
        store.forget("a");
        assert!(store.get("a").is_none());
    }
}
