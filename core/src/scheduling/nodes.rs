//! The existing nodes of a scheduling pass, kept so that the simulations cloned from one pass share them.
//!
//! Consolidation clones a pass once per simulation and places a few pods; a fleet has thousands of nodes.
//! The nodes are held in chunks shared by the clones: a clone copies one pointer per chunk, and a placement
//! copies only the chunk it writes to. Each chunk also keeps a bound on the most room any of its nodes has,
//! so a pod skips, whole, the chunks where no node has room for it, in the same node order as a scan of
//! every node.

use std::sync::Arc;

use super::pod::HostPort;
use super::scheduler::VolumeRoom;
use super::topology::NodeView;
use crate::resources::Resources;

/// How many nodes a chunk holds: small enough that copying one for a placement is cheap, large enough
/// that a clone copies few pointers and a pod skips many nodes at once.
const CHUNK: usize = 32;

/// An existing node as one pass sees it.
#[derive(Debug, Clone)]
pub(super) struct Node {
    /// What does not change about the node during a pass (name, labels, their requirements, taints),
    /// shared by every simulation and by topology.
    pub(super) info: Arc<NodeView>,
    pub(super) available: Resources,
    pub(super) host_ports: Vec<HostPort>,
    pub(super) accepts_pods: bool,
    pub(super) volume_room: Vec<VolumeRoom>,
    pub(super) pods: Vec<usize>,
    /// A solve told to stop on marked nodes stops once a pod lands here
    /// ([`Scheduler::stop_on_landing`](super::Scheduler::stop_on_landing)).
    pub(super) ends_solve: bool,
}

impl Node {
    /// What pods could still take of the node: its available resources, none below zero; nothing when it
    /// takes no pods.
    pub(super) fn room(&self) -> Resources {
        if self.accepts_pods { self.available.max(&Resources::ZERO) } else { Resources::ZERO }
    }
}

#[derive(Debug, Clone)]
struct Chunk {
    nodes: Vec<Arc<Node>>,
    /// At least the most room any of its nodes taking pods has, entry by entry (the inline entries of
    /// [`Resources`]); `None` when none takes pods. Exact when the chunk is built; a change to a node only
    /// raises it where that node now has more, so what a pass takes away leaves it high, never low.
    room: Option<Resources>,
}

impl Chunk {
    fn new(nodes: Vec<Arc<Node>>) -> Self {
        let mut chunk = Self { nodes, room: None };
        for i in 0..chunk.nodes.len() {
            chunk.raise(i);
        }
        chunk
    }

    /// Raises `room` to node `i`'s where it has more.
    fn raise(&mut self, i: usize) {
        let n = &self.nodes[i];
        if !n.accepts_pods {
            return;
        }
        match self.room.as_mut() {
            Some(r) => r.raise_inline(&n.available),
            None => self.room = Some(n.available.clone()),
        }
    }

    fn may_hold(&self, requests: &Resources) -> bool {
        self.room.as_ref().is_some_and(|room| requests.under_inline(room))
    }
}

/// The existing nodes, in the order the pass was given them. See the [module docs](self).
#[derive(Debug, Clone, Default)]
pub(super) struct Nodes {
    chunks: Vec<Arc<Chunk>>,
}

impl Nodes {
    pub(super) fn new(nodes: Vec<Node>) -> Self {
        let mut chunks = Vec::with_capacity(nodes.len().div_ceil(CHUNK));
        let mut nodes = nodes.into_iter().map(Arc::new).peekable();
        while nodes.peek().is_some() {
            chunks.push(Arc::new(Chunk::new(nodes.by_ref().take(CHUNK).collect())));
        }
        Self { chunks }
    }

    pub(super) fn get(&self, i: usize) -> Option<&Node> {
        self.chunks.get(i / CHUNK).and_then(|c| c.nodes.get(i % CHUNK)).map(|n| &**n)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Node> {
        self.chunks.iter().flat_map(|c| c.nodes.iter().map(|n| &**n))
    }

    /// Changes node `i` with `f`, copying the node and its chunk first when a clone shares them; `None` when
    /// there is no such node.
    pub(super) fn update<R>(&mut self, i: usize, f: impl FnOnce(&mut Node) -> R) -> Option<R> {
        let chunk = Arc::make_mut(self.chunks.get_mut(i / CHUNK)?);
        let node = Arc::make_mut(chunk.nodes.get_mut(i % CHUNK)?);
        let out = f(node);
        chunk.raise(i % CHUNK);
        Some(out)
    }

    /// The first node, in order, that `fits` accepts (given the node's index and the node), asked only of
    /// nodes that might have room for `requests`: every node but those of chunks where no node taking pods
    /// has that much of some resource.
    pub(super) fn find(&self, requests: &Resources, mut fits: impl FnMut(usize, &Node) -> bool) -> Option<usize> {
        for (at, chunk) in self.chunks.iter().enumerate() {
            if !chunk.may_hold(requests) {
                continue;
            }
            if let Some(j) = chunk.nodes.iter().enumerate().position(|(j, n)| fits(at * CHUNK + j, n)) {
                return Some(at * CHUNK + j);
            }
        }
        None
    }
}

impl std::ops::Index<usize> for Nodes {
    type Output = Node;

    fn index(&self, i: usize) -> &Node {
        &self.chunks[i / CHUNK].nodes[i % CHUNK]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::requirements::Requirements;
    use std::collections::BTreeMap;

    fn node(name: &str, cpu: i64, accepts_pods: bool) -> Node {
        Node {
            info: Arc::new(NodeView {
                name: name.to_owned(),
                labels: Arc::new(BTreeMap::new()),
                reqs: Arc::new(Requirements::default()),
                taints: Vec::new(),
            }),
            available: Resources::cpu_memory(cpu, 1 << 30),
            host_ports: Vec::new(),
            accepts_pods,
            volume_room: Vec::new(),
            pods: Vec::new(),
            ends_solve: false,
        }
    }

    /// The first node with room for `cpu` that `find` gives, against a scan of every node; and the nodes
    /// `find` asks about.
    fn first(nodes: &Nodes, cpu: i64) -> (Option<usize>, Option<usize>, Vec<String>) {
        let want = Resources::cpu_memory(cpu, 1 << 20);
        let has_room = |n: &Node| n.accepts_pods && want.fits(&n.available);
        let scan = nodes.iter().position(has_room);
        let mut asked = Vec::new();
        let found = nodes.find(&want, |i, n| {
            assert_eq!(nodes.get(i).map(|m| &m.info.name), Some(&n.info.name), "the index names the node");
            asked.push(n.info.name.clone());
            has_room(n)
        });
        (found, scan, asked)
    }

    #[test]
    fn chunks_skipped_hold_no_node_with_room() {
        // 100 nodes over four chunks; room grows with the index, every seventh node takes no pods.
        let all: Vec<Node> = (0..100).map(|i| node(&format!("n{i}"), i * 10, i % 7 != 0)).collect();
        let mut nodes = Nodes::new(all);
        assert_eq!(nodes.iter().count(), 100);
        for cpu in [0, 5, 300, 315, 320, 645, 990, 1000] {
            let (found, scan, _) = first(&nodes, cpu);
            assert_eq!(found, scan, "{cpu}m");
        }
        // A pod only the last chunk has room for is asked of that chunk alone.
        let (found, _, asked) = first(&nodes, 970);
        assert_eq!((found, asked.first().map(String::as_str)), (Some(97), Some("n96")));
        // A clone shares the chunks; what it takes away stays its own, and it still finds what a scan finds
        // (its bound stays high).
        let mut copy = nodes.clone();
        copy.update(99, |n| n.available = Resources::cpu_memory(0, 0));
        copy.update(97, |n| n.accepts_pods = false);
        assert_eq!(first(&copy, 985), (None, None, vec!["n96".to_owned(), "n97".into(), "n98".into(), "n99".into()]));
        assert_eq!(first(&copy, 955).0, Some(96));
        assert_eq!(first(&nodes, 985).0, Some(99));
        // Room given to a node raises its chunk's bound: the first chunk is asked again.
        nodes.update(3, |n| n.available = Resources::cpu_memory(5000, 1 << 30));
        let (found, scan, asked) = first(&nodes, 2000);
        assert_eq!((found, scan), (Some(3), Some(3)));
        assert_eq!(asked, ["n0", "n1", "n2", "n3"]);
        // A chunk none of whose nodes takes pods is never asked.
        let mut closed = Nodes::new((0..40).map(|i| node(&format!("c{i}"), 100, i >= 32)).collect());
        assert_eq!(first(&closed, 0).2.first().map(String::as_str), Some("c32"));
        closed.update(33, |n| n.pods.push(7));
        assert_eq!(closed.get(33).map(|n| n.pods.clone()), Some(vec![7]));
        assert_eq!(nodes.update(100, |_| ()), None);
        assert_eq!(nodes.get(100).map(|n| n.info.name.clone()), None);
        assert_eq!(nodes.get(42).map(|n| n.info.name.clone()), Some("n42".to_owned()));
    }
}
