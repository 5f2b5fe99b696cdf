//! The `tenon` binary's commands, run as a user runs them.

use std::process::{Command, Output};

fn tenon(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tenon"));
    cmd.args(args);
    for spec in tenon_core::settings::SETTINGS {
        cmd.env_remove(spec.env);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap_or_else(|e| panic!("the tenon binary does not run: {e}"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn crds_prints_the_karpenter_kinds_and_the_node_classes_built_in() {
    let out = tenon(&["crds"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs: Vec<serde_json::Value> =
        stdout(&out).split("---\n").map(|d| serde_yaml_ng::from_str(d).expect("valid YAML")).collect();
    let names: Vec<&str> = docs.iter().filter_map(|d| d["metadata"]["name"].as_str()).collect();
    let mut expected = vec![
        "nodepools.karpenter.sh",
        "nodeclaims.karpenter.sh",
        "kwoknodeclasses.tenon.dev",
        "selfmanagednodeclasses.tenon.dev",
    ];
    if cfg!(feature = "aws") {
        expected.push("ec2nodeclasses.karpenter.k8s.aws");
    }
    if cfg!(feature = "gcp") {
        expected.push("gcenodeclasses.karpenter.k8s.gcp");
    }
    if cfg!(feature = "azure") {
        expected.push("aksnodeclasses.karpenter.azure.com");
    }
    assert_eq!(names, expected);
}

#[test]
fn settings_shows_value_and_source_from_every_layer() {
    let dir = std::env::temp_dir().join(format!("tenon-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("settings.toml");
    std::fs::write(&file, "consolidation-split-max-attempts = 4\n").unwrap();
    let out = tenon(
        &["settings", "--config", file.to_str().unwrap(), "--set", "max-consolidation-replacements=3"],
        &[("CONSOLIDATION_SPLIT_FALLBACK", "true")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let row = |key: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no row for {key} in:\n{text}"))
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row("max-consolidation-replacements"), "max-consolidation-replacements 3 flag");
    assert_eq!(row("consolidation-split-fallback"), "consolidation-split-fallback true env");
    assert_eq!(row("consolidation-split-max-attempts"), "consolidation-split-max-attempts 4 file");
    assert_eq!(row("spot-to-spot-min-instance-types"), "spot-to-spot-min-instance-types 15 default");
    assert!(text.contains("NODECLAIM_INITIALIZATION_TIMEOUT"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_setting_is_an_error_naming_the_key() {
    let out = tenon(&["settings"], &[("SPOT_TO_SPOT_MIN_INSTANCE_TYPES", "many")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("SPOT_TO_SPOT_MIN_INSTANCE_TYPES"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "nothing is printed from half-read settings");
}

#[test]
fn run_refuses_an_unknown_provider_and_a_missing_cluster_before_doing_anything() {
    let out = tenon(&["run"], &[("PROVIDERS", "kwok,gce")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("providers: \"gce\" is not a built-in provider"), "{}", stderr(&out));
    let nowhere = std::env::temp_dir().join(format!("tenon-no-kubeconfig-{}", std::process::id()));
    let out = tenon(&["run"], &[("KUBECONFIG", nowhere.to_str().unwrap()), ("KUBERNETES_SERVICE_HOST", "")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("connecting to the cluster"), "{}", stderr(&out));
}

#[test]
fn providers_lists_the_built_in_providers_and_their_node_classes() {
    let out = tenon(&["providers"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("kwok") && text.contains("tenon.dev/KwokNodeClass"), "{text}");
    assert!(text.contains("self-managed") && text.contains("tenon.dev/SelfManagedNodeClass"), "{text}");
    #[cfg(feature = "aws")]
    assert!(text.contains("aws") && text.contains("karpenter.k8s.aws/EC2NodeClass"), "{text}");
}

#[test]
fn help_lists_the_commands() {
    let out = tenon(&["--help"], &[]);
    assert!(out.status.success());
    for cmd in ["crds", "settings", "plan", "simulate", "run"] {
        assert!(stdout(&out).contains(cmd), "{cmd}");
    }
}
