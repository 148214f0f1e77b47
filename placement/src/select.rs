//! Choosing a host for one VM: the straightforward full scan, kept as the reference, and the
//! incremental index that production and the simulator use.
//!
//! Both run the same policy and return the same [`Selection`]: the host, its score key, how many
//! hosts tie with it, and the filtering figures of every rule. With lowest-index tie-breaking they
//! pick the very same host; with random tie-breaking they pick hosts of the same score.
//!
//! The index follows Protean (paper 001 s5.2): requests are divided into equivalence classes by
//! the request traits the policy's rules read ([`crate::policy::ClassKey`]); each class caches its
//! valid hosts grouped by score key in a sorted map, plus how many hosts each validator eliminated. A journal
//! records every host that changed (a VM placed or released, a state change, a lifetime class
//! dropping); a class brings itself up to date by re-evaluating only the hosts changed since it was
//! last used, each in O(log N). Picking the best host is then the first group of the map. Classes
//! are kept for the most recently used [`IndexConfig::max_classes`] keys; a class that falls behind
//! the journal's retained window is rebuilt by a scan.

mod chunked;

use crate::lifetime::{HostLifetime, OrderedTime};
use crate::policy::{Policy, ScoreKey};
use crate::rules::{HostView, RequestTraits, RuleRequest};
use crate::state::{HostIndex, InventoryState};
use chunked::ChunkedSorted;
use domain::RuleFilterStat;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hasher;

/// How a host is drawn among those with the best score.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TieBreak {
    /// Uniformly at random with a seeded generator (Protean's randomized tie-breaking).
    #[default]
    Random,
    /// The lowest host index: deterministic, for cross-checking against other simulators.
    LowestIndex,
}

impl TieBreak {
    /// Every tie-break by its configuration name.
    pub const NAMES: [&'static str; 2] = ["random", "lowest-index"];
}

/// Draws hosts among ties.
#[derive(Clone, Debug)]
pub struct Chooser {
    mode: TieBreak,
    rng: ChaCha8Rng,
}

impl Chooser {
    pub fn new(mode: TieBreak, seed: u64) -> Self {
        Chooser { mode, rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    pub fn mode(&self) -> TieBreak {
        self.mode
    }

    /// A uniform position in `0..len` (random mode), the same draw [`Chooser::pick`] makes.
    pub(crate) fn draw(&mut self, len: usize) -> Option<usize> {
        (len > 0).then(|| self.rng.random_range(0..len))
    }

    /// True with probability `p` (a draw from the same sequence, whatever the mode).
    pub(crate) fn coin(&mut self, p: f64) -> bool {
        self.rng.random::<f64>() < p
    }

    /// One of `candidates` (not empty).
    fn pick(&mut self, candidates: &[HostIndex]) -> Option<HostIndex> {
        match self.mode {
            TieBreak::Random => self.draw(candidates.len()).map(|i| candidates[i]),
            TieBreak::LowestIndex => candidates.iter().min().copied(),
        }
    }
}

/// The outcome of choosing a host for one VM.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    pub host: Option<HostIndex>,
    /// The chosen host's score key.
    pub score: Option<ScoreKey>,
    /// How many hosts share the best score (the set the host was drawn from).
    pub ties: usize,
    /// Validators, then preference rules: hosts each saw and kept.
    pub stats: Vec<RuleFilterStat>,
}

fn view<'a>(state: &'a InventoryState, lifetimes: &'a [HostLifetime], host: HostIndex) -> HostView<'a> {
    HostView { index: host, record: &state.hosts()[host.get()], lifetime: &lifetimes[host.get()] }
}

fn prefix_eq(a: &ScoreKey, b: &ScoreKey, level: usize) -> bool {
    a[..=level] == b[..=level]
}

/// The reference: evaluates every rule on every host.
pub fn full_scan(
    policy: &Policy,
    state: &InventoryState,
    lifetimes: &[HostLifetime],
    request: &RuleRequest,
    chooser: &mut Chooser,
) -> Selection {
    let validators = policy.validators().len();
    let mut eliminated = vec![0; validators];
    let mut valid: Vec<(ScoreKey, HostIndex)> = Vec::new();
    for index in 0..state.hosts().len() {
        let host = view(state, lifetimes, HostIndex(index as u32));
        match policy.first_rejection(&host, request, 0..validators) {
            Some(rule) => eliminated[rule] += 1,
            None => valid.push((policy.score(&host, request), host.index)),
        }
    }
    let best = valid.iter().map(|(key, _)| *key).min();
    let tied: Vec<usize> = match &best {
        Some(best) => (0..policy.preferences().len())
            .map(|level| valid.iter().filter(|(key, _)| prefix_eq(key, best, level)).count())
            .collect(),
        None => vec![0; policy.preferences().len()],
    };
    let ties: Vec<HostIndex> = valid.iter().filter(|(key, _)| Some(*key) == best).map(|(_, h)| *h).collect();
    Selection {
        host: chooser.pick(&ties),
        score: best,
        ties: ties.len(),
        stats: policy.filter_stats(state.hosts().len(), &eliminated, &tied),
    }
}

/// Limits of the incremental index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexConfig {
    /// Most equivalence classes kept; the least recently used is dropped beyond it.
    pub max_classes: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { max_classes: 64 }
    }
}

/// Hosts whose state changed, in order, with a global revision number.
#[derive(Debug, Default)]
struct Journal {
    /// Revision of `changed[0]`.
    start: u64,
    changed: VecDeque<HostIndex>,
}

impl Journal {
    fn revision(&self) -> u64 {
        self.start + self.changed.len() as u64
    }

    /// Hosts changed at or after `revision`, or `None` when that part was dropped.
    fn since(&self, revision: u64) -> Option<impl Iterator<Item = HostIndex> + Clone + '_> {
        let offset = revision.checked_sub(self.start)?;
        Some(self.changed.iter().skip(offset as usize).copied())
    }

    fn drop_before(&mut self, revision: u64) {
        while self.start < revision && self.changed.pop_front().is_some() {
            self.start += 1;
        }
    }
}

/// Hosts a class reads ahead of re-evaluating them when it catches up on the journal
/// ([`ClassCache::touch`]).
const CATCH_UP_BATCH: usize = 16;

/// Slot value of a host that no validator has looked at yet.
const UNSET: u32 = u32::MAX;
/// Slot values at or above this mean "rejected by validator `value - REJECTED`".
const REJECTED: u32 = u32::MAX - 256;

/// Where a host sits in one class's evaluation.
#[derive(Copy, Clone, Debug)]
struct Slot {
    /// A bucket id, or [`REJECTED`] + validator, or [`UNSET`].
    bucket: u32,
    /// Position in the bucket's member list (random tie-breaking only).
    pos: u32,
}

/// Hosts with one score key.
#[derive(Debug)]
enum TieSet {
    /// Any order, O(1) insert, remove and uniform draw.
    Any(Vec<HostIndex>),
    /// Ordered, for lowest-index tie-breaking.
    Ordered(BTreeSet<HostIndex>),
    /// Sorted by host exit time (policies with a temporal rule): the hosts of one temporal cost
    /// are a contiguous run, found by binary search.
    ByExit(ChunkedSorted<(OrderedTime, HostIndex)>),
}

impl TieSet {
    fn len(&self) -> usize {
        match self {
            TieSet::Any(members) => members.len(),
            TieSet::Ordered(members) => members.len(),
            TieSet::ByExit(members) => members.len(),
        }
    }

    fn iter(&self) -> Box<dyn Iterator<Item = HostIndex> + '_> {
        match self {
            TieSet::Any(members) => Box::new(members.iter().copied()),
            TieSet::Ordered(members) => Box::new(members.iter().copied()),
            TieSet::ByExit(members) => Box::new(members.iter().map(|(_, h)| *h)),
        }
    }
}

#[derive(Debug)]
struct Bucket {
    key: ScoreKey,
    members: TieSet,
}

/// Hashes a request's class traits on every decision ([`RequestTraits::hash_class`]): a
/// multiply-rotate hash (FxHash's), far less code and work than SipHash on the hot path. Flooding
/// it is harmless: the index holds at most `max_classes` classes and evicts the least recently
/// used, and a hash only narrows the classes whose traits are compared.
#[derive(Default)]
struct ClassKeyHasher(u64);

impl std::hash::Hasher for ClassKeyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        for &byte in chunks.remainder() {
            self.write_u64(u64::from(byte));
        }
    }
    #[inline]
    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_u8(&mut self, byte: u8) {
        self.write_u64(u64::from(byte));
    }
    #[inline]
    fn write_u32(&mut self, word: u32) {
        self.write_u64(u64::from(word));
    }
    #[inline]
    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The request that first built a class: what its cached evaluation is computed for (the class's
/// rules read only traits that every request of the class shares).
fn representative_request(traits: &RequestTraits) -> RuleRequest<'_> {
    // The exit time is never read: the temporal rule is evaluated per request, not cached.
    RuleRequest { traits, exit_s: f64::NAN, spread: None }
}

/// The cached evaluation of one equivalence class.
#[derive(Debug)]
struct ClassCache {
    representative: RequestTraits,
    /// Journal revision this cache has seen.
    revision: u64,
    last_used: u64,
    slots: Vec<Slot>,
    order: BTreeMap<ScoreKey, u32>,
    buckets: Vec<Bucket>,
    free_buckets: Vec<u32>,
    /// Hosts eliminated by each cacheable validator.
    eliminated: Vec<usize>,
    /// For each preference level but the last, valid hosts per score-key prefix (the key with the
    /// entries below that level zeroed). Hashed with [`ClassKeyHasher`]: every host a class
    /// re-files into another group updates these, and only sums are read of them (no order).
    prefix_counts: Vec<PrefixCounts>,
    ordered: bool,
    /// The policy's temporal level: its buckets hold hosts by exit time.
    temporal: Option<usize>,
    /// Each host's exit time as filed in its bucket (temporal policies only).
    filed_exit: Vec<f64>,
}

/// What a temporal decision lists ([`ClassCache::choose_temporal`]), kept across decisions so that
/// a decision allocates none of it.
#[derive(Debug, Default)]
struct Scratch {
    /// The cached groups' keys as the request ranks them, with their buckets.
    keys: Vec<(ScoreKey, u32)>,
    /// For each bucket of one group: its lowest cost, its key and its id.
    lowest: Vec<(u32, ScoreKey, u32)>,
    /// The runs of hosts at the group's best cost.
    runs: Vec<Run>,
}

/// The hosts of one temporal cost in one bucket: a contiguous run of its exit order.
#[derive(Debug)]
struct Run {
    key: ScoreKey,
    id: u32,
    ranks: std::ops::Range<usize>,
    /// Of them, those the request may use.
    usable: usize,
}

/// Valid hosts per score-key prefix ([`ClassCache::prefix_counts`]).
type PrefixCounts = HashMap<ScoreKey, usize, std::hash::BuildHasherDefault<ClassKeyHasher>>;

fn masked(key: &ScoreKey, level: usize) -> ScoreKey {
    let mut prefix = [0; crate::policy::MAX_PREFERENCE_RULES];
    prefix[..=level].copy_from_slice(&key[..=level]);
    prefix
}

impl ClassCache {
    fn build(
        policy: &Policy,
        state: &InventoryState,
        lifetimes: &[HostLifetime],
        representative: RequestTraits,
        revision: u64,
        ordered: bool,
    ) -> Self {
        let levels = policy.preferences().len().saturating_sub(1);
        let temporal = policy.temporal_level();
        let mut cache = ClassCache {
            representative,
            revision,
            last_used: 0,
            slots: vec![Slot { bucket: UNSET, pos: 0 }; state.hosts().len()],
            order: BTreeMap::new(),
            buckets: Vec::new(),
            free_buckets: Vec::new(),
            eliminated: vec![0; policy.cached_validators()],
            prefix_counts: vec![PrefixCounts::default(); levels],
            ordered,
            temporal,
            filed_exit: if temporal.is_some() { vec![f64::NEG_INFINITY; state.hosts().len()] } else { Vec::new() },
        };
        for index in 0..state.hosts().len() {
            cache.refresh(policy, state, lifetimes, HostIndex(index as u32));
        }
        cache
    }

    /// Re-evaluates one host and moves it to its new place.
    /// A host whose key (and exit time, for a temporal policy) did not change stays where it is:
    /// most changes move a host within a coarse best-fit bucket, so this skips most moves.
    fn refresh(&mut self, policy: &Policy, state: &InventoryState, lifetimes: &[HostLifetime], host: HostIndex) {
        let request = representative_request(&self.representative);
        let view = view(state, lifetimes, host);
        let current = self.slots[host.get()].bucket;
        match policy.first_rejection(&view, &request, 0..policy.cached_validators()) {
            Some(rule) if current == REJECTED + rule as u32 => {}
            Some(rule) => {
                self.remove(host);
                self.eliminated[rule] += 1;
                self.slots[host.get()] = Slot { bucket: REJECTED + rule as u32, pos: 0 };
            }
            None => {
                let key = policy.cached_score(&view, &request);
                let exit = view.lifetime.exit_s;
                if self.key_of(host) == Some(key) {
                    // Same group: at most its exit time moved (a VM placed or released often
                    // leaves the host's coarse best-fit bucket as it was), and the
                    // host moves within the group's exit order, the group and its counts as they
                    // were.
                    self.move_exit(host, exit);
                    return;
                }
                self.remove(host);
                if self.temporal.is_some() {
                    self.filed_exit[host.get()] = exit;
                }
                self.insert(host, key);
            }
        }
    }

    /// Reads what re-evaluating `hosts` reads first (their places in this class, their lifetime
    /// summaries, the parts of their records the validators read), and returns something of it
    /// for the caller to pass to `black_box`.
    ///
    /// A changed host is rarely in the cache when a class catches up on it (at 100k hosts a class
    /// is used every few decisions, and the releases' repredictions in between sweep the caches),
    /// and each re-evaluation waits for its misses before the next one starts. These reads do not
    /// depend on each other, so their misses overlap: for a temporal policy at 100k hosts waiting
    /// on them was the larger part of what catching up cost (issue 32).
    fn touch(&self, state: &InventoryState, lifetimes: &[HostLifetime], hosts: impl Iterator<Item = HostIndex>) -> u64 {
        let records = state.hosts();
        hosts.fold(0, |seen, host| {
            let i = host.get();
            let record = &records[i];
            let filed = self.filed_exit.get(i).map_or(0, |exit| exit.to_bits());
            let used = u64::from(record.used == domain::Resources::ZERO);
            let listed = (record.vms.len() ^ record.incoming.len()) as u64 ^ record.state as u64;
            seen ^ u64::from(self.slots[i].bucket) ^ filed ^ lifetimes[i].exit_s.to_bits() ^ used ^ listed
        })
    }

    /// The host's exit time moved to `exit_s` and nothing else this class caches of it changed
    /// ([`IncrementalIndex::host_exit_moved`]): moves it within its bucket's exit order, if it is
    /// filed in one, without evaluating any rule.
    fn refile_exit(&mut self, host: HostIndex, exit_s: f64) {
        if self.key_of(host).is_some() {
            self.move_exit(host, exit_s);
        }
    }

    /// Moves a host filed in a group (`key_of` is some) to `exit_s` in the group's exit order (a
    /// temporal policy; nothing otherwise).
    fn move_exit(&mut self, host: HostIndex, exit_s: f64) {
        let slot = self.slots[host.get()];
        if self.temporal.is_none() {
            return;
        }
        let filed = &mut self.filed_exit[host.get()];
        if *filed == exit_s {
            return;
        }
        if let TieSet::ByExit(members) = &mut self.buckets[slot.bucket as usize].members {
            let was_filed = members.remove(&(OrderedTime(*filed), host));
            debug_assert!(was_filed, "host {host:?} is filed at its filed exit time");
            members.insert((OrderedTime(exit_s), host));
            *filed = exit_s;
        }
    }

    fn remove(&mut self, host: HostIndex) {
        let slot = self.slots[host.get()];
        if slot.bucket == UNSET {
            return;
        }
        self.slots[host.get()] = Slot { bucket: UNSET, pos: 0 };
        if slot.bucket >= REJECTED {
            self.eliminated[(slot.bucket - REJECTED) as usize] -= 1;
            return;
        }
        let bucket = &mut self.buckets[slot.bucket as usize];
        let key = bucket.key;
        match &mut bucket.members {
            TieSet::Any(members) => {
                members.swap_remove(slot.pos as usize);
                if let Some(&moved) = members.get(slot.pos as usize) {
                    self.slots[moved.get()].pos = slot.pos;
                }
            }
            TieSet::Ordered(members) => {
                members.remove(&host);
            }
            TieSet::ByExit(members) => {
                members.remove(&(OrderedTime(self.filed_exit[host.get()]), host));
            }
        }
        if bucket.members.len() == 0 {
            self.order.remove(&key);
            self.free_buckets.push(slot.bucket);
        }
        for (level, counts) in self.prefix_counts.iter_mut().enumerate() {
            let prefix = masked(&key, level);
            if let Some(count) = counts.get_mut(&prefix) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&prefix);
                }
            }
        }
    }

    fn insert(&mut self, host: HostIndex, key: ScoreKey) {
        let id = match self.order.get(&key) {
            Some(&id) => id,
            None => {
                let members = match (self.temporal, self.ordered) {
                    (Some(_), _) => TieSet::ByExit(ChunkedSorted::default()),
                    (None, true) => TieSet::Ordered(BTreeSet::new()),
                    (None, false) => TieSet::Any(Vec::new()),
                };
                let bucket = Bucket { key, members };
                let id = match self.free_buckets.pop() {
                    Some(id) => {
                        self.buckets[id as usize] = bucket;
                        id
                    }
                    None => {
                        self.buckets.push(bucket);
                        self.buckets.len() as u32 - 1
                    }
                };
                self.order.insert(key, id);
                id
            }
        };
        let pos = match &mut self.buckets[id as usize].members {
            TieSet::Any(members) => {
                members.push(host);
                members.len() as u32 - 1
            }
            TieSet::Ordered(members) => {
                members.insert(host);
                0
            }
            TieSet::ByExit(members) => {
                members.insert((OrderedTime(self.filed_exit[host.get()]), host));
                0
            }
        };
        self.slots[host.get()] = Slot { bucket: id, pos };
        for (level, counts) in self.prefix_counts.iter_mut().enumerate() {
            *counts.entry(masked(&key, level)).or_insert(0) += 1;
        }
    }

    fn key_of(&self, host: HostIndex) -> Option<ScoreKey> {
        let bucket = self.slots[host.get()].bucket;
        (bucket < REJECTED).then(|| self.buckets[bucket as usize].key)
    }

    /// Chooses a host for `request` (of this class) from the up-to-date cache.
    fn choose(
        &self,
        policy: &Policy,
        state: &InventoryState,
        lifetimes: &[HostLifetime],
        request: &RuleRequest,
        chooser: &mut Chooser,
        scratch: &mut Scratch,
    ) -> Selection {
        let mut eliminated = self.eliminated.clone();
        eliminated.resize(policy.validators().len(), 0);
        // Hosts valid for the class that a request-specific validator (spread) rejects.
        let excluded = self.request_rejections(policy, state, lifetimes, request, &mut eliminated);
        if let Some(level) = self.temporal {
            return self.choose_temporal(policy, state, request, chooser, level, &eliminated, &excluded, scratch);
        }
        let mut excluded_per_bucket: HashMap<u32, usize> = HashMap::new();
        for host in &excluded {
            *excluded_per_bucket.entry(self.slots[host.get()].bucket).or_insert(0) += 1;
        }
        let best = self.order.iter().find(|(_, id)| {
            self.buckets[**id as usize].members.len() > excluded_per_bucket.get(id).copied().unwrap_or(0)
        });
        let levels = policy.preferences().len();
        let Some((best_key, &best_id)) = best else {
            return Selection {
                host: None,
                score: None,
                ties: 0,
                stats: policy.filter_stats(state.hosts().len(), &eliminated, &vec![0; levels]),
            };
        };
        let bucket = &self.buckets[best_id as usize];
        let ties = bucket.members.len() - excluded_per_bucket.get(&best_id).copied().unwrap_or(0);
        let tied: Vec<usize> = (0..levels)
            .map(|level| {
                let cached = if level + 1 == levels {
                    bucket.members.len()
                } else {
                    self.prefix_counts[level].get(&masked(best_key, level)).copied().unwrap_or(0)
                };
                let gone = excluded
                    .iter()
                    .filter(|h| self.key_of(**h).is_some_and(|k| prefix_eq(&k, best_key, level)))
                    .count();
                cached - gone
            })
            .collect();
        let host = match (&bucket.members, excluded_per_bucket.contains_key(&best_id)) {
            (TieSet::Ordered(members), false) => members.first().copied(),
            (TieSet::Any(members), false) => chooser.pick(members),
            (members, _) => {
                let excluded: HashSet<HostIndex> = excluded.iter().copied().collect();
                let candidates: Vec<HostIndex> = members.iter().filter(|h| !excluded.contains(h)).collect();
                chooser.pick(&candidates)
            }
        };
        Selection {
            host,
            score: Some(*best_key),
            ties,
            stats: policy.filter_stats(state.hosts().len(), &eliminated, &tied),
        }
    }

    /// [`ClassCache::choose`] for a policy with a temporal rule at `level`.
    ///
    /// The cached keys hold 0 at that level, and each bucket keeps its hosts sorted by exit time.
    /// The temporal cost falls as the host's exit time rises, so within a bucket the hosts of one
    /// cost are a contiguous run, and a bucket's lowest cost is that of its last host. The best
    /// host is then found per group of keys above the temporal level, in the order of those keys
    /// as this request ranks them ([`Policy::rank_codes`]: a host-coded rule's codes become its
    /// scores, so several cached groups may tie): the buckets with the lowest (cost, key below
    /// the level), and in them the runs of hosts with that cost.
    ///
    /// A bucket whose lowest cost is above the group's best has no host of that cost, so the
    /// runs of the buckets at the best cost are all that the draw and the tie counts read; each is
    /// found once. The lists live in `scratch`, kept across decisions.
    #[allow(clippy::too_many_arguments)]
    fn choose_temporal(
        &self,
        policy: &Policy,
        state: &InventoryState,
        request: &RuleRequest,
        chooser: &mut Chooser,
        level: usize,
        eliminated: &[usize],
        excluded: &[HostIndex],
        scratch: &mut Scratch,
    ) -> Selection {
        let levels = policy.preferences().len();
        let bounds = policy.preferences()[level].exit_buckets().unwrap_or(&[0.0]);
        let cost = |exit: OrderedTime| crate::rules::bucket_of(bounds, request.exit_s, exit.0);
        let excluded_set: HashSet<HostIndex> = excluded.iter().copied().collect();
        let excluded = &excluded_set;
        let members = |id: u32| match &self.buckets[id as usize].members {
            TieSet::ByExit(members) => Some(members),
            _ => None,
        };
        let ranked_key = |host: &HostIndex| self.key_of(*host).map(|k| policy.rank_codes(k, request));
        let Scratch { keys, lowest, runs } = scratch;
        keys.clear();
        keys.extend(self.order.iter().map(|(k, id)| (policy.rank_codes(*k, request), *id)));
        keys.sort_unstable();
        let mut start = 0;
        while start < keys.len() {
            let end = start + keys[start..].iter().take_while(|(k, _)| k[..level] == keys[start].0[..level]).count();
            let group = &keys[start..end];
            start = end;
            // Lowest cost of each bucket among the hosts the request may use.
            lowest.clear();
            lowest.extend(group.iter().filter_map(|&(key, id)| {
                let last = members(id)?.iter().rev().find(|(_, h)| !excluded.contains(h))?;
                Some((cost(last.0), key, id))
            }));
            let Some(&(best_cost, mut best_key, _)) = lowest.iter().min_by_key(|&&(c, key, _)| (c, key)) else {
                continue;
            };
            best_key[level] = best_cost;
            // The run of hosts costing `best_cost` in each bucket at that cost, in the group's
            // order: the ranks from the first host costing it to the last (those costing more
            // come first), and how many of them the request may use.
            runs.clear();
            runs.extend(lowest.iter().filter(|&&(c, _, _)| c == best_cost).filter_map(|&(_, key, id)| {
                let hosts = members(id)?;
                let ranks = hosts.partition_point(|(e, _)| cost(*e) > best_cost)
                    ..hosts.partition_point(|(e, _)| cost(*e) >= best_cost);
                let usable = if excluded.is_empty() {
                    ranks.len()
                } else {
                    hosts.range(ranks.clone()).filter(|(_, h)| !excluded.contains(h)).count()
                };
                Some(Run { key, id, ranks, usable })
            }));
            let best_runs = || runs.iter().filter(|run| run.key[level + 1..] == best_key[level + 1..]);
            let ties: usize = best_runs().map(|run| run.usable).sum();
            let hosts_of = |run: &Run| {
                let ranks = run.ranks.clone();
                members(run.id).into_iter().flat_map(move |hosts| hosts.range(ranks.clone())).map(|(_, h)| *h)
            };
            let host = match chooser.mode() {
                // Draw among the runs directly unless some of them is excluded.
                TieBreak::Random if excluded.is_empty() => chooser.draw(ties).and_then(|mut i| {
                    best_runs().find_map(|run| {
                        if i < run.ranks.len() {
                            return members(run.id)?.get(run.ranks.start + i).map(|(_, host)| host);
                        }
                        i -= run.ranks.len();
                        None
                    })
                }),
                // The lowest index of the runs, as `Chooser::pick` takes it, without listing them.
                TieBreak::LowestIndex => best_runs().flat_map(hosts_of).filter(|h| !excluded.contains(h)).min(),
                TieBreak::Random => {
                    let candidates: Vec<HostIndex> =
                        best_runs().flat_map(hosts_of).filter(|h| !excluded.contains(h)).collect();
                    chooser.pick(&candidates)
                }
            };
            // Ties: above the level, the valid hosts whose ranked keys agree down to that level;
            // at and below it, the hosts of the group with the best cost whose keys agree.
            let tied: Vec<usize> = (0..levels)
                .map(|l| {
                    if l < level {
                        let cached: usize = self.prefix_counts[l]
                            .iter()
                            .filter(|(prefix, _)| prefix_eq(&policy.rank_codes(**prefix, request), &best_key, l))
                            .map(|(_, count)| count)
                            .sum();
                        let gone = excluded_set
                            .iter()
                            .filter(|h| ranked_key(h).is_some_and(|k| prefix_eq(&k, &best_key, l)))
                            .count();
                        return cached - gone;
                    }
                    runs.iter()
                        .filter(|run| run.key[level + 1..=l] == best_key[level + 1..=l])
                        .map(|run| run.usable)
                        .sum()
                })
                .collect();
            return Selection {
                host,
                score: Some(best_key),
                ties,
                stats: policy.filter_stats(state.hosts().len(), eliminated, &tied),
            };
        }
        Selection {
            host: None,
            score: None,
            ties: 0,
            stats: policy.filter_stats(state.hosts().len(), eliminated, &vec![0; levels]),
        }
    }

    /// The class-valid hosts that the request-specific validators reject, counted into
    /// `eliminated` under the first validator that rejects each.
    fn request_rejections(
        &self,
        policy: &Policy,
        state: &InventoryState,
        lifetimes: &[HostLifetime],
        request: &RuleRequest,
        eliminated: &mut [usize],
    ) -> Vec<HostIndex> {
        let range = policy.cached_validators()..policy.validators().len();
        if range.is_empty() {
            return Vec::new();
        }
        let named: Option<Vec<Vec<HostIndex>>> =
            policy.validators()[range.clone()].iter().map(|v| v.rejected_hosts(request, state)).collect();
        let candidates: Vec<HostIndex> = match named {
            Some(lists) => {
                let mut hosts: Vec<HostIndex> = lists.into_iter().flatten().collect();
                hosts.sort_unstable();
                hosts.dedup();
                hosts
            }
            // A rule that cannot name its rejections: check it on every valid host.
            None => self.order.values().flat_map(|id| self.buckets[*id as usize].members.iter()).collect(),
        };
        candidates
            .into_iter()
            .filter(|host| self.key_of(*host).is_some())
            .filter(|host| match policy.first_rejection(&view(state, lifetimes, *host), request, range.clone()) {
                Some(rule) => {
                    eliminated[rule] += 1;
                    true
                }
                None => false,
            })
            .collect()
    }

    /// Bytes held by this cache (for the memory figures of the bench).
    fn heap_bytes(&self) -> usize {
        let members: usize = self
            .buckets
            .iter()
            .map(|b| match &b.members {
                TieSet::Any(m) => m.capacity() * std::mem::size_of::<HostIndex>(),
                // A B-tree node holds up to 11 keys; count about 2 words of overhead per key.
                TieSet::Ordered(m) => m.len() * (std::mem::size_of::<HostIndex>() + 16),
                TieSet::ByExit(m) => m.heap_bytes(),
            })
            .sum();
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.filed_exit.capacity() * std::mem::size_of::<f64>()
            + self.buckets.capacity() * std::mem::size_of::<Bucket>()
            + members
            + self.order.len() * (std::mem::size_of::<ScoreKey>() + 4 + 16)
            + self.prefix_counts.iter().map(|c| c.capacity() * (std::mem::size_of::<ScoreKey>() + 16)).sum::<usize>()
    }
}

/// The incremental index: cached evaluations per equivalence class, kept current by the journal.
#[derive(Debug)]
pub struct IncrementalIndex {
    config: IndexConfig,
    /// The cached classes, in no order; at most `max_classes`.
    classes: Vec<ClassCache>,
    /// Each class's hash of its traits ([`RequestTraits::hash_class`]), beside `classes`: a lookup
    /// scans these, and compares traits only where the hash matches.
    class_hashes: Vec<u64>,
    journal: Journal,
    tick: u64,
    /// Journal entries kept at most, beyond which lagging classes are rebuilt instead.
    journal_limit: usize,
    scratch: Scratch,
}

impl IncrementalIndex {
    pub fn new(config: IndexConfig, hosts: usize) -> Self {
        IncrementalIndex {
            config,
            classes: Vec::new(),
            class_hashes: Vec::new(),
            journal: Journal::default(),
            tick: 0,
            journal_limit: hosts.max(4096),
            scratch: Scratch::default(),
        }
    }

    /// Records that a host's state changed: every class re-evaluates it when next used.
    pub fn host_changed(&mut self, host: HostIndex) {
        self.journal.changed.push_back(host);
    }

    /// Records that a host's exit time moved to `exit_s` and nothing else a class caches of it
    /// (what a periodic refresh of its exit time does, [`crate::Policy::caches_alike`]): every
    /// class re-files it now, by its exit time alone, instead of re-evaluating it when next used.
    /// A refresh moves about one host in a thousand every second of clock, and each class would
    /// otherwise re-evaluate every one of them since its last use: with tens of classes in
    /// rotation, most of a temporal policy's decision at 100k hosts (`docs/benchmarks.md`,
    /// issue 32). Re-filing costs a remove and an insert in one bucket of each class, in the call
    /// that moved the clock.
    pub fn host_exit_moved(&mut self, host: HostIndex, exit_s: f64) {
        for class in &mut self.classes {
            class.refile_exit(host, exit_s);
        }
    }

    /// Forgets every cached class (after the inventory was rebuilt).
    pub fn clear(&mut self) {
        self.classes.clear();
        self.class_hashes.clear();
        self.journal = Journal::default();
    }

    pub fn classes_cached(&self) -> usize {
        self.classes.len()
    }

    /// Bytes held by the cached classes.
    pub fn heap_bytes(&self) -> usize {
        self.classes.iter().map(ClassCache::heap_bytes).sum::<usize>() + self.journal.changed.capacity() * 4
    }

    pub fn select(
        &mut self,
        policy: &Policy,
        state: &InventoryState,
        lifetimes: &[HostLifetime],
        request: &RuleRequest,
        chooser: &mut Chooser,
    ) -> Selection {
        self.tick += 1;
        let class = policy.class_traits();
        let hash = {
            let mut hasher = ClassKeyHasher::default();
            request.traits.hash_class(class, &mut hasher);
            hasher.finish()
        };
        let revision = self.journal.revision();
        let ordered = chooser.mode() == TieBreak::LowestIndex;
        let found = (0..self.classes.len()).find(|&i| {
            self.class_hashes[i] == hash && self.classes[i].representative.same_class(request.traits, class)
        });
        let at = match found {
            Some(at) => at,
            None => self.add_class(policy, state, lifetimes, request, hash, revision, ordered),
        };
        let cache = &mut self.classes[at];
        match self.journal.since(cache.revision) {
            Some(changed) => {
                let mut changed = changed.peekable();
                while changed.peek().is_some() {
                    let batch = changed.clone().take(CATCH_UP_BATCH);
                    std::hint::black_box(cache.touch(state, lifetimes, batch.clone()));
                    for host in batch {
                        cache.refresh(policy, state, lifetimes, host);
                    }
                    changed.nth(CATCH_UP_BATCH - 1);
                }
                cache.revision = revision;
            }
            None => *cache = ClassCache::build(policy, state, lifetimes, request.traits.clone(), revision, ordered),
        }
        cache.last_used = self.tick;
        let selection = cache.choose(policy, state, lifetimes, request, chooser, &mut self.scratch);
        self.trim_journal();
        selection
    }

    /// Builds the class of `request` (the least recently used one dropped beyond the limit); its
    /// position.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn add_class(
        &mut self,
        policy: &Policy,
        state: &InventoryState,
        lifetimes: &[HostLifetime],
        request: &RuleRequest,
        hash: u64,
        revision: u64,
        ordered: bool,
    ) -> usize {
        if self.classes.len() >= self.config.max_classes.max(1) {
            let oldest = (0..self.classes.len()).min_by_key(|&i| self.classes[i].last_used);
            if let Some(oldest) = oldest {
                self.classes.swap_remove(oldest);
                self.class_hashes.swap_remove(oldest);
            }
        }
        // Built only when a class is (re)built: most requests find their class cached.
        self.classes.push(ClassCache::build(policy, state, lifetimes, request.traits.clone(), revision, ordered));
        self.class_hashes.push(hash);
        self.classes.len() - 1
    }

    /// Drops journal entries every class has seen, and beyond the limit the oldest ones (classes
    /// that still needed them are rebuilt when next used).
    fn trim_journal(&mut self) {
        let seen_by_all = self.classes.iter().map(|c| c.revision).min().unwrap_or(self.journal.revision());
        let over_limit = self.journal.revision().saturating_sub(self.journal_limit as u64);
        self.journal.drop_before(seen_by_all.max(over_limit));
    }
}
