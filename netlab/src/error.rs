//! The crate's errors: what a lab or a proxy could not do, and, for a refusal, what is missing and
//! how to fix it.

use std::io;
use std::net::SocketAddr;

/// Why a [`crate::Lab`] (or a thread in one of its namespaces) could not be set up or changed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The process may not create or enter network namespaces.
    #[error("network namespaces are not allowed here: missing {missing}; fix: {fix}")]
    NotAllowed {
        /// What is missing (root, or the capabilities).
        missing: String,
        /// How to get it.
        fix: String,
    },
    /// iproute2's `ip` is not on `PATH`.
    #[error("`ip` (iproute2) was not found on PATH; install iproute2 (apt-get install iproute2)")]
    IpMissing,
    /// The kernel lacks something the lab needs (veth, bridge).
    #[error("the kernel refused `{command}`: {stderr}; the lab needs network namespaces, veth and bridge support (modprobe veth bridge)")]
    Unsupported {
        /// The `ip` command line.
        command: String,
        /// What `ip` said.
        stderr: String,
    },
    /// An `ip` command failed for another reason.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The `ip` command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// A host name the lab cannot use.
    #[error("invalid host name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// More hosts than the lab's /24 holds, or none.
    #[error("a lab holds 1 to {max} hosts, not {count}")]
    HostCount {
        /// Hosts asked for.
        count: usize,
        /// The most a lab holds.
        max: usize,
    },
    /// No host of that name in this lab.
    #[error("no host named {0:?} in this lab")]
    NoSuchHost(String),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The closure run on a thread in a namespace panicked.
    #[error("the thread running in namespace {netns} panicked")]
    ThreadPanicked {
        /// The namespace.
        netns: String,
    },
}

impl LabError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        LabError::Io { context: context.into(), source }
    }

    /// The refusal for this process: as a non-root user the fix is root; as root without the
    /// capabilities (a container without them) it is the capabilities.
    pub(crate) fn not_allowed(detail: &str) -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            LabError::NotAllowed {
                missing: format!("root (running as uid {euid}; {detail})"),
                fix: "run as root (e.g. sudo), or grant CAP_SYS_ADMIN and CAP_NET_ADMIN".into(),
            }
        } else {
            LabError::NotAllowed {
                missing: format!("CAP_SYS_ADMIN and CAP_NET_ADMIN (running as root without them; {detail})"),
                fix: "needs CAP_SYS_ADMIN and CAP_NET_ADMIN: in a container, --cap-add SYS_ADMIN --cap-add NET_ADMIN (or --privileged)".into(),
            }
        }
    }
}

/// Why a [`crate::DelayProxy`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Its listening socket could not be bound.
    #[error("proxy cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Its thread or runtime could not be created.
    #[error("proxy runtime: {0}")]
    Runtime(#[source] io::Error),
    /// Entering the host's namespace failed.
    #[error(transparent)]
    Lab(#[from] LabError),
    /// Its thread ended before saying whether it listens (it panicked).
    #[error("proxy thread ended before it started listening")]
    Exited,
}
