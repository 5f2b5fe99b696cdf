//! A bounded search for a cheaper packing of the claims marginal-cost pools open in a pass.
//!
//! The greedy pass places each pod, largest first, wherever the price rises least at that moment. That
//! misses packings no single placement reveals: a memory-heavy pod fills the spare memory of an
//! expensive claim (a GPU node) and strands its CPU, so CPU pods need a claim of their own; a claim grows
//! into a bigger type (cheaper, then, than opening another) and no later pod uses the room.
//!
//! After the greedy pass, each marginal-cost pool's claims go through a large-neighbourhood search. A
//! step empties a few claims of their movable pods and places those pods again, one by one where the
//! price rises least (among equal rises: an open claim before a new one, then the tightest fit), into the
//! emptied claims, a few other claims of the pool and, when the pool has no limits, one new claim; the
//! pods are taken in one of four orders (dominant share of the largest type, CPU, memory, shuffled). A
//! step is kept only when the claims it touched cost strictly less than before, so the result never
//! costs more than the greedy pass. Before the steps, pairs of claims whose pods fit one claim cheaper
//! than the two are merged (within a quarter of the budget); the first steps then empty each claim once,
//! cheapest first, and the rest empty one to four claims drawn at random.
//!
//! The search is deterministic (a fixed-seed generator, no clock) and bounded by a budget of price
//! evaluations: `EVALS_PER_POD_AND_CLAIM` per movable pod and claim, at most `MAX_EVALS` per pool.
//!
//! Only what is provably safe moves:
//! - claims opened in the pass (existing nodes never change) whose requirements are still exactly their
//!   pool's: every pod on such a claim added nothing to them, so it fits any other such claim of the pool;
//! - pods with no topology terms of their own (required or preferred), counted by no topology group of
//!   the pass, binding no host port and attaching no volume: where they land changes nothing any
//!   constraint sees. Other pods stay on their claim, which can still take pods and change type;
//! - pools with no `minValues` requirement and whose cheapest offerings draw on no reservation (a
//!   reservation's capacity is shared between claims, so a claim's price would depend on the others).
//!
//! A claim's price is its cheapest option's cheapest allowed offering (under the pass's price ceiling),
//! as the greedy pass prices it. A pool with limits never ends with more claims than the greedy pass
//! opened, and its claims' reserved capacity (the largest of each claim's options) is re-counted claim
//! by claim against what the changed claims had reserved; if it does not fit, the pool keeps its greedy
//! packing.

use std::sync::Arc;

use super::{Claim, OfferFilter, Packing, Scheduler};
use crate::resources::{ResourceName, Resources};
use crate::scheduling::PodInfo;

/// Price evaluations granted per movable pod and claim of a pool.
const EVALS_PER_POD_AND_CLAIM: u64 = 48;
/// The most price evaluations spent on one pool in a pass.
const MAX_EVALS: u64 = 400_000;
/// The most claims one step empties.
const MAX_EMPTIED: usize = 4;
/// How many other claims of the pool a step offers the pods it moves (all of them when there are fewer).
const NEIGHBOURS: usize = 8;
/// Price differences below this (per hour) are float noise, not savings.
const EPSILON: f64 = 1e-7;
/// The seed of the search's choices, fixed so that every pass over the same input gives the same result.
const SEED: u64 = 0x7e40_0c1a_1b5e_ed01;

/// An instance type a claim of the pool can be, with the price of its cheapest allowed offering.
#[derive(Debug)]
struct Shape {
    /// Its index in the pool's types.
    option: u32,
    /// What pods can use on it.
    avail: Resources,
    /// Price per hour.
    price: f64,
}

/// A claim as the search sees it.
#[derive(Debug, Clone)]
struct Bin {
    /// The claim it stands for (`None`: a claim the search opened).
    claim: Option<usize>,
    /// The requests of the pods that cannot move.
    fixed: Resources,
    /// Whether it holds pods that cannot move (so it cannot be emptied).
    anchored: bool,
    /// Its movable pods (indices of the search's items).
    items: Vec<usize>,
    /// `fixed` plus the requests of `items`.
    load: Resources,
    /// Its cheapest shape (`None` when empty).
    shape: Option<usize>,
    /// That shape's price (zero when empty).
    price: f64,
}

impl Bin {
    fn empty() -> Self {
        Self {
            claim: None,
            fixed: Resources::ZERO,
            anchored: false,
            items: Vec::new(),
            load: Resources::ZERO,
            shape: None,
            price: 0.0,
        }
    }

    /// Whether it holds no pod (it costs nothing and would not be bought).
    fn is_empty(&self) -> bool {
        !self.anchored && self.items.is_empty()
    }
}

/// SplitMix64: small, fast and the same everywhere.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The order in which a step places the pods it moves (ties by item index).
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Largest share of the largest type's room first, in whichever resource it is largest.
    DominantShare,
    /// Most CPU first, then most memory.
    Cpu,
    /// Most memory first, then most CPU.
    Memory,
    /// Shuffled.
    Shuffled,
}

const ORDERS: [Order; 4] = [Order::DominantShare, Order::Cpu, Order::Memory, Order::Shuffled];

/// The search over one pool's bins.
#[derive(Debug)]
struct Search<'a> {
    /// The pool's shapes, cheapest first.
    shapes: &'a [Shape],
    /// The requests of each movable pod.
    sizes: &'a [Resources],
    /// Each item's dominant share.
    share: Vec<f64>,
    /// The largest CPU and memory any shape offers, for comparing fits.
    scale: (f64, f64),
    /// Whether a step may open a claim.
    open_new: bool,
    evals: u64,
    budget: u64,
    rng: Rng,
}

impl<'a> Search<'a> {
    fn new(shapes: &'a [Shape], sizes: &'a [Resources], budget: u64, open_new: bool) -> Self {
        let largest = Resources::max_of(shapes.iter().map(|s| &s.avail));
        let share = sizes
            .iter()
            .map(|size| {
                size.iter()
                    .map(|(name, v)| match largest.get(name) {
                        room if room > 0 => v as f64 / room as f64,
                        _ => 0.0,
                    })
                    .fold(0.0, f64::max)
            })
            .collect();
        let scale = (largest.get(ResourceName::CPU).max(1) as f64, largest.get(ResourceName::MEMORY).max(1) as f64);
        Self { shapes, sizes, share, scale, open_new, evals: 0, budget, rng: Rng(SEED) }
    }

    fn exhausted(&self) -> bool {
        self.evals >= self.budget
    }

    /// The cheapest shape at or after `from` that holds `load`. Shapes are cheapest first, so a bin
    /// growing from shape `s` never needs to look before `s`.
    fn cheapest(&mut self, load: &Resources, from: usize) -> Option<usize> {
        self.evals += 1;
        (from..self.shapes.len()).find(|s| load.fits(&self.shapes[*s].avail))
    }

    /// Prices `bin` from scratch; false when no shape holds it.
    fn reprice(&mut self, bin: &mut Bin) -> bool {
        if bin.is_empty() {
            bin.shape = None;
            bin.price = 0.0;
            return true;
        }
        match self.cheapest(&bin.load, 0) {
            Some(s) => {
                bin.shape = Some(s);
                bin.price = self.shapes[s].price;
                true
            }
            None => false,
        }
    }

    /// How much room a bin of shape `s` holding `load` keeps, in its roomier of CPU and memory, as a share
    /// of the largest shape's.
    fn slack(&self, load: &Resources, s: usize) -> f64 {
        let avail = &self.shapes[s].avail;
        let cpu = (avail.get(ResourceName::CPU) - load.get(ResourceName::CPU)) as f64 / self.scale.0;
        let memory = (avail.get(ResourceName::MEMORY) - load.get(ResourceName::MEMORY)) as f64 / self.scale.1;
        cpu.max(memory)
    }

    /// Places `item` in the candidate bin where the price rises least: among equal rises an open bin
    /// before an empty one, then the tightest fit, then the earliest candidate. Only the first empty
    /// candidate is tried (empty bins are all alike). False when it fits none.
    fn insert(&mut self, bins: &mut [Bin], candidates: &[usize], item: usize) -> bool {
        let size = &self.sizes[item];
        // (rise, opens, slack, bin, shape)
        let mut best: Option<(f64, bool, f64, usize, usize)> = None;
        let mut empty_tried = false;
        for &b in candidates {
            let bin = &bins[b];
            let opens = bin.is_empty();
            if opens {
                if empty_tried {
                    continue;
                }
                empty_tried = true;
            }
            let load = bin.load.add(size);
            let Some(s) = self.cheapest(&load, bin.shape.unwrap_or(0)) else { continue };
            let rise = self.shapes[s].price - bin.price;
            let slack = self.slack(&load, s);
            let better = best.as_ref().is_none_or(|&(r, o, sl, _, _)| {
                rise < r - EPSILON || (rise <= r + EPSILON && ((o && !opens) || (o == opens && slack < sl)))
            });
            if better {
                best = Some((rise, opens, slack, b, s));
            }
        }
        let Some((_, _, _, b, s)) = best else { return false };
        let bin = &mut bins[b];
        bin.items.push(item);
        bin.load.add_assign(size);
        bin.shape = Some(s);
        bin.price = self.shapes[s].price;
        true
    }

    fn sort(&mut self, items: &mut [usize], order: Order) {
        let cpu = |i: usize| self.sizes[i].get(ResourceName::CPU);
        let memory = |i: usize| self.sizes[i].get(ResourceName::MEMORY);
        match order {
            Order::DominantShare => {
                items.sort_by(|&a, &b| self.share[b].total_cmp(&self.share[a]).then(a.cmp(&b)));
            }
            Order::Cpu => items.sort_by(|&a, &b| cpu(b).cmp(&cpu(a)).then(memory(b).cmp(&memory(a))).then(a.cmp(&b))),
            Order::Memory => {
                items.sort_by(|&a, &b| memory(b).cmp(&memory(a)).then(cpu(b).cmp(&cpu(a))).then(a.cmp(&b)));
            }
            Order::Shuffled => {
                let mut keyed: Vec<(u64, usize)> = items.iter().map(|&i| (self.rng.next(), i)).collect();
                keyed.sort_unstable();
                for (slot, (_, i)) in items.iter_mut().zip(keyed) {
                    *slot = i;
                }
            }
        }
    }

    /// One step: empties the bins `emptied` of their items and places those items again among them,
    /// `others` and (when allowed) a new bin, in `order`. Kept only when the bins touched cost strictly
    /// less; answers whether it was. Bins keep their indices (an emptied bin stays, empty).
    fn step(&mut self, bins: &mut Vec<Bin>, emptied: &[usize], others: &[usize], order: Order) -> bool {
        // Even a step that evaluates nothing uses the budget.
        self.evals += 1;
        let mut candidates: Vec<usize> = emptied.iter().chain(others).copied().collect();
        if self.open_new {
            bins.push(Bin::empty());
            candidates.push(bins.len() - 1);
        }
        let saved: Vec<Bin> = candidates.iter().map(|b| bins[*b].clone()).collect();
        let before: f64 = saved.iter().map(|b| b.price).sum();
        let mut items = Vec::new();
        let mut ok = true;
        for &b in emptied {
            let bin = &mut bins[b];
            items.append(&mut bin.items);
            bin.load = bin.fixed.clone();
            ok &= self.reprice(bin);
        }
        self.sort(&mut items, order);
        ok = ok && items.iter().all(|&i| self.insert(bins, &candidates, i));
        let after: f64 = candidates.iter().map(|b| bins[*b].price).sum();
        let kept = ok && after < before - EPSILON;
        if !kept {
            for (&b, bin) in candidates.iter().zip(saved) {
                bins[b] = bin;
            }
        }
        if self.open_new && bins.last().is_some_and(Bin::is_empty) {
            bins.pop();
        }
        kept
    }

    /// Merges pairs of bins whose contents fit one bin cheaper than the two (at least one of them must be
    /// free to empty), within a quarter of the budget: with many bins, pairs are many.
    fn merge_pairs(&mut self, bins: &mut [Bin]) {
        for i in 0..bins.len() {
            for j in i + 1..bins.len() {
                if self.evals >= self.budget / 4 {
                    return;
                }
                let (a, b) = (&bins[i], &bins[j]);
                if (a.anchored && b.anchored) || a.is_empty() || b.is_empty() {
                    continue;
                }
                let load = a.load.add(&b.load);
                let from = a.shape.unwrap_or(0).max(b.shape.unwrap_or(0));
                let Some(s) = self.cheapest(&load, from) else { continue };
                if self.shapes[s].price >= a.price + b.price - EPSILON {
                    continue;
                }
                // Into the anchored one, if either is.
                let (to, gone) = if b.anchored { (j, i) } else { (i, j) };
                let moved = std::mem::take(&mut bins[gone].items);
                bins[gone] = Bin { claim: bins[gone].claim, ..Bin::empty() };
                let target = &mut bins[to];
                target.items.extend(moved);
                target.load = load;
                target.shape = Some(s);
                target.price = self.shapes[s].price;
                if gone == i {
                    break;
                }
            }
        }
    }

    /// Picks `k` distinct entries of `from` (all of them when there are no more), in a random order.
    fn pick(&mut self, from: &[usize], k: usize) -> Vec<usize> {
        if from.len() <= k {
            return from.to_vec();
        }
        let mut pool = from.to_vec();
        for n in 0..k {
            let r = n + self.rng.below(pool.len() - n);
            pool.swap(n, r);
        }
        pool.truncate(k);
        pool
    }

    /// Runs the search until the budget is spent (or no bin has a movable pod), then drops the bins left
    /// empty.
    fn run(&mut self, bins: &mut Vec<Bin>) {
        self.merge_pairs(bins);
        // First, each bin once on its own, cheapest first; then steps drawn at random.
        let mut sweep: Vec<usize> = (0..bins.len()).filter(|b| !bins[*b].items.is_empty()).collect();
        sweep.sort_by(|&a, &b| bins[a].price.total_cmp(&bins[b].price).then(a.cmp(&b)));
        let mut sweep = sweep.into_iter();
        while !self.exhausted() {
            let (emptied, order) = match sweep.next() {
                Some(b) if bins[b].items.is_empty() => continue,
                Some(b) => (vec![b], Order::DominantShare),
                None => {
                    let loaded: Vec<usize> = (0..bins.len()).filter(|b| !bins[*b].items.is_empty()).collect();
                    if loaded.is_empty() {
                        break;
                    }
                    let k = 1 + self.rng.below(MAX_EMPTIED);
                    let emptied = self.pick(&loaded, k);
                    (emptied, ORDERS[self.rng.below(ORDERS.len())])
                }
            };
            let rest: Vec<usize> = (0..bins.len()).filter(|b| !bins[*b].is_empty() && !emptied.contains(b)).collect();
            let others = self.pick(&rest, NEIGHBOURS);
            self.step(bins, &emptied, &others, order);
        }
        bins.retain(|b| !b.is_empty());
    }
}

/// Whether a pod (counted by the topology groups `selecting`) can move between claims without any
/// constraint noticing.
fn movable(pod: &PodInfo, selecting: &[usize]) -> bool {
    selecting.is_empty()
        && pod.topology.is_empty()
        && pod.soft_spreads.is_empty()
        && pod.preferred_affinity.is_empty()
        && pod.preferred_anti_affinity.is_empty()
        && pod.host_ports.is_empty()
        && pod.volumes.is_empty()
}

impl Scheduler {
    /// Looks for a cheaper packing of the claims each marginal-cost pool opened in the pass (see the
    /// module's documentation). Runs once every pod is placed, just before the claims become plans:
    /// the pass's indexes of claims are not kept up to date.
    pub(super) fn improve_marginal_cost(&mut self, pods: &[Arc<PodInfo>], selecting: &[&[usize]]) {
        for p in 0..self.pools.len() {
            if self.pools[p].packing == Packing::MarginalCost {
                self.improve_pool(p, pods, selecting);
            }
        }
    }

    fn improve_pool(&mut self, p: usize, pods: &[Arc<PodInfo>], selecting: &[&[usize]]) {
        let pool = &self.pools[p];
        if pool.reqs.iter().any(|r| r.min_values().is_some()) {
            return;
        }
        let members: Vec<usize> =
            (0..self.claims.len()).filter(|c| self.claims[*c].pool == p && self.claims[*c].reqs == pool.reqs).collect();
        if members.is_empty() {
            return;
        }
        let reserved_by =
            |claim: &Claim| Resources::max_of(claim.options.iter().map(|o| &pool.types[*o as usize].it.capacity));
        // With resource limits: what the greedy pass left, plus what the members reserved. No member can
        // become a type larger than that.
        let bound = pool.remaining.as_ref().map(|rem| {
            let mut b = rem.clone();
            for c in &members {
                b.add_assign(&reserved_by(&self.claims[*c]));
            }
            b
        });
        let filter = OfferFilter::new(&pool.reqs, self.options.price_ceiling);
        let mut shapes = Vec::new();
        for &o in pool.base.iter() {
            let te = &pool.types[o as usize];
            if bound.as_ref().is_some_and(|b| !te.it.capacity.fits(b)) {
                continue;
            }
            let Some(offering) = filter.cheapest(&te.it) else { continue };
            if offering.reservation_id.is_some() {
                return;
            }
            shapes.push(Shape { option: o, avail: te.avail.clone(), price: offering.price });
        }
        shapes.sort_by(|a, b| a.price.total_cmp(&b.price));

        let mut sizes: Vec<Resources> = Vec::new();
        let mut item_pod: Vec<usize> = Vec::new();
        let mut bins = Vec::with_capacity(members.len());
        let open_new = pool.remaining.is_none() && pool.remaining_nodes.is_none();
        let mut pricer = Search::new(&shapes, &[], 0, open_new);
        for &c in &members {
            let claim = &self.claims[c];
            let mut bin = Bin::empty();
            bin.claim = Some(c);
            for &i in &claim.pods {
                if movable(&pods[i], selecting[i]) {
                    bin.items.push(sizes.len());
                    sizes.push(pods[i].requests.clone());
                    item_pod.push(i);
                } else {
                    bin.fixed.add_assign(&pods[i].requests);
                    bin.anchored = true;
                }
            }
            bin.load = claim.requests.clone();
            // The search prices claims as the greedy pass did, or it leaves the pool alone.
            if !pricer.reprice(&mut bin) || claim.price.is_none_or(|price| (price - bin.price).abs() > EPSILON) {
                return;
            }
            bins.push(bin);
        }
        if sizes.is_empty() {
            return;
        }
        let before: f64 = bins.iter().map(|b| b.price).sum();
        let original: Vec<Vec<usize>> = bins.iter().map(|b| b.items.clone()).collect();
        let budget = (EVALS_PER_POD_AND_CLAIM.saturating_mul(sizes.len() as u64).saturating_mul(bins.len() as u64))
            .min(MAX_EVALS);
        let mut search = Search::new(&shapes, &sizes, budget, open_new);
        search.run(&mut bins);
        let after: f64 = bins.iter().map(|b| b.price).sum();
        if after >= before - EPSILON {
            return;
        }

        // Which members changed, and which are gone.
        let index_of = |c: usize| members.iter().position(|m| *m == c);
        let mut kept = vec![false; members.len()];
        let mut changed: Vec<&Bin> = Vec::new();
        for bin in &bins {
            match bin.claim.and_then(index_of) {
                Some(m) => {
                    kept[m] = true;
                    let mut now = bin.items.clone();
                    now.sort_unstable();
                    let mut was = original[m].clone();
                    was.sort_unstable();
                    if now != was {
                        changed.push(bin);
                    }
                }
                None => changed.push(bin),
            }
        }
        // Re-count reserved capacity: what the changed and emptied members reserved is released, then each
        // changed claim reserves the largest of its options, as the greedy pass counts a new claim.
        let mut room = pool.remaining.clone().map(|mut rem| {
            for (m, &c) in members.iter().enumerate() {
                let touched = !kept[m] || changed.iter().any(|b| b.claim == Some(c));
                if touched {
                    rem.add_assign(&reserved_by(&self.claims[c]));
                }
            }
            rem
        });
        let mut updates: Vec<(Option<usize>, Claim)> = Vec::with_capacity(changed.len());
        for bin in &changed {
            let options: Vec<u32> = shapes
                .iter()
                .filter(|s| {
                    bin.load.fits(&s.avail)
                        && room.as_ref().is_none_or(|r| pool.types[s.option as usize].it.capacity.fits(r))
                })
                .map(|s| s.option)
                .collect();
            let price = options.first().and_then(|o| shapes.iter().find(|s| s.option == *o)).map(|s| s.price);
            if price.is_none_or(|price| price > bin.price + EPSILON) {
                // The limits do not allow the packing found: keep the greedy one.
                return;
            }
            let max_avail = Resources::max_of(options.iter().map(|o| &pool.types[*o as usize].avail));
            if let Some(r) = room.as_mut() {
                r.sub_assign(&Resources::max_of(options.iter().map(|o| &pool.types[*o as usize].it.capacity)));
            }
            let arrived: Vec<usize> = {
                let mut v: Vec<usize> = bin
                    .items
                    .iter()
                    .map(|i| item_pod[*i])
                    .filter(|i| bin.claim.is_none_or(|c| !self.claims[c].pods.contains(i)))
                    .collect();
                v.sort_unstable();
                v
            };
            let (pods_of, host_ports) = match bin.claim {
                Some(c) => {
                    let claim = &self.claims[c];
                    let stays: Vec<usize> = claim
                        .pods
                        .iter()
                        .copied()
                        .filter(|i| {
                            !movable(&pods[*i], selecting[*i]) || bin.items.iter().any(|it| item_pod[*it] == *i)
                        })
                        .collect();
                    (stays.into_iter().chain(arrived).collect(), claim.host_ports.clone())
                }
                None => (arrived, Vec::new()),
            };
            updates.push((
                bin.claim,
                Claim {
                    pool: p,
                    reqs: pool.reqs.clone(),
                    options,
                    max_avail,
                    requests: bin.load.clone(),
                    pods: pods_of,
                    host_ports,
                    price: Some(bin.price),
                },
            ));
        }

        let gone: Vec<usize> = members.iter().zip(&kept).filter(|(_, k)| !**k).map(|(c, _)| *c).collect();
        let opened = updates.iter().filter(|(c, _)| c.is_none()).count() as u64;
        let pool = Arc::make_mut(&mut self.pools[p]);
        if let Some(r) = room {
            pool.remaining = Some(r);
        }
        if let Some(n) = pool.remaining_nodes.as_mut() {
            *n = (*n + gone.len() as u64).saturating_sub(opened);
        }
        let mut fresh = Vec::new();
        for (c, claim) in updates {
            match c {
                Some(c) => self.claims[c] = claim,
                None => fresh.push(claim),
            }
        }
        let mut c = 0;
        self.claims.retain(|_| {
            let keep = !gone.contains(&c);
            c += 1;
            keep
        });
        self.claims.extend(fresh);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};

    use super::*;
    use crate::api::NodePool;
    use crate::cloud::{CapacityType, InstanceType, Offering};
    use crate::scheduling::{HostPort, PoolInput, Results, SchedulerOptions};
    use crate::testing::merge;

    const GI: i64 = 1 << 30;

    fn shape(cpu: i64, memory_gib: i64, price: f64) -> Shape {
        Shape {
            option: 0,
            avail: Resources::cpu_memory(cpu * 1000, memory_gib * GI).with(ResourceName::PODS, 110),
            price,
        }
    }

    fn size(cpu_millis: i64, memory_gib: i64) -> Resources {
        Resources::cpu_memory(cpu_millis, memory_gib * GI).with(ResourceName::PODS, 1)
    }

    fn bin(claim: usize, items: &[usize], sizes: &[Resources]) -> Bin {
        let mut b = Bin::empty();
        b.claim = Some(claim);
        b.items = items.to_vec();
        b.load = Resources::sum_of(items.iter().map(|i| &sizes[*i]));
        b
    }

    fn total(bins: &[Bin]) -> f64 {
        bins.iter().map(|b| b.price).sum()
    }

    /// One type of 4 CPU and 4 GiB at $1. Largest first, the greedy pass puts the two 2-CPU pods together
    /// (CPU full, 2 GiB idle), then each 3-GiB pod on a claim of its own: $3. Two claims are the least any
    /// packing needs (6 CPU in all), and {2 CPU + 3 GiB pod} twice fits: $2.
    #[test]
    fn a_step_repacks_pods_stranded_by_the_greedy_order() {
        let shapes = [shape(4, 4, 1.0)];
        let sizes = [size(2000, 1), size(2000, 1), size(1000, 3), size(1000, 3)];
        let mut bins = vec![bin(0, &[0, 1], &sizes), bin(1, &[2], &sizes), bin(2, &[3], &sizes)];
        let mut search = Search::new(&shapes, &sizes, 10_000, true);
        for b in &mut bins {
            assert!(search.reprice(b));
        }
        assert_eq!(total(&bins), 3.0);
        search.run(&mut bins);
        assert_eq!(bins.len(), 2);
        assert!((total(&bins) - 2.0).abs() < 1e-9);
        for b in &bins {
            let mut items = b.items.clone();
            items.sort_unstable();
            assert!(items == [0, 2] || items == [0, 3] || items == [1, 2] || items == [1, 3], "{items:?}");
        }
    }

    #[test]
    fn pairs_whose_pods_fit_one_cheaper_claim_merge() {
        // $0.10 for 2 CPU, $0.15 for 4: two half-full small claims make one big one.
        let shapes = [shape(2, 8, 0.10), shape(4, 16, 0.15)];
        let sizes = [size(1500, 1), size(1500, 1)];
        let mut bins = vec![bin(0, &[0], &sizes), bin(1, &[1], &sizes)];
        let mut search = Search::new(&shapes, &sizes, 0, true);
        for b in &mut bins {
            assert!(search.reprice(b));
        }
        search.budget = 1_000;
        search.merge_pairs(&mut bins);
        bins.retain(|b| !b.is_empty());
        assert_eq!(bins.len(), 1);
        assert_eq!(bins[0].items, [0, 1]);
        assert_eq!(bins[0].price, 0.15);
    }

    #[test]
    fn anchored_bins_keep_their_pods_and_are_never_emptied() {
        let shapes = [shape(4, 4, 1.0)];
        let sizes = [size(2000, 1), size(2000, 1)];
        // Each claim holds a 1-CPU, 3-GiB pod that cannot move; the movable pods share a third claim.
        let anchored = |claim: usize| {
            let mut b = Bin::empty();
            b.claim = Some(claim);
            b.fixed = size(1000, 3);
            b.load = b.fixed.clone();
            b.anchored = true;
            b
        };
        let mut bins = vec![bin(0, &[0, 1], &sizes), anchored(1), anchored(2)];
        let mut search = Search::new(&shapes, &sizes, 10_000, true);
        for b in &mut bins {
            assert!(search.reprice(b));
        }
        search.run(&mut bins);
        assert_eq!(bins.len(), 2, "the movable pods join the anchored claims");
        assert!(bins.iter().all(|b| b.anchored && b.items.len() == 1));
        assert!((total(&bins) - 2.0).abs() < 1e-9);
    }

    fn instance_type(name: &str, cpu: i64, memory_gib: i64, gpus: i64, price: f64) -> InstanceType {
        InstanceType {
            name: name.into(),
            labels: Default::default(),
            capacity: Resources::cpu_memory(cpu * 1000, memory_gib * GI)
                .with(ResourceName::PODS, 110)
                .with(ResourceName::NVIDIA_GPU, gpus),
            overhead: Default::default(),
            offerings: vec![Offering::new("zone-a", CapacityType::OnDemand, price)],
        }
    }

    fn pod(name: &str, cpu: &str, memory: &str, gpus: i64, spec_extra: Value) -> PodInfo {
        let mut requests = json!({"cpu": cpu, "memory": memory});
        let mut limits = json!({});
        if gpus > 0 {
            requests["nvidia.com/gpu"] = json!(gpus.to_string());
            limits["nvidia.com/gpu"] = json!(gpus.to_string());
        }
        let mut spec = json!({"containers": [{"name": "c", "resources": {"requests": requests, "limits": limits}}]});
        merge(&mut spec, spec_extra);
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}))
            .expect("a valid pod");
        PodInfo::from_pod(&p).expect("a valid pod")
    }

    fn pool(policy: &str, spec: Value) -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default", "annotations": {"karpenter.sh/nodeclaim-packing-policy": policy}},
            "spec": spec,
        }))
        .expect("a valid NodePool")
    }

    fn solve(pool: NodePool, types: Vec<InstanceType>, pods: Vec<PodInfo>) -> Results {
        let input = PoolInput { pool, instance_types: types.into(), in_use: Resources::ZERO, nodes_in_use: 0 };
        let r = Scheduler::new(vec![input], vec![], vec![], &[], SchedulerOptions::default()).solve(pods);
        assert!(r.unschedulable.is_empty(), "{:?}", r.unschedulable);
        r
    }

    /// What each claim launches, with its pods, sorted.
    fn layout(r: &Results) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = r
            .claims
            .iter()
            .map(|c| {
                let mut pods: Vec<String> =
                    c.pods.iter().map(|p| p.trim_start_matches("default/").to_owned()).collect();
                pods.sort();
                (c.launch.as_ref().map(|l| l.instance_type.clone()).unwrap_or_default(), pods)
            })
            .collect();
        out.sort();
        out
    }

    fn four_by_four() -> Vec<InstanceType> {
        vec![instance_type("s4", 4, 4, 0, 1.0)]
    }

    /// Two 2-CPU pods with 1 GiB and two 1-CPU pods with 3 GiB, each with `extra(i)` merged into its spec.
    fn stranded_pods(extra: impl Fn(usize) -> Value) -> Vec<PodInfo> {
        [("a", "2", "1Gi"), ("b", "2", "1Gi"), ("c", "1", "3Gi"), ("d", "1", "3Gi")]
            .iter()
            .enumerate()
            .map(|(i, (name, cpu, memory))| pod(name, cpu, memory, 0, extra(i)))
            .collect()
    }

    /// See `a_step_repacks_pods_stranded_by_the_greedy_order`: the greedy pass buys $3, the optimum $2.
    #[test]
    fn marginal_cost_claims_are_repacked_to_the_optimum() {
        let r = solve(pool("marginal-cost", json!({})), four_by_four(), stranded_pods(|_| json!({})));
        assert_eq!(r.claims.len(), 2, "{:?}", layout(&r));
        assert!((r.launch_price() - 2.0).abs() < 1e-9);
        for (_, pods) in layout(&r) {
            assert_eq!(pods.len(), 2);
            assert!(pods[0].as_str() < "c" && pods[1].as_str() >= "c", "{pods:?}");
        }
        // The plans are consistent: requests, cheapest-first options and launch.
        for c in &r.claims {
            assert_eq!(c.requests, Resources::cpu_memory(3000, 4 * GI).with(ResourceName::PODS, 2));
            assert_eq!(c.instance_types.len(), 1);
        }
    }

    /// The GPU pod needs the g5-like type; the memory-heavy pod is largest (equal CPU, most memory), opens
    /// an m-type claim, which the GPU pod then grows into a GPU one (+$0.75, less than $1 for another):
    /// its spare memory is gone, so only one CPU pod joins it and the other three need two $0.20 claims:
    /// $1.40. The optimum is $1.25: the GPU pod with three CPU pods (8 CPU, 8 GiB) and the memory-heavy pod
    /// with the fourth on the $0.25 type (4 CPU, 14 GiB). (A GPU claim plus one $0.20 claim cannot hold
    /// them: the memory-heavy pod fits only the GPU claim, which then has room for one CPU pod, and three
    /// remain, 6 CPU.)
    #[test]
    fn a_memory_heavy_pod_no_longer_strands_a_gpu_claims_cpu() {
        let types = vec![
            instance_type("g", 8, 16, 1, 1.00),
            instance_type("c", 4, 8, 0, 0.20),
            instance_type("m", 4, 16, 0, 0.25),
        ];
        let pods = || {
            vec![
                pod("gpu", "2", "2Gi", 1, json!({})),
                pod("memory", "2", "12Gi", 0, json!({})),
                pod("cpu-1", "2", "2Gi", 0, json!({})),
                pod("cpu-2", "2", "2Gi", 0, json!({})),
                pod("cpu-3", "2", "2Gi", 0, json!({})),
                pod("cpu-4", "2", "2Gi", 0, json!({})),
            ]
        };
        let marginal = solve(pool("marginal-cost", json!({})), types.clone(), pods());
        assert!((marginal.launch_price() - 1.25).abs() < 1e-9, "{:?}", layout(&marginal));
        let l = layout(&marginal);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].0, "g");
        assert_eq!(l[0].1.len(), 4);
        assert!(l[0].1.contains(&"gpu".to_owned()));
        assert!(!l[0].1.contains(&"memory".to_owned()));
        assert_eq!(l[1].0, "m");
        assert!(l[1].1.contains(&"memory".to_owned()));
        // Fit-only packing fills the first claim it opened (turning it into a GPU type for the CPU pods),
        // then the GPU pod joins the least-loaded claim: two GPU claims, untouched by the search.
        let binpack = solve(pool("binpack", json!({})), types, pods());
        assert!((binpack.launch_price() - 2.0).abs() < 1e-9, "{:?}", layout(&binpack));
        assert_eq!(
            layout(&binpack),
            [
                ("g".to_owned(), vec!["cpu-1".to_owned(), "cpu-2".to_owned(), "memory".to_owned()]),
                ("g".to_owned(), vec!["cpu-3".to_owned(), "cpu-4".to_owned(), "gpu".to_owned()]),
            ]
        );
    }

    #[test]
    fn fit_only_pools_keep_the_greedy_packing() {
        let r = solve(pool("binpack", json!({})), four_by_four(), stranded_pods(|_| json!({})));
        assert_eq!(
            layout(&r),
            [
                ("s4".to_owned(), vec!["a".to_owned(), "b".to_owned()]),
                ("s4".to_owned(), vec!["c".to_owned()]),
                ("s4".to_owned(), vec!["d".to_owned()]),
            ]
        );
        // As does a marginal-cost pool when marginal-cost packing is off.
        let input = PoolInput {
            pool: pool("marginal-cost", json!({})),
            instance_types: four_by_four().into(),
            in_use: Resources::ZERO,
            nodes_in_use: 0,
        };
        let off = SchedulerOptions { marginal_cost_packing: false, ..SchedulerOptions::default() };
        let r = Scheduler::new(vec![input], vec![], vec![], &[], off).solve(stranded_pods(|_| json!({})));
        assert_eq!(r.claims.len(), 3);
    }

    #[test]
    fn pods_with_host_ports_or_topology_terms_stay_where_the_greedy_pass_put_them() {
        let mut ported = stranded_pods(|_| json!({}));
        for (i, p) in ported.iter_mut().enumerate() {
            p.host_ports.push(HostPort { ip: "0.0.0.0".into(), port: 8080 + i as i32, protocol: "TCP".into() });
        }
        let r = solve(pool("marginal-cost", json!({})), four_by_four(), ported);
        assert_eq!(r.claims.len(), 3, "host ports: {:?}", layout(&r));
        let spread = stranded_pods(|_| {
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "other"}}}]})
        });
        let r = solve(pool("marginal-cost", json!({})), four_by_four(), spread);
        assert_eq!(r.claims.len(), 3, "soft spread: {:?}", layout(&r));
        // Pod a spreads pods labelled app=web: it stays, but the others can still join its claim.
        let web_spread = |i: usize| {
            if i == 0 {
                json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "web"}}}]})
            } else {
                json!({})
            }
        };
        let r = solve(pool("marginal-cost", json!({})), four_by_four(), stranded_pods(web_spread));
        assert_eq!(r.claims.len(), 2, "a stays, c or d joins it: {:?}", layout(&r));
        // Once c and d carry app=web, a's spread counts them: they stay where they are too.
        let mut counted = stranded_pods(web_spread);
        for p in &mut counted[2..] {
            p.labels.insert("app".into(), "web".into());
        }
        let r = solve(pool("marginal-cost", json!({})), four_by_four(), counted);
        assert_eq!(r.claims.len(), 3, "c and d are counted by a's spread: {:?}", layout(&r));
    }

    #[test]
    fn limited_pools_are_repacked_within_their_limits() {
        for limits in [json!({"nodes": "3"}), json!({"cpu": "12"})] {
            let r =
                solve(pool("marginal-cost", json!({"limits": limits})), four_by_four(), stranded_pods(|_| json!({})));
            assert_eq!(r.claims.len(), 2, "{limits}: {:?}", layout(&r));
        }
    }

    #[test]
    fn the_search_is_deterministic() {
        let run = || {
            let types = vec![
                instance_type("g", 8, 16, 1, 1.00),
                instance_type("c", 4, 8, 0, 0.20),
                instance_type("m", 4, 16, 0, 0.25),
                instance_type("r", 4, 32, 0, 0.30),
            ];
            let pods: Vec<PodInfo> = (0..40)
                .map(|i| {
                    let cpu = format!("{}m", 250 * (1 + i % 7));
                    let memory = format!("{}Mi", 512 * (1 + (i * 5) % 11));
                    pod(&format!("p-{i:02}"), &cpu, &memory, i64::from(i % 9 == 0), json!({}))
                })
                .collect();
            layout(&solve(pool("marginal-cost", json!({})), types, pods))
        };
        assert_eq!(run(), run());
    }
}
