//! Scheduling benchmark, mirroring Karpenter's: 400 instance types, pods in five equal groups (plain,
//! zonal spread, hostname spread, zonal self-affinity, hostname self-anti-affinity), fixed seed.
//!
//! `scheduling/apps_*`: the same five constraint kinds spread over many applications of ten identical pods
//! each (2,000 apps at 20,000 pods), as a real cluster holds them: one topology group per constrained app.
//!
//! `scheduling/marginal_cost/5000_pods`: the 5,000-pod mix from a pool annotated
//! `karpenter.sh/nodeclaim-packing-policy: marginal-cost`.
//!
//! `cargo bench -p tenon-core --bench scheduling` prints, per size, the time per pass, pods/s, the nodes
//! bought and their total hourly price, and fails if a pod is left unscheduled or more nodes are bought
//! than Karpenter buys for the same mix (one per five pods).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tenon_core::api::{NodePool, NodePoolSpec, labels};
use tenon_core::resources::Resources;
use tenon_core::scheduling::{PodInfo, PoolInput, Results, Scheduler, SchedulerOptions, workload};

fn pool() -> PoolInput {
    PoolInput {
        pool: NodePool::new("default", NodePoolSpec::default()),
        instance_types: workload::instance_types(400).into(),
        in_use: Resources::ZERO,
        nodes_in_use: 0,
    }
}

fn run(pods: Vec<PodInfo>) -> Results {
    Scheduler::new(vec![pool()], vec![], vec![], &[], SchedulerOptions::default()).solve(pods)
}

/// The same pool, annotated `karpenter.sh/nodeclaim-packing-policy: marginal-cost`.
fn marginal_cost_pool() -> PoolInput {
    let mut input = pool();
    input
        .pool
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(labels::NODECLAIM_PACKING_POLICY.to_owned(), "marginal-cost".to_owned());
    input
}

fn run_marginal_cost(pods: Vec<PodInfo>) -> Results {
    Scheduler::new(vec![marginal_cost_pool()], vec![], vec![], &[], SchedulerOptions::default()).solve(pods)
}

fn scheduling(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduling");
    group.sample_size(10).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    for n in [1_000usize, 5_000, 20_000] {
        let pods = workload::diverse_pods(n, 42);
        let results = run(pods.clone());
        assert!(results.unschedulable.is_empty(), "{n} pods: {} unschedulable", results.unschedulable.len());
        assert!(results.claims.len() <= n / 5, "{n} pods: {} nodes, Karpenter buys {}", results.claims.len(), n / 5);
        eprintln!("scheduling/{n}: {} pods on {} nodes, ${:.2}/h", n, results.claims.len(), results.launch_price());
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("{n}_pods"), |b| {
            b.iter_batched(|| pods.clone(), |p| black_box(run(p)), BatchSize::LargeInput)
        });
    }
    for (n, apps) in [(5_000usize, 500usize), (20_000, 2_000)] {
        let pods: Vec<PodInfo> =
            workload::app_pods(n, apps, 42).iter().filter_map(|p| PodInfo::from_pod(p).ok()).collect();
        assert_eq!(pods.len(), n, "every generated pod converts");
        let results = run(pods.clone());
        assert!(results.unschedulable.is_empty(), "{n} pods: {} unschedulable", results.unschedulable.len());
        eprintln!(
            "scheduling/apps: {n} pods of {apps} apps on {} nodes, ${:.2}/h",
            results.claims.len(),
            results.launch_price()
        );
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("apps_{apps}/{n}_pods"), |b| {
            b.iter_batched(|| pods.clone(), |p| black_box(run(p)), BatchSize::LargeInput)
        });
    }
    // `scheduling/marginal_cost/5000_pods`: the diverse mix from a marginal-cost pool.
    let n = 5_000usize;
    let pods = workload::diverse_pods(n, 42);
    let results = run_marginal_cost(pods.clone());
    assert!(results.unschedulable.is_empty(), "{n} pods: {} unschedulable", results.unschedulable.len());
    eprintln!(
        "scheduling/marginal_cost/{n}: {} pods on {} nodes, ${:.2}/h",
        n,
        results.claims.len(),
        results.launch_price()
    );
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function(format!("marginal_cost/{n}_pods"), |b| {
        b.iter_batched(|| pods.clone(), |p| black_box(run_marginal_cost(p)), BatchSize::LargeInput)
    });
    group.finish();
}

criterion_group!(benches, scheduling);
criterion_main!(benches);
