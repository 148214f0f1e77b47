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
mod class_cache;

use crate::lifetime::{HostLifetime, OrderedTime};
use crate::policy::{Policy, ScoreKey};
use crate::rules::{HostView, RequestTraits, RuleRequest};
use crate::state::{HostIndex, InventoryState};
use class_cache::{ClassCache, ClassKeyHasher, Scratch, CATCH_UP_BATCH};
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
    let hosts = (0..state.hosts().len() as u32).map(HostIndex);
    scan(policy, state, lifetimes, request, chooser, hosts, state.hosts().len())
}

/// [`full_scan`] of the hosts `among` alone (a cloud scheduler's candidates), in inventory order
/// so that ties are drawn as a full scan draws them; hosts named twice count once.
pub fn scan_among(
    policy: &Policy,
    state: &InventoryState,
    lifetimes: &[HostLifetime],
    request: &RuleRequest,
    chooser: &mut Chooser,
    among: &[HostIndex],
) -> Selection {
    let mut hosts = among.to_vec();
    hosts.sort_unstable();
    hosts.dedup();
    let count = hosts.len();
    scan(policy, state, lifetimes, request, chooser, hosts.into_iter(), count)
}

fn scan(
    policy: &Policy,
    state: &InventoryState,
    lifetimes: &[HostLifetime],
    request: &RuleRequest,
    chooser: &mut Chooser,
    hosts: impl Iterator<Item = HostIndex>,
    count: usize,
) -> Selection {
    let validators = policy.validators().len();
    let mut eliminated = vec![0; validators];
    let mut valid: Vec<(ScoreKey, HostIndex)> = Vec::new();
    for index in hosts {
        let host = view(state, lifetimes, index);
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
        stats: policy.filter_stats(count, &eliminated, &tied),
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
