//! Helpers shared by the unit tests.

use serde_json::Value;

/// Merges `b` into `a`, recursively for objects, replacing everything else.
pub(crate) fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}
