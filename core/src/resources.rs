//! Compact resource vectors.
//!
//! Kubernetes speaks of resources as maps of names to quantity strings (`cpu: 500m`, `memory: 1Gi`,
//! `nvidia.com/gpu: "1"`). tenon converts them once, at the edge, into a [`Resources`]: a fixed array of
//! integers indexed by [`ResourceName`] slots. CPU is counted in millicores, every other resource in its base
//! unit (bytes, pods, devices). Arithmetic and fit checks are then a handful of integer operations with no
//! allocation, which is what the scheduler's hot path needs.
//!
//! The first slots are fixed (`cpu`, `memory`, `pods`, `ephemeral-storage`, and the common accelerators);
//! any other extended resource name is interned into a free slot the first time it is seen.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{OnceLock, PoisonError, RwLock};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_quantity::ParsedQuantity;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How many distinct resource names one process can track.
pub const SLOTS: usize = 16;

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

fn registry() -> &'static RwLock<Vec<&'static str>> {
    static NAMES: OnceLock<RwLock<Vec<&'static str>>> = OnceLock::new();
    NAMES.get_or_init(|| RwLock::new(WELL_KNOWN.to_vec()))
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
    /// More distinct resource names than [`SLOTS`].
    #[error("resource {name:?}: too many distinct resource names (at most {SLOTS})")]
    TooManyResources {
        /// The name that did not fit.
        name: String,
    },
}

/// A slot in a [`Resources`] vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName(u8);

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
        let mut names = registry().write().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = names.iter().position(|n| *n == name) {
            return Ok(Self(i as u8));
        }
        if names.len() >= SLOTS {
            return Err(ResourceError::TooManyResources { name: name.to_owned() });
        }
        // Bounded by SLOTS: at most a handful of names are ever leaked per process.
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.push(leaked);
        Ok(Self((names.len() - 1) as u8))
    }

    /// The slot for `name` if it is known.
    pub fn lookup(name: &str) -> Option<Self> {
        let names = registry().read().unwrap_or_else(PoisonError::into_inner);
        names.iter().position(|n| *n == name).map(|i| Self(i as u8))
    }

    /// The resource's Kubernetes name.
    pub fn as_str(self) -> &'static str {
        let names = registry().read().unwrap_or_else(PoisonError::into_inner);
        names.get(self.0 as usize).copied().unwrap_or("unknown")
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
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Resources {
    v: [i64; SLOTS],
}

impl Resources {
    /// The zero vector.
    pub const ZERO: Self = Self { v: [0; SLOTS] };

    /// A vector with every entry set to `value`.
    pub const fn splat(value: i64) -> Self {
        Self { v: [value; SLOTS] }
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
        self.v[name.index()]
    }

    /// Sets `name`'s slot.
    #[inline]
    pub fn set(&mut self, name: ResourceName, value: i64) {
        self.v[name.index()] = value;
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

    /// The non-zero entries.
    pub fn iter(&self) -> impl Iterator<Item = (ResourceName, i64)> + '_ {
        self.v.iter().enumerate().filter(|(_, v)| **v != 0).map(|(i, v)| (ResourceName(i as u8), *v))
    }

    /// Whether every entry is zero.
    pub fn is_zero(&self) -> bool {
        self.v.iter().all(|v| *v == 0)
    }

    /// Element-wise saturating sum.
    #[must_use]
    #[inline]
    pub fn add(&self, other: &Self) -> Self {
        let mut out = *self;
        out.add_assign(other);
        out
    }

    /// In-place element-wise saturating sum.
    #[inline]
    pub fn add_assign(&mut self, other: &Self) {
        for (a, b) in self.v.iter_mut().zip(other.v.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    /// Element-wise saturating difference (may go negative).
    #[must_use]
    #[inline]
    pub fn sub(&self, other: &Self) -> Self {
        let mut out = *self;
        out.sub_assign(other);
        out
    }

    /// In-place element-wise saturating difference.
    #[inline]
    pub fn sub_assign(&mut self, other: &Self) {
        for (a, b) in self.v.iter_mut().zip(other.v.iter()) {
            *a = a.saturating_sub(*b);
        }
    }

    /// Element-wise difference clamped at zero.
    #[must_use]
    pub fn sub_clamped(&self, other: &Self) -> Self {
        let mut out = self.sub(other);
        for v in out.v.iter_mut() {
            *v = (*v).max(0);
        }
        out
    }

    /// Element-wise maximum.
    #[must_use]
    #[inline]
    pub fn max(&self, other: &Self) -> Self {
        let mut out = *self;
        for (a, b) in out.v.iter_mut().zip(other.v.iter()) {
            *a = (*a).max(*b);
        }
        out
    }

    /// Element-wise product by an integer factor.
    #[must_use]
    pub fn scale(&self, factor: i64) -> Self {
        let mut out = *self;
        for v in out.v.iter_mut() {
            *v = v.saturating_mul(factor);
        }
        out
    }

    /// Whether every entry of `self` is at most the matching entry of `available`.
    #[inline]
    pub fn fits(&self, available: &Self) -> bool {
        self.v.iter().zip(available.v.iter()).all(|(a, b)| a <= b)
    }

    /// The names of the entries of `self` that exceed `available`.
    pub fn exceeding(&self, available: &Self) -> Vec<ResourceName> {
        self.v
            .iter()
            .zip(available.v.iter())
            .enumerate()
            .filter(|(_, (a, b))| a > b)
            .map(|(i, _)| ResourceName(i as u8))
            .collect()
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

    #[test]
    fn formats_like_kubernetes_and_round_trips_through_serde() {
        let r = Resources::from_quantities([("cpu", "2"), ("memory", "512Mi"), ("nvidia.com/gpu", "4")]).unwrap();
        let json = serde_json::to_value(r).unwrap();
        assert_eq!(json, serde_json::json!({"cpu": "2", "memory": "512Mi", "nvidia.com/gpu": "4"}));
        let back: Resources =
            serde_json::from_value(serde_json::json!({"cpu": 2, "memory": "512Mi", "nvidia.com/gpu": "4"})).unwrap();
        assert_eq!(back, r);
        assert_eq!(format_quantity(ResourceName::CPU, 700), "700m");
    }
}
