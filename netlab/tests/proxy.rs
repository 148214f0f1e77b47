//! The delay proxy on loopback (no privileges needed): round trips take at least twice the one-way
//! delay, bytes arrive intact and in order under jitter, cut / heal / close_all, counters.
//! Wall-clock assertions are lower bounds only: the machine is shared.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use netlab::{DelayProxy, ProxyConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(30);
const MS: Duration = Duration::from_millis(1);

fn any_loopback_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// An echo server on loopback; echoes every connection until EOF.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind(any_loopback_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    addr
}

async fn connect(addr: SocketAddr) -> TcpStream {
    let stream = timeout(WAIT, TcpStream::connect(addr)).await.unwrap().unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> Vec<u8> {
    stream.write_all(message).await.unwrap();
    let mut back = vec![0u8; message.len()];
    timeout(WAIT, stream.read_exact(&mut back)).await.unwrap().unwrap();
    back
}

/// Waits (bounded) until `check` holds: the proxy counts a chunk just after writing it.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(MS).await;
    }
}

/// Seeded bytes (SplitMix64), so a failure is reproducible.
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        bytes.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// Writes `data` in pieces of varied sizes (many chunks, each with its own jitter), then FIN.
async fn write_in_pieces(stream: &mut (impl AsyncWriteExt + Unpin), data: &[u8], seed: u64) {
    let sizes = random_bytes(data.len() / 100 + 1, seed);
    let mut offset = 0;
    let mut size_index = 0;
    while offset < data.len() {
        let piece = 1 + usize::from(sizes[size_index % sizes.len()]) * 40;
        size_index += 1;
        let end = (offset + piece).min(data.len());
        stream.write_all(&data[offset..end]).await.unwrap();
        offset = end;
    }
    stream.shutdown().await.unwrap();
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

#[tokio::test]
async fn round_trips_take_at_least_twice_the_one_way_delay() {
    let echo = echo_server().await;
    let proxy = DelayProxy::start(any_loopback_port(), echo, ProxyConfig::delay(MS)).unwrap();
    let mut client = connect(proxy.local_addr()).await;
    let mut direct = connect(echo).await;

    for (jitter, label) in [(Duration::ZERO, "1 ms each way"), (MS, "1 ms + U[0, 1 ms] each way")] {
        proxy.set_delay(MS, jitter);
        let mut times = Vec::new();
        let mut direct_times = Vec::new();
        for i in 0..50u8 {
            let started = Instant::now();
            assert_eq!(round_trip(&mut client, &[i]).await, [i]);
            times.push(started.elapsed());
            let started = Instant::now();
            assert_eq!(round_trip(&mut direct, &[i]).await, [i]);
            direct_times.push(started.elapsed());
        }
        times.sort();
        direct_times.sort();
        eprintln!(
            "{label}: round trip min {:?} median {:?} max {:?} (direct median {:?})",
            times[0], times[25], times[49], direct_times[25]
        );
        assert!(times[0] >= 2 * MS, "a round trip took {:?}, less than twice the one-way delay", times[0]);
    }
    assert_eq!(proxy.stats().connections_accepted, 1);
}

#[tokio::test]
async fn bytes_arrive_intact_and_in_order_both_ways_under_jitter() {
    let up = random_bytes(4 << 20, 1);
    let down = random_bytes((4 << 20) + 12_345, 2);

    // A server that sends its own buffer while it reads the client's.
    let listener = TcpListener::bind(any_loopback_port()).await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    let server_sends = down.clone();
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (mut read, mut write) = stream.into_split();
        let sending = tokio::spawn(async move { write_in_pieces(&mut write, &server_sends, 3).await });
        let mut received = Vec::new();
        read.read_to_end(&mut received).await.unwrap();
        sending.await.unwrap();
        received
    });

    let config = ProxyConfig::delay(MS).with_jitter(3 * MS).with_seed(44);
    let proxy = DelayProxy::start(any_loopback_port(), server_addr, config).unwrap();
    let client = connect(proxy.local_addr()).await;
    let (mut read, mut write) = client.into_split();
    let client_sends = up.clone();
    let sending = tokio::spawn(async move { write_in_pieces(&mut write, &client_sends, 4).await });
    let mut received = Vec::new();
    timeout(WAIT, read.read_to_end(&mut received)).await.unwrap().unwrap();
    timeout(WAIT, sending).await.unwrap().unwrap();
    let server_received = timeout(WAIT, server).await.unwrap().unwrap();

    assert_eq!(first_difference(&received, &down), None, "server -> client bytes differ");
    assert_eq!(first_difference(&server_received, &up), None, "client -> server bytes differ");
    let stats = proxy.stats();
    assert_eq!(stats.bytes_to_upstream, up.len() as u64);
    assert_eq!(stats.bytes_to_client, down.len() as u64);
    eventually("the connection closes", || proxy.stats().connections_active == 0).await;
}

#[tokio::test]
async fn cut_holds_bytes_and_new_connections_until_healed() {
    let echo = echo_server().await;
    let proxy = DelayProxy::start(any_loopback_port(), echo, ProxyConfig::default()).unwrap();
    let mut open = connect(proxy.local_addr()).await;
    assert_eq!(round_trip(&mut open, b"a").await, b"a");

    proxy.cut();
    assert!(proxy.is_cut());
    open.write_all(b"b").await.unwrap();
    let mut byte = [0u8; 1];
    assert!(timeout(Duration::from_millis(300), open.read_exact(&mut byte)).await.is_err(), "forwarded while cut");
    // Accepted, but nothing goes through, not even the connect upstream.
    let mut late = connect(proxy.local_addr()).await;
    late.write_all(b"c").await.unwrap();
    assert!(timeout(Duration::from_millis(300), late.read_exact(&mut byte)).await.is_err(), "forwarded while cut");
    eventually("both accepted", || proxy.stats().connections_accepted == 2).await;
    assert_eq!(proxy.stats().bytes_to_upstream, 1, "only the byte before the cut");

    proxy.heal();
    timeout(WAIT, open.read_exact(&mut byte)).await.unwrap().unwrap();
    assert_eq!(&byte, b"b");
    timeout(WAIT, late.read_exact(&mut byte)).await.unwrap().unwrap();
    assert_eq!(&byte, b"c");
    eventually("all counted", || proxy.stats().bytes_to_client == 3).await;
}

#[tokio::test]
async fn close_all_resets_open_connections_and_the_proxy_goes_on() {
    let echo = echo_server().await;
    let proxy = DelayProxy::start(any_loopback_port(), echo, ProxyConfig::delay(MS)).unwrap();
    let mut first = connect(proxy.local_addr()).await;
    assert_eq!(round_trip(&mut first, b"x").await, b"x");
    proxy.close_all();
    let mut byte = [0u8; 1];
    let error = timeout(WAIT, first.read(&mut byte)).await.unwrap().unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    eventually("closed", || proxy.stats().connections_active == 0).await;

    let mut second = connect(proxy.local_addr()).await;
    assert_eq!(round_trip(&mut second, b"y").await, b"y");
    assert_eq!(proxy.stats().connections_accepted, 2);
}

#[tokio::test]
async fn an_unreachable_upstream_resets_the_client_and_is_counted() {
    // A port that was just free: nothing listens there.
    let closed = {
        let listener = std::net::TcpListener::bind(any_loopback_port()).unwrap();
        listener.local_addr().unwrap()
    };
    let proxy = DelayProxy::start(any_loopback_port(), closed, ProxyConfig::default()).unwrap();
    // The reset can come so soon that the connect itself reports it (SO_ERROR), or else the read.
    let outcome = match timeout(WAIT, TcpStream::connect(proxy.local_addr())).await.unwrap() {
        Ok(mut client) => {
            let mut byte = [0u8; 1];
            timeout(WAIT, client.read(&mut byte)).await.unwrap()
        }
        Err(e) => Err(e),
    };
    assert!(matches!(outcome, Err(ref e) if e.kind() == std::io::ErrorKind::ConnectionReset), "{outcome:?}");
    eventually("counted", || proxy.stats().upstream_failures == 1).await;
}

#[tokio::test]
async fn a_dropped_proxy_stops_listening() {
    let echo = echo_server().await;
    let proxy = DelayProxy::start(any_loopback_port(), echo, ProxyConfig::default()).unwrap();
    let addr = proxy.local_addr();
    assert_ne!(addr.port(), 0);
    drop(proxy);
    let refused = timeout(WAIT, TcpStream::connect(addr)).await.unwrap();
    assert!(refused.is_err(), "still accepting after drop");
}

#[test]
fn a_bind_failure_is_reported() {
    let taken = std::net::TcpListener::bind(any_loopback_port()).unwrap();
    let addr = taken.local_addr().unwrap();
    let error = DelayProxy::start(addr, addr, ProxyConfig::default()).unwrap_err();
    assert!(matches!(error, netlab::ProxyError::Bind { .. }), "{error}");
}
