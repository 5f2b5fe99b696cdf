//! Durations as Kubernetes writes them: `30s`, `10h5m`, `720h`, and `Never` where a field allows it.

use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use regex::Regex;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const PATTERN: &str = r"^([0-9]+(ns|us|µs|ms|s|m|h))+$";

fn pattern() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(PATTERN).unwrap_or_else(|_| unreachable!("static pattern compiles")))
}

/// Parses a Go-style duration (`30s`, `10h5m`, `720h`, `1500ms`); days and fractions are not accepted,
/// matching what the Karpenter CRDs allow.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if !pattern().is_match(text) {
        return Err(format!("invalid duration {text:?}: expected a duration such as \"30s\", \"10h5m\" or \"720h\""));
    }
    humantime::parse_duration(text).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

/// Formats a duration the way it is written in manifests (`720h`, `10h5m`, `30s`, `0s`).
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    let ms = d.subsec_millis();
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    if ms > 0 {
        out.push_str(&format!("{ms}ms"));
    }
    if out.is_empty() {
        out = format!("{}ns", d.subsec_nanos());
    }
    out
}

/// A duration field (`terminationGracePeriod`, a budget's `duration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct KubeDuration(pub Duration);

impl KubeDuration {
    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }
}

impl fmt::Display for KubeDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl std::str::FromStr for KubeDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(Self)
    }
}

impl Serialize for KubeDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for KubeDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(D::Error::custom)
    }
}

impl JsonSchema for KubeDuration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": PATTERN})
    }
}

/// A duration that may also be `Never` (`expireAfter`, `consolidateAfter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NillableDuration {
    /// Never: the behaviour the field controls is disabled.
    #[default]
    Never,
    /// After this long.
    After(Duration),
}

impl NillableDuration {
    /// The duration, or `None` for `Never`.
    pub fn duration(&self) -> Option<Duration> {
        match self {
            Self::Never => None,
            Self::After(d) => Some(*d),
        }
    }

    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self::After(Duration::from_secs(secs))
    }
}

impl fmt::Display for NillableDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Never => f.write_str("Never"),
            Self::After(d) => f.write_str(&format_duration(*d)),
        }
    }
}

impl std::str::FromStr for NillableDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim() == "Never" { Ok(Self::Never) } else { parse_duration(s).map(Self::After) }
    }
}

impl Serialize for NillableDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for NillableDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(D::Error::custom)
    }
}

impl JsonSchema for NillableDuration {
    fn schema_name() -> Cow<'static, str> {
        "NillableDuration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": r"^(([0-9]+(ns|us|µs|ms|s|m|h))+|Never)$"})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_durations() {
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("10h5m").unwrap(), Duration::from_secs(10 * 3600 + 300));
        assert_eq!(parse_duration("720h").unwrap(), Duration::from_secs(720 * 3600));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1500ms").unwrap(), Duration::from_millis(1500));
        for bad in ["", "10", "5d", "1.5h", "-1m", "ten minutes", "Never"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn nillable_accepts_never() {
        assert_eq!("Never".parse::<NillableDuration>().unwrap(), NillableDuration::Never);
        assert_eq!("1m".parse::<NillableDuration>().unwrap(), NillableDuration::from_secs(60));
        assert_eq!(NillableDuration::from_secs(720 * 3600).to_string(), "720h");
    }

    #[test]
    fn formats_round_trip() {
        for s in ["720h", "10h5m", "30s", "0s", "1h0m1s"] {
            let d = parse_duration(s).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
        assert_eq!(format_duration(Duration::from_secs(36_300)), "10h5m");
    }
}
