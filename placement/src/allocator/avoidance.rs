//! Conflict avoidance for agents of a shared store (Protean, paper 001 s5.3): with a probability
//! the agent sets, a placement is drawn among the top valid hosts instead of the best ones only,
//! so that agents deciding at the same time on like views do not all go for the same host. With a
//! [`HostShare`], the draw is the best of the agent's own hosts among the top ones: agents that
//! know each other then go to different hosts, at the cost of a host a few places down the
//! ranking.

use super::Allocator;
use crate::state::HostIndex;
use domain::{HostId, VmRequest};
use std::sync::Arc;

/// How an agent of a shared store avoids conflicts ([`Allocator::set_conflict_avoidance`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ConflictAvoidance {
    /// How many of the best valid hosts a placement draws from.
    pub top: usize,
    /// The probability that a placement draws from them (else: among the best hosts only).
    pub probability: f64,
    /// This agent's own hosts: a draw takes the best of them among the top hosts (random among
    /// equals), or, when none of them is there, the best of them among the top `top` per agent;
    /// it draws at random among the top hosts only when none is there either. `None`: always at
    /// random among the top hosts.
    pub share: Option<Arc<HostShare>>,
}

/// The hosts that one agent takes first when it avoids conflicts. Each host belongs to the one
/// agent, among the agents it knows, with the highest rendezvous hash of (agent, host) (highest
/// random weight): two agents that know each other never both own a host, they need not agree on
/// anything else, and an agent that joins or leaves moves only its own share of the hosts.
#[derive(Clone, Debug, PartialEq)]
pub struct HostShare {
    own: Vec<bool>,
    agents: usize,
}

impl HostShare {
    /// The share of agent `me` among `agents` (`me` counts whether listed or not) over `hosts`, in
    /// host index order.
    pub fn rendezvous<'a>(me: &str, agents: &[&str], hosts: impl IntoIterator<Item = &'a HostId>) -> HostShare {
        let mine = stable_hash(me.as_bytes());
        let others: Vec<u64> =
            agents.iter().filter(|agent| **agent != me).map(|agent| stable_hash(agent.as_bytes())).collect();
        let own = hosts
            .into_iter()
            .map(|host| {
                let host = stable_hash(host.as_str().as_bytes());
                let weight = mix(mine ^ host);
                others.iter().all(|other| mix(other ^ host) < weight)
            })
            .collect();
        HostShare { own, agents: others.len() + 1 }
    }

    pub fn is_own(&self, host: HostIndex) -> bool {
        self.own.get(host.get()).copied().unwrap_or(false)
    }

    /// How many agents share the hosts (this one included).
    pub fn agents(&self) -> usize {
        self.agents
    }
}

/// FNV-1a: the same on every machine and every release, unlike the standard library's hasher.
fn stable_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3))
}

/// SplitMix64's finaliser: spreads a combined hash over all bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Allocator {
    /// Avoids conflicts with other agents of a shared store (see the module documentation): with
    /// `avoidance`, each placement draws, with its probability, among the `top` best valid hosts
    /// instead of among the best ones only. `None` (the default): never.
    pub fn set_conflict_avoidance(&mut self, avoidance: Option<ConflictAvoidance>) {
        self.avoidance = avoidance;
    }

    /// The host a placement of `vm` takes instead of `best` when it avoids conflicts, if the draw
    /// says so.
    pub(super) fn avoiding(&mut self, vm: &VmRequest, best: HostIndex) -> HostIndex {
        let Some(avoidance) = &self.avoidance else { return best };
        if avoidance.probability <= 0.0 {
            return best;
        }
        let (top, probability, share) = (avoidance.top, avoidance.probability, avoidance.share.clone());
        if !self.chooser.coin(probability) {
            return best;
        }
        self.among_top(vm, top, share.as_deref()).unwrap_or(best)
    }

    /// A host among the `top` best valid hosts for `vm`: the best of `share`'s own hosts there, or
    /// one drawn at random. Hosts that tie with the last of them count as among them: the ranking
    /// orders ties by host index, and cutting there would send every agent to the same
    /// lowest-index hosts.
    ///
    /// An agent that owns none of the top hosts takes its best own host among the top `top` per
    /// agent instead (past `top` only then). A draw at random among the top hosts lands on another
    /// agent's host, which that agent may be filling at the same time: with 8 agents and the top
    /// 16, (7/8)^16 = 12% of placements did, and in a zone packed tight by the churn those were
    /// 4 to 6 refused commits in 100 (`agents_scaleout`, docs/benchmarks.md), against none with the
    /// wider reach. Only a zone where the agent owns none of those either draws at random.
    fn among_top(&mut self, vm: &VmRequest, top: usize, share: Option<&HostShare>) -> Option<HostIndex> {
        let traits = self.request_traits(vm);
        // What is read below: the top `top` (per agent, with a share) and the hosts tied with the
        // last of them.
        let reads = top.saturating_mul(share.map_or(1, HostShare::agents)).max(top);
        let (ranked, valid) = self.rank_top(&self.rule_request(vm, &traits), reads);
        let n = valid.min(top);
        let boundary = &ranked.get(n.checked_sub(1)?)?.0;
        let tied_from = ranked.partition_point(|(key, _)| key < boundary);
        let tied_to = ranked.partition_point(|(key, _)| key <= boundary);
        if let Some(share) = share {
            let reach = tied_to.max(valid.min(top.saturating_mul(share.agents())));
            if let Some(first) = ranked[..reach].iter().position(|(_, host)| share.is_own(*host)) {
                let key = &ranked[first].0;
                // Every own host tied with it, wherever the reach cuts their run.
                let equals: Vec<HostIndex> = ranked[first..]
                    .iter()
                    .take_while(|(other, _)| other == key)
                    .filter(|(_, host)| share.is_own(*host))
                    .map(|(_, host)| *host)
                    .collect();
                return Some(equals[self.chooser.draw(equals.len())?]);
            }
        }
        let pick = self.chooser.draw(n)?;
        if pick < tied_from {
            return Some(ranked[pick].1);
        }
        let tied = self.chooser.draw(tied_to - tied_from)?;
        Some(ranked[tied_from + tied].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(n: usize) -> Vec<HostId> {
        (0..n).map(|i| HostId(format!("z-h{i}"))).collect()
    }

    #[test]
    fn agents_that_know_each_other_split_the_hosts_without_overlap() {
        let hosts = hosts(1000);
        let agents = ["a", "b", "c", "d"];
        let shares: Vec<HostShare> = agents.iter().map(|me| HostShare::rendezvous(me, &agents, &hosts)).collect();
        for h in 0..hosts.len() {
            let owners = shares.iter().filter(|share| share.is_own(HostIndex(h as u32))).count();
            assert_eq!(owners, 1, "host {h} has {owners} owners");
        }
        for share in &shares {
            let own = share.own.iter().filter(|own| **own).count();
            assert!((180..320).contains(&own), "a quarter of 1000 hosts, roughly: {own}");
            assert_eq!(share.agents(), 4);
        }
    }

    #[test]
    fn an_agent_that_leaves_moves_only_its_own_hosts() {
        let hosts = hosts(500);
        let before = HostShare::rendezvous("a", &["a", "b", "c"], &hosts);
        let after = HostShare::rendezvous("a", &["a", "b"], &hosts);
        let with_c = HostShare::rendezvous("c", &["a", "b", "c"], &hosts);
        for h in 0..hosts.len() {
            let h = HostIndex(h as u32);
            if before.is_own(h) {
                assert!(after.is_own(h), "a keeps its hosts when c leaves");
            } else if after.is_own(h) {
                assert!(with_c.is_own(h), "a gains only c's hosts");
            }
        }
        let alone = HostShare::rendezvous("a", &[], &hosts);
        assert!(alone.own.iter().all(|own| *own), "alone, every host is its own");
    }
}
