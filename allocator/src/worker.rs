//! The thread that owns the [`DurableAllocator`] and group-commits what the HTTP handlers send it.
//!
//! Handlers send a command ([`Request`]) over a bounded channel as a [`Job`] and await its typed
//! [`Answer`](crate::durable::Answer). The worker thread blocks for the first command, then takes whatever else is already
//! queued without waiting, up to `max_batch` commands in all, and runs them as one batch: one SQLite
//! transaction and one `fsync` for all of their writes ([`DurableAllocator::execute`]). Under load
//! the batches grow by themselves (requests queue while the previous batch commits); an idle
//! service answers a lone request at once, with no added delay. `max_batch = 1` makes one commit per
//! request.
//!
//! With a store that other agents share, the store's listener wakes the worker when another agent
//! commits: it queues a [`Follow`], so that an idle worker follows then, not in front of the next
//! request.
//!
//! A panic while a batch runs (a bug) drops that batch's replies, so its requests are answered with
//! an error, and the state is rebuilt from the store before the next batch.

use crate::config::Clock;
use crate::durable::{job, CommandError, ConsolidationRound, DurableAllocator, Follow, Job, ReloadReason, Request};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A handle on the worker thread; cheap to clone. The thread stops when every handle is dropped.
#[derive(Clone, Debug)]
pub struct Worker {
    jobs: mpsc::Sender<Box<dyn Job>>,
}

pub use crate::store::unix_now_s;

impl Worker {
    /// Starts the worker thread. `max_batch` is the most commands per batch (at least 1);
    /// `queue` the most commands waiting (senders wait beyond it); `clock` what time batches run at.
    pub fn spawn(
        mut durable: DurableAllocator,
        max_batch: usize,
        queue: usize,
        clock: Clock,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (jobs, receiver) = mpsc::channel(queue.max(1));
        // Another agent committed: an idle worker follows now rather than before its next
        // request. A full queue means a busy worker, which follows before its next batch anyway;
        // the handle is weak so that the worker still stops when the service's handles are gone.
        let weak = jobs.downgrade();
        durable.set_waker(std::sync::Arc::new(move || {
            if let Some(jobs) = weak.upgrade() {
                let _ = jobs.try_send(job(Follow).0);
            }
        }));
        let handle = std::thread::Builder::new()
            .name("allocator-worker".to_owned())
            .spawn(move || run(durable, receiver, max_batch.max(1), clock))?;
        Ok((Worker { jobs }, handle))
    }

    /// A handle that does not keep the worker running (for background tasks: the worker stops when
    /// the service's handles are gone, whatever they hold).
    pub fn downgrade(&self) -> WeakWorker {
        WeakWorker { jobs: self.jobs.downgrade() }
    }

    /// Runs one command in the next batch and waits for its answer, which comes only after the
    /// batch's commit.
    pub async fn call<R: Request>(&self, request: R) -> Result<R::Output, CommandError> {
        self.call_timed(request).await.0
    }

    /// [`Worker::call`], with where the command's time went (none when it never ran).
    pub async fn call_timed<R: Request>(&self, request: R) -> (Result<R::Output, CommandError>, Option<Stages>) {
        let sent = Instant::now();
        let (job, answer) = job(request);
        if self.jobs.send(job).await.is_err() {
            return (Err(CommandError::Unavailable("the allocator worker has stopped".to_owned())), None);
        }
        let (reply, timing) = answer.wait_timed().await;
        let stages = timing.map(|batch| {
            let ran = batch.answered.saturating_duration_since(batch.started);
            Stages {
                queue: batch.started.saturating_duration_since(sent),
                decide: ran.saturating_sub(batch.commit),
                commit: batch.commit,
                wake: batch.answered.elapsed(),
            }
        });
        (reply, stages)
    }
}

/// A [`Worker`] handle that does not keep the worker running ([`Worker::downgrade`]).
#[derive(Clone, Debug)]
pub struct WeakWorker {
    jobs: mpsc::WeakSender<Box<dyn Job>>,
}

impl WeakWorker {
    /// The worker, while it runs.
    pub fn upgrade(&self) -> Option<Worker> {
        self.jobs.upgrade().map(|jobs| Worker { jobs })
    }
}

/// Where a command's time went between its handler and the worker thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stages {
    /// From the send to its batch's start: the channel, waking the worker, earlier batches.
    pub queue: Duration,
    /// Its batch's work but the commits: following the store, deciding every command of the batch.
    pub decide: Duration,
    /// Its batch's commits (with the sync to disk of a durable store).
    pub commit: Duration,
    /// From the answers handed out to the handler running again: waking the async runtime.
    pub wake: Duration,
}

fn run(mut durable: DurableAllocator, mut receiver: mpsc::Receiver<Box<dyn Job>>, max_batch: usize, clock: Clock) {
    // The request clock starts at the allocator's clock as opened and never goes back.
    let mut request_clock_s = durable.allocator().map_or(0.0, |a| a.clock_s());
    while let Some(first) = receiver.blocking_recv() {
        let mut batch = Vec::with_capacity(max_batch);
        batch.push(first);
        while batch.len() < max_batch {
            match receiver.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let now_s = match clock {
            Clock::Wall => unix_now_s(),
            Clock::Request => {
                if let Some(latest) = batch.iter().filter_map(|job| job.time_s()).reduce(f64::max) {
                    request_clock_s = request_clock_s.max(latest);
                }
                request_clock_s
            }
        };
        if matches!(clock, Clock::Request) {
            run_due_rounds(&mut durable, now_s);
        }
        let commands = batch.len();
        // A panic drops the batch's jobs unanswered: their callers are told it was not applied.
        if catch_unwind(AssertUnwindSafe(|| durable.execute(batch, now_s))).is_err() {
            tracing::error!(commands, "the allocator panicked on a batch; rebuilding from the store");
            if let Err(error) = durable.rebuild(now_s, ReloadReason::Panic) {
                tracing::error!(%error, "rebuilding after a panic failed");
            }
        }
    }
    tracing::info!("allocator worker stopped");
}

/// On the request clock time moves only with the requests, so the consolidation rounds due by
/// `now_s` run first, each at its own time, before the batch that moved the clock past them (as
/// the simulator runs them between its events).
fn run_due_rounds(durable: &mut DurableAllocator, now_s: f64) {
    while let Some(due) = durable.allocator().and_then(|a| a.consolidation_due_s()).filter(|due| *due <= now_s) {
        // The answer is kept until the round ran: a job nobody waits for is skipped.
        let (round, _answer) = job(ConsolidationRound { due_only: true });
        let ran = catch_unwind(AssertUnwindSafe(|| durable.execute(vec![round], due))).is_ok();
        let next = durable.allocator().and_then(|a| a.consolidation_due_s());
        if !ran || next.is_none_or(|next| next <= due) {
            tracing::error!(due_s = due, "a consolidation round did not run; the next batch tries again");
            return;
        }
    }
}
