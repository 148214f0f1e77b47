//! Running Rust code of this process inside a network namespace.
//!
//! A Linux thread's network namespace is its own: `setns(2)` with `CLONE_NEWNET` moves only the
//! calling thread, and a thread inherits the namespace of the thread that spawned it. So the code
//! runs on a fresh thread that enters the namespace first; the caller's threads (the test's main
//! thread, a tokio runtime's workers) stay where they are. A socket belongs to the namespace it was
//! created in for its whole life, whichever thread later uses it: a listener or a `TcpSocket`
//! created on such a thread can be handed back and used from anywhere (see [`crate::Host::run`]).

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::thread::JoinHandle;

use crate::error::LabError;
use crate::ip::NETNS_DIR;

/// A thread running in a host's namespace; [`NsThread::join`] waits for its result.
///
/// Dropping it detaches the thread (like [`std::thread::JoinHandle`]); a thread still running keeps
/// its namespace alive after the lab is dropped (the namespace only disappears from `ip netns
/// list`), so end such threads before dropping the lab.
#[derive(Debug)]
pub struct NsThread<T> {
    handle: JoinHandle<Result<T, LabError>>,
    netns: String,
}

impl<T> NsThread<T> {
    /// Waits for the thread: its value, or why it could not enter the namespace, or that it panicked.
    pub fn join(self) -> Result<T, LabError> {
        match self.handle.join() {
            Ok(result) => result,
            Err(_) => Err(LabError::ThreadPanicked { netns: self.netns }),
        }
    }

    /// Whether the thread has ended.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The namespace it runs in.
    pub fn netns(&self) -> &str {
        &self.netns
    }
}

/// Opens a namespace's file; the descriptor is what `setns` takes. Opened by the caller, before the
/// thread starts, so that a namespace already removed is reported at once.
pub(crate) fn open(netns: &str) -> Result<File, LabError> {
    let path = Path::new(NETNS_DIR).join(netns);
    File::open(&path).map_err(|e| LabError::io(format!("opening network namespace {}", path.display()), e))
}

/// Moves the calling thread into the namespace of `file`.
pub(crate) fn enter(file: &File, netns: &str) -> Result<(), LabError> {
    // SAFETY: the descriptor is open for the duration of the call (borrowed from `file`);
    // CLONE_NEWNET restricts it to network namespaces, which a multi-threaded process may enter.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EPERM) {
        return Err(LabError::not_allowed(&format!("setns into {netns}: {error}")));
    }
    Err(LabError::io(format!("setns into network namespace {netns}"), error))
}

/// Spawns a thread that enters `netns` and then runs `f`.
pub(crate) fn spawn<T, F>(netns: &str, f: F) -> Result<NsThread<T>, LabError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_fallible(netns, move || Ok(f()))
}

/// Spawns a thread that enters `netns`, builds a current-thread tokio runtime there and runs the
/// future `f` makes to completion. The future is made on that thread, so it need not be `Send`.
pub(crate) fn spawn_async<F, Fut>(netns: &str, f: F) -> Result<NsThread<Fut::Output>, LabError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    Fut::Output: Send + 'static,
{
    let owner = netns.to_owned();
    spawn_fallible(netns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LabError::io(format!("building a tokio runtime in namespace {owner}"), e))?;
        Ok(runtime.block_on(f()))
    })
}

fn spawn_fallible<T, F>(netns: &str, f: F) -> Result<NsThread<T>, LabError>
where
    F: FnOnce() -> Result<T, LabError> + Send + 'static,
    T: Send + 'static,
{
    let file = open(netns)?;
    let name = netns.to_owned();
    let handle = std::thread::Builder::new()
        .name(format!("netns {netns}"))
        .spawn(move || {
            enter(&file, &name)?;
            drop(file);
            f()
        })
        .map_err(|e| LabError::io(format!("spawning a thread for namespace {netns}"), e))?;
    Ok(NsThread { handle, netns: netns.to_owned() })
}
