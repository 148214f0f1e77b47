//! Whether a started server is the one answering on its port, and starting one so that only its
//! own answer counts. CI once ran a test's clients against another test's server on a port both
//! had been handed, whose readiness answered for the server that failed to bind.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// A loopback port free at the time of asking (another process may take it before it is bound:
/// hence [`start_ours`]).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether process `pid` holds the socket listening on `port` (`/proc/net/tcp`, then the process's
/// descriptors).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (_, local_port) = fields.get(1)?.split_once(':')?;
            // State 0A: listening.
            let listening = u16::from_str_radix(local_port, 16).ok()? == port && *fields.get(3)? == "0A";
            listening.then(|| format!("socket:[{}]", fields.get(9).copied().unwrap_or_default()))
        })
        .collect();
    let descriptors = std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten();
    descriptors.filter_map(|fd| std::fs::read_link(fd.path()).ok()).any(|target| {
        let target = target.to_string_lossy();
        sockets.iter().any(|socket| *socket == target)
    })
}

/// Waits, at most `ready_within`, until `child` answers `GET /readyz` on loopback `port` from its
/// own socket ([`listens_on`]). `Err` with its status when it exits first (most likely its port
/// was taken in between); past the deadline it is killed and the test fails.
pub async fn wait_ours(
    client: &reqwest::Client,
    child: &mut Child,
    port: u16,
    what: &str,
    ready_within: Duration,
) -> Result<(), ExitStatus> {
    let deadline = Instant::now() + ready_within;
    loop {
        if let Ok(response) = client.get(format!("http://127.0.0.1:{port}/readyz")).send().await {
            if response.status().is_success() && listens_on(child.id(), port) {
                return Ok(());
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not become ready on port {port}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Starts a server with `spawn(port)` on a port handed out free, and waits, at most `ready_within`,
/// until it answers `GET /readyz` from its own socket ([`wait_ours`]); a child that exited is
/// started again on another port. Returns the ready child and its port.
pub async fn start_ours(
    client: &reqwest::Client,
    what: &str,
    ready_within: Duration,
    mut spawn: impl FnMut(u16) -> Child,
) -> (Child, u16) {
    for _attempt in 0..5 {
        let port = free_port();
        let mut child = spawn(port);
        match wait_ours(client, &mut child, port, what, ready_within).await {
            Ok(()) => return (child, port),
            Err(status) => {
                eprintln!("{what} exited during start-up ({status}), most likely its port was taken; another port")
            }
        }
    }
    panic!("{what} did not start on any of five ports");
}
