//! Writes the generated cluster snapshots that `scripts/bench-plan.sh` times `tenon plan` on, as
//! multi-document YAML on standard output:
//!
//! - `pending --pods N --apps A --types T`: N pending pods of A applications (the scheduling benchmark's five
//!   constraint kinds spread over the apps) and one NodePool over T instance types shaped like Karpenter's
//!   benchmark catalog;
//! - `fleet --nodes N --pods-per-node P`: a running fleet (the disruption benchmark's: mixed instance and
//!   capacity types, some pods behind PDBs, some spread across zones, some do-not-disrupt) and its NodePool.
//!
//! `cargo run --release -p tenon-core --example bench_snapshot -- pending 20000 2000 400 > pending.yaml`
//!
//! Arguments, all optional and positional after the kind: `pending PODS APPS TYPES SEED` (defaults 20000,
//! 2000, 400, 42) and `fleet NODES PODS_PER_NODE SEED` (defaults 5000, 10, 11).
//!
//! `time FILE…` reads snapshot files and prints how long each step of a plan takes (reading, the cluster
//! state, provisioning, disruption), for profiling the steps one at a time. It reads them as `tenon plan`
//! does (pods reduced as they are read, the snapshot consumed by the state); `time-objects FILE…` keeps
//! every `Pod` object and builds the state from borrowed objects instead. `simulate SCENARIO` runs a
//! scenario as `tenon simulate` does and prints its cost and time.

use std::error::Error;
use std::io::{BufWriter, Write};

use serde::Serialize;
use serde_json::{Value, json};
use tenon_core::api::NodePool;
use tenon_core::cloud::InstanceType;
use tenon_core::disruption::workload as fleet;
use tenon_core::scheduling::workload;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The `i`th positional number after the kind, or `default`.
fn arg(args: &[String], i: usize, default: u64) -> Result<u64> {
    match args.get(i) {
        Some(a) => a.parse().map_err(|e| format!("argument {}: {a:?}: {e}", i + 1).into()),
        None => Ok(default),
    }
}

fn document(out: &mut impl Write, value: &impl Serialize) -> Result<()> {
    out.write_all(b"---\n")?;
    serde_yaml_ng::to_writer(&mut *out, value)?;
    Ok(())
}

fn with_kind(value: &impl Serialize, api_version: &str, kind: &str) -> Result<Value> {
    let mut v = serde_json::to_value(value)?;
    if let Some(map) = v.as_object_mut() {
        map.insert("apiVersion".into(), api_version.into());
        map.insert("kind".into(), kind.into());
    }
    Ok(v)
}

fn catalog(types: &[InstanceType]) -> Value {
    json!({"apiVersion": "tenon.dev/v1alpha1", "kind": "InstanceCatalog", "metadata": {"name": "generated"},
        "spec": {"instanceTypes": types}})
}

fn pool(pool: &NodePool) -> Result<Value> {
    with_kind(pool, "karpenter.sh/v1", "NodePool")
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match args.first().map(String::as_str) {
        Some("pending") => {
            let (pods, apps, types, seed) =
                (arg(&args, 1, 20_000)?, arg(&args, 2, 2_000)?, arg(&args, 3, 400)?, arg(&args, 4, 42)?);
            document(&mut out, &pool(&NodePool::new("default", Default::default()))?)?;
            document(&mut out, &catalog(&workload::instance_types(types as usize)))?;
            for pod in workload::app_pods(pods as usize, apps as usize, seed) {
                document(&mut out, &with_kind(&pod, "v1", "Pod")?)?;
            }
        }
        Some("fleet") => {
            let (nodes, per_node, seed) = (arg(&args, 1, 5_000)?, arg(&args, 2, 10)?, arg(&args, 3, 11)?);
            let f = fleet::fleet(nodes as usize, per_node as usize, seed);
            document(&mut out, &pool(&f.pool)?)?;
            document(&mut out, &catalog(&f.instance_types))?;
            for node in &f.nodes {
                document(&mut out, &with_kind(node, "v1", "Node")?)?;
            }
            for pod in &f.pods {
                document(&mut out, &with_kind(pod, "v1", "Pod")?)?;
            }
            for pdb in &f.pdbs {
                document(&mut out, &with_kind(pdb, "policy/v1", "PodDisruptionBudget")?)?;
            }
        }
        Some("time") => time(&args[1..], false)?,
        Some("time-objects") => time(&args[1..], true)?,
        Some("simulate") => simulate(args.get(1).ok_or("simulate: which scenario?")?)?,
        _ => {
            return Err(
                "usage: bench_snapshot pending [PODS APPS TYPES SEED] | fleet [NODES PODS_PER_NODE SEED]".into()
            );
        }
    }
    out.flush()?;
    Ok(())
}

/// The process's resident memory now and at its peak, where the system tells (Linux's /proc).
fn memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field =
        |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned()).unwrap_or_default();
    format!("rss {}, peak {}", field("VmRSS:"), field("VmHWM:"))
}

/// How long a phase took: on the wall clock, and on a CPU (this thread's time running, where the system
/// tells it: Linux's /proc/thread-self/schedstat), which a busy machine does not inflate.
struct Phase {
    wall: std::time::Instant,
    cpu_ns: u64,
}

impl Phase {
    fn cpu_ns() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        stat.split_whitespace().next().and_then(|ns| ns.parse().ok()).unwrap_or(0)
    }

    fn start() -> Self {
        Phase { wall: std::time::Instant::now(), cpu_ns: Self::cpu_ns() }
    }

    fn done(&self) -> String {
        let cpu = Self::cpu_ns().saturating_sub(self.cpu_ns) as f64 / 1e6;
        format!("{:>8.1} ms (cpu {cpu:>7.1} ms)", self.wall.elapsed().as_secs_f64() * 1e3)
    }
}

fn simulate(path: &str) -> Result<()> {
    use tenon_core::sim::scenario::{self, Scenario};
    let scenario = Scenario::load(std::path::Path::new(path))?;
    let settings = scenario.settings(&[])?;
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let t = std::time::Instant::now();
    let report = runtime.block_on(scenario::run(&scenario, settings, &mut |_, _, _| {}));
    eprintln!("{path}: ${:.2} in {:.2} s, {}", report.total_cost, t.elapsed().as_secs_f64(), memory());
    Ok(())
}

fn time(files: &[String], objects: bool) -> Result<()> {
    use tenon_core::snapshot::Snapshot;
    use tenon_core::state::{ClusterState, ReadPods};
    use tenon_core::{disruption, provisioning, settings::Settings};
    let now: jiff::Timestamp = "2026-03-04T12:00:00Z".parse()?;
    let settings = Settings::default();
    let t = Phase::start();
    let (state, types) = if objects {
        let snapshot = Snapshot::load_files(files)?;
        eprintln!("read:         {}  {}", t.done(), memory());
        let t = Phase::start();
        let state = ClusterState::from_objects_with_storage(
            &snapshot.pods,
            &snapshot.nodes,
            &snapshot.node_claims,
            &snapshot.daemon_sets,
            &snapshot.pdbs,
            &snapshot.node_pools,
            &snapshot.storage(),
            &snapshot.namespace_labels(),
            now,
        )?;
        eprintln!("state:        {}  {}", t.done(), memory());
        (state, snapshot.instance_types())
    } else {
        let snapshot = Snapshot::<ReadPods>::read_files(files)?;
        eprintln!("read:         {}  {}", t.done(), memory());
        let t = Phase::start();
        let types = snapshot.instance_types();
        let state = ClusterState::from_read_snapshot(snapshot, now)?;
        eprintln!("state:        {}  {}", t.done(), memory());
        (state, types)
    };
    let types: std::sync::Arc<[tenon_core::cloud::InstanceType]> = types.into();
    let types_for = |_: &NodePool| types.clone();
    let t = Phase::start();
    let results = provisioning::schedule(&state, &types_for, &Default::default(), &settings, now);
    eprintln!("provisioning: {}  {} ({} claims)", t.done(), memory(), results.claims.len());
    let t = Phase::start();
    let pass =
        disruption::compute(&disruption::Inputs { state: &state, types_for: &types_for, settings: &settings, now });
    eprintln!("disruption:   {}  {} ({:?})", t.done(), memory(), pass.method);
    Ok(())
}
