//! How an agent of a shared PostgreSQL store tells the others that it committed a batch: after the
//! commit, from a thread of its own on a connection of its own, never inside the batch's
//! transaction (issue 44).
//!
//! A `NOTIFY` in a transaction makes its commit take PostgreSQL's database-wide lock for
//! notifications and hold it through the commit's flush (so that the queue is in commit order):
//! every notifying commit of the zone then waits for the one before it to reach the disk, which is
//! the queue behind one flush that the log's positions from a sequence removed. Measured with
//! `pgbench` (8 clients, this machine, PostgreSQL 15): an insert alone 4,600 to 8,200
//! transactions/s, an insert and its notification in one transaction 1,900 to 2,250, the
//! notification sent as a statement of its own after the insert 3,800 to 5,800. A transaction
//! that only notifies writes no WAL, so it does not wait for a flush.
//!
//! Notifications are hints ([`super::listener`]): one that is never sent (the agent died right
//! after its commit, the notifying connection is down) costs the others latency, not correctness.
//! So the thread sends what is queued when it can, all of it in one statement per round trip, and
//! drops what it cannot send.

use postgres::{Config, NoTls};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

/// The notifying sessions' `application_name` (`pg_stat_activity`).
const APPLICATION_NAME: &str = "allocator-notifier";

/// A notification's payload must be shorter than 8,000 bytes: a batch's changes go with it only
/// below this.
const MAX_PAYLOAD: usize = 7_900;

/// The pause before connecting again after a failure.
const RECONNECT: Duration = Duration::from_millis(200);

/// The payload of the log's notification for the batch at `seq` (see [`super::listener::CHANNEL`]):
/// its position and agent, and its changes (the change log's JSON) when they fit.
pub(crate) fn payload(seq: i64, agent: &str, body: &str) -> String {
    let head = format!("{seq} {agent}");
    if head.len() + 1 + body.len() < MAX_PAYLOAD {
        format!("{head} {body}")
    } else {
        head
    }
}

/// A handle on the notifying thread; the thread ends once the handle is dropped.
pub(crate) struct Notifier {
    queue: Option<Sender<String>>,
}

impl Notifier {
    /// Starts notifying with `config` (the store's own settings). Never fails: a notifier that
    /// cannot connect drops what it is given and tries again.
    pub(crate) fn start(mut config: Config) -> Notifier {
        config.application_name(APPLICATION_NAME);
        let (queue, pending) = mpsc::channel();
        let spawned =
            std::thread::Builder::new().name("allocator-notify".to_owned()).spawn(move || run(&config, &pending));
        match spawned {
            Ok(_) => Notifier { queue: Some(queue) },
            Err(error) => {
                // Without the thread the other agents learn of this agent's commits when they
                // commit on its hosts or follow for a read: slower, not wrong.
                tracing::warn!(%error, "cannot start the change-log notifier; other agents will not be told of commits");
                Notifier { queue: None }
            }
        }
    }

    /// Tells the other agents, soon, of a committed batch (a [`payload`]).
    pub(crate) fn send(&self, payload: String) {
        if let Some(queue) = &self.queue {
            // The thread is gone only when its store is: nothing to tell then.
            let _ = queue.send(payload);
        }
    }
}

/// The notifying thread: takes what is queued, sends it in one statement, and again, until the
/// store is gone.
fn run(config: &Config, pending: &Receiver<String>) {
    let mut client = None;
    while let Ok(first) = pending.recv() {
        let mut payloads = vec![first];
        payloads.extend(pending.try_iter());
        if client.is_none() {
            client = connect(config)
                .inspect_err(|error| tracing::debug!(%error, "the change-log notifier cannot connect"))
                .ok();
        }
        let Some((connection, notify)) = &mut client else {
            metrics::counter!("allocator_notifications_dropped_total").increment(payloads.len() as u64);
            std::thread::sleep(RECONNECT);
            continue;
        };
        let sent = connection.execute(&*notify, &[&super::listener::CHANNEL, &payloads]);
        if let Err(error) = sent {
            tracing::debug!(%error, "the change-log notifier lost its connection");
            metrics::counter!("allocator_notifications_dropped_total").increment(payloads.len() as u64);
            client = None;
        }
    }
}

/// A connection and its notifying statement, planned once: a statement of its own per commit is
/// the database's price for commits that do not queue, kept small.
fn connect(config: &Config) -> Result<(postgres::Client, postgres::Statement), postgres::Error> {
    let mut client = config.connect(NoTls)?;
    let notify = client
        .prepare("SELECT pg_notify($1, payload) FROM unnest($2::text[]) WITH ORDINALITY AS n(payload, i) ORDER BY i")?;
    Ok((client, notify))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_goes_with_its_notification_only_when_it_fits() {
        assert_eq!(payload(41, "a-1", "[]"), "41 a-1 []");
        let large = "x".repeat(MAX_PAYLOAD);
        assert_eq!(payload(42, "a-1", &large), "42 a-1");
        let just = "y".repeat(MAX_PAYLOAD - "43 a-1 ".len() - 1);
        assert_eq!(payload(43, "a-1", &just).len(), MAX_PAYLOAD - 1);
    }
}
