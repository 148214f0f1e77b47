//! Tracing and Prometheus metrics setup.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

pub use metrics_exporter_prometheus::PrometheusHandle;

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log file (scripts/stack.sh) or a container's log (docker compose
    // logs) gets plain text, which grep and log collectors read.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).try_init();
}

/// Latency buckets in seconds, fine enough for sub-millisecond predictions.
const LATENCY_BUCKETS: [f64; 16] =
    [0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0];

/// How often histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the global Prometheus recorder (once per process) and returns its handle. Metrics whose
/// name ends in `_seconds` are histograms with [`LATENCY_BUCKETS`].
///
/// The recorder keeps every histogram sample until an upkeep (or a `/metrics` scrape) folds them
/// into the buckets; with `install_recorder` that upkeep is the caller's job. Without it a service
/// that nobody scrapes grows by every sample of every request (about 70 bytes a request in the
/// control service; docs/benchmarks.md, "Overload"), so a thread runs it every 5 s.
pub fn install_prometheus() -> Result<PrometheusHandle, String> {
    static HANDLE: std::sync::OnceLock<Result<PrometheusHandle, String>> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &LATENCY_BUCKETS)
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| e.to_string())?;
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".to_owned())
                .spawn(move || loop {
                    std::thread::sleep(UPKEEP_INTERVAL);
                    upkeep.run_upkeep();
                })
                .map_err(|e| format!("starting the metrics upkeep thread: {e}"))?;
            Ok(handle)
        })
        .clone()
}

/// The `/metrics` response, with the heap's own accounting appended ([`heap_metrics`]).
pub fn render_metrics(handle: &PrometheusHandle) -> Response {
    let mut body = handle.render();
    body.push_str(&heap_metrics());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// What the C heap holds, from glibc's `mallinfo2`: bytes in use by the program and bytes free
/// inside the heap (some of them already given back to the system as whole free pages). Beside the resident size they tell a leak (in use grows) from fragmentation (free
/// grows, in use flat), which the resident size alone cannot (docs/benchmarks.md, "Soak"). Empty
/// where glibc is not the allocator.
pub fn heap_metrics() -> String {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no pointer; it reads the allocator's statistics under its locks.
        let info = unsafe { libc::mallinfo2() };
        let in_use = info.uordblks + info.hblkhd;
        let free = info.fordblks;
        format!(
            "# HELP process_heap_in_use_bytes Bytes of the C heap in use by the program (glibc mallinfo2).\n\
             # TYPE process_heap_in_use_bytes gauge\n\
             process_heap_in_use_bytes {in_use}\n\
             # HELP process_heap_free_bytes Bytes free inside the C heap, some already given back as whole pages (glibc mallinfo2).\n\
             # TYPE process_heap_free_bytes gauge\n\
             process_heap_free_bytes {free}\n"
        )
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauge(text: &str, name: &str) -> Option<u64> {
        text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn heap_in_use_counts_what_the_program_holds() {
        let before = gauge(&heap_metrics(), "process_heap_in_use_bytes").expect("in-use gauge");
        assert!(gauge(&heap_metrics(), "process_heap_free_bytes").is_some(), "free gauge");
        let held = vec![1u8; 64 << 20];
        let during = gauge(&heap_metrics(), "process_heap_in_use_bytes").expect("in-use gauge");
        // Slack for what the other tests of this binary free meanwhile.
        assert!(during >= before + (48 << 20), "{before} -> {during} while holding 64 MiB");
        drop(std::hint::black_box(held));
    }
}
