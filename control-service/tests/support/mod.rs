//! Starting the real three binaries on loopback for the end-to-end tests: an inference server on a
//! models directory, an allocator on a fresh store, and the control service in front of them.

#![allow(dead_code)]

// The allocator's test support has the same check (where CI met the race): one copy for both.
#[path = "../../../allocator/tests/support/listening.rs"]
mod listening;

use listening::listens_on;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The service credential of every stack these tests start: the allocators and inference servers
/// require it and the control service presents it, as `scripts/stack.sh` runs them.
pub const SERVICE_TOKEN: &str = "test-service-token";

/// Hands [`SERVICE_TOKEN`] to whichever binary `command` starts (each reads only its own
/// variables), and keeps any token of the caller's environment out.
pub fn with_service_token(command: &mut Command) -> &mut Command {
    for variable in [
        "ALLOCATOR_SERVICE_TOKEN",
        "INFERENCE_SERVICE_TOKEN",
        "CONTROL_ALLOCATOR_SERVICE_TOKEN",
        "CONTROL_INFERENCE_SERVICE_TOKEN",
    ] {
        command.env(variable, SERVICE_TOKEN).env_remove(format!("{variable}_FILE"));
    }
    command.env_remove("ALLOCATOR_PREVIOUS_SERVICE_TOKEN").env_remove("INFERENCE_PREVIOUS_SERVICE_TOKEN")
}

/// `Authorization: Bearer` [`SERVICE_TOKEN`], for a client that calls the allocators or the
/// inference servers directly.
pub fn service_credential() -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {SERVICE_TOKEN}").parse().unwrap());
    headers
}

/// `GET url` of an allocator or an inference server, with [`SERVICE_TOKEN`], as JSON.
pub async fn service_json(client: &reqwest::Client, url: String) -> serde_json::Value {
    client.get(url).bearer_auth(SERVICE_TOKEN).send().await.unwrap().json().await.unwrap()
}

/// A child process killed (SIGKILL) when dropped.
pub struct Process {
    child: Option<Child>,
    pub base: String,
    /// The binary, its configuration and what it is, to start it again.
    command: (PathBuf, PathBuf, String),
}

impl Process {
    /// Starts the process again as it was started (same configuration, same port) and waits until
    /// it is ready.
    pub async fn restart(&mut self) {
        self.kill();
        let (binary, config, what) = self.command.clone();
        self.child = Some(spawn(&binary, &config));
        wait_ready(self, &what).await;
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Set to a directory, the stacks started from then on run the three binaries found there instead
/// of this build's (a bench's before/after in one run: the directory holds an older commit's).
pub const BINARIES_DIR_VARIABLE: &str = "STACK_BINARIES_DIR";

/// A workspace binary built beside this test's package (`cargo test --workspace` builds them all),
/// or the one in [`BINARIES_DIR_VARIABLE`] when it is set.
pub fn workspace_binary(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_BIN_EXE_control-service")).parent().unwrap().to_owned();
    let dir = std::env::var_os(BINARIES_DIR_VARIABLE).map_or(built, PathBuf::from);
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: these tests start the real binaries; build them with \
         `cargo build --release --workspace --bins` (or run `cargo test --release --workspace`)",
        path.display()
    );
    path
}

/// Starts `binary` with `--config config`, serving on `port`, and waits until it is ready.
async fn start_binary(binary: &Path, config: &Path, port: u16, what: &str) -> Process {
    let mut process = Process {
        child: Some(spawn(binary, config)),
        base: format!("http://127.0.0.1:{port}"),
        command: (binary.to_owned(), config.to_owned(), what.to_owned()),
    };
    wait_ready(&mut process, what).await;
    process
}

async fn wait_ready(process: &mut Process, what: &str) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let port: u16 = process.base.rsplit(':').next().and_then(|port| port.parse().ok()).unwrap_or_default();
    loop {
        if let Ok(response) = client.get(process.url("/readyz")).send().await {
            // Another test's server may have taken the port in between (this one then fails to
            // bind): only an answer from this child counts.
            let ours = process.child.as_ref().is_some_and(|child| listens_on(child.id(), port));
            if response.status().is_success() && ours {
                return;
            }
        }
        if let Some(child) = process.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{what} exited during start-up: {status}");
            }
        }
        assert!(Instant::now() < deadline, "{what} did not become ready at {}", process.base);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn spawn(binary: &Path, config: &Path) -> Child {
    with_service_token(&mut Command::new(binary))
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .env_remove("ALLOCATOR_ADMIN_TOKEN")
        .env_remove("INFERENCE_ADMIN_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()))
}

/// An inference server on `models` (a directory of bundles).
pub async fn start_inference(dir: &Path, models: &Path) -> Process {
    start_inference_with(dir, models, "watch_interval_ms = 200").await
}

/// An allocator serving zone `zone-1`: `hosts` hosts of 16 cores and 64 GiB, LA-binary placement.
pub async fn start_allocator(dir: &Path, hosts: usize) -> Process {
    start_allocator_with(dir, hosts, "").await
}

/// The control service in front of `inference` servers and the `zone-1` allocator, with `extra`
/// TOML sections appended (`[cache]`, `[safeguard]`, ...).
pub async fn start_control(dir: &Path, inference: &[&str], allocator: &str, timeout_ms: u64, extra: &str) -> Process {
    start_control_agents(dir, inference, &[allocator], timeout_ms, extra).await
}

/// [`start_control`] with several allocation agents for `zone-1` (one shared store).
pub async fn start_control_agents(
    dir: &Path,
    inference: &[&str],
    agents: &[&str],
    timeout_ms: u64,
    extra: &str,
) -> Process {
    start_control_full(dir, inference, agents, timeout_ms, "", extra).await
}

/// [`start_control_agents`] with `inference_extra` lines in its `[inference]` section.
#[allow(dead_code)]
pub async fn start_control_full(
    dir: &Path,
    inference: &[&str],
    agents: &[&str],
    timeout_ms: u64,
    inference_extra: &str,
    extra: &str,
) -> Process {
    let port = free_port();
    let config = dir.join(format!("control-{port}.toml"));
    let quoted = |urls: &[&str]| urls.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
    let zone = match agents {
        [one] => format!("allocator = \"{one}\""),
        many => format!("allocators = [{}]", quoted(many)),
    };
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndefault_zone = \"zone-1\"\n[zones.zone-1]\n{zone}\n\
             [inference]\nservers = [{}]\ntimeout_ms = {timeout_ms}\nhealth_interval_ms = 100\n{inference_extra}\n\
             [allocator]\nhealth_interval_ms = 100\n{extra}\n",
            quoted(inference)
        ),
    )
    .unwrap();
    start_binary(&workspace_binary("control-service"), &config, port, "control-service").await
}

/// The checked-in default model bundle, copied into a fresh models directory under `dir`.
pub fn default_models(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default");
    let models = dir.join("models");
    let target = models.join("default");
    std::fs::create_dir_all(&target).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
    }
    models
}

/// The JSON body of a single-VM request.
pub fn vm(vm_id: &str, tenant: &str, vm_type: &str, cores: f64) -> serde_json::Value {
    serde_json::json!({"vm": {
        "vm_id": vm_id, "tenant_id": tenant, "vm_type": vm_type,
        "demand": {"cores": cores, "memory_gib": cores * 4.0},
        "requested_at_s": 864_000.0 + 13.0 * 3_600.0
    }})
}

/// A process whose stderr (its log) is kept for the test to read.
pub struct LoggedProcess {
    pub process: Process,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl LoggedProcess {
    /// Everything the process logged so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|log| log.clone()).unwrap_or_default()
    }
}

/// The control service on a free port with `config` (TOML without `listen`, which is set here),
/// logging at `info` without colours into a buffer the test can read.
pub async fn start_control_logged(dir: &Path, config: &str) -> LoggedProcess {
    use std::io::BufRead;
    let port = free_port();
    let path = dir.join(format!("control-{port}.toml"));
    std::fs::write(&path, format!("listen = \"127.0.0.1:{port}\"\n{config}\n")).unwrap();
    // CONTROL_SERVICE_BIN runs the same test against another build (e.g. an older commit's).
    let binary = std::env::var_os("CONTROL_SERVICE_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_control-service")), PathBuf::from);
    let mut child = with_service_token(&mut Command::new(&binary))
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting the control service: {e}"));
    let stderr = child.stderr.take().expect("stderr is piped");
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&log);
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(mut log) = sink.lock() {
                log.push_str(&line);
                log.push('\n');
            }
        }
    });
    // A restart starts it again without capturing its log.
    let command = (binary, path, "control-service".to_owned());
    let mut process = Process { child: Some(child), base: format!("http://127.0.0.1:{port}"), command };
    wait_ready(&mut process, "control-service").await;
    LoggedProcess { process, log }
}

/// The operating-system id of a running process (for benches that read its memory).
pub fn process_id(process: &Process) -> Option<u32> {
    process.child.as_ref().map(Child::id)
}

/// The resident set size of process `pid` in KiB, from `/proc` (Linux).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| line.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
}

/// An inference server like [`start_inference`], with `extra` top-level TOML (an `admin_token`, ...).
pub async fn start_inference_with(dir: &Path, models: &Path, extra: &str) -> Process {
    let port = free_port();
    let config = dir.join(format!("inference-{port}.toml"));
    std::fs::write(&config, format!("listen = \"127.0.0.1:{port}\"\nmodels_dir = \"{}\"\n{extra}\n", models.display()))
        .unwrap();
    start_binary(&workspace_binary("inference-server"), &config, port, "inference-server").await
}

/// An allocator like [`start_allocator`], with `extra` top-level TOML (an `admin_token`, ...).
pub async fn start_allocator_with(dir: &Path, hosts: usize, extra: &str) -> Process {
    let store = dir.join(format!("allocator-{}.db", free_port())).display().to_string();
    start_allocator_on(dir, hosts, &store, extra).await
}

/// An allocator like [`start_allocator`] on the store `store` (an SQLite path or a PostgreSQL URL).
pub async fn start_allocator_on(dir: &Path, hosts: usize, store: &str, extra: &str) -> Process {
    let port = free_port();
    let config = dir.join(format!("allocator-{port}.toml"));
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nstore = \"{store}\"\n{extra}\n[generate]\nzone = \"zone-1\"\nhosts = {hosts}\n\
             hosts_per_rack = 2\ncores = 16\nmemory_gib = 64\n[allocator.policy]\nkind = \"la-binary\"\n"
        ),
    )
    .unwrap();
    start_binary(&workspace_binary("allocator"), &config, port, "allocator").await
}
