//! CPU accounting from `/proc` (Linux), in clock ticks: what the agents benches charge to each
//! process and thread.

#![allow(dead_code)]

use std::path::Path;

/// Fields 14-17 of `/proc/<pid>/stat` or `/proc/<pid>/task/<tid>/stat`: utime, stime, cutime,
/// cstime (0s for a process that is gone). The name (field 2) may hold spaces: the fields are
/// counted after its closing parenthesis.
fn times(stat: &Path) -> [u64; 4] {
    let Ok(text) = std::fs::read_to_string(stat) else { return [0; 4] };
    let Some(rest) = text.rfind(')').map(|i| &text[i + 1..]) else { return [0; 4] };
    let fields: Vec<u64> = rest.split_whitespace().skip(11).take(4).filter_map(|f| f.parse().ok()).collect();
    std::array::from_fn(|i| fields.get(i).copied().unwrap_or(0))
}

fn name(stat: &Path) -> String {
    let text = std::fs::read_to_string(stat).unwrap_or_default();
    match (text.find('('), text.rfind(')')) {
        (Some(open), Some(close)) if open < close => text[open + 1..close].to_owned(),
        _ => String::new(),
    }
}

/// User + system time of process `pid` (all its threads).
pub fn process(pid: u32) -> u64 {
    let [user, system, ..] = times(Path::new(&format!("/proc/{pid}/stat")));
    user + system
}

/// User + system time of the threads of `pid` named `thread` (as `/proc` shortens it).
pub fn thread(pid: u32, thread: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .map(|task| task.path().join("stat"))
        .filter(|stat| {
            // `/proc` keeps the first 15 bytes of a thread's name.
            let name = name(stat);
            name == thread || (name.len() == 15 && thread.starts_with(&name))
        })
        .map(|stat| {
            let [user, system, ..] = times(&stat);
            user + system
        })
        .sum()
}

/// User + system time of process `pid`, of its living children, and of those it reaped (a
/// PostgreSQL cluster: the postmaster and its backends).
pub fn tree(pid: u32) -> u64 {
    let [user, system, children_user, children_system] = times(Path::new(&format!("/proc/{pid}/stat")));
    let living: u64 = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|child| parent(*child) == Some(pid))
        .map(process)
        .sum();
    user + system + children_user + children_system + living
}

fn parent(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux if it cannot be asked).
pub fn ticks_per_s() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}
