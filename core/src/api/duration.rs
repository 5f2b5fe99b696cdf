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

/// Parses a duration in Go's `time.ParseDuration` syntax, as Karpenter reads annotations and settings:
/// a sequence of decimal numbers, each with an optional fraction and a unit (`ns`, `us`, `µs`, `ms`, `s`,
/// `m`, `h`), such as `1.5h`, `90m30s` or `300ms`, an optional sign, and `0` alone. A negative duration
/// reads as zero (it has already run out). Hand-written: the grammar is a few lines, and the crates for it
/// are unmaintained.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let invalid =
        || format!("invalid duration {text:?}: expected a Go duration such as \"90s\", \"1.5h\" or \"1h30m\"");
    let t = text.trim();
    let (negative, mut rest) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(invalid());
        }
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(invalid()),
        };
        nanos += value * scale;
        rest = next;
    }
    // Go's durations are int64 nanoseconds, about 292 years.
    if !nanos.is_finite() || nanos > i64::MAX as f64 {
        return Err(format!("invalid duration {text:?}: out of range"));
    }
    if negative {
        return Ok(Duration::ZERO);
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
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

    #[test]
    fn go_durations_parse_as_go_parses_them() {
        let ok = |t: &str| parse_go_duration(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok("90m30s"), Duration::from_secs(5430));
        assert_eq!(ok("1h30m0.5s"), Duration::from_millis(5_400_500));
        assert_eq!(ok("300ms"), Duration::from_millis(300));
        assert_eq!(ok("2us"), Duration::from_micros(2));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("-1h"), Duration::ZERO, "already run out");
        for bad in ["", "1", "1d", "h", "1.2.3s", "true", "1h 30m", "-", "1.s.5"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} parsed");
        }
    }
}
