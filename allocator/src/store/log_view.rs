//! Which positions of a shared store's change log an agent's view holds (schema 8, issue 44).
//!
//! Positions come from a sequence, taken by each batch after its last lock and before its commit,
//! so concurrent commits of different agents never wait for each other's flush. The price is that
//! the log is no longer visible in position order: a position can be taken by a transaction that
//! is still committing (visible later) or that rolled back (never visible). Two batches that touch
//! one row (a host, a VM id, the drain) still get positions in the order they commit, since the
//! second takes its position only once the first released that row's lock: applying the visible
//! batches in position order is the database's order for every pair that does not commute.
//!
//! A [`LogView`] is the positions a view holds: every position up to [`LogView::through`], and
//! some above it (batches followed or committed by this agent out of order). A position above
//! `through` that was not visible while a later one was is *pending*: it is either still
//! committing or rolled back. A batch inserts its change-log row right after it takes its
//! position, so a position still pending after [`CLAIM_AFTER`] is almost surely rolled back; the
//! store then *claims* it by inserting an empty row at it (`ON CONFLICT DO NOTHING`). The primary
//! key makes that exact whatever the timing: either the batch's row is there (the claim waits for
//! the batch's transaction and yields) or the claim's is, and the batch, should it still be
//! running, is refused at its insert and decided again. Either way the position becomes visible
//! and is followed like any other.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How long a position may stay pending before the store claims it (see the module documentation).
pub const CLAIM_AFTER: Duration = Duration::from_secs(1);

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct LogView {
    /// Every position up to here is in the view, or was never committed.
    through: i64,
    /// Positions above `through` that are in the view or known never to be committed.
    settled: BTreeSet<i64>,
    /// Positions above `through` not visible while a later one was, each with when that was
    /// first seen.
    pending: BTreeMap<i64, Instant>,
}

impl LogView {
    /// A view loaded from the tables at `now`: every position up to `floor` settled (older than
    /// the log keeps, or pruned), and of those above it, `visible` (ascending) are the ones the
    /// tables' snapshot saw.
    pub fn loaded(floor: i64, visible: &[i64], now: Instant) -> Self {
        let mut view = LogView { through: floor, ..LogView::default() };
        view.saw(visible.iter().copied(), now);
        view
    }

    /// Every position up to this one is in the view (or was never committed): what the view
    /// reflects for the log function's checks.
    pub fn through(&self) -> i64 {
        self.through
    }

    /// The positions above [`Self::through`] the view holds (or knows were never committed).
    pub fn held_above(&self) -> Vec<i64> {
        self.settled.iter().copied().collect()
    }

    /// Whether the batch at `seq` is in the view (or was never committed).
    pub fn holds(&self, seq: i64) -> bool {
        seq <= self.through || self.settled.contains(&seq)
    }

    /// Whether positions above [`Self::through`] are in the view or pending: a follow would
    /// settle them (the view's checks are against `through`, so it should not lag for long).
    pub fn unsettled(&self) -> bool {
        !self.settled.is_empty() || !self.pending.is_empty()
    }

    /// The batch at `seq` is in the view now (this agent's own, or followed).
    pub fn add(&mut self, seq: i64) {
        if seq > self.through {
            self.pending.remove(&seq);
            self.settled.insert(seq);
            self.advance();
        }
    }

    /// A follow at `now` saw the positions `visible` (ascending; the caller has added those it
    /// applied): every position between `through` and the last of them that it did not see is
    /// pending from now on, unless it was already.
    pub fn saw(&mut self, visible: impl IntoIterator<Item = i64>, now: Instant) {
        let through = self.through;
        let mut next = through + 1;
        for seq in visible.into_iter().filter(|seq| *seq > through) {
            for missing in next..seq {
                if !self.settled.contains(&missing) {
                    self.pending.entry(missing).or_insert(now);
                }
            }
            self.pending.remove(&seq);
            self.settled.insert(seq);
            next = next.max(seq + 1);
        }
        self.advance();
    }

    /// The positions pending for at least `after` at `now`: to be claimed.
    pub fn overdue(&self, now: Instant, after: Duration) -> Vec<i64> {
        self.pending.iter().filter(|(_, since)| now.duration_since(**since) >= after).map(|(seq, _)| *seq).collect()
    }

    fn advance(&mut self) {
        while self.settled.remove(&(self.through + 1)) {
            self.through += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(ms: u64) -> Instant {
        // One origin per test run: only differences matter.
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *ORIGIN.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    #[test]
    fn positions_in_order_move_through_along() {
        let mut view = LogView::default();
        view.add(1);
        view.saw([2, 3], at(0));
        assert_eq!(view.through(), 3);
        assert!(!view.unsettled());
    }

    #[test]
    fn a_position_still_committing_holds_the_view_back_until_it_is_seen() {
        let mut view = LogView::default();
        view.saw([1, 3], at(0));
        assert_eq!(view.through(), 1);
        assert!(view.holds(3) && !view.holds(2));
        assert_eq!(view.held_above(), [3]);
        assert!(view.overdue(at(999), CLAIM_AFTER).is_empty(), "not yet due");
        view.saw([3], at(500));
        assert_eq!(view.overdue(at(1000), CLAIM_AFTER), [2], "pending since it was first missed");
        view.saw([2, 3], at(1001));
        assert_eq!(view.through(), 3);
        assert!(!view.unsettled());
    }

    #[test]
    fn an_own_batch_after_a_hole_is_held_and_settles_once_the_hole_is_claimed() {
        let mut view = LogView::default();
        view.add(1);
        view.add(3);
        assert_eq!(view.through(), 1);
        view.saw([3], at(0));
        assert!(view.unsettled());
        // The claim made position 2 visible (an empty row).
        view.saw([2, 3], at(1200));
        assert_eq!(view.through(), 3);
    }

    #[test]
    fn a_loaded_view_holds_what_its_snapshot_saw() {
        let view = LogView::loaded(5, &[6, 8, 9], at(0));
        assert_eq!(view.through(), 6);
        assert!(view.holds(8) && view.holds(9) && !view.holds(7) && !view.holds(10));
        assert_eq!(view.overdue(at(1000), CLAIM_AFTER), [7]);
    }

    proptest! {
        /// Positions committed, rolled back or claimed in any order, followed at any times: the
        /// view never holds a position in flight, and once every position is visible (committed
        /// or claimed) two follows settle the whole log.
        #[test]
        fn the_view_never_holds_a_position_in_flight(
            events in prop::collection::vec((0u8..4, 0usize..12), 1..60),
        ) {
            #[derive(Clone, Copy, PartialEq, Debug)]
            enum Fate { InFlight, Committed, RolledBack, Claimed }
            let mut fate = [Fate::InFlight; 13];
            let mut view = LogView::default();
            let mut clock = 0u64;
            let visible = |fate: &[Fate; 13], view: &LogView| -> Vec<i64> {
                (view.through() + 1..=12)
                    .filter(|s| matches!(fate[*s as usize], Fate::Committed | Fate::Claimed))
                    .collect()
            };
            for (kind, index) in events {
                let seq = index + 1;
                clock += 400;
                match kind {
                    0 | 1 if fate[seq] == Fate::InFlight => {
                        fate[seq] = if kind == 0 { Fate::Committed } else { Fate::RolledBack };
                    }
                    2 => {
                        // A follow, then the claims it makes: an in-flight batch loses its
                        // position to a claim (refused at its insert), a rolled-back one's is filled.
                        let seen = visible(&fate, &view);
                        for seq in &seen {
                            view.add(*seq);
                        }
                        view.saw(seen, at(clock));
                        for claimed in view.overdue(at(clock), CLAIM_AFTER) {
                            if matches!(fate[claimed as usize], Fate::InFlight | Fate::RolledBack) {
                                fate[claimed as usize] = Fate::Claimed;
                            }
                        }
                    }
                    _ => {}
                }
                for (s, f) in fate.iter().enumerate().skip(1) {
                    if view.holds(s as i64) {
                        prop_assert!(matches!(f, Fate::Committed | Fate::Claimed), "position {} held while {:?}", s, f);
                    }
                }
            }
            for f in fate.iter_mut().skip(1) {
                if matches!(*f, Fate::InFlight | Fate::RolledBack) {
                    *f = Fate::Claimed;
                }
            }
            for _ in 0..2 {
                let seen = visible(&fate, &view);
                view.saw(seen, at(clock));
            }
            prop_assert_eq!(view.through(), 12);
            prop_assert!(!view.unsettled());
        }
    }
}
