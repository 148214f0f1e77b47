//! The three services started on loopback as a stack, for the tests and benches that drive them
//! together (the control service's): an inference server on a models directory, an allocator on a
//! fresh store, and the control service in front of them, all holding [`SERVICE_TOKEN`].

use crate::binaries::workspace_binary;
use crate::listening::free_port;
use crate::process::{self, Process};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The service credential of every stack started here: the allocators and inference servers
/// require it and the control service presents it, as `scripts/stack.sh` runs them.
pub const SERVICE_TOKEN: &str = "test-service-token";

/// How long a service of the stack may take to become ready.
pub const READY_WITHIN: Duration = Duration::from_secs(60);

/// `Authorization: Bearer` [`SERVICE_TOKEN`], for a client that calls the allocators or the
/// inference servers directly.
pub fn service_credential() -> reqwest::header::HeaderMap {
    process::bearer(SERVICE_TOKEN)
}

/// `GET url` of an allocator or an inference server, with [`SERVICE_TOKEN`], as JSON.
pub async fn service_json(client: &reqwest::Client, url: String) -> serde_json::Value {
    client.get(url).bearer_auth(SERVICE_TOKEN).send().await.unwrap().json().await.unwrap()
}

/// Starts `binary` with `--config config`, serving on `port`, and waits until it is ready; a
/// restart starts it again alike.
async fn start_binary(binary: &Path, config: &Path, port: u16, what: &str) -> Process {
    let (binary, config) = (binary.to_owned(), config.to_owned());
    let mut process =
        Process::on_port(spawn(&binary, &config), port, what).restartable(move || spawn(&binary, &config));
    process.wait_ready(READY_WITHIN).await;
    process
}

fn spawn(binary: &Path, config: &Path) -> Child {
    process::with_service_token(process::with_config(&mut Command::new(binary), config), SERVICE_TOKEN)
        .env_remove("ALLOCATOR_ADMIN_TOKEN")
        .env_remove("INFERENCE_ADMIN_TOKEN")
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
        .map_or_else(|| crate::binaries::binaries_dir().join("control-service"), PathBuf::from);
    let mut command = Command::new(&binary);
    let mut child = process::with_service_token(process::with_config(&mut command, &path), SERVICE_TOKEN)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
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
    let mut process = Process::on_port(child, port, "control-service").restartable(move || spawn(&binary, &path));
    process.wait_ready(READY_WITHIN).await;
    LoggedProcess { process, log }
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
