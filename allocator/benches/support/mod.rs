//! What the allocator's service benches share: starting the real binary on a free loopback port
//! and reading its `/metrics`.

pub mod cpu;
pub mod load;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `allocator`; killed when dropped.
pub struct Server {
    child: Child,
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The service credential the benches' allocators require, as a deployed one does: the
/// measured path includes the check.
pub const SERVICE_TOKEN: &str = "bench-service-token";

/// A client that presents [`SERVICE_TOKEN`] on every request.
pub fn client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = format!("Bearer {SERVICE_TOKEN}").parse().expect("a valid header value");
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder().default_headers(headers).build().expect("HTTP client")
}

impl Server {
    /// The process id, for its CPU accounting.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Starts the binary with `config` (TOML after the `listen` line) written to `dir/<name>.toml`,
/// and waits until `/readyz` answers.
#[allow(dead_code)]
pub async fn start(dir: &Path, name: &str, config: &str) -> Server {
    start_with(dir, name, config, Path::new(env!("CARGO_BIN_EXE_allocator")), None).await
}

/// [`start`] with another `allocator` binary (a reference build, for before/after in one run),
/// and pinned to CPU `cpu` (`taskset -c`) when given.
pub async fn start_with(dir: &Path, name: &str, config: &str, binary: &Path, cpu: Option<usize>) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("listen = \"127.0.0.1:{port}\"\n{config}")).expect("config written");
    let mut command = match cpu {
        Some(cpu) => {
            let mut taskset = Command::new("taskset");
            taskset.arg("-c").arg(cpu.to_string()).arg(binary);
            taskset
        }
        None => Command::new(binary),
    };
    // `taskset -c CPU PROGRAM` execs the program: the child's pid is the allocator's.
    let child = command
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "warn")
        .env("ALLOCATOR_SERVICE_TOKEN", SERVICE_TOKEN)
        .env_remove("ALLOCATOR_SERVICE_TOKEN_FILE")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("allocator started");
    let server = Server { child, base: format!("http://127.0.0.1:{port}") };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !client.get(format!("{}/readyz", server.base)).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(Instant::now() < deadline, "the allocator did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server
}

/// The value of the metric line `name ...` (a counter, or a histogram's `_count`), 0 if absent.
pub async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.expect("metrics").text().await.expect("text");
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The body of allocation `i` of client `c` in the service benches: VM `prefix-i` of 1 to 8 cores,
/// a third of them predicted long-lived.
pub fn vm_body(prefix: &str, i: usize, c: usize) -> serde_json::Value {
    serde_json::json!({"vm": {"vm_id": format!("{prefix}-{i}"), "tenant_id": format!("t{c}"), "vm_type": "D4",
        "demand": {"cores": 1 + i % 8, "memory_gib": 4 * (1 + i % 8)},
        "prediction": {"p_long": 0.5, "class": if i % 3 == 0 { "long" } else { "short" }, "source": "model"}}})
}
