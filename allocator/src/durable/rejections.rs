//! The "rejected" answers that stand (issues 31 and 56): a client that sends the same request twice
//! at about the same time (a retry after a timeout, to the same agent or another one) gets the
//! first answer to both. A placement stands by itself (the second request finds the VM placed and
//! is that answer, replayed); a rejection leaves nothing behind, so it is remembered here, by VM
//! id, for [`REJECTION_STANDS_S`], and a request for one of those ids in that time gets it again
//! without trying a host, even if capacity has freed up since.
//!
//! What this agent answered comes from its own batches once they committed (the store records the
//! rejection with the batch, so it also stands across a restart and, in a shared store, for the
//! other agents); what other agents answered comes from the store (loaded, or a commit refused
//! because of one). Within a batch, a request for an id that an earlier request of the same batch
//! was answered "rejected" gets that answer ([`BatchRejections`]).

use crate::store::{StandingRejection, REJECTION_STANDS_S};
use domain::{AllocationDecision, AllocationOutcome, Rejection, RejectionCode, VmId};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How long a rejection stands, as a [`Duration`].
fn stands() -> Duration {
    Duration::from_secs_f64(REJECTION_STANDS_S)
}

/// The rejections of the last [`REJECTION_STANDS_S`], by VM id.
#[derive(Debug, Default)]
pub struct StandingRejections {
    by_vm: HashMap<VmId, (Instant, Rejection)>,
    /// The same ids in the order they were answered, to let them go when they no longer stand.
    order: VecDeque<(Instant, VmId)>,
}

impl StandingRejections {
    /// The answer that stands for `vm` at `now`, if one does.
    pub fn get(&self, vm: &VmId, now: Instant) -> Option<&Rejection> {
        self.by_vm.get(vm).filter(|(since, _)| now.saturating_duration_since(*since) < stands()).map(|(_, r)| r)
    }

    /// `vm` was answered `rejection` at `since`. A rejection already standing for it is kept (it
    /// was the first answer).
    pub fn insert(&mut self, vm: VmId, rejection: Rejection, since: Instant) {
        self.let_go(since);
        if let std::collections::hash_map::Entry::Vacant(entry) = self.by_vm.entry(vm.clone()) {
            entry.insert((since, rejection));
            self.order.push_back((since, vm));
        }
    }

    /// Another agent answered `vm` "rejected" (the store said so, without its answer).
    pub fn insert_elsewhere(&mut self, vm: VmId, since: Instant) {
        let rejection = elsewhere(&vm);
        self.insert(vm, rejection, since);
    }

    /// The rejections a store recorded (loaded at start or after a rebuild), aged as it says.
    pub fn extend_stored(&mut self, stored: Vec<StandingRejection>, now: Instant) {
        let mut stored = stored;
        // Oldest first, so that the order of letting go holds.
        stored.sort_by(|a, b| b.age_s.total_cmp(&a.age_s));
        for StandingRejection { vm, age_s, rejection } in stored {
            let since = now.checked_sub(Duration::from_secs_f64(age_s.clamp(0.0, REJECTION_STANDS_S))).unwrap_or(now);
            let rejection = rejection.unwrap_or_else(|| elsewhere(&vm));
            self.insert(vm, rejection, since);
        }
    }

    /// Forgets the rejections that no longer stand at `now`.
    fn let_go(&mut self, now: Instant) {
        while let Some((since, _)) = self.order.front() {
            if now.saturating_duration_since(*since) < stands() {
                break;
            }
            if let Some((_, vm)) = self.order.pop_front() {
                self.by_vm.remove(&vm);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_vm.len()
    }
}

/// The rejections a batch answered, each VM id with its answer, in order: recorded with the batch's
/// commit, and the answer to a second request for one of those ids in the same batch.
#[derive(Debug, Default)]
pub struct BatchRejections(Vec<(VmId, Rejection)>);

impl BatchRejections {
    pub fn push(&mut self, vm: VmId, rejection: Rejection) {
        self.0.push((vm, rejection));
    }

    pub fn get(&self, vm: &VmId) -> Option<&Rejection> {
        self.0.iter().find(|(id, _)| id == vm).map(|(_, r)| r)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_slice(&self) -> &[(VmId, Rejection)] {
        &self.0
    }

    /// Hands them to what stands, as answered at `since` (the batch committed).
    pub fn stand(self, standing: &mut StandingRejections, since: Instant) {
        for (vm, rejection) in self.0 {
            standing.insert(vm, rejection, since);
        }
    }
}

/// The answer again: a rejection that stands, told as an earlier request's answer replayed.
pub fn replayed(rejection: &Rejection) -> AllocationDecision {
    AllocationDecision {
        outcome: AllocationOutcome::Rejected { rejection: rejection.clone() },
        rule_stats: Vec::new(),
        replayed: true,
    }
}

/// The answer another agent gave, known only by its VM id.
fn elsewhere(vm: &VmId) -> Rejection {
    Rejection {
        code: RejectionCode::NoFeasibleHost,
        detail: format!(
            "a request for VM `{vm}` was answered \"rejected\" by an allocation agent of this zone less than \
             {REJECTION_STANDS_S} s ago (a retry sent to two agents at once, or again): that first answer stands; \
             no host was tried"
        ),
        vm_id: Some(vm.clone()),
        eliminated_by: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(detail: &str) -> Rejection {
        Rejection {
            code: RejectionCode::GangDoesNotFit,
            detail: detail.to_owned(),
            vm_id: None,
            eliminated_by: Vec::new(),
        }
    }

    #[test]
    fn the_first_rejection_stands_for_its_time_then_goes() {
        let t0 = Instant::now();
        let mut standing = StandingRejections::default();
        standing.insert(VmId::from("a"), rejection("first"), t0);
        standing.insert(VmId::from("a"), rejection("second"), t0 + Duration::from_secs(1));
        assert_eq!(standing.get(&VmId::from("a"), t0 + Duration::from_secs(29)).unwrap().detail, "first");
        assert!(standing.get(&VmId::from("a"), t0 + Duration::from_secs(30)).is_none());
        assert!(standing.get(&VmId::from("b"), t0).is_none());
        // Later insertions let the old ones go.
        standing.insert(VmId::from("b"), rejection("b"), t0 + Duration::from_secs(31));
        assert_eq!(standing.len(), 1);
    }

    #[test]
    fn stored_rejections_stand_for_what_is_left_of_their_time() {
        let now = Instant::now() + Duration::from_secs(60);
        let mut standing = StandingRejections::default();
        standing.extend_stored(
            vec![
                StandingRejection { vm: VmId::from("old"), age_s: 25.0, rejection: Some(rejection("kept")) },
                StandingRejection { vm: VmId::from("elsewhere"), age_s: 1.0, rejection: None },
            ],
            now,
        );
        assert_eq!(standing.get(&VmId::from("old"), now).unwrap().detail, "kept");
        assert!(standing.get(&VmId::from("old"), now + Duration::from_secs(6)).is_none());
        let other = standing.get(&VmId::from("elsewhere"), now + Duration::from_secs(6)).unwrap();
        assert_eq!(other.code, RejectionCode::NoFeasibleHost);
    }
}
