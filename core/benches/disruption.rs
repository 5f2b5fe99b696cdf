//! Disruption benchmark: a generated fleet of mixed instance and capacity types, ~10 pods per node, some
//! behind PDBs, some spread across zones, some do-not-disrupt.
//!
//! - `single_node_candidates/1000`: every single-node consolidation candidate of a 1,000-node /
//!   10,000-pod fleet evaluated (delete or replace, with its reason), from one shared base.
//! - `full_pass/5000`: a whole disruption pass (candidates, budgets, every method) over 5,000 nodes /
//!   50,000 pods.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use jiff::Timestamp;
use tenon_core::api::NodePool;
use tenon_core::disruption::{self, Inputs, Simulator, workload};
use tenon_core::settings::Settings;
use tenon_core::state::ClusterState;

fn state(f: &workload::Fleet, now: Timestamp) -> ClusterState {
    ClusterState::from_objects(&f.pods, &f.nodes, &[], &[], &f.pdbs, std::slice::from_ref(&f.pool), now)
        .unwrap_or_default()
}

fn bench(c: &mut Criterion) {
    let now: Timestamp = "2026-03-04T12:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
    let settings = Settings::default();
    let mut group = c.benchmark_group("disruption");
    group.sample_size(10).measurement_time(Duration::from_secs(10)).warm_up_time(Duration::from_secs(1));

    let small = workload::fleet(1_000, 10, 7);
    let st = state(&small, now);
    let types: std::sync::Arc<[tenon_core::cloud::InstanceType]> = small.instance_types.clone().into();
    let types_for = |_: &NodePool| types.clone();
    let inputs = Inputs { state: &st, types_for: &types_for, settings: &settings, now };
    let (cands, _) = disruption::candidates(&st, &types_for, now);
    eprintln!("disruption/1000: {} nodes, {} pods, {} candidates", st.nodes.len(), st.pods.len(), cands.len());
    group.bench_function("single_node_candidates/1000", |b| {
        b.iter(|| {
            let mut sim = Simulator::new(&inputs, &cands);
            let decided = cands.iter().filter(|c| sim.consolidate(&[c], false).is_ok()).count();
            black_box(decided)
        })
    });

    let big = workload::fleet(5_000, 10, 11);
    let st = state(&big, now);
    let types: std::sync::Arc<[tenon_core::cloud::InstanceType]> = big.instance_types.clone().into();
    let types_for = |_: &NodePool| types.clone();
    let pass = disruption::compute(&Inputs { state: &st, types_for: &types_for, settings: &settings, now });
    eprintln!(
        "disruption/5000: {} nodes, {} pods; the pass chose {:?} with {} command(s)",
        st.nodes.len(),
        st.pods.len(),
        pass.method,
        pass.commands.len()
    );
    group.bench_function("full_pass/5000", |b| {
        b.iter(|| {
            black_box(disruption::compute(&Inputs { state: &st, types_for: &types_for, settings: &settings, now }))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
