//! A throwaway PostgreSQL cluster for one test: `initdb` into a temporary directory, `pg_ctl start`
//! on a free loopback port (its socket in that directory too), and on drop an immediate stop and
//! the directory removed. PostgreSQL refuses to run as root, so as root the cluster belongs to the
//! unprivileged `postgres` user (created by Debian's package; `scripts/setup.sh` installs it).
//!
//! The binaries are looked up on `PATH`, then in `/usr/lib/postgresql/*/bin` (Debian keeps them
//! there). A missing PostgreSQL fails the test with the fix: the tests never skip for want of it.

use crate::listening::free_port;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A running cluster; stopped and removed when dropped.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    /// `postgres://alloc@127.0.0.1:PORT/alloc`: the test database, trust authentication on loopback.
    pub url: String,
    stopped: bool,
}

/// The directory of PostgreSQL's server programs (`pg_ctl`, `initdb`, `postgres`, `psql`).
pub fn bin_dir() -> PathBuf {
    if let Ok(path) = which("pg_ctl") {
        // A link on PATH (/usr/local/bin/pg_ctl) leads to the directory that has psql too.
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        return path.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "PostgreSQL's pg_ctl and initdb are not installed: run scripts/setup.sh (it installs Debian's postgresql)"
        )
    })
}

fn which(name: &str) -> Result<PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file()).ok_or(())
}

/// Whether this process runs as root: `/proc/self` belongs to the process's effective user.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// Runs a PostgreSQL binary, as the `postgres` user when we are root.
fn run(bin: &Path, args: &[&str]) -> Output {
    let mut command = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    command.args(args).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

impl Postgres {
    /// Creates and starts a cluster with the database `alloc` owned by the role `alloc`.
    pub fn start() -> Postgres {
        let bin = bin_dir();
        let dir = tempfile::Builder::new().prefix("pg-test-").tempdir().unwrap();
        let data = dir.path().join("data");
        if is_root() {
            // The cluster's directory must belong to the unprivileged user that runs it.
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status().unwrap();
            assert!(status.success(), "chown of the cluster directory to postgres failed");
        }
        let data_str = data.to_str().unwrap();
        let out = run(&bin.join("initdb"), &["-D", data_str, "-A", "trust", "-U", "alloc", "--no-sync", "-E", "UTF8"]);
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        for _attempt in 0..5 {
            let port = free_port();
            let options = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200",
                dir.path().display()
            );
            let log = dir.path().join("postgres.log");
            let out = run(
                &bin.join("pg_ctl"),
                &["-D", data_str, "-o", &options, "-l", log.to_str().unwrap(), "-w", "-t", "30", "start"],
            );
            if out.status.success() {
                let mut pg = Postgres {
                    dir,
                    bin,
                    port,
                    url: format!("postgres://alloc@127.0.0.1:{port}/alloc"),
                    stopped: false,
                };
                pg.create_database();
                return pg;
            }
        }
        panic!("PostgreSQL did not start (see {}/postgres.log)", dir.path().display());
    }

    fn create_database(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = Command::new(self.bin.join("psql"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "alloc", "-d", "postgres", "-c"])
                .arg("CREATE DATABASE alloc")
                .output()
                .unwrap();
            if out.status.success() {
                return;
            }
            assert!(Instant::now() < deadline, "CREATE DATABASE failed: {}", String::from_utf8_lossy(&out.stderr));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs SQL in the test database with psql (for tests that look at the store directly).
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "alloc", "-d", "alloc"])
            .args(["-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .unwrap();
        assert!(out.status.success(), "psql `{sql}` failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The cluster's directory (removed on drop).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// Stops the server at once (an outage); [`Postgres::restart`] brings it back on the same port.
    pub fn stop(&mut self) {
        let data = self.dir.path().join("data");
        let out = run(&self.bin.join("pg_ctl"), &["-D", data.to_str().unwrap(), "-m", "immediate", "-w", "stop"]);
        assert!(out.status.success(), "pg_ctl stop failed: {}", String::from_utf8_lossy(&out.stderr));
        self.stopped = true;
    }

    /// Crashes the server: SIGKILL to the postmaster and every backend, as an OOM kill or a lost
    /// machine would (no shutdown of any kind; the restart runs crash recovery from the WAL).
    pub fn crash(&mut self) {
        let pid_file = self.dir.path().join("data").join("postmaster.pid");
        let pid = std::fs::read_to_string(&pid_file).expect("postmaster.pid of a running server");
        let pid = pid.lines().next().unwrap_or_default().trim().to_owned();
        // The postmaster is stopped first so that it cannot react to its children's deaths by
        // forking new ones (crash recovery's startup process, which would outlive it and hold the
        // shared memory the restart needs); then its children are listed and all are killed.
        let _ = Command::new("kill").args(["-STOP", &pid]).status().expect("kill");
        let children = Command::new("pgrep").args(["-P", &pid]).output().expect("pgrep");
        let mut pids: Vec<String> =
            String::from_utf8_lossy(&children.stdout).split_whitespace().map(str::to_owned).collect();
        pids.push(pid);
        // A backend may exit by itself in between: kill's status is not checked, the exits are.
        let _ = Command::new("kill").arg("-KILL").args(&pids).status().expect("kill");
        // Wait until every one of them is gone, so the restart finds no shared memory in use.
        let deadline = Instant::now() + Duration::from_secs(20);
        while pids.iter().any(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
            assert!(Instant::now() < deadline, "the killed PostgreSQL processes did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stopped = true;
    }

    pub fn restart(&mut self) {
        let out = self.pg_start();
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        self.stopped = false;
    }

    /// The last lines of the server's log, for a failure message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!("postgres.log ends:\n{}", lines[lines.len().saturating_sub(15)..].join("\n"))
    }

    /// `pg_ctl start` of this cluster's data directory on its port, waiting until it accepts
    /// connections (a standby: until it is consistent and accepts read-only ones).
    fn pg_start(&self) -> Output {
        let data = self.dir.path().join("data");
        // A standby whose primary died retries streaming every `wal_retrieve_retry_interval`
        // (5 s by default), and a promotion can wait that long: retry often instead.
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c wal_retrieve_retry_interval=200ms",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("postgres.log");
        run(
            &self.bin.join("pg_ctl"),
            &["-D", data.to_str().unwrap(), "-o", &options, "-l", log.to_str().unwrap(), "-w", "-t", "30", "start"],
        )
    }

    /// A streaming-replication standby of `primary` in a directory of its own, started on a free
    /// port: `pg_basebackup -R` copies the primary's data directory and writes `standby.signal` and
    /// `primary_conninfo`. initdb's pg_hba trusts replication connections on loopback, and the
    /// `alloc` role (the superuser initdb created) may replicate.
    pub fn standby_of(primary: &Postgres) -> Postgres {
        let dir = tempfile::Builder::new().prefix("pg-standby-").tempdir().unwrap();
        if is_root() {
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status().unwrap();
            assert!(status.success(), "chown of the standby's directory to postgres failed");
        }
        let mut pg = Postgres { dir, bin: bin_dir(), port: 0, url: String::new(), stopped: true };
        pg.base_backup(primary.port);
        for _attempt in 0..5 {
            pg.port = free_port();
            pg.url = format!("postgres://alloc@127.0.0.1:{}/alloc", pg.port);
            if pg.pg_start().status.success() {
                pg.stopped = false;
                return pg;
            }
        }
        panic!("the standby did not start (see {}/postgres.log)", pg.dir.path().display());
    }

    /// Rebuilds this (stopped or crashed) cluster as a standby of the primary on `primary_port`:
    /// its data directory is thrown away (its WAL may hold commits the new primary never had, and
    /// its timeline ended) and copied afresh with `pg_basebackup -R`, then started on its own port.
    pub fn rebuild_as_standby_of(&mut self, primary_port: u16) {
        assert!(self.stopped, "rebuild a stopped server only");
        let data = self.dir.path().join("data");
        std::fs::remove_dir_all(&data).unwrap();
        self.base_backup(primary_port);
        let out = self.pg_start();
        assert!(out.status.success(), "the rebuilt standby did not start: {}", String::from_utf8_lossy(&out.stderr));
        self.stopped = false;
    }

    fn base_backup(&self, primary_port: u16) {
        let data = self.dir.path().join("data");
        // `-c fast`: an immediate checkpoint on the primary rather than waiting for the next one.
        let out = run(
            &self.bin.join("pg_basebackup"),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary_port.to_string(),
                "-U",
                "alloc",
                "-D",
                data.to_str().unwrap(),
                "-R",
                "-c",
                "fast",
                "-X",
                "stream",
            ],
        );
        assert!(out.status.success(), "pg_basebackup failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Promotes this standby to a primary (`pg_ctl promote`, waiting until it accepts writes).
    pub fn promote(&mut self) {
        let data = self.dir.path().join("data");
        let out = run(&self.bin.join("pg_ctl"), &["-D", data.to_str().unwrap(), "-w", "-t", "30", "promote"]);
        assert!(out.status.success(), "pg_ctl promote failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Sets `synchronous_standby_names` (`ALTER SYSTEM`, then a reload): `*` makes every commit
    /// wait until a standby has flushed it, `''` turns synchronous replication off. Works on a
    /// standby too (it only writes `postgresql.auto.conf`).
    pub fn set_synchronous_standby_names(&self, value: &str) {
        self.psql(&format!("ALTER SYSTEM SET synchronous_standby_names = '{value}'"));
        self.psql("SELECT pg_reload_conf()");
    }

    /// `state sync_state` of each standby connected to this server (`pg_stat_replication`).
    pub fn replication(&self) -> Vec<String> {
        self.psql("SELECT state || ' ' || sync_state FROM pg_stat_replication").lines().map(str::to_owned).collect()
    }

    /// Stops (SIGSTOP) this primary's WAL senders: its standbys receive nothing more, as when one
    /// lags behind (a slow network or disk), while the primary goes on committing. Meant to be
    /// followed by [`Postgres::crash`] (SIGKILL ends stopped processes too); returns how many.
    pub fn pause_wal_senders(&self) -> usize {
        let pid_file = self.dir.path().join("data").join("postmaster.pid");
        let pid = std::fs::read_to_string(&pid_file).expect("postmaster.pid of a running server");
        let pid = pid.lines().next().unwrap_or_default().trim().to_owned();
        let children = Command::new("pgrep").args(["-P", &pid]).output().expect("pgrep");
        let senders: Vec<String> = String::from_utf8_lossy(&children.stdout)
            .split_whitespace()
            .filter(|child| {
                // The backend's title: `postgres: walsender alloc 127.0.0.1(port) streaming 0/...`.
                std::fs::read(format!("/proc/{child}/cmdline"))
                    .is_ok_and(|title| String::from_utf8_lossy(&title).starts_with("postgres: walsender"))
            })
            .map(str::to_owned)
            .collect();
        if !senders.is_empty() {
            let _ = Command::new("kill").arg("-STOP").args(&senders).status().expect("kill");
        }
        senders.len()
    }

    /// Waits until a standby streams from this server, synchronously when `synchronous`.
    pub fn wait_for_standby(&self, synchronous: bool) {
        let wanted = if synchronous { "streaming sync" } else { "streaming async" };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.replication().iter().any(|s| s == wanted) {
            assert!(Instant::now() < deadline, "no standby `{wanted}`: {:?}", self.replication());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if !self.stopped {
            let data = self.dir.path().join("data");
            let _ =
                run(&self.bin.join("pg_ctl"), &["-D", data.to_str().unwrap_or_default(), "-m", "immediate", "stop"]);
        }
    }
}
