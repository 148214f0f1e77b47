//! A sub-millisecond sleep for the proxy: a `timerfd` polled by tokio.
//!
//! tokio's own timer has a 1 ms tick and rounds deadlines up to it, so a 1 ms delay would come out
//! anywhere between 1 and 2 ms, and a round trip through the proxy up to 2 ms longer than asked.
//! A timerfd fires within microseconds of its deadline and wakes the runtime through epoll like any
//! socket.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// One timer, re-armed for each deadline; one per proxy direction.
pub(crate) struct PreciseTimer {
    fd: AsyncFd<OwnedFd>,
}

impl PreciseTimer {
    /// Must be called inside a tokio runtime (the descriptor is registered with its reactor).
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked before use.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor just created and owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an OwnedFd keeps its descriptor open, and the same, for as long as the AsyncFd
        // owns it.
        let fd = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }.map_err(io::Error::from)?;
        Ok(PreciseTimer { fd })
    }

    /// Waits until `due` (at once if it has passed).
    pub(crate) async fn sleep_until(&mut self, due: Instant) -> io::Result<()> {
        let wait = due.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            // Also: a zero it_value would disarm the timer rather than fire it.
            return Ok(());
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(wait.as_secs()).unwrap_or(libc::time_t::MAX),
                // Below 10^9, so it fits a c_long of any width (a 32-bit one too).
                tv_nsec: wait.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec; the old value is not asked for (null). Arming the
        // timer also resets its expiry count, so an expiry left over from a cancelled wait cannot
        // end this one early.
        let rc = unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        loop {
            let mut guard = self.fd.readable().await?;
            let read = guard.try_io(|inner| {
                let mut expirations = [0u8; 8];
                // SAFETY: reads at most 8 bytes into an 8-byte buffer from an open descriptor.
                let n = unsafe { libc::read(inner.as_raw_fd(), expirations.as_mut_ptr().cast(), expirations.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match read {
                Ok(result) => return result,
                // Readiness was stale (EAGAIN): try_io cleared it; wait again.
                Err(_would_block) => continue,
            }
        }
    }
}
