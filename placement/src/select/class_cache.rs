//! One equivalence class's cached evaluation: its valid hosts grouped by score key (by exit time
//! within a group for a temporal policy), what each validator eliminated, brought up to date host by
//! host from the index's journal, and the choice of the best host among them.

use super::chunked::ChunkedSorted;
use super::*;

/// Hosts a class reads ahead of re-evaluating them when it catches up on the journal
/// ([`ClassCache::touch`]).
pub(super) const CATCH_UP_BATCH: usize = 16;

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
pub(super) struct ClassKeyHasher(u64);

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
pub(super) struct ClassCache {
    pub(super) representative: RequestTraits,
    /// Journal revision this cache has seen.
    pub(super) revision: u64,
    pub(super) last_used: u64,
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
pub(super) struct Scratch {
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
    pub(super) fn build(
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
    pub(super) fn refresh(
        &mut self,
        policy: &Policy,
        state: &InventoryState,
        lifetimes: &[HostLifetime],
        host: HostIndex,
    ) {
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
    pub(super) fn touch(
        &self,
        state: &InventoryState,
        lifetimes: &[HostLifetime],
        hosts: impl Iterator<Item = HostIndex>,
    ) -> u64 {
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
    pub(super) fn refile_exit(&mut self, host: HostIndex, exit_s: f64) {
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
    pub(super) fn choose(
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
    pub(super) fn heap_bytes(&self) -> usize {
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
