//! HTTP prediction latency and throughput on loopback, for several servers with one client.
//!
//! `cargo bench -p inference-server --bench http_latency -- NAME=URL [NAME=URL ...]`; the first
//! target is the reference for the ratios. `scripts/bench-inference.sh` starts our server and the
//! Python (LightGBM + FastAPI/uvicorn) server on the same bundle and runs this against both.
//! Every instance names a tenant the feature store does not know, so both servers do the same work.
//!
//! Single-instance latency is measured twice with one client each for every server: a minimal
//! HTTP/1.1 client on a kept-alive socket that busy-polls for the answer (so that neither the client's
//! own HTTP stack nor its wake-up from sleep is counted: what remains is loopback plus the server),
//! and reqwest, what a Rust caller such as the control service uses.

use serde_json::{json, Value};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const WARMUP: usize = 200;
const SINGLE_REQUESTS: usize = 3_000;
const BATCH: usize = 64;
const BATCH_REQUESTS_PER_CLIENT: usize = 300;
const CLIENTS: usize = 2;

fn instance(i: usize) -> Value {
    let (vm_type, cores, memory) = [("D2", 2, 8), ("F1", 1, 2), ("E4", 4, 32), ("D8", 8, 32)][i % 4];
    json!({"key": format!("bench-{i}"), "tenant_id": format!("bench-tenant-{i}"), "vm_type": vm_type,
           "cores": cores, "memory_gib": memory, "os": "linux", "requested_at_s": 900000.0 + i as f64,
           "features": {"batch_size": 1 + i % 3}})
}

/// Sends a pre-serialized body and counts the predictions in the answer without parsing the rest,
/// so that the client adds as little as possible to what is measured.
async fn post(client: &reqwest::Client, url: &str, body: &axum::body::Bytes) -> usize {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("request sent");
    assert!(response.status().is_success(), "{url} answered {}", response.status());
    count_predictions(&response.bytes().await.expect("answer"))
}

fn body(instances: Vec<Value>) -> axum::body::Bytes {
    axum::body::Bytes::from(serde_json::to_vec(&json!({ "instances": instances })).expect("serializable"))
}

/// A kept-alive HTTP/1.1 connection that sends pre-built requests and busy-polls for each answer.
struct RawClient {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl RawClient {
    fn connect(base: &str) -> Self {
        let authority = base.strip_prefix("http://").expect("an http:// URL");
        let stream = TcpStream::connect(authority).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_nonblocking(true).expect("nonblocking");
        RawClient { stream, buffer: Vec::with_capacity(4096) }
    }

    fn request(authority: &str, body: &[u8]) -> Vec<u8> {
        let mut request = format!(
            "POST /v1/predict HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        request
    }

    /// Sends one request and returns the answer's body.
    fn call(&mut self, request: &[u8]) -> &[u8] {
        self.stream.write_all(request).expect("request written");
        self.buffer.clear();
        let mut chunk = [0u8; 4096];
        let (header_end, total) = loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => panic!("server closed the connection"),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::hint::spin_loop();
                    continue;
                }
                Err(e) => panic!("read: {e}"),
            }
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buffer[..end]).expect("ASCII head");
                assert!(head.starts_with("HTTP/1.1 200"), "answer: {head}");
                let length: usize = head
                    .lines()
                    .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-length")))
                    .map(|(_, v)| v.trim().parse().expect("numeric content-length"))
                    .expect("the answer has a content-length");
                let total = end + 4 + length;
                if self.buffer.len() >= total {
                    break (end + 4, total);
                }
            }
        };
        &self.buffer[header_end..total]
    }
}

fn count_predictions(answer: &[u8]) -> usize {
    answer.windows(8).filter(|w| w == b"\"p_long\"").count()
}

/// p50, p99 and mean of latency samples.
fn summarize(mut samples: Vec<Duration>) -> (Duration, Duration, Duration) {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    (samples[samples.len() / 2], samples[samples.len() * 99 / 100], mean)
}

fn raw_singles(base: &str, singles: &[axum::body::Bytes]) -> (Duration, Duration, Duration) {
    let authority = base.trim_start_matches("http://");
    let requests: Vec<Vec<u8>> = singles.iter().map(|b| RawClient::request(authority, b)).collect();
    let mut client = RawClient::connect(base);
    for request in requests.iter().take(WARMUP) {
        assert_eq!(count_predictions(client.call(request)), 1);
    }
    let samples = requests
        .iter()
        .map(|request| {
            let start = Instant::now();
            assert_eq!(count_predictions(client.call(request)), 1);
            start.elapsed()
        })
        .collect();
    summarize(samples)
}

/// The loopback floor: p50 of a one-byte echo between two threads over TCP on this machine, with the
/// echo side blocking in `read` (it sleeps between messages, as a server does) or busy-polling.
fn loopback_echo_p50(echo_spins: bool) -> Duration {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let echo = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_nonblocking(echo_spins).expect("mode");
        let mut byte = [0u8; 1];
        loop {
            match stream.read(&mut byte) {
                Ok(0) => return,
                Ok(_) => stream.write_all(&byte).expect("echo"),
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("echo read: {e}"),
            }
        }
    });
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream.set_nonblocking(true).expect("nonblocking");
    let mut byte = [0u8; 1];
    let samples = (0..WARMUP + SINGLE_REQUESTS)
        .map(|_| {
            let start = Instant::now();
            stream.write_all(&byte).expect("ping");
            loop {
                match stream.read(&mut byte) {
                    Ok(_) => break,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => panic!("pong: {e}"),
                }
            }
            start.elapsed()
        })
        .skip(WARMUP)
        .collect();
    drop(stream);
    echo.join().expect("echo thread");
    summarize(samples).0
}

struct Figures {
    raw: (Duration, Duration, Duration),
    reqwest: (Duration, Duration, Duration),
    batch_instances_per_s: f64,
}

async fn measure(base: &str) -> Figures {
    let url = format!("{base}/v1/predict");
    let url = url.as_str();
    let client = reqwest::Client::new();
    let singles: Vec<axum::body::Bytes> = (0..SINGLE_REQUESTS).map(|i| body(vec![instance(i)])).collect();
    for single in singles.iter().take(WARMUP) {
        post(&client, url, single).await;
    }
    let mut samples = Vec::with_capacity(SINGLE_REQUESTS);
    for single in &singles {
        let start = Instant::now();
        assert_eq!(post(&client, url, single).await, 1);
        samples.push(start.elapsed());
    }
    let reqwest = summarize(samples);
    let raw = raw_singles(base, &singles);

    let started = Instant::now(); // includes building the batch bodies: a few ms, the same for every server
    let workers: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, url) = (client.clone(), url.to_owned());
            let batches: Vec<axum::body::Bytes> = (0..BATCH_REQUESTS_PER_CLIENT)
                .map(|r| body((0..BATCH).map(|i| instance(c * 100_000 + r * BATCH + i)).collect()))
                .collect();
            tokio::spawn(async move {
                let mut done = 0;
                for batch in &batches {
                    done += post(&client, &url, batch).await;
                }
                done
            })
        })
        .collect();
    let mut instances = 0;
    for worker in workers {
        instances += worker.await.expect("worker");
    }
    Figures { raw, reqwest, batch_instances_per_s: instances as f64 / started.elapsed().as_secs_f64() }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let targets: Vec<(String, String)> = std::env::args()
        .skip(1)
        .filter_map(|a| a.split_once('=').map(|(n, u)| (n.to_owned(), u.trim_end_matches('/').to_owned())))
        .collect();
    if targets.is_empty() {
        eprintln!("usage: http_latency NAME=URL [NAME=URL ...]");
        return;
    }
    let mut results = Vec::new();
    for (name, url) in &targets {
        eprintln!("measuring {name} at {url} ...");
        results.push((name.clone(), measure(url).await));
    }
    println!(
        "single-instance requests: {SINGLE_REQUESTS} sequential after {WARMUP} warm-up, per client; batches: {CLIENTS} clients x {BATCH_REQUESTS_PER_CLIENT} requests of {BATCH}"
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("| server | client | p50 | p99 | mean |");
    println!("|---|---|---:|---:|---:|");
    for (name, f) in &results {
        for (client, (p50, p99, mean)) in [("minimal, busy-polling", f.raw), ("reqwest", f.reqwest)] {
            println!("| {name} | {client} | {:.0} us | {:.0} us | {:.0} us |", us(p50), us(p99), us(mean));
        }
    }
    println!();
    println!("| server | batch-{BATCH} throughput (reqwest) |");
    println!("|---|---:|");
    for (name, f) in &results {
        println!("| {name} | {:.0} predictions/s |", f.batch_instances_per_s);
    }
    println!();
    println!(
        "loopback floor, one-byte TCP echo p50 (client busy-polling): echo thread blocking in read {:.0} us, echo thread busy-polling {:.0} us",
        us(loopback_echo_p50(false)),
        us(loopback_echo_p50(true))
    );
    let (reference_name, reference) = (&results[0].0, &results[0].1);
    for (name, f) in results.iter().skip(1) {
        println!(
            "{name} / {reference_name}: p50 {:.2}x, p99 {:.2}x (minimal client); p50 {:.2}x (reqwest); batch throughput {:.2}x",
            us(f.raw.0) / us(reference.raw.0),
            us(f.raw.1) / us(reference.raw.1),
            us(f.reqwest.0) / us(reference.reqwest.0),
            f.batch_instances_per_s / reference.batch_instances_per_s
        );
    }
}
