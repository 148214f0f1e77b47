//! The transport limits of the real `control-service` binary (`service_common::server` and the
//! admission limit of `service_common::layers`), against a stand-in allocator in this process that
//! answers its readiness probe and holds allocations until the test lets them go:
//!
//! - `half_open_connections_are_dropped_and_do_not_block_service`: 3,000 connections that send a
//!   partial request head or nothing are closed after the header-read or idle timeout, while a
//!   normal request is still served.
//! - `connections_beyond_the_cap_are_closed_at_once`: with every allowed connection held open, one
//!   more is closed without an answer; once they close, requests are served again.
//! - `requests_beyond_the_admission_limit_get_503_with_retry_after`: past `max_concurrency`
//!   requests in flight, the excess is refused with 503, `Retry-After` and a problem body, counted
//!   in `/metrics` by reason, and summarised in the log without one ERROR line per refusal; the
//!   probes still answer.
//! - `an_oversized_body_gets_a_413_problem`: a body over `max_body_bytes` is refused with a problem
//!   body, like every other refusal.

use axum::routing::{get, post};
use axum::Router;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use test_support::stack;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// A stand-in allocator (and inference server): ready, and holding every allocation until
/// [`FakeUpstream::release`]; then it answers 409, which the control service passes on as it is.
struct FakeUpstream {
    base: String,
    arrived: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
}

impl FakeUpstream {
    async fn start() -> FakeUpstream {
        let arrived = Arc::new(AtomicUsize::new(0));
        let (release, released) = watch::channel(false);
        let counter = Arc::clone(&arrived);
        let app = Router::new().route("/readyz", get(|| async { "ready" })).route(
            "/v1/allocations",
            post(move || {
                let counter = Arc::clone(&counter);
                let mut released = released.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let _ = released.wait_for(|released| *released).await;
                    (axum::http::StatusCode::CONFLICT, "held by the test")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeUpstream { base, arrived, release }
    }

    /// A control-service configuration in front of this stand-in, with `http` as its `[http]`.
    fn control_config(&self, http: &str) -> String {
        format!(
            "default_zone = \"zone-1\"\n[zones.zone-1]\nallocator = \"{base}\"\n\
             [inference]\nservers = [\"{base}\"]\ntimeout_ms = 20\nhealth_interval_ms = 100\n\
             [allocator]\ntimeout_ms = 20000\nhealth_interval_ms = 100\n[http]\nrequest_timeout_ms = 30000\n{http}\n",
            base = self.base
        )
    }
}

fn address(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// The value of `http_refused_total{reason="<reason>"}` in the Prometheus text, 0 when absent.
fn refused(metrics: &str, reason: &str) -> u64 {
    let prefix = format!("http_refused_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until the peer closes `stream` (EOF or reset) and returns what it sent before, or panics
/// after `patience`.
async fn wait_closed(mut stream: TcpStream, patience: Duration) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return received,
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the connection was still open after {patience:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_are_dropped_and_do_not_block_service() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = FakeUpstream::start().await;
    let control = stack::start_control_logged(
        dir.path(),
        &upstream.control_config("header_read_timeout_ms = 1000\nidle_timeout_ms = 2000\nmax_connections = 8192"),
    )
    .await;
    let addr = address(&control.process.base);
    let mut half_open = Vec::with_capacity(3_000);
    for i in 0..3_000 {
        let mut stream = TcpStream::connect(&addr).await.expect("connecting");
        if i % 2 == 0 {
            // A request line cut short: the head never completes.
            stream.write_all(b"GET /healthz HT").await.unwrap();
        }
        half_open.push(stream);
    }
    let client = reqwest::Client::new();
    let response = client.get(control.process.url("/healthz")).send().await.expect("a normal request is served");
    assert_eq!(response.status(), 200);

    let started = Instant::now();
    let closing: Vec<_> =
        half_open.into_iter().map(|stream| tokio::spawn(wait_closed(stream, Duration::from_secs(20)))).collect();
    for task in closing {
        let answer = task.await.expect("a half-open connection was not closed");
        assert!(answer.is_empty(), "a half-open connection got an answer: {}", String::from_utf8_lossy(&answer));
    }
    eprintln!("3,000 half-open connections closed within {:?}", started.elapsed());

    // A new connection: the first request's kept-alive one has been idle about as long as the
    // idle timeout (2 s) by now, and the server may close it just as it is reused.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let metrics = client.get(control.process.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(refused(&metrics, "header_timeout"), 1_500, "partial heads are counted as header timeouts");
    let response = client.get(control.process.url("/healthz")).send().await.expect("still serving");
    assert_eq!(response.status(), 200);
}

/// Sends a whole `GET /healthz` on `stream` and reads its answer, keeping the connection open.
async fn healthz_on(stream: &mut TcpStream) -> String {
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
        .await
        .expect("no answer within 10 s")
        .expect("reading the answer");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = FakeUpstream::start().await;
    let control = stack::start_control_logged(
        dir.path(),
        &upstream.control_config("max_connections = 20\nidle_timeout_ms = 600000"),
    )
    .await;
    let addr = address(&control.process.base);
    // Let the start-up probe's connection close and give its slot back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held = Vec::new();
    for _ in 0..20 {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        let answer = healthz_on(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "a connection under the cap was not served: {answer}");
        held.push(stream);
    }

    let mut beyond = TcpStream::connect(&addr).await.expect("the kernel still completes the handshake");
    // The request may or may not be written before the server closes the socket.
    let _ = beyond.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").await;
    let answer = wait_closed(beyond, Duration::from_secs(5)).await;
    assert!(answer.is_empty(), "a connection beyond the cap was served: {}", String::from_utf8_lossy(&answer));

    drop(held);
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let metrics = loop {
        match client.get(control.process.url("/metrics")).send().await {
            Ok(response) if response.status() == 200 => break response.text().await.unwrap(),
            _ => {
                // The held connections' slots come back as the server sees them close.
                assert!(Instant::now() < deadline, "no request served after the held connections closed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(refused(&metrics, "connection_cap") >= 1, "the closed connection is counted: {metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_admission_limit_get_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = FakeUpstream::start().await;
    let control = stack::start_control_logged(dir.path(), &upstream.control_config("max_concurrency = 4")).await;
    let client = reqwest::Client::new();
    let url = control.process.url("/allocate");

    // Four requests reach the stand-in allocator and stay there: the admission limit is full.
    let admitted: Vec<_> = (0..4)
        .map(|i| {
            let request = client.post(&url).json(&stack::vm(&format!("held-{i}"), "t", "D2", 2.0));
            tokio::spawn(async move { request.send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstream.arrived.load(Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline, "the held requests never reached the allocator");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    const EXCESS: usize = 50;
    let refused_requests: Vec<_> = (0..EXCESS)
        .map(|i| {
            let request = client.post(&url).json(&stack::vm(&format!("excess-{i}"), "t", "D2", 2.0));
            tokio::spawn(async move {
                let response = request.send().await.expect("an excess request got no answer");
                let status = response.status().as_u16();
                let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap_or("").to_owned());
                let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap_or("").to_owned());
                let body: serde_json::Value = response.json().await.expect("a JSON body");
                (status, retry_after, content_type, body)
            })
        })
        .collect();
    for task in refused_requests {
        let (status, retry_after, content_type, body) = task.await.unwrap();
        assert_eq!(status, 503, "{body}");
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert_eq!(content_type.as_deref(), Some("application/problem+json"));
        assert_eq!(body["status"], 503);
        assert!(body["type"].as_str().unwrap_or("").ends_with("overloaded"), "{body}");
    }
    assert_eq!(upstream.arrived.load(Ordering::SeqCst), 4, "a refused request reached the allocator");
    // The probes answer from memory and are never refused: an overloaded service is still alive.
    for probe in ["/healthz", "/readyz", "/metrics"] {
        let response = client.get(control.process.url(probe)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{probe} refused while overloaded");
    }

    upstream.release.send(true).unwrap();
    for task in admitted {
        assert_eq!(task.await.unwrap().unwrap(), 409, "the admitted requests get the allocator's answer");
    }
    let metrics = client.get(control.process.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(refused(&metrics, "overloaded"), EXCESS as u64);

    // The summary line comes within a second or two; it, not one line per refusal, is the log.
    let deadline = Instant::now() + Duration::from_secs(5);
    let summarised = |log: &str| -> u64 {
        log.lines()
            .filter(|line| line.contains("refused requests"))
            .filter_map(|line| line.split("overloaded=").nth(1))
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    };
    while summarised(&control.log()) < EXCESS as u64 {
        assert!(Instant::now() < deadline, "no summary of the refusals in the log:\n{}", control.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = control.log();
    assert_eq!(summarised(&log), EXCESS as u64, "{log}");
    let error_lines: Vec<&str> = log.lines().filter(|line| line.contains("ERROR")).collect();
    assert!(error_lines.is_empty(), "refusals logged as errors:\n{}", error_lines.join("\n"));
    let warn_lines = log.lines().filter(|line| line.contains("WARN")).count();
    assert!(warn_lines < 10, "refusals should be summarised, not logged one by one:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_gets_a_413_problem() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = FakeUpstream::start().await;
    let control = stack::start_control_logged(dir.path(), &upstream.control_config("max_body_bytes = 1024")).await;
    let client = reqwest::Client::new();
    // Declared by its length: refused before the body is read.
    let response = client
        .post(control.process.url("/allocate"))
        .header("content-type", "application/json")
        .body(vec![b' '; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap_or("").to_owned());
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap_or("").contains("1024 bytes"), "{body}");
    // Streamed in chunks, with no length: refused when the extractor reads past the limit.
    let mut stream = TcpStream::connect(address(&control.process.base)).await.unwrap();
    let chunk = format!("200\r\n{}\r\n", " ".repeat(512));
    let request = format!(
        "POST /allocate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n",
        chunk.repeat(4)
    );
    let _ = stream.write_all(request.as_bytes()).await;
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    while !received.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
        match read.expect("no answer to the streamed body") {
            Ok(0) | Err(_) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
        }
    }
    let answer = String::from_utf8_lossy(&received).into_owned();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("content-type: application/problem+json"), "{answer}");
    assert_eq!(upstream.arrived.load(Ordering::SeqCst), 0, "nothing reached the allocator");
}
