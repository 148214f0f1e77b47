//! Where namespaces are not allowed the lab refuses clearly: run as an unprivileged user (through
//! `setpriv`, when this runs as root), `Lab::available` and `Lab::new` say what is missing and the fix.

use std::process::Command;

use netlab::{Lab, LabError};

const CHILD_ENV: &str = "NETLAB_REFUSAL_CHILD";

/// What the unprivileged process checks.
fn check_refusal() {
    let error = Lab::available().unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, LabError::NotAllowed { .. }), "{text}");
    assert!(text.contains("run as root"), "{text}");
    let error = Lab::new(["a"]).unwrap_err();
    assert!(matches!(error, LabError::NotAllowed { .. }), "{error}");
    println!("refusal checked: {text}");
}

#[test]
fn refuses_clearly_without_privileges() {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if std::env::var_os(CHILD_ENV).is_some() {
        check_refusal();
        return;
    }
    if euid != 0 {
        // Already unprivileged: refused here (unless granted the capabilities, then nothing to check).
        if Lab::available().is_err() {
            check_refusal();
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let output = match Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&exe)
        .args(["--exact", "refuses_clearly_without_privileges", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            eprintln!("\n==== SKIPPED refuses_clearly_without_privileges: cannot run setpriv ({e}) ====\n");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(output.status.success(), "as uid 65534: {stdout}\n{stderr}");
    assert!(stdout.contains("refusal checked"), "{stdout}\n{stderr}");
}
