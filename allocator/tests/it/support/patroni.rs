//! A zone on Patroni-managed PostgreSQL across real links (issue 44), for the failover tests of
//! `patroni_failover.rs`: one network lab (`netlab`) with a host each for etcd, two PostgreSQL
//! nodes (`pg1`, `pg2`, each a Patroni process running its own PostgreSQL), the `allocator`
//! agents and the test's clients. Every process runs in its own host's network namespace, so a
//! fault is a real one: a node killed (every process of its host: Patroni and PostgreSQL, a lost
//! machine), a host's link taken down (packets vanish both ways; TCP timeouts and keepalives really
//! fire), or one path cut (`Lab::partition`).
//!
//! The nodes run the shipped `configs/patroni/patroni.yml` unchanged (copied beside them), with
//! what differs between nodes in Patroni's environment variables, as an operator runs it
//! (docs/operations.md): synchronous mode, not strict, ttl 10 s, loop_wait 2 s, retry_timeout 4 s.
//! Settings a test changes (strict mode, `synchronous_commit`) go through Patroni's REST API
//! (`PATCH /config`, what `patronictl edit-config` does). The agents are real `allocator`
//! binaries whose `store` names both nodes and asks for the writable one ([`Zone::store_url`]).
//!
//! Teardown, also when a test panics: [`Zone`]'s `Drop` kills every process in the lab's hosts
//! (found by namespace, so a PostgreSQL that Patroni started, detached, is found too), reaps its
//! children, removes the lab and the directory; on a panic it first prints the tails of the logs.
//! A run killed outright leaves its processes in namespaces that the next run's lab removes as
//! stale: [`Zone::start`] kills those of them that run this harness's programs.
//!
//! Traffic stays inside the lab: every address is the lab's own (`netlab`'s README says why
//! nothing can leave it). The test's own code reaches the lab from the `client` host (a thread
//! that entered its namespace, [`Zone::in_client`]); psql runs there too.

#![allow(dead_code)]

use netlab::{Host, Lab};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The lab's hosts besides the agents.
pub const ETCD: &str = "etcd";
pub const NODES: [&str; 2] = ["pg1", "pg2"];
pub const CLIENT: &str = "client";

const PG_PORT: u16 = 5432;
const REST_PORT: u16 = 8008;
const ETCD_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;
const AGENT_PORT: u16 = 8080;

/// Test-only credentials (the lab is unreachable from anywhere else).
const SUPERUSER_PASSWORD: &str = "patroni-test-superuser";
const REPLICATION_PASSWORD: &str = "patroni-test-replication";
const ALLOCATOR_PASSWORD: &str = "patroni-test-allocator";

/// How long a node may take to come up, or the cluster to be healthy again after a fault.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(120);

/// The prefix of this harness's directories. Every process it starts names its directory on its
/// command line (Patroni's config, PostgreSQL's data directory, etcd's, the agent's config), so a
/// process left in a dead run's namespace with it there is this harness's own leftover (killed at
/// the next start); anything else, another test's, is left alone.
const DIR_PREFIX: &str = "patroni-test-";

pub fn agent_host(index: usize) -> String {
    format!("agent{index}")
}

/// A running zone; see the module documentation. Everything is torn down on drop.
pub struct Zone {
    lab: Lab,
    dir: tempfile::TempDir,
    bin_dir: PathBuf,
    etcd: Mutex<Option<Child>>,
    patroni: [Mutex<Option<Child>>; 2],
    agents: Vec<Mutex<Option<Child>>>,
}

fn require(program: &str) {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    assert!(
        on_path,
        "`{program}` is not installed: run scripts/setup.sh (it installs Debian's patroni and etcd-server)"
    );
}

fn chown_postgres(path: &Path) {
    let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(path).status().unwrap();
    assert!(status.success(), "chown of {} to postgres failed", path.display());
}

/// The last `lines` lines of a log file, for a failure message.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Pids of the processes in a network namespace (`ip netns pids`), this process excluded.
fn pids_in(netns: &str) -> Vec<i32> {
    let out = Command::new("ip").args(["netns", "pids", netns]).output();
    let own = std::process::id() as i32;
    out.map(|out| {
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .filter(|pid| *pid != own)
            .collect()
    })
    .unwrap_or_default()
}

/// Stops, then kills, every process of `pids` and waits until they are gone (false if one is still
/// there after 20 s): stopped first so that none of them reacts to another's death (a postmaster
/// forking crash recovery, Patroni restarting PostgreSQL) in between. A lost machine.
fn kill_all(pids: &[i32]) -> bool {
    for &pid in pids {
        // SAFETY: kill(2) with a pid read from the kernel's list of this namespace's processes.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    for &pid in pids {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids.iter().any(|pid| {
        // A zombie (our own child not reaped yet) is gone as far as the node is concerned.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
    }) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn reap(child: &Mutex<Option<Child>>) {
    if let Some(mut child) = child.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A bare HTTP/1.1 exchange (`Connection: close`), enough for Patroni's REST API, etcd's health
/// check and the agents' probes: status and body.
fn http_exchange(addr: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    Ok((status, body))
}

impl Zone {
    /// Starts etcd, the two Patroni nodes (pg1 first, so it bootstraps and leads; then pg2, which
    /// copies it and becomes its synchronous standby), creates the agents' role and database, and
    /// starts `agents` agents; returns once every agent is ready.
    pub fn start(agents: usize) -> Zone {
        require("patroni");
        require("etcd");
        require("setpriv");
        kill_stale_runs();
        let mut names = vec![ETCD.to_owned()];
        names.extend(NODES.iter().map(|n| (*n).to_owned()));
        names.extend((0..agents).map(agent_host));
        names.push(CLIENT.to_owned());
        let lab = Lab::new(&names).expect("a network lab (run as root; NETLAB_REQUIRE=1 on CI)");
        let dir = tempfile::Builder::new().prefix(DIR_PREFIX).tempdir().unwrap();
        // The nodes run as `postgres`, which must reach their directories.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        for name in [ETCD, NODES[0], NODES[1]] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            chown_postgres(&dir.path().join(name));
        }
        let config = dir.path().join("patroni.yml");
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/patroni/patroni.yml");
        std::fs::copy(&shipped, &config).unwrap_or_else(|e| panic!("{}: {e}", shipped.display()));
        let zone = Zone {
            lab,
            dir,
            bin_dir: test_support::postgres::bin_dir(),
            etcd: Mutex::new(None),
            patroni: [Mutex::new(None), Mutex::new(None)],
            agents: (0..agents).map(|_| Mutex::new(None)).collect(),
        };
        // From here a panic drops `zone`, which kills what was started.
        zone.start_etcd();
        zone.start_node(0);
        zone.wait_for(CLUSTER_TIMEOUT, "pg1 to lead", |z| z.leader() == Some(0));
        zone.create_database();
        zone.start_node(1);
        zone.wait_healthy();
        for index in 0..agents {
            zone.start_agent(index);
        }
        for index in 0..agents {
            let base = zone.agent_addr(index);
            zone.wait_for(Duration::from_secs(60), &format!("agent {index} to be ready"), |z| {
                z.http(base, "GET", "/readyz", "").is_ok_and(|(status, _)| status == 200)
            });
        }
        zone
    }

    pub fn lab(&self) -> &Lab {
        &self.lab
    }

    pub fn host(&self, name: &str) -> &Host {
        &self.lab[name]
    }

    /// Runs `f` on a thread in the client host and waits: what it connects to is reached across
    /// the lab, as from another machine.
    pub fn in_client<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.lab[CLIENT].run(f).expect("a thread in the client host")
    }

    fn http(&self, addr: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        let (method, path, body) = (method.to_owned(), path.to_owned(), body.to_owned());
        self.in_client(move || http_exchange(addr, &method, &path, &body))
    }

    fn wait_for(&self, timeout: Duration, what: &str, mut done: impl FnMut(&Zone) -> bool) {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            assert!(Instant::now() < deadline, "waited {timeout:?} for {what}\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn start_etcd(&self) {
        let host = &self.lab[ETCD];
        let client = format!("http://{}", host.socket_addr(ETCD_PORT));
        let peer = format!("http://{}", host.socket_addr(ETCD_PEER_PORT));
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let child = host
            .command("setpriv")
            .args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--", "etcd", "--name", "etcd"])
            .arg("--data-dir")
            .arg(self.dir.path().join(ETCD).join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("etcd={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd");
        *self.etcd.lock().unwrap() = Some(child);
        let addr = host.socket_addr(ETCD_PORT);
        self.wait_for(Duration::from_secs(30), "etcd to be healthy", |z| {
            z.http(addr, "GET", "/health", "").is_ok_and(|(status, body)| status == 200 && body.contains("true"))
        });
    }

    /// Starts node `index`'s Patroni (which starts its PostgreSQL): the shipped config, the node's
    /// own settings in the environment.
    pub fn start_node(&self, index: usize) {
        let name = NODES[index];
        let host = &self.lab[name];
        let node_dir = self.dir.path().join(name);
        let rest = host.socket_addr(REST_PORT).to_string();
        let pg = host.socket_addr(PG_PORT).to_string();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(node_dir.join("patroni.log")).unwrap();
        let child = host
            .command("setpriv")
            .args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--", "patroni"])
            .arg(self.dir.path().join("patroni.yml"))
            .current_dir(&node_dir)
            .env("HOME", &node_dir)
            .env("PATRONI_NAME", name)
            .env("PATRONI_RESTAPI_LISTEN", &rest)
            .env("PATRONI_RESTAPI_CONNECT_ADDRESS", &rest)
            .env("PATRONI_POSTGRESQL_LISTEN", &pg)
            .env("PATRONI_POSTGRESQL_CONNECT_ADDRESS", &pg)
            .env("PATRONI_POSTGRESQL_DATA_DIR", node_dir.join("data"))
            .env("PATRONI_POSTGRESQL_BIN_DIR", &self.bin_dir)
            .env("PATRONI_POSTGRESQL_PGPASS", node_dir.join("pgpass"))
            .env("PATRONI_ETCD3_HOSTS", self.lab[ETCD].socket_addr(ETCD_PORT).to_string())
            .env("PATRONI_SUPERUSER_PASSWORD", SUPERUSER_PASSWORD)
            .env("PATRONI_REPLICATION_PASSWORD", REPLICATION_PASSWORD)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("patroni");
        *self.patroni[index].lock().unwrap() = Some(child);
    }

    /// Kills node `index` as a lost machine: every process of its host (Patroni, the postmaster
    /// and its backends, a pg_rewind or base backup in progress) stopped, then SIGKILLed.
    pub fn kill_node(&self, index: usize) {
        let pids = pids_in(self.lab[NODES[index]].netns());
        assert!(kill_all(&pids), "the processes of {} ({pids:?}) did not exit", NODES[index]);
        reap(&self.patroni[index]);
    }

    /// The agents' role and database, on the leader (pg1 right after bootstrap).
    fn create_database(&self) {
        self.psql_on(0, "postgres", &format!("CREATE ROLE allocator LOGIN PASSWORD '{ALLOCATOR_PASSWORD}'"));
        self.psql_on(0, "postgres", "CREATE DATABASE allocator OWNER allocator");
    }

    /// The agents' `store`: both nodes, the writable one chosen at each connection. `connect_timeout`
    /// (1 s): a node whose link is down costs that much per reconnection before the next is tried.
    /// `tcp_user_timeout` (5 s): a connection whose packets vanish fails after that long instead of
    /// when TCP gives up (about 15 minutes); one waiting for the answer to a statement the node
    /// acknowledged fails by the agents' keepalives (5 s idle, then probes 1 s apart).
    pub fn store_url(&self) -> String {
        format!(
            "postgres://allocator:{ALLOCATOR_PASSWORD}@{},{}/allocator?target_session_attrs=read-write&connect_timeout=1&tcp_user_timeout=5",
            self.lab[NODES[0]].socket_addr(PG_PORT),
            self.lab[NODES[1]].socket_addr(PG_PORT)
        )
    }

    fn start_agent(&self, index: usize) {
        let name = agent_host(index);
        let host = &self.lab[&*name];
        let dir = self.dir.path().join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        // Open routes (no service token) beyond loopback: the lab's addresses exist only inside it.
        let config = format!(
            "listen = \"{}\"\nstore = \"{}\"\ninsecure_open = true\n\n[generate]\nzone = \"z\"\nhosts = {}\n\
             hosts_per_rack = 2\ncores = 16\nmemory_gib = 64\n",
            host.socket_addr(AGENT_PORT),
            self.store_url(),
            super::faults::HOSTS
        );
        std::fs::write(dir.join("allocator.toml"), config).unwrap();
        let log = std::fs::File::create(dir.join("allocator.log")).unwrap();
        let child = host
            .command(env!("CARGO_BIN_EXE_allocator"))
            .arg("--config")
            .arg(dir.join("allocator.toml"))
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .env_remove("ALLOCATOR_ADMIN_TOKEN")
            .env_remove("ALLOCATOR_SERVICE_TOKEN")
            .env_remove("ALLOCATOR_SERVICE_TOKEN_FILE")
            .env_remove("ALLOCATOR_PREVIOUS_SERVICE_TOKEN")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("allocator");
        *self.agents[index].lock().unwrap() = Some(child);
    }

    pub fn agent_addr(&self, index: usize) -> SocketAddr {
        self.lab[&*agent_host(index)].socket_addr(AGENT_PORT)
    }

    /// The agents' base URLs, as the clients in the client host reach them.
    pub fn agent_bases(&self) -> Vec<String> {
        (0..self.agents.len()).map(|i| format!("http://{}", self.agent_addr(i))).collect()
    }

    /// `GET` on node `index`'s Patroni REST API, as JSON; `None` when it does not answer.
    pub fn patroni(&self, index: usize, path: &str) -> Option<Value> {
        let (status, body) = self.http(self.lab[NODES[index]].socket_addr(REST_PORT), "GET", path, "").ok()?;
        // /patroni answers 503 on a replica, with the same body.
        (status != 0).then(|| serde_json::from_str(&body).ok()).flatten()
    }

    /// The node whose PostgreSQL is the running primary, as its Patroni says.
    pub fn leader(&self) -> Option<usize> {
        (0..NODES.len()).find(|&i| {
            self.patroni(i, "/patroni").is_some_and(|status| {
                matches!(status["role"].as_str(), Some("master" | "primary")) && status["state"] == "running"
            })
        })
    }

    /// Node `index`'s role as its Patroni says (`master`/`primary`, `replica`), if it answers.
    pub fn role(&self, index: usize) -> Option<String> {
        self.patroni(index, "/patroni").and_then(|status| status["role"].as_str().map(str::to_owned))
    }

    /// The cluster as the leader's view of etcd has it: each member's name, role and state.
    pub fn members(&self) -> Vec<(String, String, String)> {
        let view = self.leader().and_then(|i| self.patroni(i, "/cluster"));
        view.and_then(|cluster| cluster["members"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|m| {
                let field = |key: &str| m[key].as_str().unwrap_or_default().to_owned();
                (field("name"), field("role"), field("state"))
            })
            .collect()
    }

    /// Whether node `index` is in the synchronous set (etcd's `/sync` key, as the leader reads it).
    pub fn is_sync_standby(&self, index: usize) -> bool {
        self.members().iter().any(|(name, role, _)| name == NODES[index] && role == "sync_standby")
    }

    /// A leader and a synchronous standby that streams (in `/sync`, and `sync` on the primary):
    /// the state a fault starts from. Returns the leader.
    pub fn wait_healthy(&self) -> usize {
        let mut leader = None;
        self.wait_for(CLUSTER_TIMEOUT, "a leader and a streaming synchronous standby", |z| {
            leader = z.leader();
            let Some(l) = leader else { return false };
            let standby = 1 - l;
            let members = z.members();
            let sync = members.iter().any(|(name, role, state)| {
                name == NODES[standby] && role == "sync_standby" && matches!(state.as_str(), "running" | "streaming")
            });
            sync && z
                .try_psql_on(l, "postgres", "SELECT sync_state FROM pg_stat_replication")
                .is_some_and(|s| s == "sync")
        });
        leader.expect("a leader")
    }

    /// Takes node or agent `name`'s link down at the switch: cut from every other host, both ways.
    pub fn link_down(&self, name: &str) {
        self.lab.link_down(name).expect("link down");
    }

    pub fn link_up(&self, name: &str) {
        self.lab.link_up(name).expect("link up");
    }

    /// Cuts the path between two hosts only, both ways.
    pub fn partition(&self, a: &str, b: &str) {
        self.lab.partition(a, b).expect("partition");
    }

    pub fn heal_partition(&self, a: &str, b: &str) {
        self.lab.heal_partition(a, b).expect("heal partition");
    }

    /// Changes the cluster's dynamic configuration (what `patronictl edit-config` does: a
    /// `PATCH /config` on any node, written to etcd, applied by every node at its next loop).
    pub fn patch_config(&self, patch: &Value) {
        let leader = self.leader().expect("a leader to configure");
        let addr = self.lab[NODES[leader]].socket_addr(REST_PORT);
        let (status, body) = self.http(addr, "PATCH", "/config", &patch.to_string()).expect("PATCH /config");
        assert_eq!(status, 200, "PATCH /config {patch}: {body}");
    }

    /// Runs SQL with psql in the client host, as the superuser, on node `index` (database `db`).
    pub fn try_psql_on(&self, index: usize, db: &str, sql: &str) -> Option<String> {
        let url = format!("postgresql://postgres@{}/{db}", self.lab[NODES[index]].socket_addr(PG_PORT));
        self.try_psql(&url, sql)
    }

    pub fn psql_on(&self, index: usize, db: &str, sql: &str) -> String {
        let url = format!("postgresql://postgres@{}/{db}", self.lab[NODES[index]].socket_addr(PG_PORT));
        self.try_psql(&url, sql).unwrap_or_else(|| panic!("psql on {} `{sql}` failed", NODES[index]))
    }

    fn try_psql(&self, url: &str, sql: &str) -> Option<String> {
        let out = self.lab[CLIENT]
            .command(self.bin_dir.join("psql"))
            .args(["-At", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql])
            .env("PGPASSWORD", SUPERUSER_PASSWORD)
            .env("PGCONNECT_TIMEOUT", "2")
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Holds an exclusive lock on the agents' tables on node `index` from a psql session in the
    /// client host (a transaction left open), and returns once every agent's connection waits on
    /// it: their statements sent, received by the node's TCP, unanswered. Kill the returned
    /// process to end the session.
    pub fn hold_agents_tables(&self, index: usize, agents: usize) -> Child {
        let url = format!("postgresql://postgres@{}/allocator", self.lab[NODES[index]].socket_addr(PG_PORT));
        let holder = self.lab[CLIENT]
            .command(self.bin_dir.join("psql"))
            .args(["-At", "-v", "ON_ERROR_STOP=1", "-d", &url])
            .args(["-c", "BEGIN", "-c", "LOCK TABLE vms, hosts, changes IN ACCESS EXCLUSIVE MODE"])
            .args(["-c", "SELECT pg_sleep(3600)"])
            .env("PGPASSWORD", SUPERUSER_PASSWORD)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("psql holding the agents' tables");
        let waiting = "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND relation IN \
                       ('vms'::regclass, 'hosts'::regclass, 'changes'::regclass)";
        self.wait_for(Duration::from_secs(30), "every agent waiting on the held lock", |z| {
            z.try_psql_on(index, "allocator", waiting)
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n >= agents)
        });
        // The node's TCP acknowledges a statement it has no answer for within its delayed-ACK
        // time (at most 200 ms): past it, nothing of the agents' is unacknowledged.
        std::thread::sleep(Duration::from_millis(300));
        holder
    }

    /// The agents' database on whichever node is the primary (libpq's multi-host URL, as the
    /// agents'), retried while there is none.
    pub fn psql(&self, sql: &str) -> String {
        let url = format!(
            "postgresql://postgres@{},{}/allocator?target_session_attrs=read-write",
            self.lab[NODES[0]].socket_addr(PG_PORT),
            self.lab[NODES[1]].socket_addr(PG_PORT)
        );
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            if let Some(out) = self.try_psql(&url, sql) {
                return out;
            }
            assert!(Instant::now() < deadline, "no primary answered `{sql}`\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The tails of every log, for a failure message.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        let mut files = vec![(ETCD.to_owned(), self.dir.path().join("etcd.log"))];
        files.extend(NODES.iter().map(|n| ((*n).to_owned(), self.dir.path().join(n).join("patroni.log"))));
        files.extend(
            (0..self.agents.len()).map(|i| (agent_host(i), self.dir.path().join(agent_host(i)).join("allocator.log"))),
        );
        for (name, path) in files {
            text.push_str(&format!("---- {name}: {} ----\n{}\n", path.display(), tail(&path, 25)));
        }
        text
    }
}

impl super::faults::Database for Zone {
    fn query(&self, sql: &str) -> String {
        self.psql(sql)
    }
}

impl Drop for Zone {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        // Every process of every host but the client's (this process's threads live there).
        let mut pids = Vec::new();
        for host in self.lab.hosts().iter().filter(|h| h.name() != CLIENT) {
            pids.extend(pids_in(host.netns()));
        }
        if !kill_all(&pids) {
            eprintln!("patroni harness: processes {pids:?} did not exit after SIGKILL");
        }
        reap(&self.etcd);
        for child in self.patroni.iter().chain(&self.agents) {
            reap(child);
        }
        // Then the lab (its own Drop) and the directory (TempDir's).
    }
}

/// Kills what a run killed outright left behind: processes of this harness's programs still
/// running in namespaces of labs whose process is gone (`Lab::teardown_stale` removes the
/// namespaces and lists such processes without killing them).
fn kill_stale_runs() {
    let Ok(cleanup) = Lab::teardown_stale() else { return };
    for (netns, pids) in cleanup.processes_left {
        let ours: Vec<i32> = pids
            .into_iter()
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                String::from_utf8_lossy(&cmdline).contains(DIR_PREFIX)
            })
            .filter_map(|pid| i32::try_from(pid).ok())
            .collect();
        if !ours.is_empty() {
            eprintln!("patroni harness: killing {ours:?}, left running in {netns} by a run that was killed");
            let _ = kill_all(&ours);
        }
    }
}
