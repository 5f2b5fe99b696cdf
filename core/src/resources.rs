//! Compact resource vectors.
//!
//! Kubernetes speaks of resources as maps of names to quantity strings (`cpu: 500m`, `memory: 1Gi`,
//! `nvidia.com/gpu: "1"`). tenon converts them once, at the edge, into a [`Resources`]: integers indexed by
//! [`ResourceName`] slots. CPU is counted in millicores, every other resource in its base unit (bytes, pods,
//! devices).
//!
//! The first [`INLINE`] slots live in a fixed array, so arithmetic and fit checks on the resources nearly
//! every cluster uses are a handful of integer operations with no allocation, which is what the scheduler's
//! hot path needs. The first slots are fixed (`cpu`, `memory`, `pods`, `ephemeral-storage`, and the common
//! accelerators); any other extended resource name is interned into the next slot the first time it is
//! seen. Names past the inline array (a fleet with many MIG profiles, hugepage sizes and device plugins)
//! live in a short sorted list beside it, so any number of names works and only vectors that carry such
//! a resource pay for it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{OnceLock, PoisonError, RwLock};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_quantity::ParsedQuantity;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How many resource names a vector holds in its inline array; names interned later are stored sparsely.
pub const INLINE: usize = 15;

/// How many distinct resource names one process interns. Names are never freed, so a bound keeps a
/// snapshot naming millions of resources from exhausting memory; real clusters use a few dozen.
pub const MAX_NAMES: usize = 1 << 16;

const WELL_KNOWN: [&str; 9] = [
    "cpu",
    "memory",
    "pods",
    "ephemeral-storage",
    "nvidia.com/gpu",
    "amd.com/gpu",
    "aws.amazon.com/neuron",
    "google.com/tpu",
    "hugepages-2Mi",
];

struct Registry {
    names: Vec<&'static str>,
    slots: HashMap<&'static str, u32>,
}

fn registry() -> &'static RwLock<Registry> {
    static NAMES: OnceLock<RwLock<Registry>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let names = WELL_KNOWN.to_vec();
        let slots = names.iter().enumerate().map(|(i, n)| (*n, i as u32)).collect();
        RwLock::new(Registry { names, slots })
    })
}

/// Errors converting Kubernetes resource quantities.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// A quantity string that is not a Kubernetes quantity.
    #[error("resource {name:?}: invalid quantity {value:?}: {reason}")]
    InvalidQuantity {
        /// The resource name.
        name: String,
        /// The value as given.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// More distinct resource names than [`MAX_NAMES`].
    #[error("resource {name:?}: too many distinct resource names (at most {MAX_NAMES})")]
    TooManyResources {
        /// The name that did not fit.
        name: String,
    },
}

/// A slot in a [`Resources`] vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName(u32);

impl ResourceName {
    /// `cpu`, in millicores.
    pub const CPU: Self = Self(0);
    /// `memory`, in bytes.
    pub const MEMORY: Self = Self(1);
    /// `pods`, a count.
    pub const PODS: Self = Self(2);
    /// `ephemeral-storage`, in bytes.
    pub const EPHEMERAL_STORAGE: Self = Self(3);
    /// `nvidia.com/gpu`, a count.
    pub const NVIDIA_GPU: Self = Self(4);

    /// The slot for `name`, interning it if it was never seen.
    pub fn intern(name: &str) -> Result<Self, ResourceError> {
        if let Some(found) = Self::lookup(name) {
            return Ok(found);
        }
        let mut reg = registry().write().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = reg.slots.get(name) {
            return Ok(Self(*i));
        }
        if reg.names.len() >= MAX_NAMES {
            return Err(ResourceError::TooManyResources { name: name.to_owned() });
        }
        // Bounded by MAX_NAMES, and in practice by the handful of names a cluster uses.
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        let slot = reg.names.len() as u32;
        reg.names.push(leaked);
        reg.slots.insert(leaked, slot);
        Ok(Self(slot))
    }

    /// The slot for `name` if it is known.
    pub fn lookup(name: &str) -> Option<Self> {
        let reg = registry().read().unwrap_or_else(PoisonError::into_inner);
        reg.slots.get(name).map(|i| Self(*i))
    }

    /// The resource's Kubernetes name.
    pub fn as_str(self) -> &'static str {
        let reg = registry().read().unwrap_or_else(PoisonError::into_inner);
        reg.names.get(self.0 as usize).copied().unwrap_or("unknown")
    }

    /// The slot index.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    fn is_milli(self) -> bool {
        self == Self::CPU
    }

    fn is_bytes(self) -> bool {
        matches!(self.as_str(), "memory" | "ephemeral-storage") || self.as_str().starts_with("hugepages-")
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A resource vector: CPU in millicores, everything else in base units.
///
/// Slots below [`INLINE`] are an array. Later slots, when a vector has any, live in a boxed `Sparse`
/// tail, so the common vector is the array and one null pointer: cloning it copies the array, and the
/// arithmetic checks one pointer per operand before touching the tail.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Resources {
    v: [i64; INLINE],
    sparse: Option<Box<Sparse>>,
}

/// The slots of a vector past [`INLINE`]: `entries` (sorted by slot) lists those that differ from `rest`,
/// the value of every slot not listed (zero, or `i64::MAX` for [`Resources::splat`]'s "unlimited").
/// Entries equal to `rest` are never stored and a tail with no entries and a zero `rest` is no tail, so
/// derived equality and hashing are exact.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct Sparse {
    entries: Vec<(u32, i64)>,
    rest: i64,
}

impl Sparse {
    fn get(&self, slot: u32) -> i64 {
        match self.entries.binary_search_by_key(&slot, |(s, _)| *s) {
            Ok(i) => self.entries[i].1,
            Err(_) => self.rest,
        }
    }
}

const NO_ENTRIES: &[(u32, i64)] = &[];

impl Resources {
    /// The zero vector.
    pub const ZERO: Self = Self { v: [0; INLINE], sparse: None };

    /// A vector with every entry set to `value`, including names interned later.
    pub fn splat(value: i64) -> Self {
        let sparse = (value != 0).then(|| Box::new(Sparse { entries: Vec::new(), rest: value }));
        Self { v: [value; INLINE], sparse }
    }

    /// A vector with CPU (millicores) and memory (bytes) set.
    pub fn cpu_memory(cpu_millis: i64, memory_bytes: i64) -> Self {
        let mut r = Self::ZERO;
        r.set(ResourceName::CPU, cpu_millis);
        r.set(ResourceName::MEMORY, memory_bytes);
        r
    }

    /// The value in `name`'s slot.
    #[inline]
    pub fn get(&self, name: ResourceName) -> i64 {
        match self.v.get(name.index()) {
            Some(v) => *v,
            None => self.sparse.as_ref().map_or(0, |s| s.get(name.0)),
        }
    }

    /// The tail's entries and default value.
    fn tail(&self) -> (&[(u32, i64)], i64) {
        match &self.sparse {
            Some(s) => (&s.entries, s.rest),
            None => (NO_ENTRIES, 0),
        }
    }

    /// Stores a tail, dropping it when it says nothing.
    fn set_tail(&mut self, entries: Vec<(u32, i64)>, rest: i64) {
        self.sparse = (!entries.is_empty() || rest != 0).then(|| Box::new(Sparse { entries, rest }));
    }

    /// Sets `name`'s slot.
    #[inline]
    pub fn set(&mut self, name: ResourceName, value: i64) {
        match self.v.get_mut(name.index()) {
            Some(v) => *v = value,
            None => self.set_sparse(name.0, value),
        }
    }

    fn set_sparse(&mut self, slot: u32, value: i64) {
        let (entries, rest) = self.tail();
        let mut entries = entries.to_vec();
        match entries.binary_search_by_key(&slot, |(s, _)| *s) {
            Ok(i) if value == rest => {
                entries.remove(i);
            }
            Ok(i) => entries[i].1 = value,
            Err(_) if value == rest => {}
            Err(i) => entries.insert(i, (slot, value)),
        }
        self.set_tail(entries, rest);
    }

    /// Builder form of [`Resources::set`].
    #[must_use]
    pub fn with(mut self, name: ResourceName, value: i64) -> Self {
        self.set(name, value);
        self
    }

    /// Parses one quantity for `name` into this vector's unit for it (CPU rounds up to the millicore,
    /// everything else up to the unit).
    pub fn parse_quantity(name: &str, value: &str) -> Result<(ResourceName, i64), ResourceError> {
        let slot = ResourceName::intern(name)?;
        let invalid =
            |reason: String| ResourceError::InvalidQuantity { name: name.to_owned(), value: value.to_owned(), reason };
        let parsed = ParsedQuantity::try_from(value.trim()).map_err(|e| invalid(e.to_string()))?;
        let scaled = if slot.is_milli() { parsed * 1000 } else { parsed };
        let exact = scaled.to_bytes_f64().ok_or_else(|| invalid("out of range".into()))?;
        if exact < 0.0 {
            return Err(invalid("negative quantity".into()));
        }
        let rounded = exact.ceil();
        if rounded > i64::MAX as f64 {
            return Err(invalid("out of range".into()));
        }
        Ok((slot, rounded as i64))
    }

    /// Builds a vector from `(name, quantity)` pairs; a name given twice keeps the last value.
    pub fn from_quantities<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, ResourceError> {
        let mut r = Self::ZERO;
        for (name, value) in pairs {
            let (slot, v) = Self::parse_quantity(name, value)?;
            r.set(slot, v);
        }
        Ok(r)
    }

    /// Builds a vector from a Kubernetes resource list.
    pub fn from_resource_list(list: &BTreeMap<String, Quantity>) -> Result<Self, ResourceError> {
        Self::from_quantities(list.iter().map(|(k, v)| (k.as_str(), v.0.as_str())))
    }

    /// Converts back to a Kubernetes resource list (zero entries omitted).
    pub fn to_resource_list(&self) -> BTreeMap<String, Quantity> {
        self.iter().map(|(n, v)| (n.as_str().to_owned(), Quantity(format_quantity(n, v)))).collect()
    }

    /// The non-zero entries, in slot order. The unlisted tail of a [`Resources::splat`] vector is not
    /// enumerated.
    pub fn iter(&self) -> impl Iterator<Item = (ResourceName, i64)> + '_ {
        let inline = self.v.iter().enumerate().map(|(i, v)| (i as u32, *v));
        inline.chain(self.tail().0.iter().copied()).filter(|(_, v)| *v != 0).map(|(i, v)| (ResourceName(i), v))
    }

    /// Whether every entry is zero.
    pub fn is_zero(&self) -> bool {
        self.sparse.is_none() && self.v.iter().all(|v| *v == 0)
    }

    /// Applies `f` slot by slot to `self` and `other`, in place.
    #[inline(always)]
    fn zip_assign(&mut self, other: &Self, f: impl Fn(i64, i64) -> i64) {
        for (a, b) in self.v.iter_mut().zip(other.v.iter()) {
            *a = f(*a, *b);
        }
        if self.sparse.is_some() || other.sparse.is_some() {
            self.zip_sparse(other, f);
        }
    }

    #[cold]
    #[inline(never)]
    fn zip_sparse(&mut self, other: &Self, f: impl Fn(i64, i64) -> i64) {
        let ((a, a_rest), (b, b_rest)) = (self.tail(), other.tail());
        let rest = f(a_rest, b_rest);
        let mut out = Vec::with_capacity(a.len() + b.len());
        merge_sparse(a, a_rest, b, b_rest, |slot, x, y| {
            let v = f(x, y);
            if v != rest {
                out.push((slot, v));
            }
            true
        });
        self.set_tail(out, rest);
    }

    /// Applies `f` to every slot, in place.
    fn map_assign(&mut self, f: impl Fn(i64) -> i64) {
        for v in self.v.iter_mut() {
            *v = f(*v);
        }
        if self.sparse.is_some() {
            let (entries, rest) = self.tail();
            let rest = f(rest);
            let entries = entries.iter().map(|(s, v)| (*s, f(*v))).filter(|(_, v)| *v != rest).collect();
            self.set_tail(entries, rest);
        }
    }

    /// Element-wise saturating sum.
    #[must_use]
    #[inline]
    pub fn add(&self, other: &Self) -> Self {
        let mut out = self.clone();
        out.add_assign(other);
        out
    }

    /// In-place element-wise saturating sum.
    #[inline]
    pub fn add_assign(&mut self, other: &Self) {
        self.zip_assign(other, i64::saturating_add);
    }

    /// Element-wise saturating difference (may go negative).
    #[must_use]
    #[inline]
    pub fn sub(&self, other: &Self) -> Self {
        let mut out = self.clone();
        out.sub_assign(other);
        out
    }

    /// In-place element-wise saturating difference.
    #[inline]
    pub fn sub_assign(&mut self, other: &Self) {
        self.zip_assign(other, i64::saturating_sub);
    }

    /// Element-wise difference clamped at zero.
    #[must_use]
    pub fn sub_clamped(&self, other: &Self) -> Self {
        let mut out = self.sub(other);
        out.map_assign(|v| v.max(0));
        out
    }

    /// Element-wise maximum.
    #[must_use]
    #[inline]
    pub fn max(&self, other: &Self) -> Self {
        let mut out = self.clone();
        out.max_assign(other);
        out
    }

    /// In-place element-wise maximum.
    #[inline]
    pub fn max_assign(&mut self, other: &Self) {
        self.zip_assign(other, i64::max);
    }

    /// The element-wise maximum of `vectors` and zero.
    pub fn max_of<'r>(vectors: impl IntoIterator<Item = &'r Self>) -> Self {
        // The inline slots accumulate in a local array; the few vectors with a tail are merged after.
        let mut v = [0_i64; INLINE];
        let mut tails: Vec<&Self> = Vec::new();
        for r in vectors {
            for (a, b) in v.iter_mut().zip(r.v.iter()) {
                if *b > *a {
                    *a = *b;
                }
            }
            if r.sparse.is_some() {
                tails.push(r);
            }
        }
        let mut out = Self { v, sparse: None };
        for r in tails {
            out.zip_sparse(r, i64::max);
        }
        out
    }

    /// The element-wise sum of `vectors` (zero for none).
    pub fn sum_of<'r>(vectors: impl IntoIterator<Item = &'r Self>) -> Self {
        let mut out = Self::ZERO;
        for v in vectors {
            out.add_assign(v);
        }
        out
    }

    /// Element-wise product by an integer factor.
    #[must_use]
    pub fn scale(&self, factor: i64) -> Self {
        let mut out = self.clone();
        out.map_assign(|v| v.saturating_mul(factor));
        out
    }

    /// Whether every entry of `self` is at most the matching entry of `available`.
    #[inline]
    pub fn fits(&self, available: &Self) -> bool {
        if !self.v.iter().zip(available.v.iter()).all(|(a, b)| a <= b) {
            return false;
        }
        if self.sparse.is_none() && available.sparse.is_none() {
            return true;
        }
        let ((a, a_rest), (b, b_rest)) = (self.tail(), available.tail());
        a_rest <= b_rest && merge_sparse(a, a_rest, b, b_rest, |_, x, y| x <= y)
    }

    /// Raises each of the first [`INLINE`] entries of `self` to `other`'s where `other`'s is larger. Folded
    /// over several vectors, it gives a ceiling on what any of them holds of those names, for
    /// [`Resources::under_inline`]; the sparse tail is left as it is.
    pub fn raise_inline(&mut self, other: &Self) {
        for (a, b) in self.v.iter_mut().zip(other.v.iter()) {
            *a = (*a).max(*b);
        }
    }

    /// Whether each of the first [`INLINE`] entries of `self` is at most `ceiling`'s. When not, `self`
    /// [`fits`](Resources::fits) in no vector at or under that ceiling in those entries: a quick test that
    /// rules a whole set of vectors out at once.
    #[inline]
    pub fn under_inline(&self, ceiling: &Self) -> bool {
        self.v.iter().zip(ceiling.v.iter()).all(|(a, b)| a <= b)
    }

    /// The names of the entries of `self` that exceed `available`.
    pub fn exceeding(&self, available: &Self) -> Vec<ResourceName> {
        let mut out: Vec<ResourceName> = self
            .v
            .iter()
            .zip(available.v.iter())
            .enumerate()
            .filter(|(_, (a, b))| a > b)
            .map(|(i, _)| ResourceName(i as u32))
            .collect();
        let ((a, a_rest), (b, b_rest)) = (self.tail(), available.tail());
        if a_rest > b_rest {
            // Every unlisted name exceeds: walk all the names interned past the inline array.
            let interned = registry().read().unwrap_or_else(PoisonError::into_inner).names.len();
            out.extend((INLINE..interned).map(|i| ResourceName(i as u32)).filter(|n| self.get(*n) > available.get(*n)));
        } else {
            merge_sparse(a, a_rest, b, b_rest, |slot, x, y| {
                if x > y {
                    out.push(ResourceName(slot));
                }
                true
            });
        }
        out
    }
}

/// Walks the union of two sparse lists in slot order, calling `visit(slot, a, b)` with each side's value
/// (its `rest` where it has no entry), and stops early when `visit` answers false. Answers whether every
/// visit answered true.
fn merge_sparse(
    a: &[(u32, i64)],
    a_rest: i64,
    b: &[(u32, i64)],
    b_rest: i64,
    mut visit: impl FnMut(u32, i64, i64) -> bool,
) -> bool {
    let (mut i, mut j) = (0, 0);
    loop {
        let step = match (a.get(i), b.get(j)) {
            (None, None) => return true,
            (Some(&(s, x)), None) => {
                i += 1;
                (s, x, b_rest)
            }
            (None, Some(&(s, y))) => {
                j += 1;
                (s, a_rest, y)
            }
            (Some(&(s, x)), Some(&(t, y))) => match s.cmp(&t) {
                std::cmp::Ordering::Less => {
                    i += 1;
                    (s, x, b_rest)
                }
                std::cmp::Ordering::Greater => {
                    j += 1;
                    (t, a_rest, y)
                }
                std::cmp::Ordering::Equal => {
                    i += 1;
                    j += 1;
                    (s, x, y)
                }
            },
        };
        if !visit(step.0, step.1, step.2) {
            return false;
        }
    }
}

/// Formats a value of `name` the way Kubernetes would print it (`700m`, `2`, `1Gi`, `512Mi`).
pub fn format_quantity(name: ResourceName, value: i64) -> String {
    if name.is_milli() {
        if value % 1000 == 0 { format!("{}", value / 1000) } else { format!("{value}m") }
    } else if name.is_bytes() && value != 0 {
        const UNITS: [(&str, i64); 4] = [("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
        UNITS
            .iter()
            .find(|(_, size)| value % size == 0)
            .map(|(unit, size)| format!("{}{unit}", value / size))
            .unwrap_or_else(|| value.to_string())
    } else {
        value.to_string()
    }
}

impl fmt::Debug for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (n, v) in self.iter() {
            m.entry(&n.as_str(), &format_quantity(n, v));
        }
        m.finish()
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> =
            self.iter().map(|(n, v)| format!("{}={}", n.as_str(), format_quantity(n, v))).collect();
        if parts.is_empty() { f.write_str("{}") } else { write!(f, "{{{}}}", parts.join(", ")) }
    }
}

impl Serialize for Resources {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let map: BTreeMap<&str, String> = self.iter().map(|(n, v)| (n.as_str(), format_quantity(n, v))).collect();
        map.serialize(serializer)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum QuantityValue {
    Text(String),
    Int(i64),
    Float(f64),
}

impl<'de> Deserialize<'de> for Resources {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = BTreeMap::<String, QuantityValue>::deserialize(deserializer)?;
        let mut r = Resources::ZERO;
        for (name, value) in raw {
            let text = match value {
                QuantityValue::Text(s) => s,
                QuantityValue::Int(i) => i.to_string(),
                QuantityValue::Float(f) => f.to_string(),
            };
            let (slot, v) = Resources::parse_quantity(&name, &text).map_err(D::Error::custom)?;
            r.set(slot, v);
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_quantities_into_base_units() {
        let r = Resources::from_quantities([
            ("cpu", "700m"),
            ("memory", "1Gi"),
            ("pods", "58"),
            ("nvidia.com/gpu", "1"),
            ("ephemeral-storage", "10G"),
        ])
        .unwrap();
        assert_eq!(r.get(ResourceName::CPU), 700);
        assert_eq!(r.get(ResourceName::MEMORY), 1 << 30);
        assert_eq!(r.get(ResourceName::PODS), 58);
        assert_eq!(r.get(ResourceName::NVIDIA_GPU), 1);
        assert_eq!(r.get(ResourceName::EPHEMERAL_STORAGE), 10_000_000_000);
        assert_eq!(Resources::parse_quantity("cpu", "1.5").unwrap().1, 1500);
        assert_eq!(Resources::parse_quantity("cpu", "0.0001").unwrap().1, 1, "cpu rounds up to 1m");
    }

    #[test]
    fn rejects_bad_quantities_naming_the_resource() {
        let err = Resources::from_quantities([("memory", "lots")]).unwrap_err();
        assert!(err.to_string().contains("\"memory\""), "{err}");
        assert!(err.to_string().contains("lots"), "{err}");
        assert!(Resources::from_quantities([("cpu", "-1")]).is_err());
    }

    #[test]
    fn arithmetic_and_fit() {
        let a = Resources::cpu_memory(500, 1 << 30);
        let b = Resources::cpu_memory(1500, 1 << 29);
        assert_eq!(a.add(&b), Resources::cpu_memory(2000, (1 << 30) + (1 << 29)));
        assert_eq!(a.max(&b), Resources::cpu_memory(1500, 1 << 30));
        assert!(a.fits(&a.add(&b)));
        assert!(!b.fits(&a));
        assert_eq!(b.exceeding(&a), vec![ResourceName::CPU]);
        assert_eq!(a.sub_clamped(&b), Resources::cpu_memory(0, 1 << 29));
    }

    #[test]
    fn extended_resources_are_interned() {
        let slot = ResourceName::intern("example.com/fpga").unwrap();
        assert_eq!(ResourceName::intern("example.com/fpga").unwrap(), slot);
        assert_eq!(slot.as_str(), "example.com/fpga");
    }

    /// A reference model: a map of slot to value with a default for every slot not in it.
    fn model(r: &Resources, slots: &[ResourceName]) -> Vec<i64> {
        slots.iter().map(|s| r.get(*s)).collect()
    }

    fn many_names() -> Vec<ResourceName> {
        let mut slots = vec![ResourceName::CPU, ResourceName::MEMORY, ResourceName::NVIDIA_GPU];
        slots.extend((0..40).map(|i| ResourceName::intern(&format!("example.com/device-{i}")).unwrap()));
        slots
    }

    #[test]
    fn names_past_the_inline_slots_are_stored_sparsely_and_compare_exactly() {
        let slots = many_names();
        let far = slots[slots.len() - 1];
        assert!(far.index() >= INLINE, "the test needs a name past the inline array");
        let mut a = Resources::cpu_memory(1000, 1 << 30).with(far, 3);
        assert_eq!(a.get(far), 3);
        assert_eq!(a.to_string().matches("example.com/device-39=3").count(), 1, "{a}");
        let b = Resources::ZERO.with(far, 5);
        assert!(!b.fits(&a));
        assert_eq!(b.exceeding(&a), vec![far]);
        assert!(a.fits(&a.add(&b)));
        a.sub_assign(&Resources::ZERO.with(far, 3));
        assert_eq!(a, Resources::cpu_memory(1000, 1 << 30), "a slot back at zero is not stored");
        let unlimited = Resources::splat(i64::MAX).with(ResourceName::CPU, 500);
        assert!(b.fits(&unlimited), "splat covers names interned after it");
        assert!(!Resources::cpu_memory(501, 0).fits(&unlimited));
        let parsed = Resources::from_quantities([("example.com/device-39", "2"), ("cpu", "1")]).unwrap();
        let json = serde_json::to_value(&parsed).unwrap();
        assert_eq!(json, serde_json::json!({"cpu": "1", "example.com/device-39": "2"}));
        assert_eq!(serde_json::from_value::<Resources>(json).unwrap(), parsed);
    }

    proptest::proptest! {
        #[test]
        fn sparse_arithmetic_matches_the_per_slot_model(
            xs in proptest::collection::vec((0usize..43, -50i64..50), 0..12),
            ys in proptest::collection::vec((0usize..43, -50i64..50), 0..12),
            splat_x in proptest::bool::ANY,
            factor in -3i64..4,
        ) {
            let slots = many_names();
            let build = |entries: &[(usize, i64)], base: Resources| {
                entries.iter().fold(base, |r, (i, v)| r.with(slots[*i], *v))
            };
            let x = build(&xs, if splat_x { Resources::splat(7) } else { Resources::ZERO });
            let y = build(&ys, Resources::ZERO);
            let (mx, my) = (model(&x, &slots), model(&y, &slots));
            let zip = |f: fn(i64, i64) -> i64| mx.iter().zip(&my).map(|(a, b)| f(*a, *b)).collect::<Vec<_>>();
            proptest::prop_assert_eq!(model(&x.add(&y), &slots), zip(i64::saturating_add));
            proptest::prop_assert_eq!(model(&x.sub(&y), &slots), zip(i64::saturating_sub));
            proptest::prop_assert_eq!(model(&x.max(&y), &slots), zip(i64::max));
            proptest::prop_assert_eq!(model(&x.sub_clamped(&y), &slots), zip(|a, b| a.saturating_sub(b).max(0)));
            proptest::prop_assert_eq!(
                model(&x.scale(factor), &slots),
                mx.iter().map(|a| a.saturating_mul(factor)).collect::<Vec<_>>()
            );
            // Beyond the named slots, only a splat's tail matters for fits.
            let fits = mx.iter().zip(&my).all(|(a, b)| a <= b) && (!splat_x || 7 <= 0);
            proptest::prop_assert_eq!(x.fits(&y), fits);
            let exceeding: Vec<ResourceName> =
                slots.iter().zip(mx.iter().zip(&my)).filter(|(_, (a, b))| a > b).map(|(s, _)| *s).collect();
            let mut got = x.exceeding(&y);
            got.retain(|s| slots.contains(s));
            got.sort();
            let mut want = exceeding;
            want.sort();
            proptest::prop_assert_eq!(got, want);
            // Equal values are equal vectors, however they were built.
            let rebuilt = slots.iter().fold(
                if splat_x { Resources::splat(7) } else { Resources::ZERO },
                |r, s| r.with(*s, x.get(*s)),
            );
            proptest::prop_assert_eq!(&rebuilt, &x);
            proptest::prop_assert_eq!(x.is_zero(), !splat_x && mx.iter().all(|v| *v == 0) && x.iter().next().is_none());
        }
    }

    #[test]
    fn formats_like_kubernetes_and_round_trips_through_serde() {
        let r = Resources::from_quantities([("cpu", "2"), ("memory", "512Mi"), ("nvidia.com/gpu", "4")]).unwrap();
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json, serde_json::json!({"cpu": "2", "memory": "512Mi", "nvidia.com/gpu": "4"}));
        let back: Resources =
            serde_json::from_value(serde_json::json!({"cpu": 2, "memory": "512Mi", "nvidia.com/gpu": "4"})).unwrap();
        assert_eq!(back, r);
        assert_eq!(format_quantity(ResourceName::CPU, 700), "700m");
    }
}
