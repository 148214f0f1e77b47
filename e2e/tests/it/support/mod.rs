//! What the e2e tests share: the service credential of their stacks, starting the workspace's
//! binaries with it ([`test_support`] holds the process and readiness plumbing), and copying a
//! bundle.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use test_support::binaries::workspace_binary;
use test_support::process::{with_config, with_service_token, Process};

/// The service credential of the stacks these tests start: the allocator and the inference server
/// require it and the control service presents it, as `scripts/stack.sh` and compose run them.
pub const SERVICE_TOKEN: &str = "e2e-service-token";

/// Starts the workspace binary `what` with `config` (TOML without `listen`) and waits until it is
/// ready ([`Process::start`]); its admin routes closed.
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
        with_service_token(with_config(&mut command, &path), SERVICE_TOKEN)
            .args(args)
            .env_remove("ALLOCATOR_ADMIN_TOKEN_FILE")
            .env_remove("INFERENCE_ADMIN_TOKEN")
            .env_remove("CONTROL_INFERENCE_ADMIN_TOKEN");
        match admin_token {
            Some(token) => command.env("ALLOCATOR_ADMIN_TOKEN", token),
            None => command.env_remove("ALLOCATOR_ADMIN_TOKEN"),
        };
        command.spawn().unwrap_or_else(|e| panic!("starting {what}: {e}"))
    };
    Process::start(what, Duration::from_secs(60), spawn).await
}

/// Copies the files of `from` (a model bundle) into `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}
