//! A started service: its process, killed (SIGKILL) when dropped, and its base URL; the command
//! line every service binary is started with in tests; the service credential handed to it; a
//! process's resident memory.

use crate::listening;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Starts the service again as it was started (same binary, configuration and port).
type Respawn = Box<dyn Fn() -> Child + Send + Sync>;

/// A running service process, killed (SIGKILL: no graceful shutdown, no last checkpoint) when
/// dropped, so that no test leaves a server behind.
pub struct Process {
    child: Option<Child>,
    /// `http://ADDRESS:PORT`, without a trailing slash.
    pub base: String,
    /// What it is, for failure messages.
    pub what: String,
    respawn: Option<Respawn>,
}

impl Process {
    /// `child`, serving at `base`.
    pub fn new(child: Child, base: impl Into<String>, what: impl Into<String>) -> Process {
        Process { child: Some(child), base: base.into(), what: what.into(), respawn: None }
    }

    /// `child`, serving on loopback `port`.
    pub fn on_port(child: Child, port: u16, what: impl Into<String>) -> Process {
        Process::new(child, format!("http://127.0.0.1:{port}"), what)
    }

    /// Starts a server with `spawn(port)` and waits until it is ready ([`listening::start_ours`]:
    /// another port if it exits meanwhile).
    pub async fn start(what: &str, ready_within: Duration, spawn: impl FnMut(u16) -> Child) -> Process {
        // A readiness probe that hangs must not outlast the deadline.
        let client = reqwest::Client::builder().timeout(ready_within).build().expect("an HTTP client");
        let (child, port) = listening::start_ours(&client, what, ready_within, spawn).await;
        Process::on_port(child, port, what)
    }

    /// This process, which [`Process::restart`] starts again with `respawn`.
    pub fn restartable(mut self, respawn: impl Fn() -> Child + Send + Sync + 'static) -> Process {
        self.respawn = Some(Box::new(respawn));
        self
    }

    /// Waits, at most `ready_within`, until the process answers `/readyz` on its loopback port
    /// from its own socket; it must not exit meanwhile.
    pub async fn wait_ready(&mut self, ready_within: Duration) {
        let port = self.port();
        let child = self.child.as_mut().unwrap_or_else(|| panic!("{} is not running", self.what));
        let client = reqwest::Client::builder().timeout(ready_within).build().expect("an HTTP client");
        if let Err(status) = listening::wait_ours(&client, child, port, &self.what, ready_within).await {
            panic!("{} exited during start-up: {status}", self.what);
        }
    }

    /// Kills the process and starts it again as it was started ([`Process::restartable`]), then
    /// waits until it is ready.
    pub async fn restart(&mut self, ready_within: Duration) {
        self.kill();
        let respawn = self.respawn.as_ref().unwrap_or_else(|| panic!("{} was not started restartable", self.what));
        self.child = Some(respawn());
        self.wait_ready(ready_within).await;
    }

    /// SIGKILL, then waits for the exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `base` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The operating-system id of the process while it runs (for its CPU and memory accounting).
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The port of [`Process::base`].
    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().and_then(|port| port.parse().ok()).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The resident set size of process `pid` in KiB, from `/proc` (Linux).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| line.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()
}

/// `command` as the tests start a service binary: `--config config`, warnings-only logs, its
/// stdout discarded and its stderr the test's.
pub fn with_config<'c>(command: &'c mut Command, config: &Path) -> &'c mut Command {
    command.arg("--config").arg(config).env("RUST_LOG", "warn").stdout(Stdio::null()).stderr(Stdio::inherit())
}

/// Hands `token` to whichever service binary `command` starts as its service credential (each
/// reads only its own variables), and keeps any token of the caller's environment out.
pub fn with_service_token<'c>(command: &'c mut Command, token: &str) -> &'c mut Command {
    for variable in [
        "ALLOCATOR_SERVICE_TOKEN",
        "INFERENCE_SERVICE_TOKEN",
        "CONTROL_ALLOCATOR_SERVICE_TOKEN",
        "CONTROL_INFERENCE_SERVICE_TOKEN",
    ] {
        command.env(variable, token).env_remove(format!("{variable}_FILE"));
    }
    command.env_remove("ALLOCATOR_PREVIOUS_SERVICE_TOKEN").env_remove("INFERENCE_PREVIOUS_SERVICE_TOKEN")
}

/// `Authorization: Bearer token`, as default headers of a client that calls the allocators or the
/// inference servers directly.
pub fn bearer(token: &str) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().expect("a header value"));
    headers
}
