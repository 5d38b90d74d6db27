//! Comparing two configs field by field.

use super::Config;

/// "field: a vs b" for the architecture fields on which two configs differ (extra keys ignored).
pub fn config_diff(a: &Config, b: &Config) -> Vec<String> {
    differing_fields(a, b).into_iter().map(|(k, v, w)| format!("{k}: {v} vs {w}")).collect()
}

/// The config.json fields on which two configs differ (extra keys ignored): name, a's value and
/// b's, as JSON, in name order.
pub fn differing_fields(a: &Config, b: &Config) -> Vec<(String, serde_json::Value, serde_json::Value)> {
    let strip = |c: &Config| {
        let mut c = c.clone();
        c.extra.clear();
        serde_json::to_value(&c).ok().and_then(|v| v.as_object().cloned()).unwrap_or_default()
    };
    let none = |v: Option<serde_json::Value>| v.unwrap_or_default();
    json_field_diff(&strip(a), &strip(b)).into_iter().map(|(k, v, w)| (k, none(v), none(w))).collect()
}

/// The fields of two JSON objects whose values differ, in name order: name, a's value and b's
/// (None where absent).
pub fn json_field_diff(
    a: &serde_json::Map<String, serde_json::Value>,
    b: &serde_json::Map<String, serde_json::Value>,
) -> Vec<(String, Option<serde_json::Value>, Option<serde_json::Value>)> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (k.clone(), a.get(k).cloned(), b.get(k).cloned()))
        .collect()
}
