//! Routing NodePools and NodeClaims to providers.

use std::collections::HashMap;
use std::sync::Arc;

use super::types::NodeClassKind;
use super::{CloudProvider, DynCloudProvider};
use crate::api::{NodeClaim, NodeClassRef, NodePool};

/// Why a pool or claim cannot be routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// No provider serves the object's NodeClass kind.
    #[error("{object}: spec.template.spec.nodeClassRef: no provider serves {kind} (registered: {registered})")]
    UnknownNodeClass {
        /// `NodePool/name` or `NodeClaim/name`.
        object: String,
        /// The NodeClass kind asked for.
        kind: NodeClassKind,
        /// The kinds that are registered.
        registered: String,
    },
    /// The object names no NodeClass and more than one provider is registered.
    #[error(
        "{object}: spec.template.spec.nodeClassRef is required when several providers are registered ({registered})"
    )]
    Ambiguous {
        /// `NodePool/name` or `NodeClaim/name`.
        object: String,
        /// The registered providers.
        registered: String,
    },
    /// No provider is registered at all.
    #[error("{object}: no provider is registered")]
    Empty {
        /// `NodePool/name` or `NodeClaim/name`.
        object: String,
    },
    /// Two providers claim the same NodeClass kind.
    #[error("providers {first} and {second} both serve {kind}")]
    DuplicateKind {
        /// The contested kind.
        kind: NodeClassKind,
        /// The provider registered first.
        first: String,
        /// The provider registered second.
        second: String,
    },
}

/// The providers serving one cluster, routed by NodeClass group and kind.
#[derive(Debug, Default, Clone)]
pub struct ProviderRegistry {
    providers: Vec<DynCloudProvider>,
    by_kind: HashMap<NodeClassKind, usize>,
}

impl ProviderRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same routing over each provider passed through `wrap` (a metrics or logging decorator, which
    /// must keep the provider's name and descriptor).
    #[must_use]
    pub fn wrapped(self, wrap: impl FnMut(DynCloudProvider) -> DynCloudProvider) -> Self {
        Self { providers: self.providers.into_iter().map(wrap).collect(), by_kind: self.by_kind }
    }

    /// Adds a provider for every NodeClass kind its descriptor lists.
    pub fn register(&mut self, provider: impl CloudProvider) -> Result<&mut Self, RegistryError> {
        self.register_arc(Arc::new(provider))
    }

    /// Adds an already shared provider.
    pub fn register_arc(&mut self, provider: DynCloudProvider) -> Result<&mut Self, RegistryError> {
        let index = self.providers.len();
        for kind in provider.descriptor().node_classes {
            if let Some(&other) = self.by_kind.get(&kind) {
                return Err(RegistryError::DuplicateKind {
                    kind,
                    first: self.providers[other].name().to_owned(),
                    second: provider.name().to_owned(),
                });
            }
            self.by_kind.insert(kind, index);
        }
        self.providers.push(provider);
        Ok(self)
    }

    /// Every registered provider.
    pub fn providers(&self) -> &[DynCloudProvider] {
        &self.providers
    }

    /// The provider named `name`.
    pub fn by_name(&self, name: &str) -> Option<&DynCloudProvider> {
        self.providers.iter().find(|p| p.name() == name)
    }

    fn registered(&self) -> String {
        let mut kinds: Vec<String> = self.by_kind.keys().map(ToString::to_string).collect();
        kinds.sort();
        if kinds.is_empty() { "none".into() } else { kinds.join(", ") }
    }

    fn route(&self, object: String, class: Option<&NodeClassRef>) -> Result<&DynCloudProvider, RegistryError> {
        match class {
            Some(r) => {
                let kind = NodeClassKind::new(r.group.clone(), r.kind.clone());
                self.by_kind.get(&kind).map(|&i| &self.providers[i]).ok_or_else(|| RegistryError::UnknownNodeClass {
                    object,
                    kind,
                    registered: self.registered(),
                })
            }
            None => match self.providers.as_slice() {
                [only] => Ok(only),
                [] => Err(RegistryError::Empty { object }),
                _ => Err(RegistryError::Ambiguous { object, registered: self.registered() }),
            },
        }
    }

    /// The provider for a NodePool: by its `nodeClassRef`, or the only provider when it names none.
    pub fn for_pool(&self, pool: &NodePool) -> Result<&DynCloudProvider, RegistryError> {
        self.route(format!("NodePool/{}", pool.name()), pool.spec.template.spec.node_class_ref.as_ref())
    }

    /// The provider for a NodeClaim.
    pub fn for_claim(&self, claim: &NodeClaim) -> Result<&DynCloudProvider, RegistryError> {
        self.route(format!("NodeClaim/{}", claim.name()), claim.spec.node_class_ref.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodePoolSpec;
    use crate::cloud::fake::FakeCloud;

    fn pool(name: &str, class: Option<(&str, &str)>) -> NodePool {
        let mut p = NodePool::new(name, NodePoolSpec::default());
        p.spec.template.spec.node_class_ref =
            class.map(|(g, k)| NodeClassRef { group: g.into(), kind: k.into(), name: "default".into() });
        p
    }

    #[test]
    fn routes_by_group_and_kind_and_rejects_unknown_kinds_per_pool() {
        let mut reg = ProviderRegistry::new();
        reg.register(FakeCloud::builder().name("metal").node_class("tenon.dev", "SelfManagedNodeClass").build())
            .unwrap();
        reg.register(FakeCloud::builder().name("cloud").node_class("karpenter.k8s.aws", "EC2NodeClass").build())
            .unwrap();
        let metal = pool("gpu-owned", Some(("tenon.dev", "SelfManagedNodeClass")));
        let cloud = pool("gpu-burst", Some(("karpenter.k8s.aws", "EC2NodeClass")));
        assert_eq!(reg.for_pool(&metal).unwrap().name(), "metal");
        assert_eq!(reg.for_pool(&cloud).unwrap().name(), "cloud");
        let err = reg.for_pool(&pool("odd", Some(("example.com", "Widget")))).unwrap_err();
        assert!(err.to_string().contains("NodePool/odd"), "{err}");
        assert!(err.to_string().contains("example.com/Widget"), "{err}");
        assert!(matches!(reg.for_pool(&pool("none", None)), Err(RegistryError::Ambiguous { .. })));
        // The other pools still route.
        assert_eq!(reg.for_pool(&metal).unwrap().name(), "metal");
    }

    #[test]
    fn a_single_provider_serves_pools_without_a_node_class() {
        let mut reg = ProviderRegistry::new();
        reg.register(FakeCloud::builder().build()).unwrap();
        assert!(reg.for_pool(&pool("default", None)).is_ok());
        assert!(matches!(ProviderRegistry::new().for_pool(&pool("x", None)), Err(RegistryError::Empty { .. })));
    }

    #[test]
    fn two_providers_cannot_claim_one_kind() {
        let mut reg = ProviderRegistry::new();
        reg.register(FakeCloud::builder().name("a").node_class("g", "K").build()).unwrap();
        let err = reg.register(FakeCloud::builder().name("b").node_class("g", "K").build()).unwrap_err();
        assert!(matches!(err, RegistryError::DuplicateKind { .. }));
    }
}
