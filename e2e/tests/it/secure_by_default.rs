//! Secure by default (issue 44): each of the three real binaries refuses to listen beyond loopback
//! while its routes are open to anyone (no service token; for the control service, no API keys),
//! names the fix and changes nothing; it serves there once a credential closes the routes, or
//! when `--insecure-open` says so explicitly.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use test_support::binaries::workspace_binary;

/// One of the three binaries listening on `listen`, with what else it needs to start (state in
/// `dir`); `token`: its routes closed by a service token (the control service: an API key).
fn command(what: &str, dir: &Path, listen: &str, token: bool, insecure_open: bool) -> Command {
    let mut command = Command::new(workspace_binary(what));
    command.arg("--listen").arg(listen).env("RUST_LOG", "warn").stdout(Stdio::null()).stderr(Stdio::piped());
    command.env_remove("ALLOCATOR_ADMIN_TOKEN").env_remove("ALLOCATOR_ADMIN_TOKEN_FILE");
    for variable in ["ALLOCATOR_SERVICE_TOKEN", "INFERENCE_SERVICE_TOKEN"] {
        command.env_remove(variable).env_remove(format!("{variable}_FILE"));
    }
    match what {
        "allocator" => {
            std::fs::write(
                dir.join("allocator.toml"),
                "[generate]\nzone = \"zone-1\"\nhosts = 4\ncores = 8\nmemory_gib = 32\n",
            )
            .unwrap();
            command.arg("--config").arg(dir.join("allocator.toml")).arg("--store").arg(dir.join("allocator.db"));
            if token {
                command.env("ALLOCATOR_SERVICE_TOKEN", support::SERVICE_TOKEN);
            }
        }
        "inference-server" => {
            command.arg("--models-dir").arg(dir);
            if token {
                command.env("INFERENCE_SERVICE_TOKEN", support::SERVICE_TOKEN);
            }
        }
        _ => {
            let mut config = String::from("[zones.zone-1]\nallocator = \"http://127.0.0.1:9\"\n");
            if token {
                // An operator key (its SHA-256; the key itself is never written down).
                config +=
                    "[[auth.keys]]\nsha256 = \"2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\"\n\
                           admin = true\n";
            }
            std::fs::write(dir.join("control-service.toml"), config).unwrap();
            command
                .arg("--config")
                .arg(dir.join("control-service.toml"))
                .args(["--inference-server", "http://127.0.0.1:9"]);
        }
    }
    if insecure_open {
        command.arg("--insecure-open");
    }
    command
}

/// Runs a start that must be refused: a non-zero exit whose message names the listen address,
/// what closes the routes and the explicit flag.
fn assert_refused(what: &str, dir: &Path, listen: &str, closed_by: &str) {
    let output = command(what, dir, listen, false, false).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{what} --listen {listen} without a credential started: {stderr}");
    for needle in [listen, closed_by, "--insecure-open", "insecure_open = true"] {
        assert!(stderr.contains(needle), "{what}'s refusal does not name `{needle}`: {stderr}");
    }
}

/// Starts a serving process on 0.0.0.0 and waits until `/healthz` answers on loopback.
async fn start_beyond_loopback(what: &str, dir: &Path, token: bool, insecure_open: bool) -> (Child, u16) {
    let client = reqwest::Client::new();
    for _attempt in 0..5 {
        let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
        let mut child = command(what, dir, &format!("0.0.0.0:{port}"), token, insecure_open).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                let mut stderr = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
                if stderr.contains("binding") {
                    break; // the port was taken meanwhile: another one
                }
                panic!("{what} on 0.0.0.0 (token {token}, insecure_open {insecure_open}) exited {status}: {stderr}");
            }
            let url = format!("http://127.0.0.1:{port}/healthz");
            if client.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
                return (child, port);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("{what} did not start on 0.0.0.0");
}

#[tokio::test]
async fn open_routes_are_refused_beyond_loopback_unless_closed_or_explicitly_opened() {
    let client = reqwest::Client::new();
    for (what, closed_by, data_route) in [
        ("allocator", "ALLOCATOR_SERVICE_TOKEN", "/v1/hosts"),
        ("inference-server", "INFERENCE_SERVICE_TOKEN", "/v1/models"),
        ("control-service", "[auth] keys", "/v1/stats"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        // Every interface, and a single address other than loopback (refused before any bind).
        for listen in ["0.0.0.0:1", "[::]:1", "192.0.2.1:1"] {
            assert_refused(what, dir.path(), listen, closed_by);
        }
        // Refused before anything is written: no store is created.
        assert!(!dir.path().join("allocator.db").exists(), "{what}: a refused start created the store");

        // Closed by a credential: serves on every interface, and a data route needs it.
        let (mut child, port) = start_beyond_loopback(what, dir.path(), true, false).await;
        let response = client.get(format!("http://127.0.0.1:{port}{data_route}")).send().await.unwrap();
        assert_eq!(response.status(), 401, "{what} with a credential on 0.0.0.0: {data_route} without one");
        child.kill().unwrap();
        child.wait().unwrap();

        // Explicitly opened: serves anyone, as asked.
        let (mut child, port) = start_beyond_loopback(what, dir.path(), false, true).await;
        let response = client.get(format!("http://127.0.0.1:{port}{data_route}")).send().await.unwrap();
        assert_ne!(response.status(), 401, "{what} --insecure-open asks no credential");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
