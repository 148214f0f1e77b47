//! Whether a started server is the one answering on its port, shared by the tests that start the
//! binaries (the control service's, the inference server's and the e2e tests include this file by
//! path).

/// Whether process `pid` holds the socket listening on `port` (`/proc/net/tcp`, then the process's
/// descriptors). CI once ran a test's clients against another test's server on a port both had
/// been handed, whose readiness answered for the server that failed to bind.
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
