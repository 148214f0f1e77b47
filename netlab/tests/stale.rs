//! Leftovers of a crashed run are removed; live labs are not. A test binary of its own, so that no
//! other test's `Lab::new` cleans the planted leftovers first. Needs root; skips loudly without it.

mod common;

use std::process::{Child, Command};

use common::netns_list;
use netlab::testing::lab_or_skip;
use netlab::{process_prefix, Lab};

fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().unwrap();
    assert!(output.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// Removes what the test planted, whatever happens to it.
struct Planted {
    namespaces: Vec<String>,
    children: Vec<Child>,
}

impl Drop for Planted {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for netns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", netns]).output();
        }
    }
}

#[test]
fn stale_namespaces_of_dead_processes_are_removed_and_live_ones_kept() {
    if !lab_or_skip("stale_namespaces_of_dead_processes_are_removed_and_live_ones_kept") {
        return;
    }
    // A pid that existed and is gone.
    let dead = {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    };
    assert!(!std::path::Path::new(&format!("/proc/{dead}")).exists());

    let switch = format!("netlab-{dead}-777-0-switch");
    let host = format!("netlab-{dead}-777-0-h-a");
    // This process's pid with another start time: the pid of a dead owner, reused.
    let reused = format!("netlab-{}-1-0-h-reused", std::process::id());
    // This process's own: alive, must stay.
    let live = format!("{}-999-h-live", process_prefix());
    let mut planted = Planted { namespaces: vec![], children: vec![] };
    for netns in [&switch, &host, &reused, &live] {
        ip(&["netns", "add", netns]);
        planted.namespaces.push(netns.clone());
    }
    ip(&["-n", &switch, "link", "add", "p0", "type", "veth", "peer", "name", "eth0", "netns", &host]);
    // A crashed run's child still inside: reported, not killed.
    let child = Command::new("ip").args(["netns", "exec", &host, "sleep", "30"]).spawn().unwrap();
    let child_pid = child.id();
    planted.children.push(child);
    // `ip netns exec` enters the namespace before exec'ing sleep: wait until it is inside.
    let deadline = std::time::Instant::now() + common::WAIT;
    loop {
        let out = Command::new("ip").args(["netns", "pids", &host]).output().unwrap();
        if String::from_utf8_lossy(&out.stdout).split_whitespace().any(|pid| pid == child_pid.to_string()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "sleep never entered {host}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    let cleanup = Lab::teardown_stale().unwrap();
    eprintln!("{cleanup:?}");
    let listed = netns_list();
    for netns in [&switch, &host, &reused] {
        assert!(cleanup.removed.contains(netns), "{netns} not removed: {cleanup:?}");
        assert!(!listed.contains(netns), "{netns} still listed");
    }
    assert!(listed.contains(&live), "a live process's namespace was removed");
    assert!(!cleanup.removed.contains(&live));
    assert!(cleanup.processes_left.contains(&(host.clone(), vec![child_pid])), "{cleanup:?}");

    // Idempotent: nothing of these is left to remove, and that is no error.
    let again = Lab::teardown_stale().unwrap();
    assert!(again.removed.iter().all(|netns| ![&switch, &host, &reused].contains(&netns)));
    // And Lab::new runs it too, leaving the live one.
    let lab = Lab::new(["a"]).unwrap();
    assert!(netns_list().contains(&live));
    drop(lab);
}
