//! The existing nodes of a scheduling pass, kept so that the simulations cloned from one pass share them.
//!
//! Consolidation clones a pass once per simulation and places a few pods; a fleet has thousands of nodes.
//! The nodes are held in chunks shared by the clones: a clone copies one pointer per chunk, and a placement
//! copies only the chunk it writes to. Each chunk also keeps the most room any of its nodes has, so a pod
//! skips, whole, the chunks where no node has room for it, in the same node order as a scan of every node.

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
}

#[derive(Debug, Clone)]
struct Chunk {
    nodes: Vec<Arc<Node>>,
    /// The most room any of its nodes taking pods has, entry by entry (the inline entries of
    /// [`Resources`]); `None` when none takes pods.
    room: Option<Resources>,
}

impl Chunk {
    fn new(nodes: Vec<Arc<Node>>) -> Self {
        let mut chunk = Self { nodes, room: None };
        chunk.measure();
        chunk
    }

    fn measure(&mut self) {
        let mut room: Option<Resources> = None;
        for n in self.nodes.iter().filter(|n| n.accepts_pods) {
            match room.as_mut() {
                Some(r) => r.raise_inline(&n.available),
                None => room = Some(n.available.clone()),
            }
        }
        self.room = room;
    }
}

/// The existing nodes, in the order the pass was given them. See the [module docs](self).
#[derive(Debug, Clone, Default)]
pub(super) struct Nodes {
    chunks: Vec<Arc<Chunk>>,
    len: usize,
}

impl Nodes {
    pub(super) fn new(nodes: Vec<Node>) -> Self {
        let len = nodes.len();
        let mut chunks = Vec::with_capacity(len.div_ceil(CHUNK));
        let mut nodes = nodes.into_iter().map(Arc::new).peekable();
        while nodes.peek().is_some() {
            chunks.push(Arc::new(Chunk::new(nodes.by_ref().take(CHUNK).collect())));
        }
        Self { chunks, len }
    }

    pub(super) fn len(&self) -> usize {
        self.len
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
        chunk.measure();
        Some(out)
    }

    /// The indexes of the nodes, in order, that might have room for `requests`: every node but those of
    /// chunks where no node taking pods has that much of some resource.
    pub(super) fn with_room_for<'a>(&'a self, requests: &'a Resources) -> impl Iterator<Item = usize> + 'a {
        self.chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.room.as_ref().is_some_and(|room| requests.under_inline(room)))
            .flat_map(|(at, c)| at * CHUNK..at * CHUNK + c.nodes.len())
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
        }
    }

    /// The nodes `with_room_for` offers, against those a scan of every node finds room on.
    fn offered(nodes: &Nodes, cpu: i64) -> (Vec<usize>, Vec<usize>) {
        let want = Resources::cpu_memory(cpu, 1 << 20);
        let fits: Vec<usize> =
            (0..nodes.len()).filter(|&i| nodes[i].accepts_pods && want.fits(&nodes[i].available)).collect();
        let offered: Vec<usize> =
            nodes.with_room_for(&want).filter(|&i| nodes[i].accepts_pods && want.fits(&nodes[i].available)).collect();
        (offered, fits)
    }

    #[test]
    fn chunks_skipped_hold_no_node_with_room() {
        // 100 nodes over four chunks; room grows with the index, every seventh node takes no pods.
        let all: Vec<Node> = (0..100).map(|i| node(&format!("n{i}"), i * 10, i % 7 != 0)).collect();
        let mut nodes = Nodes::new(all);
        assert_eq!(nodes.len(), 100);
        assert_eq!(nodes.iter().count(), 100);
        for cpu in [0, 5, 300, 315, 320, 645, 990, 1000] {
            let (offered, fits) = offered(&nodes, cpu);
            assert_eq!(offered, fits, "{cpu}m");
        }
        // The first chunks are skipped whole for a pod only the last chunk has room for.
        assert_eq!(nodes.with_room_for(&Resources::cpu_memory(970, 0)).next(), Some(96));
        // A clone shares the chunks; a change to it re-measures the chunk it copies, and the original keeps
        // its room.
        let mut copy = nodes.clone();
        copy.update(99, |n| n.available = Resources::cpu_memory(0, 0));
        copy.update(97, |n| n.accepts_pods = false);
        assert_eq!(copy.with_room_for(&Resources::cpu_memory(970, 0)).next(), None);
        assert_eq!(nodes.with_room_for(&Resources::cpu_memory(970, 0)).next(), Some(96));
        nodes.update(3, |n| n.available = Resources::cpu_memory(5000, 1 << 30));
        assert_eq!(
            nodes.with_room_for(&Resources::cpu_memory(2000, 0)).collect::<Vec<_>>(),
            (0..32).collect::<Vec<_>>()
        );
        assert_eq!(offered(&nodes, 2000), (vec![3], vec![3]));
        assert_eq!(nodes.update(100, |_| ()), None);
        assert_eq!(nodes.get(100).map(|n| n.info.name.clone()), None);
        assert_eq!(nodes.get(42).map(|n| n.info.name.clone()), Some("n42".to_owned()));
    }
}
