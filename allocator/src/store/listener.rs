//! How an agent of a shared PostgreSQL store learns that other agents committed, without asking
//! before every batch (issue 32): a thread of its own, on a connection of its own, `LISTEN`s to
//! the change log's channel, which each agent notifies after each commit with the batch's
//! position and agent ([`super::notifier`]).
//!
//! What it keeps is a hint, never the truth: the positions other agents are known to have
//! committed that the view may lack, each with its batch when the notification carried it
//! (schema 9: every batch whose changes fit in a notification), and whether it is connected and
//! listening. With the batches at hand a follow needs no query ([`Listener::take_notified`]): an
//! agent among many spends no round trip and no database work on the others' commits. Positions
//! are not committed in their order (schema 8: [`super::log_view`]), so it keeps each notified position
//! until the view holds it, not only the latest. The store skips its follow query only while the
//! listener is connected, it has followed since the listener (re)started listening (what was
//! committed before that is in the follow's snapshot), and the view holds every notified
//! position; a notification that is late or lost (the connection broke, the server restarted)
//! costs latency only, because every commit still checks which batches committed before it on
//! its rows. While reconnecting, the listener answers "not listening", so every batch follows
//! first, as it did before notifications.

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Config, NoTls};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The channel agents notify after a commit (`pg_notify`, [`super::notifier::payload`]), with
/// payload `"<seq> <agent> <changes>"`, or `"<seq> <agent>"` for a batch whose changes (the change
/// log's JSON) would not fit.
pub(crate) const CHANNEL: &str = "allocator_log";

/// The listening sessions' `application_name` (`pg_stat_activity`).
const APPLICATION_NAME: &str = "allocator-listener";

/// How long the listening thread waits for a notification before it looks whether its store is
/// gone (the store does not wait for it when dropped).
const POLL: Duration = Duration::from_millis(500);

/// The pause between attempts to connect, doubled up to [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The most notified batches kept with their changes: past it (a worker that does not follow) the
/// positions are kept alone, and the store's next follow reads them from the log.
const KEPT_BATCHES: usize = 4096;

/// Another agent's commit, as notified.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Notified {
    pub(crate) seq: i64,
    pub(crate) agent: String,
    /// The batch's changes (the change log's `body`), when the notification carried them.
    pub(crate) body: Option<String>,
}

/// Called when another agent committed a batch this agent has not followed (from the listening
/// thread: it must not block). The allocator's worker uses it to follow while idle.
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// What the listening thread shares with the store.
struct Shared {
    /// This agent's name: its own notifications are no news.
    agent: String,
    /// Commits of other agents, until the view holds them.
    notified: Mutex<Vec<Notified>>,
    /// Connected and listening: every commit from [`Shared::generation`]'s start on is notified.
    listening: AtomicBool,
    /// Counts the times listening (re)started: a view followed in an earlier generation may lack
    /// commits that were never notified.
    generation: AtomicU64,
    /// A wake-up was sent and the store has not followed since: no need for another.
    woken: AtomicBool,
    waker: Mutex<Option<Waker>>,
    /// The store is gone: the thread ends.
    stopped: AtomicBool,
}

impl Shared {
    fn committed_elsewhere(&self, mut batch: Notified) {
        // A poisoned lock only means a holder panicked; the store then follows before every
        // batch ([`Listener::up_to`]).
        if let Ok(mut notified) = self.notified.lock() {
            if notified.len() >= KEPT_BATCHES {
                batch.body = None;
            }
            notified.push(batch);
        }
        self.wake();
    }

    /// Wakes the worker to follow, once until the store follows.
    fn wake(&self) {
        if !self.woken.swap(true, Ordering::AcqRel) {
            // A poisoned lock only means a waker panicked: the hint is not worth a panic here.
            if let Some(wake) = self.waker.lock().ok().and_then(|waker| waker.clone()) {
                wake();
            }
        }
    }
}

/// A handle on the listening thread; the thread ends (within [`POLL`]) once it is dropped.
pub(crate) struct Listener {
    shared: Arc<Shared>,
}

impl Listener {
    /// Starts listening with `config` (the store's own settings) for `agent`. Never fails: a
    /// listener that cannot connect keeps trying and meanwhile says it does not listen.
    pub(crate) fn start(mut config: Config, agent: &str) -> Listener {
        // So that an operator (and a test) can tell it among the agents' sessions.
        config.application_name(APPLICATION_NAME);
        let shared = Arc::new(Shared {
            agent: agent.to_owned(),
            notified: Mutex::new(Vec::new()),
            listening: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            woken: AtomicBool::new(false),
            waker: Mutex::new(None),
            stopped: AtomicBool::new(false),
        });
        let thread = Arc::clone(&shared);
        let spawned =
            std::thread::Builder::new().name("allocator-listen".to_owned()).spawn(move || listen(&config, &thread));
        if let Err(error) = spawned {
            // Without the thread the store simply follows before every batch.
            tracing::warn!(%error, "cannot start the change-log listener; following before every batch");
        }
        Listener { shared }
    }

    /// Whether a batch may skip the follow query: listening, followed in this generation of
    /// listening (`followed_generation`, from [`Self::following`]), and every commit of another
    /// agent notified since is one the view `holds`.
    pub(crate) fn up_to(&self, followed_generation: u64, holds: impl Fn(i64) -> bool) -> bool {
        if !self.shared.listening.load(Ordering::Acquire)
            || self.shared.generation.load(Ordering::Acquire) != followed_generation
        {
            return false;
        }
        let Ok(mut notified) = self.shared.notified.lock() else { return false };
        notified.retain(|batch| !holds(batch.seq));
        notified.is_empty()
    }

    /// The commits notified since the last call that the view does not `holds`, in the log's
    /// order, each as its position, agent and changes, if a follow may take them instead of
    /// reading the log: listening, in the generation `followed_generation` (so every commit since
    /// the last read of the log was notified), every such commit's changes at hand, and no
    /// position missing below them (every one above `through`, the view's settled part, is held
    /// or notified). `None` leaves them for the next call.
    ///
    /// Agents notify after their commits, so notifications arrive in any order: the release of a
    /// VM (its agent saw the placement committed) can be notified before the placement is. A
    /// view that applied it first would find the VM not placed; a log read sees both, since a
    /// commit is visible before any batch that depends on it is decided.
    pub(crate) fn take_notified(
        &self,
        followed_generation: u64,
        through: i64,
        holds: impl Fn(i64) -> bool,
    ) -> Option<Vec<(i64, String, String)>> {
        if !self.shared.listening.load(Ordering::Acquire)
            || self.shared.generation.load(Ordering::Acquire) != followed_generation
        {
            return None;
        }
        let mut notified = self.shared.notified.lock().ok()?;
        notified.retain(|batch| !holds(batch.seq));
        if notified.iter().any(|batch| batch.body.is_none()) {
            return None;
        }
        notified.sort_unstable_by_key(|batch| batch.seq);
        let mut next = through + 1;
        for batch in notified.iter() {
            while next < batch.seq && holds(next) {
                next += 1;
            }
            if next != batch.seq {
                metrics::counter!("allocator_notified_gaps_total").increment(1);
                return None;
            }
            next += 1;
        }
        let batches = std::mem::take(&mut *notified)
            .into_iter()
            .filter_map(|batch| Some((batch.seq, batch.agent, batch.body?)))
            .collect();
        Some(batches)
    }

    /// The store is about to follow: a commit notified from now on wakes the worker again.
    /// Answers the generation of listening the follow will be current for; one that started
    /// before the listener listened is of no generation the listener will report.
    pub(crate) fn following(&self) -> u64 {
        self.shared.woken.store(false, Ordering::Release);
        if self.shared.listening.load(Ordering::Acquire) {
            self.shared.generation.load(Ordering::Acquire)
        } else {
            u64::MAX
        }
    }

    pub(crate) fn set_waker(&self, waker: Waker) {
        if let Ok(mut slot) = self.shared.waker.lock() {
            *slot = Some(waker);
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Release);
    }
}

/// The listening thread: connect, `LISTEN`, read the head, then take notifications until the
/// connection breaks or the store is gone; reconnect after a pause.
fn listen(config: &Config, shared: &Shared) {
    let mut pause = RECONNECT_MIN;
    while !shared.stopped.load(Ordering::Acquire) {
        match listen_once(config, shared) {
            Ok(()) => return,
            Err(error) => {
                if shared.listening.swap(false, Ordering::AcqRel) {
                    // It had worked: try again soon.
                    pause = RECONNECT_MIN;
                    tracing::warn!(%error, "the change-log listener lost its connection; following before every batch until it is back");
                } else {
                    tracing::debug!(%error, "the change-log listener cannot connect yet");
                }
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

/// One connection's life: `Ok` once the store is gone, why it ended otherwise.
fn listen_once(config: &Config, shared: &Shared) -> Result<(), String> {
    let mut client = config.connect(NoTls).map_err(|e| e.to_string())?;
    client.batch_execute(&format!("LISTEN {CHANNEL}")).map_err(|e| e.to_string())?;
    loop {
        // Listening from here on: what committed before is in the snapshot of the store's next
        // follow, which the new generation asks for.
        shared.generation.fetch_add(1, Ordering::AcqRel);
        shared.listening.store(true, Ordering::Release);
        shared.wake();
        loop {
            if shared.stopped.load(Ordering::Acquire) {
                return Ok(());
            }
            let next = client.notifications().timeout_iter(POLL).next().map_err(|e| e.to_string())?;
            let Some(notification) = next else {
                // Nothing for a while, or the connection closed.
                if client.is_closed() {
                    return Err("the connection closed".to_owned());
                }
                continue;
            };
            match parse(notification.payload()) {
                Some(batch) if batch.agent != shared.agent => shared.committed_elsewhere(batch),
                Some(_) => {}
                // Not an agent's (someone else's NOTIFY on the channel): news of an unknown
                // position. A new generation: the store follows again.
                None => {
                    shared.listening.store(false, Ordering::Release);
                    break;
                }
            }
        }
    }
}

/// An agent's notification of its commit ([`super::notifier::payload`]): `"<seq> <agent>"`, then
/// the batch's changes after a space when they fit (an agent's name has no space: [`super::postgres`] makes it).
fn parse(payload: &str) -> Option<Notified> {
    let mut words = payload.splitn(3, ' ');
    let seq = words.next()?.parse::<i64>().ok()?;
    let agent = words.next()?.to_owned();
    Some(Notified { seq, agent, body: words.next().map(str::to_owned) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that is listening (generation 1) and was notified of `seqs`, each with a body.
    fn notified(seqs: &[i64]) -> Listener {
        let shared = Arc::new(Shared {
            agent: "me".to_owned(),
            notified: Mutex::new(
                seqs.iter().map(|&seq| Notified { seq, agent: "other".into(), body: Some("[]".into()) }).collect(),
            ),
            listening: AtomicBool::new(true),
            generation: AtomicU64::new(1),
            woken: AtomicBool::new(false),
            waker: Mutex::new(None),
            stopped: AtomicBool::new(true),
        });
        Listener { shared }
    }

    #[test]
    fn notified_batches_are_taken_only_with_no_position_missing_below_them() {
        // The view holds everything up to 10, and 11 (its own batch); 12 and 14 are notified, 13
        // not yet (its agent notifies after its commit): nothing is taken, all is kept.
        let listener = notified(&[14, 12]);
        let holds = |seq: i64| seq <= 11;
        assert_eq!(listener.take_notified(1, 10, holds), None);
        assert_eq!(listener.shared.notified.lock().unwrap().len(), 2);
        // 13 arrives: all three, in the log's order.
        listener.shared.committed_elsewhere(Notified { seq: 13, agent: "other".into(), body: Some("[]".into()) });
        let taken = listener.take_notified(1, 10, holds).expect("no gap");
        assert_eq!(taken.iter().map(|(seq, _, _)| *seq).collect::<Vec<_>>(), [12, 13, 14]);
        assert!(listener.shared.notified.lock().unwrap().is_empty());
        // Another generation of listening: the log must be read.
        assert_eq!(notified(&[11]).take_notified(2, 10, |seq| seq <= 10), None);
    }

    #[test]
    fn a_notification_carries_its_position_agent_and_changes_when_they_fit() {
        let with = parse(r#"41 agent-a [{"placed":{"vm":"a b"}}]"#).expect("parsed");
        assert_eq!(
            with,
            Notified { seq: 41, agent: "agent-a".into(), body: Some(r#"[{"placed":{"vm":"a b"}}]"#.into()) }
        );
        assert_eq!(parse("42 agent-b"), Some(Notified { seq: 42, agent: "agent-b".into(), body: None }));
        // Someone else's NOTIFY on the channel.
        assert_eq!(parse("hello"), None);
        assert_eq!(parse("43"), None);
    }
}
