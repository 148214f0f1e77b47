//! Simulated time for the event heaps of the engine and of the agents' simulation.

use std::cmp::Ordering;

/// A time with a total order, for the event heaps (also [`crate::agents`]').
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) struct Time(pub(crate) f64);

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}
