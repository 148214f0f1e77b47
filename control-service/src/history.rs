//! The tenants' history, fed to every inference server (issue 18): each VM the control service
//! places is a `started` event, each release an `ended` one ([`HistoryEvent`]), on the model's
//! clock. Every server has a queue of the events it has not had yet. They travel with the next
//! prediction request to that server (so a prediction always sees every event acknowledged before
//! it), or on their own every flush interval (`POST /v1/history`). Events that could not be
//! delivered go back to the front of the queue: the servers ignore an event they already have, so
//! sending one twice is harmless. A queue holds at most `max_pending` events (a server down for
//! long loses the oldest, counted).

use domain::validate::MAX_HISTORY_EVENTS;
use domain::HistoryEvent;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// See the module documentation.
#[derive(Debug)]
pub struct HistoryFeed {
    queues: Vec<Mutex<VecDeque<HistoryEvent>>>,
    /// Held while events are on their way to the server on their own: a prediction waits for
    /// them to land before it takes the next ones, so it never overtakes them.
    sending: Vec<tokio::sync::Mutex<()>>,
    max_pending: usize,
    dropped: AtomicU64,
    recorded: AtomicU64,
}

impl HistoryFeed {
    /// A feed to `servers` inference servers (none: events are counted and dropped).
    pub fn new(servers: usize, max_pending: usize) -> Self {
        HistoryFeed {
            queues: (0..servers).map(|_| Mutex::new(VecDeque::new())).collect(),
            sending: (0..servers).map(|_| tokio::sync::Mutex::new(())).collect(),
            max_pending: max_pending.max(1),
            dropped: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
        }
    }

    /// Queues `event` for every server.
    pub fn record(&self, event: HistoryEvent) {
        self.recorded.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("control_history_events_total").increment(1);
        for queue in &self.queues {
            let mut queue = queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if queue.len() >= self.max_pending {
                queue.pop_front();
                self.dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("control_history_events_dropped_total").increment(1);
            }
            queue.push_back(event.clone());
        }
    }

    /// [`HistoryFeed::take`], once the events sent on their own to `server` have landed.
    pub async fn take_after_sends(&self, server: usize) -> Vec<HistoryEvent> {
        let Some(sending) = self.sending.get(server) else { return Vec::new() };
        let _landed = sending.lock().await;
        self.take(server)
    }

    /// Holds back predictions to `server` ([`HistoryFeed::take_after_sends`]) while events go to it
    /// on their own.
    pub async fn sending(&self, server: usize) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        Some(self.sending.get(server)?.lock().await)
    }

    /// The events server `server` has not had yet, oldest first (at most one request's worth).
    pub fn take(&self, server: usize) -> Vec<HistoryEvent> {
        let Some(queue) = self.queues.get(server) else { return Vec::new() };
        let mut queue = queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let n = queue.len().min(MAX_HISTORY_EVENTS);
        queue.drain(..n).collect()
    }

    /// Puts back events [`HistoryFeed::take`] gave that did not reach the server, before the
    /// newer ones.
    pub fn give_back(&self, server: usize, events: Vec<HistoryEvent>) {
        let Some(queue) = self.queues.get(server) else { return };
        let mut queue = queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for event in events.into_iter().rev() {
            if queue.len() >= self.max_pending {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("control_history_events_dropped_total").increment(1);
                continue;
            }
            queue.push_front(event);
        }
    }

    /// Events waiting, per server.
    pub fn pending(&self) -> Vec<usize> {
        self.queues.iter().map(|q| q.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()).collect()
    }

    /// Events recorded, and events dropped from a full queue, since start.
    pub fn counts(&self) -> (u64, u64) {
        (self.recorded.load(Ordering::Relaxed), self.dropped.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(vm: &str) -> HistoryEvent {
        HistoryEvent::Started { vm_id: vm.to_owned(), tenant_id: "t".to_owned(), vm_type: "D2".to_owned(), at_s: 1.0 }
    }

    #[test]
    fn every_server_gets_every_event_once_in_order_and_failures_go_back_first() {
        let feed = HistoryFeed::new(2, 10);
        feed.record(started("a"));
        feed.record(started("b"));
        let first = feed.take(0);
        assert_eq!(first, vec![started("a"), started("b")]);
        feed.record(started("c"));
        feed.give_back(0, first);
        assert_eq!(feed.take(0), vec![started("a"), started("b"), started("c")]);
        assert_eq!(feed.take(1), vec![started("a"), started("b"), started("c")], "the other server's own queue");
        assert!(feed.take(0).is_empty());
    }

    #[test]
    fn a_server_that_stays_away_loses_only_the_oldest_events() {
        let feed = HistoryFeed::new(1, 3);
        for vm in ["a", "b", "c", "d", "e"] {
            feed.record(started(vm));
        }
        assert_eq!(feed.take(0), vec![started("c"), started("d"), started("e")]);
        assert_eq!(feed.counts(), (5, 2));
    }
}
