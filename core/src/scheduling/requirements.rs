//! The requirements algebra: sets of label values per key, with every operator, intersection and the
//! compatibility rules Karpenter uses.
//!
//! A [`Requirement`] is a set of values for one key: either a concrete set (`In`, `DoesNotExist` as the
//! empty set), or the complement of one (`NotIn`, `Exists` as the complement of nothing), optionally
//! bounded by integers (`Gt`/`Gte` as an inclusive lower bound, `Lt`/`Lte` as an inclusive upper bound).
//! Values are kept sorted, so intersections are merges with no hashing. A requirement's key and values are
//! shared, not copied, by its clones and by intersections that leave a side's values as they were: the
//! scheduler copies and narrows requirements for every target it tries.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use crate::api::{NodeSelectorRequirement, Operator, labels};

/// The values one label key may take.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: Arc<str>,
    complement: bool,
    values: Arc<[String]>,
    gte: Option<i64>,
    lte: Option<i64>,
    min_values: Option<u32>,
}

fn sorted(values: impl IntoIterator<Item = impl Into<String>>) -> Arc<[String]> {
    let mut v: Vec<String> = values.into_iter().map(Into::into).collect();
    v.sort_unstable();
    v.dedup();
    v.into()
}

impl Requirement {
    /// `key In values`.
    pub fn is_in(key: &str, values: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            key: Arc::from(labels::normalize(key)),
            complement: false,
            values: sorted(values),
            gte: None,
            lte: None,
            min_values: None,
        }
    }

    /// `key NotIn values`.
    pub fn not_in(key: &str, values: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self { complement: true, ..Self::is_in(key, values) }
    }

    /// `key Exists`: any value.
    pub fn exists(key: &str) -> Self {
        Self::not_in(key, Vec::<String>::new())
    }

    /// `key DoesNotExist`: no value.
    pub fn does_not_exist(key: &str) -> Self {
        Self::is_in(key, Vec::<String>::new())
    }

    /// Builds a requirement from an operator and values. `Gt`/`Lt` with a non-integer value, or any
    /// operator given the wrong number of values, yields the empty set (nothing satisfies it).
    pub fn new(key: &str, operator: Operator, values: &[String]) -> Self {
        let bound = || match values {
            [v] => v.trim().parse::<i64>().ok(),
            _ => None,
        };
        match operator {
            Operator::In => Self::is_in(key, values.iter().cloned()),
            Operator::NotIn => Self::not_in(key, values.iter().cloned()),
            Operator::Exists => Self::exists(key),
            Operator::DoesNotExist => Self::does_not_exist(key),
            Operator::Gt | Operator::Gte | Operator::Lt | Operator::Lte => match bound() {
                None => Self::does_not_exist(key),
                Some(b) => {
                    let mut r = Self::exists(key);
                    match operator {
                        Operator::Gt => r.gte = b.checked_add(1),
                        Operator::Gte => r.gte = Some(b),
                        Operator::Lt => r.lte = b.checked_sub(1),
                        _ => r.lte = Some(b),
                    }
                    if r.gte.is_none() && r.lte.is_none() {
                        return Self::does_not_exist(key);
                    }
                    r
                }
            },
        }
    }

    /// From an API requirement, keeping `minValues`.
    pub fn from_api(r: &NodeSelectorRequirement) -> Self {
        let mut out = Self::new(&r.key, r.operator, &r.values);
        out.min_values = r.min_values.and_then(|m| u32::try_from(m).ok());
        out
    }

    /// The (normalized) key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The `minValues` flexibility floor.
    pub fn min_values(&self) -> Option<u32> {
        self.min_values
    }

    /// Sets the `minValues` floor.
    pub fn set_min_values(&mut self, min: Option<u32>) {
        self.min_values = min;
    }

    /// Whether this is a complement set (`NotIn`, `Exists`, bounds).
    pub fn is_complement(&self) -> bool {
        self.complement
    }

    /// Whether intersecting `other` into `self` would leave `self` as it is because both are the same
    /// `In` set (an `In` set is its own intersection); a cheap test that never builds the intersection.
    pub fn absorbs_same(&self, other: &Self) -> bool {
        !self.complement && self.gte.is_none() && self.lte.is_none() && self == other
    }

    /// The concrete values (for a complement, the excluded values).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    fn in_bounds(&self, v: &str) -> bool {
        in_bounds(self.gte, self.lte, v)
    }

    /// Whether `value` is in the set.
    pub fn has(&self, value: &str) -> bool {
        if self.complement {
            self.values.binary_search_by(|v| v.as_str().cmp(value)).is_err() && self.in_bounds(value)
        } else {
            self.values.binary_search_by(|v| v.as_str().cmp(value)).is_ok()
        }
    }

    /// Whether the set is empty (nothing satisfies it, or the label must be absent).
    pub fn is_empty(&self) -> bool {
        if self.complement {
            matches!((self.gte, self.lte), (Some(g), Some(l)) if g > l)
        } else {
            self.values.is_empty()
        }
    }

    /// How many values the set holds (`u64::MAX` minus the exclusions for a complement).
    pub fn len(&self) -> u64 {
        if self.complement {
            match (self.gte, self.lte) {
                (Some(g), Some(l)) if g <= l => (l - g + 1) as u64,
                (Some(g), Some(l)) if g > l => 0,
                _ => u64::MAX - self.values.len() as u64,
            }
        } else {
            self.values.len() as u64
        }
    }

    /// One value of the set, if it is concrete and non-empty (the smallest).
    pub fn any(&self) -> Option<&str> {
        if self.complement { None } else { self.values.first().map(String::as_str) }
    }

    /// The single value of a concrete one-value set.
    pub fn single(&self) -> Option<&str> {
        match (self.complement, &*self.values) {
            (false, [v]) => Some(v),
            _ => None,
        }
    }

    /// The operator this set would be written with.
    pub fn operator(&self) -> Operator {
        if self.complement {
            match (self.gte, self.lte, self.values.is_empty()) {
                (Some(_), _, _) => Operator::Gte,
                (None, Some(_), _) => Operator::Lte,
                (None, None, true) => Operator::Exists,
                (None, None, false) => Operator::NotIn,
            }
        } else if self.values.is_empty() {
            Operator::DoesNotExist
        } else {
            Operator::In
        }
    }

    /// Whether `NotIn` or `DoesNotExist`: a side that two requirements with no value in common may still
    /// agree on, as the label's absence (Karpenter's `Intersects`). `Exists` is not one: it needs a value.
    fn allows_absence(&self) -> bool {
        matches!(self.operator(), Operator::NotIn | Operator::DoesNotExist)
    }

    /// The intersection of two sets for the same key.
    pub fn intersect(&self, other: &Self) -> Self {
        let gte = match (self.gte, other.gte) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let lte = match (self.lte, other.lte) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let min_values = match (self.min_values, other.min_values) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let key = Arc::clone(&self.key);
        match (self.complement, other.complement) {
            (true, true) => {
                let bounded = gte.is_some() || lte.is_some();
                let excluded = |v: &&String| in_bounds(gte, lte, v);
                let values = if !bounded && other.values.is_empty() {
                    Arc::clone(&self.values)
                } else if !bounded && self.values.is_empty() {
                    Arc::clone(&other.values)
                } else {
                    let mut values: Vec<String> =
                        self.values.iter().chain(other.values.iter()).filter(excluded).cloned().collect();
                    values.sort_unstable();
                    values.dedup();
                    values.into()
                };
                Self { key, complement: true, values, gte, lte, min_values }
            }
            (false, false) => {
                let values = merge_intersection(&self.values, &other.values);
                Self { key, complement: false, values, gte: None, lte: None, min_values }
            }
            (true, false) | (false, true) => {
                let (set, comp) = if self.complement { (other, self) } else { (self, other) };
                let values = if set.values.iter().all(|v| comp.has(v)) {
                    Arc::clone(&set.values)
                } else {
                    set.values.iter().filter(|v| comp.has(v)).cloned().collect()
                };
                Self { key, complement: false, values, gte: None, lte: None, min_values }
            }
        }
    }

    /// Whether the intersection is non-empty, without building it.
    pub fn intersects(&self, other: &Self) -> bool {
        match (self.complement, other.complement) {
            (false, false) => has_common(&self.values, &other.values),
            (true, false) => other.values.iter().any(|v| self.has(v)),
            (false, true) => self.values.iter().any(|v| other.has(v)),
            (true, true) => !self.intersect(other).is_empty(),
        }
    }

    /// Whether a concrete node label (`None`: absent) satisfies the set.
    pub fn matches(&self, value: Option<&str>) -> bool {
        match value {
            Some(v) => self.has(v),
            // An absent label satisfies `DoesNotExist` and `NotIn`, not `Exists` or bounds.
            None => matches!(self.operator(), Operator::DoesNotExist | Operator::NotIn),
        }
    }

    /// As an API requirement.
    pub fn to_api(&self) -> NodeSelectorRequirement {
        let op = self.operator();
        let values = match op {
            Operator::Gte => vec![self.gte.unwrap_or_default().to_string()],
            Operator::Lte => vec![self.lte.unwrap_or_default().to_string()],
            Operator::Exists | Operator::DoesNotExist => Vec::new(),
            _ => self.values.to_vec(),
        };
        NodeSelectorRequirement {
            key: self.key.to_string(),
            operator: op,
            values,
            min_values: self.min_values.and_then(|m| i32::try_from(m).ok()),
        }
    }
}

/// Whether `v` is an integer within the inclusive bounds, if there are any.
fn in_bounds(gte: Option<i64>, lte: Option<i64>, v: &str) -> bool {
    if gte.is_none() && lte.is_none() {
        return true;
    }
    match v.parse::<i64>() {
        Ok(n) => gte.is_none_or(|g| n >= g) && lte.is_none_or(|l| n <= l),
        Err(_) => false,
    }
}

/// The values two sorted sets share: one of them, shared, when it holds nothing the other lacks.
fn merge_intersection(a: &Arc<[String]>, b: &Arc<[String]>) -> Arc<[String]> {
    let common = count_common(a, b);
    if common == a.len() {
        return Arc::clone(a);
    }
    if common == b.len() {
        return Arc::clone(b);
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::with_capacity(common));
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                out.push(a[i].clone());
                i += 1;
                j += 1;
            }
        }
    }
    out.into()
}

fn count_common(a: &[String], b: &[String]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

fn has_common(a: &[String], b: &[String]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => return true,
        }
    }
    false
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.operator() {
            Operator::Exists => write!(f, "{} Exists", self.key),
            Operator::DoesNotExist => write!(f, "{} DoesNotExist", self.key),
            Operator::Gte => write!(f, "{} >= {}", self.key, self.gte.unwrap_or_default()),
            Operator::Lte => write!(f, "{} <= {}", self.key, self.lte.unwrap_or_default()),
            op => write!(f, "{} {:?} [{}]", self.key, op, self.values.join(", ")),
        }
    }
}

/// Requirements on several keys, each a [`Requirement`], kept sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Requirements(Vec<Requirement>);

/// Why two sets of requirements cannot be satisfied together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incompatible {
    /// The key on which they disagree.
    pub key: String,
    /// A human-readable explanation.
    pub reason: String,
}

impl fmt::Display for Incompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl Requirements {
    /// No requirements.
    pub fn new() -> Self {
        Self::default()
    }

    /// From API requirements (intersecting repeated keys).
    pub fn from_api<'a>(reqs: impl IntoIterator<Item = &'a NodeSelectorRequirement>) -> Self {
        let mut out = Self::new();
        for r in reqs {
            out.add(Requirement::from_api(r));
        }
        out
    }

    /// From single-valued labels (`key In [value]`).
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        let mut out = Self::new();
        for (k, v) in labels {
            out.add(Requirement::is_in(k, [v.clone()]));
        }
        out
    }

    /// Intersects `req` into the set.
    pub fn add(&mut self, req: Requirement) {
        match self.0.binary_search_by(|r| (*r.key).cmp(&*req.key)) {
            Ok(i) => {
                let merged = self.0[i].intersect(&req);
                self.0[i] = merged;
            }
            Err(i) => self.0.insert(i, req),
        }
    }

    /// Sets the requirement on `req`'s key to `req`, whatever was there.
    pub fn replace(&mut self, req: Requirement) {
        match self.0.binary_search_by(|r| (*r.key).cmp(&*req.key)) {
            Ok(i) => self.0[i] = req,
            Err(i) => self.0.insert(i, req),
        }
    }

    /// Intersects every requirement of `other` into the set.
    pub fn add_all(&mut self, other: &Self) {
        for r in &other.0 {
            self.add(r.clone());
        }
    }

    /// The requirement on `key`, if any.
    pub fn get(&self, key: &str) -> Option<&Requirement> {
        self.0.binary_search_by(|r| (*r.key).cmp(key)).ok().map(|i| &self.0[i])
    }

    /// Whether `key` is constrained.
    pub fn has_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Removes the requirement on `key`.
    pub fn remove(&mut self, key: &str) -> Option<Requirement> {
        self.0.binary_search_by(|r| (*r.key).cmp(key)).ok().map(|i| self.0.remove(i))
    }

    /// Every requirement, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = &Requirement> {
        self.0.iter()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `incoming` (a pod's requirements) can be satisfied on a node described by `self`.
    ///
    /// A key `incoming` constrains but `self` does not define is allowed when it is well known (every
    /// provider defines it) and `allow_undefined_well_known` is set, or when `incoming` only excludes
    /// values (`NotIn`, `DoesNotExist`). Keys both define must intersect, unless both only exclude.
    pub fn compatible(&self, incoming: &Self, allow_undefined_well_known: bool) -> Result<(), Incompatible> {
        self.compatible_with(incoming, |key| allow_undefined_well_known && labels::is_well_known(key))
    }

    /// As [`Requirements::compatible`], with `may_be_undefined` saying which keys `self` may leave
    /// undefined (the well-known keys, and those its instance types define).
    pub fn compatible_with(
        &self,
        incoming: &Self,
        may_be_undefined: impl Fn(&str) -> bool,
    ) -> Result<(), Incompatible> {
        match self.first_incompatible(incoming, may_be_undefined) {
            None => Ok(()),
            Some((r, None)) => Err(Incompatible {
                key: r.key.to_string(),
                reason: format!("label {:?} does not exist (requires {r})", r.key),
            }),
            Some((r, Some(mine))) => Err(Incompatible {
                key: r.key.to_string(),
                reason: format!("requires {r}, but the node offers {mine}"),
            }),
        }
    }

    /// As [`Requirements::compatible`], without saying why not: for the many checks whose failures nobody
    /// reads, which then allocate nothing.
    pub fn is_compatible(&self, incoming: &Self, allow_undefined_well_known: bool) -> bool {
        self.first_incompatible(incoming, |key| allow_undefined_well_known && labels::is_well_known(key)).is_none()
    }

    /// The first requirement of `incoming` a node described by `self` cannot satisfy, with `self`'s
    /// requirement on its key (`None`: `self` leaves the key undefined).
    fn first_incompatible<'a>(
        &'a self,
        incoming: &'a Self,
        may_be_undefined: impl Fn(&str) -> bool,
    ) -> Option<(&'a Requirement, Option<&'a Requirement>)> {
        incoming.0.iter().find_map(|r| match self.get(&r.key) {
            None => {
                let excludes_only = matches!(r.operator(), Operator::NotIn | Operator::DoesNotExist);
                (!(excludes_only || may_be_undefined(&r.key))).then_some((r, None))
            }
            Some(mine) => {
                (!(mine.intersects(r) || mine.allows_absence() && r.allows_absence())).then_some((r, Some(mine)))
            }
        })
    }

    /// Whether every key both define intersects (keys only one side defines are ignored).
    pub fn intersects(&self, other: &Self) -> Result<(), Incompatible> {
        match self.first_disjoint(other) {
            None => Ok(()),
            Some((a, b)) => {
                Err(Incompatible { key: a.key.to_string(), reason: format!("requires {b}, but offers {a}") })
            }
        }
    }

    /// As [`Requirements::intersects`], without saying why not (nothing is allocated).
    pub fn is_intersecting(&self, other: &Self) -> bool {
        self.first_disjoint(other).is_none()
    }

    /// The first key both define on which `self`'s requirement and `other`'s do not intersect.
    fn first_disjoint<'a>(&'a self, other: &'a Self) -> Option<(&'a Requirement, &'a Requirement)> {
        let (mut i, mut j) = (0, 0);
        while i < self.0.len() && j < other.0.len() {
            let (a, b) = (&self.0[i], &other.0[j]);
            match a.key.cmp(&b.key) {
                Ordering::Less => i += 1,
                Ordering::Greater => j += 1,
                Ordering::Equal => {
                    if !(a.intersects(b) || a.allows_absence() && b.allows_absence()) {
                        return Some((a, b));
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        None
    }

    /// The labels these requirements pin to a single value.
    pub fn single_values(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().filter_map(|r| r.single().map(|v| (&*r.key, v)))
    }

    /// As API requirements.
    pub fn to_api(&self) -> Vec<NodeSelectorRequirement> {
        self.0.iter().map(Requirement::to_api).collect()
    }
}

impl fmt::Display for Requirements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(", "))
    }
}

impl FromIterator<Requirement> for Requirements {
    fn from_iter<T: IntoIterator<Item = Requirement>>(iter: T) -> Self {
        let mut out = Self::new();
        for r in iter {
            out.add(r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn every_operator_builds_the_right_set() {
        let r = Requirement::new("k", Operator::In, &v(&["b", "a", "a"]));
        assert_eq!(r.values(), ["a", "b"]);
        assert!(r.has("a") && !r.has("c"));
        let r = Requirement::new("k", Operator::NotIn, &v(&["a"]));
        assert!(!r.has("a") && r.has("z"));
        assert!(Requirement::new("k", Operator::Exists, &[]).has("anything"));
        assert!(Requirement::new("k", Operator::DoesNotExist, &[]).is_empty());
        let gt = Requirement::new("gen", Operator::Gt, &v(&["2"]));
        assert!(!gt.has("2") && gt.has("3") && !gt.has("x"));
        let gte = Requirement::new("gen", Operator::Gte, &v(&["2"]));
        assert!(gte.has("2") && !gte.has("1"));
        let lt = Requirement::new("gen", Operator::Lt, &v(&["4"]));
        assert!(lt.has("3") && !lt.has("4"));
        let lte = Requirement::new("gen", Operator::Lte, &v(&["4"]));
        assert!(lte.has("4") && !lte.has("5"));
        assert!(Requirement::new("gen", Operator::Gt, &v(&["x"])).is_empty(), "a non-integer bound matches nothing");
    }

    #[test]
    fn intersections() {
        let a = Requirement::is_in("k", ["a", "b", "c"]);
        let b = Requirement::is_in("k", ["b", "c", "d"]);
        assert_eq!(a.intersect(&b).values(), ["b", "c"]);
        let n = Requirement::not_in("k", ["b"]);
        assert_eq!(a.intersect(&n).values(), ["a", "c"]);
        assert!(n.intersect(&Requirement::not_in("k", ["c"])).is_complement());
        let range = Requirement::new("k", Operator::Gte, &v(&["2"])).intersect(&Requirement::new(
            "k",
            Operator::Lte,
            &v(&["4"]),
        ));
        assert_eq!(range.len(), 3);
        assert!(range.has("3") && !range.has("5"));
        let empty =
            Requirement::new("k", Operator::Gt, &v(&["5"])).intersect(&Requirement::new("k", Operator::Lt, &v(&["3"])));
        assert!(empty.is_empty());
        assert_eq!(range.intersect(&Requirement::is_in("k", ["1", "3", "x"])).values(), ["3"]);
        assert!(!a.intersects(&Requirement::is_in("k", ["z"])));
        assert!(a.intersects(&n));
    }

    /// Intersections that leave one side's values as they were (a subset, nothing excluded, `Exists`) give
    /// that side's values; the others build new ones.
    #[test]
    fn intersections_that_keep_a_side_give_its_values() {
        let abc = Requirement::is_in("k", ["a", "b", "c"]);
        let ab = Requirement::is_in("k", ["b", "a"]);
        assert_eq!(abc.intersect(&ab).values(), ["a", "b"]);
        assert_eq!(ab.intersect(&abc).values(), ["a", "b"]);
        assert_eq!(abc.intersect(&abc), abc);
        assert_eq!(abc.intersect(&Requirement::not_in("k", ["z"])).values(), ["a", "b", "c"]);
        assert_eq!(Requirement::exists("k").intersect(&abc), abc);
        let excluded = Requirement::not_in("k", ["x", "y"]);
        assert_eq!(Requirement::exists("k").intersect(&excluded).values(), ["x", "y"]);
        assert_eq!(excluded.intersect(&Requirement::exists("k")).values(), ["x", "y"]);
        assert_eq!(excluded.intersect(&Requirement::not_in("k", ["w", "y"])).values(), ["w", "x", "y"]);
        // Bounds drop the exclusions they already rule out.
        let bounded =
            Requirement::new("k", Operator::Gte, &v(&["2"])).intersect(&Requirement::not_in("k", ["1", "3", "x"]));
        assert_eq!(bounded.values(), ["3"]);
        assert!(bounded.has("2") && !bounded.has("3") && !bounded.has("1"));
    }

    #[test]
    fn an_in_set_absorbs_only_itself() {
        let mut abc = Requirement::is_in("k", ["a", "b", "c"]);
        abc.set_min_values(Some(2));
        let mut reqs: Requirements = [abc.clone()].into_iter().collect();
        let before = reqs.clone();
        // Absorbing means adding it changes nothing.
        assert!(abc.absorbs_same(&abc.clone()));
        reqs.add(abc.clone());
        assert_eq!(reqs, before);
        let narrower = Requirement::is_in("k", ["a", "b"]);
        assert!(!abc.absorbs_same(&narrower));
        assert!(!abc.absorbs_same(&Requirement::is_in("k", ["a", "b", "c"])), "the floor differs");
        assert!(!abc.absorbs_same(&Requirement::is_in("j", ["a", "b", "c"])));
        // Complements and bounds are never taken for unchanged, however equal.
        let excluded = Requirement::not_in("k", ["x"]);
        assert!(!excluded.absorbs_same(&excluded.clone()));
        let bounded = Requirement::new("k", Operator::Gte, &v(&["2"]));
        assert!(!bounded.absorbs_same(&bounded.clone()));
    }

    #[test]
    fn min_values_take_the_larger_floor() {
        let mut a = Requirement::is_in("k", ["a", "b", "c"]);
        a.set_min_values(Some(2));
        let mut b = Requirement::exists("k");
        b.set_min_values(Some(3));
        assert_eq!(a.intersect(&b).min_values(), Some(3));
    }

    #[test]
    fn compatibility_follows_the_well_known_label_rule() {
        let node: Requirements = [Requirement::is_in(labels::ZONE, ["a", "b"])].into_iter().collect();
        let zone_a: Requirements = [Requirement::is_in(labels::ZONE, ["a"])].into_iter().collect();
        let zone_c: Requirements = [Requirement::is_in(labels::ZONE, ["c"])].into_iter().collect();
        assert!(node.compatible(&zone_a, true).is_ok());
        assert!(node.compatible(&zone_c, true).is_err());
        let arch: Requirements = [Requirement::is_in(labels::ARCH, ["arm64"])].into_iter().collect();
        assert!(node.compatible(&arch, true).is_ok(), "well-known keys may be undefined on the node side");
        assert!(node.compatible(&arch, false).is_err());
        let custom: Requirements = [Requirement::is_in("example.com/team", ["ml"])].into_iter().collect();
        let err = node.compatible(&custom, true).unwrap_err();
        assert_eq!(err.key, "example.com/team", "custom keys must exist on the node side");
        let not_custom: Requirements = [Requirement::not_in("example.com/team", ["ml"])].into_iter().collect();
        assert!(node.compatible(&not_custom, true).is_ok());
        let absent: Requirements = [Requirement::does_not_exist("example.com/team")].into_iter().collect();
        assert!(node.compatible(&absent, false).is_ok());
        // Both sides agreeing the label is absent is compatible.
        let node_absent: Requirements = [Requirement::does_not_exist("x")].into_iter().collect();
        assert!(node_absent.compatible(&[Requirement::not_in("x", ["a"])].into_iter().collect(), false).is_ok());
        // The checks that say nothing of why agree with those that do, and the reasons name both sides.
        let incoming = [&zone_a, &zone_c, &arch, &custom, &not_custom, &absent];
        for (side, other) in [&node, &node_absent].into_iter().flat_map(|n| incoming.map(|i| (n, i))) {
            for allow in [false, true] {
                assert_eq!(
                    side.is_compatible(other, allow),
                    side.compatible(other, allow).is_ok(),
                    "{side:?} {other:?}"
                );
            }
            assert_eq!(side.is_intersecting(other), side.intersects(other).is_ok(), "{side:?} {other:?}");
        }
        assert_eq!(
            node.compatible(&zone_c, true).unwrap_err().reason,
            format!("requires {}, but the node offers {}", zone_c.0[0], node.0[0])
        );
        assert_eq!(
            node.intersects(&zone_c).unwrap_err().reason,
            format!("requires {}, but offers {}", zone_c.0[0], node.0[0])
        );
        assert_eq!(
            node.compatible(&arch, false).unwrap_err().reason,
            format!("label {:?} does not exist (requires {})", labels::ARCH, arch.0[0])
        );
    }

    #[test]
    fn legacy_keys_are_normalized() {
        let r = Requirement::is_in(labels::LEGACY_ZONE, ["a"]);
        assert_eq!(r.key(), labels::ZONE);
    }

    #[test]
    fn round_trips_to_the_api() {
        for (op, vals) in [
            (Operator::In, v(&["a"])),
            (Operator::NotIn, v(&["a"])),
            (Operator::Exists, vec![]),
            (Operator::DoesNotExist, vec![]),
            (Operator::Gte, v(&["3"])),
            (Operator::Lte, v(&["3"])),
        ] {
            let r = Requirement::new("k", op, &vals);
            let api = r.to_api();
            assert_eq!(api.operator, op);
            assert_eq!(Requirement::from_api(&api), r);
        }
    }
}
