//! `tenon run`: the operator on a cluster.
//!
//! The same [`Runtime`] `tenon simulate` drives, over the kube-rs port ([`KubeCluster`]) and the system
//! clock. Start-up: connect (kubeconfig, else in-cluster), start the watches, serve `/healthz` and
//! `/readyz` (ready once every store holds its initial list) and `/metrics`, and join the leader
//! election on a coordination.k8s.io Lease in the pod's namespace. Only the leader runs the controllers;
//! a replica that becomes leader builds a fresh runtime, whose first step rebuilds what it needs from the
//! cluster (provider state, the launch cache, disruption commands found in flight). Standbys keep their
//! stores warm. The loop steps whenever a watch reports a change or the runtime's next wake comes (and at
//! least every ten seconds). SIGTERM or SIGINT stop it between two steps, and the lease is released, so a
//! standby takes over at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::Client;
use kube::runtime::events::Reporter;
use tenon_core::clock::SystemClock;
use tenon_core::cloud::ProviderRegistry;
use tenon_core::cluster::Cluster;
use tenon_core::runtime::{NameSource, Runtime};
use tenon_core::settings::Settings;

use crate::kube::KubeCluster;
use crate::metrics::Metrics;

/// The longest the loop waits between two steps.
const MAX_IDLE: Duration = Duration::from_secs(10);
/// The shortest time between two steps, so a burst of watch events makes one step, not hundreds.
const MIN_SPACING: Duration = Duration::from_millis(250);
/// The leader lease's duration; a standby takes over within it when the leader dies.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// How long before the lease runs out the leader renews it.
const LEASE_GRACE_SECONDS: u64 = 5;

/// Claim names as the API server's `generateName` makes them: the pool, a dash and five characters.
fn random_names() -> NameSource {
    use std::hash::{BuildHasher, Hasher};
    let state = std::collections::hash_map::RandomState::new();
    let mut n: u64 = 0;
    Box::new(move |pool: &str| {
        n += 1;
        let mut h = state.build_hasher();
        h.write_u64(n);
        let mut x = h.finish();
        let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
        let suffix: String = (0..5)
            .map(|_| {
                let c = alphabet[(x % alphabet.len() as u64) as usize] as char;
                x /= alphabet.len() as u64;
                c
            })
            .collect();
        format!("{pool}-{suffix}")
    })
}

/// The namespace tenon runs in: `POD_NAMESPACE` (the chart sets it), else the service account's, else the
/// client's default.
fn pod_namespace(client: &Client) -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|n| n.trim().to_owned())
        })
        .unwrap_or_else(|| client.default_namespace().to_owned())
}

/// This replica's identity in the leader election: `POD_NAME`, else the host name and process id.
fn identity() -> String {
    std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
        format!("{}-{}", if host.is_empty() { "tenon" } else { &host }, std::process::id())
    })
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(ready): State<Arc<AtomicBool>>) -> (StatusCode, &'static str) {
    if ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "the cluster state is not synced yet")
    }
}

/// What the metrics endpoint reads: the metrics, and the cluster its per-node and per-pod series come from.
type Scraped = (Arc<Metrics>, Arc<KubeCluster>);

async fn metrics_text(
    State((metrics, cluster)): State<Scraped>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    match metrics.scrape(&cluster.snapshot()) {
        Ok(text) => {
            (StatusCode::OK, [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "text/plain")], e.to_string()),
    }
}

async fn serve(port: u16, router: Router, what: &str) -> Result<()> {
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding the {what} port {port}"))?;
    tracing::info!(%addr, "serving {what}");
    axum::serve(listener, router).await.with_context(|| format!("serving {what}"))
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
}

/// Runs the operator until SIGTERM or SIGINT, with the providers in `registry` (and the built-in ones,
/// when `builtins`).
pub fn run(registry: ProviderRegistry, builtins: bool, settings: Settings) -> Result<()> {
    // Several crates of the stack enable rustls with different crypto back-ends; the process picks one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(operate(registry, builtins, settings))
}

async fn operate(mut registry: ProviderRegistry, builtins: bool, settings: Settings) -> Result<()> {
    let client = Client::try_default().await.context("connecting to the cluster (kubeconfig or in-cluster config)")?;
    let namespace = pod_namespace(&client);
    let identity = identity();
    // One cache for the process: a runtime rebuilt on a change of leader keeps what was learned, and
    // the providers that mark offerings themselves share it.
    let unavailable = Arc::new(tenon_core::cloud::UnavailableOfferings::new());
    // Whether this replica leads, for the providers' own controllers; set by the loop below.
    let (gate, gated) = tokio::sync::watch::channel(false);
    let feeds = if builtins {
        crate::builtins::register(&mut registry, &client, &namespace, &settings, &unavailable, &gated).await?
    } else {
        Vec::new()
    };
    if registry.providers().is_empty() {
        anyhow::bail!("no providers are registered: nothing could launch a node (see the `providers` setting)");
    }
    let names: Vec<&str> = registry.providers().iter().map(|p| p.name()).collect();
    tracing::info!(providers = ?names, %namespace, %identity, "starting");

    let reporter = Reporter { controller: "tenon".into(), instance: Some(identity.clone()) };
    let mut cluster = KubeCluster::start(client.clone(), reporter);
    for feed in feeds {
        feed(&mut cluster);
    }
    let cluster = Arc::new(cluster);
    let metrics = Arc::new(Metrics::new());
    let registry = registry.wrapped(|p| metrics.instrument(p));
    let ready = Arc::new(AtomicBool::new(false));
    let health = Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(ready.clone());
    let metrics_router =
        Router::new().route("/metrics", get(metrics_text)).with_state((metrics.clone(), cluster.clone()));
    let servers = [
        tokio::spawn({
            let port = settings.health_probe_port;
            async move { serve(port, health, "health probes").await }
        }),
        tokio::spawn({
            let port = settings.metrics_port;
            async move { serve(port, metrics_router, "metrics").await }
        }),
    ];

    let mut shutdown = std::pin::pin!(shutdown_signal());
    // Leadership: a watch channel that says whether this replica leads.
    let mut always_leading = None;
    let (mut leading, lease) = if settings.disable_leader_election {
        let (tx, rx) = tokio::sync::watch::channel(true);
        always_leading = Some(tx);
        (rx, None)
    } else {
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &settings.leader_election_name)
            .with_namespace(&namespace)
            .with_identity(&identity)
            .with_duration(LEASE_DURATION_SECONDS)
            .with_grace(LEASE_GRACE_SECONDS)
            .build()
            .await
            .with_context(|| {
                format!("joining the leader election on Lease {namespace}/{}", settings.leader_election_name)
            })?;
        let (rx, task) = manager.watch().await;
        (rx, Some(task))
    };

    tokio::select! {
        _ = cluster.wait_synced() => {}
        _ = &mut shutdown => return Ok(()),
    }
    ready.store(true, Ordering::Release);
    metrics.synced(true);
    tracing::info!("cluster state synced");

    let changes = cluster.changes();
    let mut runtime: Option<Runtime> = None;
    loop {
        for s in &servers {
            if s.is_finished() {
                anyhow::bail!("a health or metrics server stopped; see the log above");
            }
        }
        let leader = *leading.borrow_and_update();
        metrics.leader(leader);
        gate.send_if_modified(|was| std::mem::replace(was, leader) != leader);
        match (leader, runtime.is_some()) {
            (true, false) => {
                tracing::info!(%identity, "leading: starting the controllers");
                let rt = Runtime::new(Arc::new(SystemClock), registry.clone(), settings.clone(), random_names());
                runtime = Some(rt.with_unavailable(unavailable.clone()));
            }
            (false, true) => {
                tracing::warn!(%identity, "no longer leading: stopping the controllers");
                runtime = None;
            }
            _ => {}
        }
        let mut wait = MAX_IDLE;
        if let Some(rt) = runtime.as_mut() {
            rt.step(&*cluster).await;
            metrics.observe(rt, &cluster.snapshot());
            let until = jiff::Timestamp::now().duration_until(rt.next_wake());
            wait = Duration::try_from(until).unwrap_or_default().min(MAX_IDLE);
        }
        tokio::select! {
            _ = tokio::time::sleep(wait.max(MIN_SPACING)) => {}
            _ = changes.notified() => tokio::time::sleep(MIN_SPACING).await,
            _ = leading.changed() => {}
            _ = &mut shutdown => break,
        }
    }
    tracing::info!("shutting down");
    drop(runtime);
    drop(always_leading);
    // Dropping the receiver makes the lease task release the lease.
    drop(leading);
    if let Some(task) = lease {
        match tokio::time::timeout(Duration::from_secs(5), task).await {
            Ok(Ok(Ok(_))) => tracing::info!("leader lease released"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "releasing the leader lease"),
            Ok(Err(e)) => tracing::warn!(error = %e, "the lease task failed"),
            Err(_) => tracing::warn!("releasing the leader lease timed out"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_look_like_generate_name_and_do_not_repeat() {
        let mut names = random_names();
        let a = names("default");
        let b = names("default");
        assert_ne!(a, b);
        assert!(a.starts_with("default-") && a.len() == "default-".len() + 5, "{a}");
        assert!(a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
    }
}
