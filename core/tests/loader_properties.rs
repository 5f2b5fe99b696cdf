//! The snapshot and scenario loaders never panic, whatever they are fed: mutated and truncated copies of
//! real files either load or fail with an error that names the file, the document and what is wrong.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions unwrap too

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use tenon_core::sim::scenario::Scenario;
use tenon_core::snapshot::Snapshot;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// Bits of text that make YAML and Kubernetes objects go wrong in interesting ways.
const NOISE: &[&str] = &[
    ":",
    "- ",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "'",
    "\n",
    "  ",
    "#",
    "&a",
    "*a",
    "!!int",
    "~",
    "null",
    "-1",
    "1e400",
    "0x",
    "99999999999999999999",
    "500m",
    "1Gi",
    "NaN",
    "true",
    "kind: List",
    "items:",
    "apiVersion: v1",
    "kind: Pod",
    "requests:",
    "cpu: ",
    "\t",
    "ü",
    "💥",
];

/// One edit of a text: truncation, a deleted or duplicated line, or noise spliced in at some point.
#[derive(Debug, Clone)]
enum Edit {
    Truncate(usize),
    DeleteLine(usize),
    DuplicateLine(usize),
    Splice { at: usize, cut: usize, noise: usize },
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let one = prop_oneof![
        any::<usize>().prop_map(Edit::Truncate),
        any::<usize>().prop_map(Edit::DeleteLine),
        any::<usize>().prop_map(Edit::DuplicateLine),
        (any::<usize>(), 0usize..12, 0..NOISE.len()).prop_map(|(at, cut, noise)| Edit::Splice { at, cut, noise }),
    ];
    prop::collection::vec(one, 1..4)
}

fn boundary(text: &str, at: usize) -> usize {
    let mut i = if text.is_empty() { 0 } else { at % (text.len() + 1) };
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut t = text.to_owned();
    for e in edits {
        match *e {
            Edit::Truncate(at) => {
                let i = boundary(&t, at);
                t.truncate(i);
            }
            Edit::DeleteLine(n) | Edit::DuplicateLine(n) => {
                let mut lines: Vec<&str> = t.lines().collect();
                if lines.is_empty() {
                    continue;
                }
                let i = n % lines.len();
                if matches!(e, Edit::DeleteLine(_)) {
                    lines.remove(i);
                } else {
                    lines.insert(i, lines[i]);
                }
                t = lines.join("\n");
            }
            Edit::Splice { at, cut, noise } => {
                let i = boundary(&t, at);
                let j = boundary(&t, i + cut).max(i);
                t.replace_range(i..j, NOISE[noise]);
            }
        }
    }
    t
}

fn snapshot_sources() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in ["tests/plan", "core/tests/snapshots"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(repo(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        out.extend(files.into_iter().map(|p| (p.display().to_string(), read(&p))));
    }
    let catalog = repo("examples/catalogs/gcp-us-central1.yaml");
    // A slice of a catalog is enough to reach its parsing paths, and keeps each case fast.
    let text: String = read(&catalog).lines().take(120).collect::<Vec<_>>().join("\n");
    out.push((catalog.display().to_string(), text));
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_snapshots_load_or_name_the_file_document_and_field(pick in any::<usize>(), edits in edits()) {
        let sources = snapshot_sources();
        let (file, text) = &sources[pick % sources.len()];
        let mutated = apply(text, &edits);
        if let Err(e) = Snapshot::parse_str(file, &mutated) {
            prop_assert_eq!(&e.file, file);
            prop_assert!(e.document >= 1, "a parse error names its document: {}", e);
            prop_assert!(!e.message.is_empty());
            let shown = e.to_string();
            prop_assert!(shown.contains(file.as_str()) && shown.contains("document"), "{}", shown);
            // An empty field and object mean the whole document is wrong (not YAML, not an object).
            if e.field.is_empty() && e.object.is_empty() {
                prop_assert!(e.message.contains("YAML") || e.message.contains("expected"), "unlocated: {}", shown);
            }
        }
    }

    #[test]
    fn mutated_scenarios_load_or_name_the_file_and_field(pick in any::<usize>(), edits in edits()) {
        let scenarios = [
            repo("tests/scenarios/short.yaml"),
            repo("examples/scenarios/mixed-accelerators.yaml"),
            repo("examples/scenarios/diurnal-web.yaml"),
        ];
        let path = &scenarios[pick % scenarios.len()];
        let mutated = apply(&read(path), &edits);
        if let Err(e) = Scenario::parse(&mutated, path) {
            prop_assert_eq!(&e.file, &path.display().to_string());
            prop_assert!(!e.message.is_empty());
            prop_assert!(
                !e.field.is_empty() || e.message.contains("line") || e.message.contains("YAML"),
                "unlocated: {}", e
            );
        }
    }
}

#[test]
fn the_edits_do_change_the_files() {
    // The properties above are only worth something if the edits reach the loaders' error paths.
    let text = read(&repo("tests/scenarios/short.yaml"));
    let nan = NOISE.iter().position(|n| *n == "NaN").unwrap();
    let broken = apply(&text, &[Edit::Splice { at: text.find("cpu: 500m").unwrap() + 5, cut: 4, noise: nan }]);
    let err = Scenario::parse(&broken, &repo("tests/scenarios/short.yaml")).unwrap_err();
    assert!(err.field.starts_with("spec.workloads[1]"), "{err}");
    let truncated = apply(&text, &[Edit::Truncate(text.find("nodePools").unwrap())]);
    assert!(Scenario::parse(&truncated, &repo("tests/scenarios/short.yaml")).is_err());
}
