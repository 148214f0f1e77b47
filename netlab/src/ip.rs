//! Running iproute2's `ip`. Shelling out keeps the setup readable (each step is the command one
//! would type) and its errors are the ones an operator knows.
//!
//! Only two shapes of command exist, so nothing here can touch the machine's own (root) namespace:
//! [`netns`] (`ip netns add|del|list|pids`, which manage the namespace files) and [`in_ns`]
//! (`ip -n <namespace> ...`, which acts inside one lab namespace).

use std::io;
use std::process::{Command, Output};

use crate::error::LabError;

/// Where `ip netns` keeps its namespace files (iproute2's `NETNS_RUN_DIR`).
pub(crate) const NETNS_DIR: &str = "/var/run/netns";

/// `ip netns <args>`.
pub(crate) fn netns(args: &[&str]) -> Result<String, LabError> {
    let mut all = vec!["netns"];
    all.extend_from_slice(args);
    run(&all)
}

/// `ip -n <namespace> <args>`: a command acting inside one namespace.
pub(crate) fn in_ns(namespace: &str, args: &[&str]) -> Result<String, LabError> {
    let mut all = vec!["-n", namespace];
    all.extend_from_slice(args);
    run(&all)
}

fn run(args: &[&str]) -> Result<String, LabError> {
    let command = format!("ip {}", args.join(" "));
    let output: Output = match Command::new("ip").args(args).output() {
        Ok(output) => output,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(LabError::IpMissing),
        Err(e) => return Err(LabError::io(format!("running `{command}`"), e)),
    };
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    Err(classify(command, output.status.to_string(), stderr))
}

/// Turns a failed command into the error that says what to do about it.
pub(crate) fn classify(command: String, status: String, stderr: String) -> LabError {
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("operation not permitted") || lower.contains("permission denied") {
        return LabError::not_allowed(&format!("`{command}`: {stderr}"));
    }
    // What iproute2 prints when the kernel has no such link type.
    if lower.contains("unknown device type") || lower.contains("not supported") {
        return LabError::Unsupported { command, stderr };
    }
    LabError::Command { command, status, stderr }
}

/// Whether an error only says that the thing to remove is already gone (teardown is idempotent).
pub(crate) fn is_already_gone(error: &LabError) -> bool {
    match error {
        LabError::Command { stderr, .. } => {
            let lower = stderr.to_ascii_lowercase();
            lower.contains("no such file")
                || lower.contains("cannot find device")
                || lower.contains("does not exist")
                || lower.contains("invalid netns name")
                || lower.contains("cannot open network namespace")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_errors_are_refusals_that_name_the_fix() {
        let error = classify(
            "ip netns add x".into(),
            "exit status: 1".into(),
            "mkdir /var/run/netns failed: Permission denied".into(),
        );
        let text = error.to_string();
        assert!(matches!(error, LabError::NotAllowed { .. }), "{text}");
        assert!(text.contains("CAP_SYS_ADMIN") && text.contains("CAP_NET_ADMIN"), "{text}");
        let error = classify(
            "ip netns add x".into(),
            "exit status: 1".into(),
            "mount --make-shared /run/netns failed: Operation not permitted".into(),
        );
        assert!(matches!(error, LabError::NotAllowed { .. }));
    }

    #[test]
    fn missing_link_types_say_which_modules() {
        let error = classify(
            "ip -n x link add br0 type bridge".into(),
            "exit status: 2".into(),
            "Error: Unknown device type.".into(),
        );
        assert!(matches!(error, LabError::Unsupported { .. }));
        assert!(error.to_string().contains("modprobe veth bridge"));
    }

    #[test]
    fn gone_is_recognised_for_idempotent_teardown() {
        let gone = classify(
            "ip netns del x".into(),
            "exit status: 1".into(),
            "Cannot remove namespace file \"/var/run/netns/x\": No such file or directory".into(),
        );
        assert!(is_already_gone(&gone));
        let other = classify("ip netns del x".into(), "exit status: 1".into(), "Device or resource busy".into());
        assert!(!is_already_gone(&other));
    }
}
