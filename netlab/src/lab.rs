//! The lab: named hosts, each a network namespace with its own address, joined by veth pairs to a
//! bridge in a switch namespace; partitions by taking a host's link down; teardown on drop and of
//! what crashed runs left.
//!
//! Layout of a lab whose prefix is `P` (`netlab-<pid>-<start>-<serial>`):
//!
//! ```text
//!   namespace P-switch:  br0 (bridge, no address) --- p0, p1, ... (veth ends, one per host)
//!   namespace P-h-<name> (host i):  lo (up), eth0 (the other end of p<i>), 10.213.N.(i+1)/24
//! ```
//!
//! A partition is `p<i>` set down in the switch namespace: the host keeps its address and route
//! (its `eth0` only loses carrier), the veth drops what it sends and the bridge sends it nothing,
//! so packets vanish both ways and nobody is told, as when a cable is pulled at the switch.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::Index;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::LabError;
use crate::ip::{self, NETNS_DIR};
use crate::netns::{self, NsThread};

/// What every namespace of this crate is named after, so stale ones can be recognised.
const NAME_PREFIX: &str = "netlab-";

/// The most hosts a lab holds: its /24 less the network and broadcast addresses and some room.
const MAX_HOSTS: usize = 250;

/// The longest host name (namespace names are file names; this keeps them readable).
const MAX_NAME: usize = 24;

/// How long [`Lab::link_up`] waits for the link to carry traffic again.
const LINK_SETTLE: Duration = Duration::from_secs(5);

/// A unicast MAC no host has. Frames to it are flooded by the bridge (unknown destination) and
/// dropped by every host (not theirs): pointing one host's neighbour entry for another at it
/// silences that one path, both ways once both sides do it.
const BLACKHOLE_MAC: &str = "02:6e:6c:ff:ff:fe";

/// Labs made by this process so far: their serial, and the third octet of their /24.
static LAB_SERIAL: AtomicU32 = AtomicU32::new(0);

/// `netlab-<pid>-<start>`: the prefix of every namespace this process creates. The start time
/// (in clock ticks since boot, from `/proc/<pid>/stat`) tells a live owner from a new process
/// that was given the pid of a dead one.
pub fn process_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let pid = std::process::id();
        format!("{NAME_PREFIX}{pid}-{}", process_start_time(pid).unwrap_or(0))
    })
}

/// Field 22 of `/proc/<pid>/stat`, counted after the command name, which may hold spaces and
/// parentheses (hence the last `)`).
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// The owner (pid, start time) a namespace name carries, if it is one of this crate's.
fn owner_of(netns: &str) -> Option<(u32, u64)> {
    let rest = netns.strip_prefix(NAME_PREFIX)?;
    let mut parts = rest.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    // A name must go on after the owner (serial, role); a bare `netlab-1-2` is not ours.
    parts.next()?;
    Some((pid, start))
}

/// Whether the process that made a namespace still runs. Where `/proc` cannot tell, the answer is
/// yes: a lab is never removed on a guess.
fn owner_alive(pid: u32, start: u64) -> bool {
    if !Path::new("/proc/self/stat").exists() {
        return true;
    }
    match process_start_time(pid) {
        None => false,
        // Start 0: the owner could not read its own start time; the pid alone has to do.
        Some(actual) => start == 0 || actual == start,
    }
}

/// One host of a lab: a network namespace with `lo` and one veth to the lab's switch.
///
/// Cheap to clone (names and an address), to move into threads and closures.
#[derive(Debug, Clone)]
pub struct Host {
    name: String,
    netns: String,
    address: Ipv4Addr,
    mac: String,
    /// This host's veth end in the switch namespace.
    port: String,
    switch: String,
}

impl Host {
    /// The name given to [`Lab::new`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace's name (as `ip netns list` shows it).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The host's own address on the lab's /24.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// The host's address with a port.
    pub fn socket_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.address), port)
    }

    /// A command that runs `program` inside this host's namespace: `ip netns exec <netns> program`.
    /// Add arguments, environment and stdio as usual. `ip netns exec` enters the namespace and then
    /// execs the program, so the child's pid is the program's (`kill` and `wait` reach it). Kill
    /// such children before dropping the lab: a process still running keeps its namespace alive.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.netns]).arg(program);
        command
    }

    /// Runs `f` on a new thread inside this host's namespace (see [`crate::NsThread`]; the
    /// namespace is the thread's, not the process's, and threads it spawns inherit it).
    pub fn spawn<T, F>(&self, f: F) -> Result<NsThread<T>, LabError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        netns::spawn(&self.netns, f)
    }

    /// Runs the future `f` makes on a new thread inside this host's namespace, on a current-thread
    /// tokio runtime of its own (timers and I/O enabled). The sockets the future creates are this
    /// host's.
    pub fn spawn_async<F, Fut>(&self, f: F) -> Result<NsThread<Fut::Output>, LabError>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future,
        Fut::Output: Send + 'static,
    {
        netns::spawn_async(&self.netns, f)
    }

    /// Runs `f` inside this host's namespace and waits for it. Sockets created in `f` stay in the
    /// namespace wherever they are used later: `host.run(|| TcpListener::bind(...))` hands back a
    /// listener of this host to any thread or runtime.
    pub fn run<T, F>(&self, f: F) -> Result<T, LabError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.spawn(f)?.join()
    }

    /// A tokio `TcpSocket` created in this host's namespace, to `connect` (or `bind` and `listen`)
    /// from any runtime: its connections are this host's.
    pub fn tcp_socket(&self) -> Result<tokio::net::TcpSocket, LabError> {
        let netns = self.netns.clone();
        self.run(tokio::net::TcpSocket::new_v4)?
            .map_err(|e| LabError::io(format!("creating a TCP socket in namespace {netns}"), e))
    }

    /// A blocking listener on this host's address (port 0: any free port), usable from any thread;
    /// for tokio, `set_nonblocking(true)` and `tokio::net::TcpListener::from_std`.
    pub fn bind_tcp(&self, port: u16) -> Result<TcpListener, LabError> {
        let addr = self.socket_addr(port);
        self.run(move || TcpListener::bind(addr))?
            .map_err(|e| LabError::io(format!("binding {addr} in namespace {}", self.netns), e))
    }

    /// A blocking TCP connection from this host to `addr`, given up after `timeout`.
    pub fn connect_tcp(&self, addr: SocketAddr, timeout: Duration) -> Result<TcpStream, LabError> {
        self.run(move || TcpStream::connect_timeout(&addr, timeout))?
            .map_err(|e| LabError::io(format!("connecting from {} to {addr}", self.name), e))
    }
}

/// Namespaces [`Lab::teardown_stale`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StaleCleanup {
    /// The namespaces removed.
    pub removed: Vec<String>,
    /// Namespaces removed while processes still ran in them (a crashed run's children): the
    /// namespace name is gone, but those processes keep a namespace, cut off from every other host
    /// (its links went with the switch), until they exit. Listed so they can be found; never killed.
    pub processes_left: Vec<(String, Vec<u32>)>,
}

/// A set of hosts, each in its own network namespace, joined by one switch. Dropping it removes
/// every namespace and link it made.
#[derive(Debug)]
pub struct Lab {
    prefix: String,
    switch: String,
    switch_created: bool,
    network: Ipv4Addr,
    hosts: Vec<Host>,
    torn_down: bool,
}

impl Lab {
    /// Creates one host per name (ASCII letters, digits, `-` and `_`; at most 24 characters;
    /// unique), host `i` at `.i+1` of the lab's /24, each reachable from every other through the
    /// switch. First removes what crashed runs left ([`Lab::teardown_stale`]). On an error, what
    /// was created so far is removed again.
    pub fn new<I, S>(names: I) -> Result<Lab, LabError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let names: Vec<String> = names.into_iter().map(|name| name.as_ref().to_owned()).collect();
        validate_names(&names)?;
        match Lab::teardown_stale() {
            Ok(cleanup) => report_stale(&cleanup),
            Err(e @ (LabError::NotAllowed { .. } | LabError::IpMissing)) => return Err(e),
            // Someone else's leftovers must not stop this lab; they are said, and left.
            Err(e) => eprintln!("netlab: could not remove every stale namespace: {e}"),
        }

        let serial = LAB_SERIAL.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{}-{serial}", process_prefix());
        let [.., octet] = serial.to_be_bytes();
        let mut lab = Lab {
            switch: format!("{prefix}-switch"),
            prefix,
            switch_created: false,
            network: Ipv4Addr::new(10, 213, octet, 0),
            hosts: Vec::with_capacity(names.len()),
            torn_down: false,
        };
        // From here an early return drops `lab`, which removes what exists so far.
        ip::netns(&["add", &lab.switch])?;
        lab.switch_created = true;
        ip::in_ns(&lab.switch, &["link", "add", "br0", "type", "bridge"])?;
        ip::in_ns(&lab.switch, &["link", "set", "br0", "up"])?;
        for (index, name) in names.iter().enumerate() {
            lab.add_host(index, name)?;
        }
        lab.add_neighbours()?;
        Ok(lab)
    }

    fn add_host(&mut self, index: usize, name: &str) -> Result<(), LabError> {
        let number = u16::try_from(index + 1).map_err(|_| LabError::HostCount { count: index + 1, max: MAX_HOSTS })?;
        let [high, low] = number.to_be_bytes();
        let [a, b, c, _] = self.network.octets();
        let host = Host {
            name: name.to_owned(),
            netns: format!("{}-h-{name}", self.prefix),
            address: Ipv4Addr::new(a, b, c, low),
            // Locally administered ("02"), "nl", then the host number: unique within the lab,
            // which is all a bridge of its own needs.
            mac: format!("02:6e:6c:00:{high:02x}:{low:02x}"),
            port: format!("p{index}"),
            switch: self.switch.clone(),
        };
        ip::netns(&["add", &host.netns])?;
        self.hosts.push(host.clone());
        // Created in the switch namespace with its peer born in the host's: no veth ever exists in
        // the machine's own namespace, not even for a moment.
        ip::in_ns(
            &self.switch,
            &[
                "link",
                "add",
                &host.port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "address",
                &host.mac,
                "netns",
                &host.netns,
            ],
        )?;
        ip::in_ns(&self.switch, &["link", "set", &host.port, "master", "br0", "up"])?;
        batch(
            &host.netns,
            &[
                format!("addr add {}/24 dev eth0", host.address),
                "link set eth0 up".to_owned(),
                "link set lo up".to_owned(),
            ],
        )
    }

    /// Static neighbour entries for every pair, so that a downed link is a black hole (connects
    /// and retransmissions time out) rather than ARP failing and the kernel answering "no route to
    /// host" after a few seconds, which a real partition between hosts that knew each other is not.
    fn add_neighbours(&self) -> Result<(), LabError> {
        for host in &self.hosts {
            let lines: Vec<String> = self
                .hosts
                .iter()
                .filter(|other| other.netns != host.netns)
                .map(|other| format!("neigh replace {} lladdr {} dev eth0 nud permanent", other.address, other.mac))
                .collect();
            batch(&host.netns, &lines)?;
        }
        Ok(())
    }

    /// Checks that labs can be made here: `ip` is installed, and a probe namespace with a bridge, a
    /// veth pair and a thread entering it can be created (then it is removed). The error says what
    /// is missing and the fix. Tests use [`crate::testing::lab_or_skip`].
    pub fn available() -> Result<(), LabError> {
        match Command::new("ip").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(LabError::IpMissing),
            Err(e) => return Err(LabError::io("running `ip -V`", e)),
        }
        let serial = LAB_SERIAL.fetch_add(1, Ordering::Relaxed);
        let probe = format!("{}-{serial}-probe", process_prefix());
        ip::netns(&["add", &probe])?;
        let checked = (|| {
            ip::in_ns(&probe, &["link", "add", "br0", "type", "bridge"])?;
            ip::in_ns(&probe, &["link", "add", "v0", "type", "veth", "peer", "name", "v1"])?;
            netns::spawn(&probe, || ())?.join()
        })();
        let removed = ip::netns(&["del", &probe]);
        checked?;
        removed.map(|_| ())
    }

    /// Removes the namespaces of labs whose process is gone (a crashed or killed run): any
    /// `netlab-<pid>-<start>-...` whose pid no longer runs, or now runs a process that started at
    /// another time. Namespaces of live processes, this one's included, are left alone; so is
    /// anything not named by this crate. Idempotent; [`Lab::new`] calls it.
    pub fn teardown_stale() -> Result<StaleCleanup, LabError> {
        let mut cleanup = StaleCleanup::default();
        let entries = match fs::read_dir(NETNS_DIR) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(cleanup),
            Err(e) => return Err(LabError::io(format!("listing {NETNS_DIR}"), e)),
        };
        let mut stale: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| owner_of(name).is_some_and(|(pid, start)| !owner_alive(pid, start)))
            .collect();
        // Switches first: their removal takes every veth of that lab with them.
        stale.sort_by_key(|name| (!name.ends_with("-switch"), name.clone()));
        let mut first_error = None;
        for name in stale {
            let pids: Vec<u32> = ip::netns(&["pids", &name])
                .map(|out| out.split_whitespace().filter_map(|pid| pid.parse().ok()).collect())
                .unwrap_or_default();
            match ip::netns(&["del", &name]) {
                Ok(_) => {}
                // Another process's cleanup got there first.
                Err(e) if ip::is_already_gone(&e) => continue,
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            }
            if !pids.is_empty() {
                cleanup.processes_left.push((name.clone(), pids));
            }
            cleanup.removed.push(name);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(cleanup),
        }
    }

    /// `netlab-<pid>-<start>-<serial>`: the prefix of this lab's namespace names.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The lab's network, a /24 (`10.213.N.0`).
    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    /// The hosts, in the order given to [`Lab::new`].
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host of that name.
    pub fn host(&self, name: &str) -> Result<&Host, LabError> {
        self.hosts.iter().find(|host| host.name == name).ok_or_else(|| LabError::NoSuchHost(name.to_owned()))
    }

    /// The switch's namespace (it holds the bridge; no address, no process of its own).
    pub fn switch_netns(&self) -> &str {
        &self.switch
    }

    /// Every namespace of this lab, the switch's first.
    pub fn namespaces(&self) -> Vec<String> {
        std::iter::once(self.switch.clone()).chain(self.hosts.iter().map(|host| host.netns.clone())).collect()
    }

    /// Partitions `name` from every other host: its link is taken down at the switch. Packets it
    /// sends and packets sent to it vanish, silently, both ways; its own address, routes and
    /// sockets stay as they were, so TCP retransmits, connects time out and keepalives fire.
    pub fn link_down(&self, name: &str) -> Result<(), LabError> {
        let host = self.host(name)?;
        ip::in_ns(&host.switch, &["link", "set", &host.port, "down"]).map(|_| ())
    }

    /// Heals [`Lab::link_down`], returning once the link carries traffic again (the switch port
    /// forwards and the host's `eth0` has carrier), or with an error after 5 s.
    pub fn link_up(&self, name: &str) -> Result<(), LabError> {
        let host = self.host(name)?;
        ip::in_ns(&host.switch, &["link", "set", &host.port, "up"])?;
        let deadline = Instant::now() + LINK_SETTLE;
        loop {
            let port = ip::in_ns(&host.switch, &["-d", "-o", "link", "show", "dev", &host.port])?;
            let eth0 = ip::in_ns(&host.netns, &["-o", "link", "show", "dev", "eth0"])?;
            if port.contains("bridge_slave state forwarding") && eth0.contains("LOWER_UP") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LabError::Command {
                    command: format!("ip -n {} link set {} up", host.switch, host.port),
                    status: format!("link not forwarding after {LINK_SETTLE:?}"),
                    stderr: format!("port: {port}; eth0: {eth0}"),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Partitions two hosts from each other only: every other path stays up (e.g. an agent loses
    /// the database while its clients still reach it). Each side's neighbour entry for the other
    /// points at a MAC nobody has, so their packets to each other vanish, silently, both ways, and
    /// TCP between them retransmits, times out and keepalives fire, as with [`Lab::link_down`].
    pub fn partition(&self, a: &str, b: &str) -> Result<(), LabError> {
        let (first, second) = self.pair(a, b)?;
        set_neighbour(first, second.address, BLACKHOLE_MAC)?;
        set_neighbour(second, first.address, BLACKHOLE_MAC)
    }

    /// Heals [`Lab::partition`] (restores the two hosts' real neighbour entries); healing a pair
    /// that is not partitioned changes nothing.
    pub fn heal_partition(&self, a: &str, b: &str) -> Result<(), LabError> {
        let (first, second) = self.pair(a, b)?;
        set_neighbour(first, second.address, &second.mac)?;
        set_neighbour(second, first.address, &first.mac)
    }

    fn pair(&self, a: &str, b: &str) -> Result<(&Host, &Host), LabError> {
        if a == b {
            return Err(LabError::InvalidName {
                name: a.to_owned(),
                reason: "a host cannot be partitioned from itself",
            });
        }
        Ok((self.host(a)?, self.host(b)?))
    }

    /// Removes the lab now and says whether everything went; dropping it does the same and only
    /// prints what failed.
    pub fn teardown(mut self) -> Result<(), LabError> {
        self.remove()
    }

    fn remove(&mut self) -> Result<(), LabError> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Ok(());
        }
        let mut first_error = None;
        let mut note = |result: Result<String, LabError>| match result {
            Err(e) if !ip::is_already_gone(&e) => {
                first_error.get_or_insert(e);
            }
            _ => {}
        };
        // The links first, explicitly: removing a namespace file does not end a namespace that a
        // thread or process still occupies, but a deleted veth end takes its peer with it at once.
        if self.switch_created {
            for host in &self.hosts {
                note(ip::in_ns(&self.switch, &["link", "del", &host.port]));
            }
        }
        for host in &self.hosts {
            note(ip::netns(&["del", &host.netns]));
        }
        if self.switch_created {
            note(ip::netns(&["del", &self.switch]));
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!(
                "netlab: tearing down lab {}: {e} (the next Lab::new removes the rest once this process exits)",
                self.prefix
            );
        }
    }
}

impl Index<&str> for Lab {
    type Output = Host;

    /// The host of that name; panics if there is none (see [`Lab::host`]).
    fn index(&self, name: &str) -> &Host {
        match self.host(name) {
            Ok(host) => host,
            Err(e) => panic!("{e}"),
        }
    }
}

fn validate_names(names: &[String]) -> Result<(), LabError> {
    if names.is_empty() || names.len() > MAX_HOSTS {
        return Err(LabError::HostCount { count: names.len(), max: MAX_HOSTS });
    }
    for (index, name) in names.iter().enumerate() {
        let invalid = |reason| Err(LabError::InvalidName { name: name.clone(), reason });
        if name.is_empty() || name.len() > MAX_NAME {
            return invalid("1 to 24 characters");
        }
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return invalid("only ASCII letters, digits, '-' and '_'");
        }
        if names[..index].contains(name) {
            return invalid("given twice");
        }
    }
    Ok(())
}

fn report_stale(cleanup: &StaleCleanup) {
    if !cleanup.removed.is_empty() {
        eprintln!(
            "netlab: removed {} stale namespace(s) of crashed runs: {:?}",
            cleanup.removed.len(),
            cleanup.removed
        );
    }
    for (netns, pids) in &cleanup.processes_left {
        eprintln!("netlab: processes {pids:?} of a crashed run still ran in {netns}; they are cut off, not killed");
    }
}

/// `host`'s (permanent) neighbour entry for `address`: which MAC its packets to that address get.
/// Replacing an entry also updates the headers cached for it, so open connections follow at once.
fn set_neighbour(host: &Host, address: Ipv4Addr, mac: &str) -> Result<(), LabError> {
    let address = address.to_string();
    ip::in_ns(&host.netns, &["neigh", "replace", &address, "lladdr", mac, "dev", "eth0", "nud", "permanent"])
        .map(|_| ())
}

/// `ip -n <netns> -batch -`: several commands in one process.
fn batch(netns: &str, lines: &[String]) -> Result<(), LabError> {
    if lines.is_empty() {
        return Ok(());
    }
    let command = format!("ip -n {netns} -batch - ({})", lines.join("; "));
    let mut child = match Command::new("ip")
        .args(["-n", netns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(LabError::IpMissing),
        Err(e) => return Err(LabError::io(format!("running `{command}`"), e)),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let text = lines.join("\n") + "\n";
        stdin.write_all(text.as_bytes()).map_err(|e| LabError::io(format!("writing to `{command}`"), e))?;
        // Dropping stdin closes it: the end of the batch.
    }
    let output = child.wait_with_output().map_err(|e| LabError::io(format!("waiting for `{command}`"), e))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    Err(ip::classify(command, output.status.to_string(), stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_read_from_this_crates_names_only() {
        assert_eq!(owner_of("netlab-123-456-0-switch"), Some((123, 456)));
        assert_eq!(owner_of("netlab-123-456-7-h-agent-1"), Some((123, 456)));
        assert_eq!(owner_of("netlab-123-456-3-probe"), Some((123, 456)));
        assert_eq!(owner_of("netlab-123-456"), None);
        assert_eq!(owner_of("netlab-x-456-0-switch"), None);
        assert_eq!(owner_of("other-123-456-0-switch"), None);
        assert_eq!(owner_of("cni-1234"), None);
    }

    #[test]
    fn this_process_is_alive_and_its_prefix_names_it() {
        let pid = std::process::id();
        let start = process_start_time(pid).expect("own /proc/self/stat");
        assert_eq!(process_prefix(), format!("netlab-{pid}-{start}"));
        assert!(owner_alive(pid, start));
        assert!(!owner_alive(pid, start + 1), "a pid reused by another process is not the owner");
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_names(&["db".into(), "agent-1".into(), "client_2".into()]).is_ok());
        assert!(matches!(validate_names(&[]), Err(LabError::HostCount { .. })));
        assert!(matches!(validate_names(&["a b".into()]), Err(LabError::InvalidName { .. })));
        assert!(matches!(validate_names(&["a".into(), "a".into()]), Err(LabError::InvalidName { .. })));
        assert!(matches!(validate_names(&["x".repeat(25)]), Err(LabError::InvalidName { .. })));
    }
}
