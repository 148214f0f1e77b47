//! Helpers shared by the lab tests.

#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest any single wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(20);

/// The namespaces `ip netns list` shows now.
pub fn netns_list() -> Vec<String> {
    let output = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    assert!(output.status.success(), "ip netns list: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Accepts one connection, giving up after `timeout` (a test must never hang in accept).
pub fn accept_within(listener: &TcpListener, timeout: Duration) -> io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// An echo server: accepts up to `connections` connections (each within `WAIT`), echoing each on a
/// thread of its own until EOF or an error (reads time out after 60 s, so nothing lingers).
pub fn echo_server(listener: TcpListener, connections: usize) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for _ in 0..connections {
            let Ok(mut stream) = accept_within(&listener, WAIT) else { return };
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
                let _ = stream.set_nodelay(true);
                let mut buffer = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    })
}

/// Sends `message` and reads as many bytes back, within `WAIT`.
pub fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Vec<u8> {
    stream.set_read_timeout(Some(WAIT)).expect("read timeout");
    stream.write_all(message).expect("write");
    let mut back = vec![0u8; message.len()];
    stream.read_exact(&mut back).expect("echo within the wait");
    back
}

/// One `read`, again if interrupted: a blocking read with a timeout (SO_RCVTIMEO) is not restarted
/// after a signal or a freeze of the process (on a shared machine, e.g. a cgroup freezer), it fails
/// with EINTR, which says nothing about the network.
pub fn read_once(stream: &mut TcpStream, buffer: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buffer) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}
