//! Well-known label, annotation, taint and finalizer keys.
//!
//! The `karpenter.sh/*` keys are Karpenter's, so NodePools, pods and dashboards written for Karpenter keep
//! working. The Kubernetes keys are the standard node labels the scheduler understands.

/// Label: the NodePool that owns a node or claim.
pub const NODE_POOL: &str = "karpenter.sh/nodepool";
/// Label: `on-demand`, `spot` or `reserved`.
pub const CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// Label set to `"true"` once a node has registered with its claim.
pub const REGISTERED: &str = "karpenter.sh/registered";
/// Label set to `"true"` once a node is initialized (Ready, startup taints gone, extended resources reported).
pub const INITIALIZED: &str = "karpenter.sh/initialized";
/// Label: the reservation an offering or node belongs to.
pub const RESERVATION_ID: &str = "karpenter.sh/reservation-id";

/// Annotation on a pod or node: `"true"`, or a duration since the pod started, blocks voluntary disruption.
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Annotation on a node: `"true"` blocks node auto repair.
pub const DO_NOT_REPAIR: &str = "karpenter.sh/do-not-repair";
/// Annotation on a pod: a 32-bit integer weighing how costly the pod is to evict.
pub const DISRUPTION_COST: &str = "karpenter.sh/disruption-cost";
/// Label on a node: `"true"` stops tenon from syncing the claim's taints onto it at registration.
pub const DO_NOT_SYNC_TAINTS: &str = "karpenter.sh/do-not-sync-taints";
/// Annotation on a NodePool: `binpack` (default) or `marginal-cost`.
pub const NODECLAIM_PACKING_POLICY: &str = "karpenter.sh/nodeclaim-packing-policy";
/// Annotation on a NodePool: a duration overriding the 15-minute registration timeout for its claims.
pub const NODECLAIM_REGISTRATION_TIMEOUT: &str = "karpenter.sh/nodeclaim-registration-timeout";
/// Annotation on a NodePool: the hash of its claim template, compared for drift.
pub const NODEPOOL_HASH: &str = "karpenter.sh/nodepool-hash";
/// Annotation on a NodePool: the version of the hashing scheme.
pub const NODEPOOL_HASH_VERSION: &str = "karpenter.sh/nodepool-hash-version";
/// Annotation on a NodeClaim: `"true"` when its `minValues` were lowered to what its options meet
/// (`min-values-policy: BestEffort`).
pub const NODECLAIM_MIN_VALUES_RELAXED: &str = "karpenter.sh/nodeclaim-min-values-relaxed";
/// Annotation on a NodeClaim: when its termination grace period runs out.
pub const NODECLAIM_TERMINATION_TIMESTAMP: &str = "karpenter.sh/nodeclaim-termination-timestamp";

/// Taint key on a node being disrupted (`NoSchedule`).
pub const DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
/// Taint key on a node that has not registered with its claim yet (`NoExecute`).
pub const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";
/// Taint key on a node being rebooted for repair (`NoSchedule`).
pub const REBOOTING_TAINT: &str = "karpenter.sh/rebooting";
/// Finalizer that holds a node or claim until termination has drained and released it.
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";

/// Label: the node's zone.
pub const ZONE: &str = "topology.kubernetes.io/zone";
/// Label: the node's region.
pub const REGION: &str = "topology.kubernetes.io/region";
/// Label: the node's instance type.
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Label: the node's CPU architecture.
pub const ARCH: &str = "kubernetes.io/arch";
/// Label: the node's operating system.
pub const OS: &str = "kubernetes.io/os";
/// Label: the node's hostname.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// Label: the Windows build of a Windows node.
pub const WINDOWS_BUILD: &str = "node.kubernetes.io/windows-build";

/// Legacy zone label, normalized to [`ZONE`].
pub const LEGACY_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
/// Legacy region label, normalized to [`REGION`].
pub const LEGACY_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Legacy instance-type label, normalized to [`INSTANCE_TYPE`].
pub const LEGACY_INSTANCE_TYPE: &str = "beta.kubernetes.io/instance-type";
/// Legacy architecture label, normalized to [`ARCH`].
pub const LEGACY_ARCH: &str = "beta.kubernetes.io/arch";
/// Legacy OS label, normalized to [`OS`].
pub const LEGACY_OS: &str = "beta.kubernetes.io/os";

/// Keys that may be left undefined on the node side of a requirement (every provider defines them).
pub const WELL_KNOWN_LABELS: [&str; 8] =
    [NODE_POOL, ZONE, REGION, INSTANCE_TYPE, ARCH, OS, CAPACITY_TYPE, WINDOWS_BUILD];

/// Labels a NodePool template may not set: tenon owns them.
pub const RESTRICTED_LABELS: [&str; 4] = [HOSTNAME, REGISTERED, INITIALIZED, NODE_POOL];

/// Known taints that come and go while a node boots (key and effect), as Karpenter lists them: a node is
/// not initialized while it carries one, or any taint under [`READINESS_TAINT_PREFIX`].
pub const KNOWN_EPHEMERAL_TAINTS: [(&str, &str); 5] = [
    ("node.kubernetes.io/not-ready", "NoSchedule"),
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoSchedule"),
    ("node.cloudprovider.kubernetes.io/uninitialized", "NoSchedule"),
    (UNREGISTERED_TAINT, "NoExecute"),
];

/// The prefix of node readiness taints (`readiness.k8s.io/…`, any value and effect): ephemeral, as
/// [`KNOWN_EPHEMERAL_TAINTS`], removed by whatever gates the node's readiness.
pub const READINESS_TAINT_PREFIX: &str = "readiness.k8s.io/";

/// Whether a taint is one of the ephemeral taints of a booting node.
pub fn is_known_ephemeral_taint(key: &str, effect: &str) -> bool {
    key.starts_with(READINESS_TAINT_PREFIX) || KNOWN_EPHEMERAL_TAINTS.iter().any(|(k, e)| *k == key && *e == effect)
}

/// The key Kubernetes uses for `key`, mapping legacy beta labels to their GA names.
pub fn normalize(key: &str) -> &str {
    match key {
        LEGACY_ZONE => ZONE,
        LEGACY_REGION => REGION,
        LEGACY_INSTANCE_TYPE => INSTANCE_TYPE,
        LEGACY_ARCH => ARCH,
        LEGACY_OS => OS,
        other => other,
    }
}

/// Whether `key` is well known: defined by every provider, so it may be undefined on the node side.
pub fn is_well_known(key: &str) -> bool {
    WELL_KNOWN_LABELS.contains(&normalize(key))
}

/// Capacity type value: on-demand.
pub const CAPACITY_TYPE_ON_DEMAND: &str = "on-demand";
/// Capacity type value: spot.
pub const CAPACITY_TYPE_SPOT: &str = "spot";
/// Capacity type value: reserved.
pub const CAPACITY_TYPE_RESERVED: &str = "reserved";
