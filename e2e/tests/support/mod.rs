//! What the e2e tests share: finding the workspace's binaries they start, and starting them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[path = "../../../allocator/tests/support/listening.rs"]
pub mod listening;

/// The service credential of the stacks these tests start: the allocator and the inference server
/// require it and the control service presents it, as `scripts/stack.sh` and compose run them.
pub const SERVICE_TOKEN: &str = "e2e-service-token";

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

/// The directory of the workspace's binaries: the target profile directory (`target/release`),
/// the grandparent of this test's executable (`target/release/deps/<test>-<hash>`).
pub fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test's own executable: {e}"));
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap_or_else(|| panic!("{} is not in <target>/<profile>/deps", exe.display()))
        .to_path_buf()
}

/// The binary `name` of another workspace package, built beside this test. `cargo test --release
/// --workspace` builds every member's binaries before it runs any test; with `-p e2e` alone they
/// must have been built before, and a missing one fails here, naming the command.
pub fn workspace_binary(name: &str) -> PathBuf {
    let path = binaries_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: this test starts the real `{name}` binary of the workspace; build the binaries with \
         `cargo build --release --workspace` (or run the tests with `cargo test --release --workspace`, which \
         builds them first)",
        path.display()
    );
    path
}

/// A child process killed when dropped.
pub struct Process {
    child: Option<Child>,
    pub base: String,
    pub what: &'static str,
}

impl Process {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts the workspace binary `what` with `config` (TOML without `listen`) and waits until it is
/// ready ([`listening::start_ours`]); its admin routes closed.
pub async fn start(what: &'static str, dir: &Path, config: &str) -> Process {
    start_with(what, dir, config, &[], None).await
}

/// [`start`] with more flags and, for the allocator, an admin token.
pub async fn start_with(
    what: &'static str,
    dir: &Path,
    config: &str,
    args: &[&str],
    admin_token: Option<&str>,
) -> Process {
    let path = dir.join(format!("{what}.toml"));
    let spawn = |port: u16| {
        std::fs::write(&path, format!("listen = \"127.0.0.1:{port}\"\n{config}")).unwrap();
        let mut command = Command::new(workspace_binary(what));
        with_service_token(&mut command)
            .arg("--config")
            .arg(&path)
            .args(args)
            .env("RUST_LOG", "warn")
            .env_remove("ALLOCATOR_ADMIN_TOKEN_FILE")
            .env_remove("INFERENCE_ADMIN_TOKEN")
            .env_remove("CONTROL_INFERENCE_ADMIN_TOKEN");
        match admin_token {
            Some(token) => command.env("ALLOCATOR_ADMIN_TOKEN", token),
            None => command.env_remove("ALLOCATOR_ADMIN_TOKEN"),
        };
        command
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"))
    };
    let client = reqwest::Client::new();
    let (child, port) = listening::start_ours(&client, what, Duration::from_secs(60), spawn).await;
    Process { child: Some(child), base: format!("http://127.0.0.1:{port}"), what }
}

/// Copies the files of `from` (a model bundle) into `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
