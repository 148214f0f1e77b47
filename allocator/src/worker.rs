//! The thread that owns the [`DurableAllocator`] and group-commits what the HTTP handlers send it.
//!
//! Handlers send a [`Command`] over a bounded channel with a `tokio::sync::oneshot` for the reply
//! and await it. The worker thread blocks for the first command, then takes whatever else is already
//! queued without waiting, up to `max_batch` commands in all, and runs them as one batch: one SQLite
//! transaction and one `fsync` for all of their writes ([`DurableAllocator::execute`]). Under load
//! the batches grow by themselves (requests queue while the previous batch commits); an idle
//! service answers a lone request at once, with no added delay. `max_batch = 1` makes one commit per
//! request.
//!
//! A panic while a batch runs (a bug) drops that batch's replies, so its requests are answered with
//! an error, and the state is rebuilt from the store before the next batch.

use crate::config::Clock;
use crate::durable::{Command, CommandError, DurableAllocator, Reply};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

type Answer = Result<Reply, CommandError>;

struct Job {
    command: Command,
    reply: oneshot::Sender<Answer>,
}

/// A handle on the worker thread; cheap to clone. The thread stops when every handle is dropped.
#[derive(Clone, Debug)]
pub struct Worker {
    jobs: mpsc::Sender<Job>,
}

/// Seconds since the Unix epoch: the allocator's clock in the service.
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Worker {
    /// Starts the worker thread. `max_batch` is the most commands per batch (at least 1);
    /// `queue` the most commands waiting (senders wait beyond it); `clock` what time batches run at.
    pub fn spawn(
        durable: DurableAllocator,
        max_batch: usize,
        queue: usize,
        clock: Clock,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (jobs, receiver) = mpsc::channel(queue.max(1));
        let handle = std::thread::Builder::new()
            .name("allocator-worker".to_owned())
            .spawn(move || run(durable, receiver, max_batch.max(1), clock))?;
        Ok((Worker { jobs }, handle))
    }

    /// Runs one command in the next batch and waits for its reply, which comes only after the
    /// batch's commit.
    pub async fn call(&self, command: Command) -> Answer {
        let (reply, answer) = oneshot::channel();
        if self.jobs.send(Job { command, reply }).await.is_err() {
            return Err(CommandError::Unavailable("the allocator worker has stopped".to_owned()));
        }
        answer.await.unwrap_or_else(|_| {
            Err(CommandError::Unavailable("the allocator worker failed on this batch; it was not applied".to_owned()))
        })
    }
}

/// The latest time a command carries: an allocation's request time, a release's end.
fn request_time_s(command: &Command) -> Option<f64> {
    match command {
        Command::Allocate(request) => {
            request.vms().iter().filter_map(|vm| vm.requested_at_s).filter(|t| t.is_finite()).reduce(f64::max)
        }
        Command::Release { ended_at_s, .. } => ended_at_s.filter(|t| t.is_finite()),
        _ => None,
    }
}

fn run(mut durable: DurableAllocator, mut receiver: mpsc::Receiver<Job>, max_batch: usize, clock: Clock) {
    // The request clock starts at the allocator's clock as opened and never goes back.
    let mut request_clock_s = durable.allocator().map_or(0.0, |a| a.clock_s());
    let mut commands = Vec::with_capacity(max_batch);
    let mut replies = Vec::with_capacity(max_batch);
    while let Some(first) = receiver.blocking_recv() {
        commands.push(first.command);
        replies.push(first.reply);
        while commands.len() < max_batch {
            match receiver.try_recv() {
                Ok(job) => {
                    commands.push(job.command);
                    replies.push(job.reply);
                }
                Err(_) => break,
            }
        }
        let now_s = match clock {
            Clock::Wall => unix_now_s(),
            Clock::Request => {
                if let Some(latest) = commands.iter().filter_map(request_time_s).reduce(f64::max) {
                    request_clock_s = request_clock_s.max(latest);
                }
                request_clock_s
            }
        };
        match catch_unwind(AssertUnwindSafe(|| durable.execute(&commands, now_s))) {
            Ok(answers) => {
                for (reply, answer) in replies.drain(..).zip(answers) {
                    // The client may have gone; its answer is simply dropped.
                    let _ = reply.send(answer);
                }
            }
            Err(_) => {
                tracing::error!(
                    commands = commands.len(),
                    "the allocator panicked on a batch; rebuilding from the store"
                );
                replies.clear();
                if let Err(error) = durable.rebuild(now_s) {
                    tracing::error!(%error, "rebuilding after a panic failed");
                }
            }
        }
        commands.clear();
        replies.clear();
    }
    tracing::info!("allocator worker stopped");
}
