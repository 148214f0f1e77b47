//! What the allocator's service benches share: starting the real binary on a free loopback port
//! and reading its `/metrics`.

pub mod cpu;
pub mod load;

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use test_support::process::{bearer, with_config, Process};

/// A running `allocator`; killed when dropped.
pub type Server = Process;

/// The service credential the benches' allocators require, as a deployed one does: the
/// measured path includes the check.
pub const SERVICE_TOKEN: &str = "bench-service-token";

/// A client that presents [`SERVICE_TOKEN`] on every request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().default_headers(bearer(SERVICE_TOKEN)).build().expect("HTTP client")
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
    let path = dir.join(format!("{name}.toml"));
    let spawn = |port: u16| {
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
        with_config(&mut command, &path)
            .env("ALLOCATOR_SERVICE_TOKEN", SERVICE_TOKEN)
            .env_remove("ALLOCATOR_SERVICE_TOKEN_FILE")
            .spawn()
            .expect("allocator started")
    };
    Process::start("the allocator", Duration::from_secs(30), spawn).await
}

/// The value of the metric `name` (a counter, or a histogram's `_count`), summed over its labels
/// (`name{reason="..."} ...`), 0 if absent.
pub async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics")).await.expect("metrics").text().await.expect("text");
    text.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        .filter_map(|rest| rest.rsplit_once(' ').and_then(|(_, v)| v.trim().parse::<f64>().ok()))
        .sum()
}

/// The body of allocation `i` of client `c` in the service benches: VM `prefix-i` of 1 to 8 cores,
/// a third of them predicted long-lived.
pub fn vm_body(prefix: &str, i: usize, c: usize) -> serde_json::Value {
    serde_json::json!({"vm": {"vm_id": format!("{prefix}-{i}"), "tenant_id": format!("t{c}"), "vm_type": "D4",
        "demand": {"cores": 1 + i % 8, "memory_gib": 4 * (1 + i % 8)},
        "prediction": {"p_long": 0.5, "class": if i % 3 == 0 { "long" } else { "short" }, "source": "model"}}})
}
