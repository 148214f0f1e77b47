//! The agents benches' load: concurrent clients that fill a zone to a steady state, then place
//! and release VMs, each allocation followed by the release of the client's oldest VM.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one load run measured.
pub struct Figures {
    pub allocations_per_s: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Allocations and releases answered 503 and sent again.
    pub unavailable: usize,
}

/// `allocations` by `held.len()` concurrent clients, client c talking to `agents[c % agents.len()]`
/// (base URLs). Each client holds its VMs in `held[c]` (oldest first) and, once it holds `keep`, releases its oldest after every allocation: the zone stays
/// in a steady state in which VMs leave in about the order they came, as in a zone in use.
pub async fn drive(
    agents: &[String],
    allocations: usize,
    prefix: &str,
    held: &mut [VecDeque<String>],
    keep: usize,
) -> Figures {
    let next = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..held.len())
        .map(|c| {
            let (next, base, prefix) = (Arc::clone(&next), agents[c % agents.len()].clone(), prefix.to_owned());
            let unavailable = Arc::clone(&unavailable);
            let mut mine = std::mem::take(&mut held[c]);
            tokio::spawn(async move {
                let client = super::client();
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= allocations {
                        break (latencies, mine);
                    }
                    let id = format!("{prefix}-{i}");
                    let body = super::vm_body(&prefix, i, c);
                    let sent = Instant::now();
                    // A 503 (the store refused the batch MAX_ATTEMPTS times) is retried, as a client
                    // does; the latency counts until the VM is placed.
                    loop {
                        let response =
                            client.post(format!("{base}/v1/allocations")).json(&body).send().await.expect("allocate");
                        match response.status().as_u16() {
                            201 => break,
                            503 => {
                                unavailable.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            status => panic!("allocation {id}: {status}"),
                        }
                    }
                    latencies.push(sent.elapsed());
                    mine.push_back(id);
                    if mine.len() <= keep {
                        continue;
                    }
                    let Some(oldest) = mine.pop_front() else { continue };
                    // A release in a refused batch is answered 503 too, and sent again; 404 after a
                    // 503 means the first one was done after all.
                    let mut retried = false;
                    loop {
                        let response =
                            client.delete(format!("{base}/v1/allocations/{oldest}")).send().await.expect("release");
                        match response.status().as_u16() {
                            204 => break,
                            404 if retried => break,
                            503 => {
                                retried = true;
                                unavailable.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            status => panic!("release {oldest}: {status}"),
                        }
                    }
                }
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(allocations);
    for (c, task) in tasks.into_iter().enumerate() {
        let (mine, kept) = task.await.expect("client");
        latencies.extend(mine);
        held[c] = kept;
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Figures {
        allocations_per_s: allocations as f64 / elapsed.as_secs_f64(),
        p50: latencies[latencies.len() / 2],
        p99: latencies[latencies.len() * 99 / 100],
        unavailable: unavailable.load(Ordering::Relaxed),
    }
}
