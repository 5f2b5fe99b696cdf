//! The Helm chart stays in step with the binary: every setting has a value and an environment variable in
//! the chart, and the chart knows no setting the binary does not.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too
#![allow(clippy::expect_used)] // test helpers outside #[test] functions expect too

use std::collections::BTreeSet;

use tenon_core::settings::SETTINGS;

/// The `env` column of the chart's settings table (`templates/_helpers.tpl`, `tenon.settingsTable`).
fn chart_env_names() -> BTreeSet<String> {
    let helpers =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/charts/tenon/templates/_helpers.tpl")).unwrap();
    let start = helpers.find("define \"tenon.settingsTable\"").expect("the settings table");
    let table = &helpers[start..];
    let end = table.find("{{- end }}").expect("its end");
    table[..end].lines().skip(1).filter_map(|l| l.split_once(": ").map(|(_, env)| env.trim().to_owned())).collect()
}

#[test]
fn every_setting_is_a_chart_value_and_nothing_else_is() {
    let binary: BTreeSet<String> = SETTINGS.iter().map(|s| s.env.to_owned()).collect();
    let chart = chart_env_names();
    let missing: Vec<_> = binary.difference(&chart).collect();
    let unknown: Vec<_> = chart.difference(&binary).collect();
    assert!(missing.is_empty(), "settings the chart cannot set: {missing:?}");
    assert!(unknown.is_empty(), "chart values the binary does not read: {unknown:?}");
    let values = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/charts/tenon/values.yaml")).unwrap();
    for env in &binary {
        assert!(values.contains(&format!("# {env}:")), "values.yaml does not document {env}");
    }
}
