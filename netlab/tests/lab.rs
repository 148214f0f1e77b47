//! Hosts in their own namespaces: TCP across the switch, partitions by link, what a thread in a
//! namespace sees, teardown, and the delay proxy between hosts. Needs root; skips loudly without
//! it (fails instead with NETLAB_REQUIRE=1).

mod common;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::{echo_server, netns_list, read_once, round_trip, WAIT};
use netlab::testing::lab_or_skip;
use netlab::{DelayProxy, Lab, LabError, ProxyConfig};

#[test]
fn two_hosts_talk_tcp_across_the_switch_each_with_its_own_address() {
    if !lab_or_skip("two_hosts_talk_tcp_across_the_switch_each_with_its_own_address") {
        return;
    }
    let lab = Lab::new(["a", "b"]).unwrap();
    let (a, b) = (lab["a"].clone(), lab["b"].clone());
    assert_ne!(a.address(), b.address());
    assert_eq!(a.address().octets()[..3], lab.network().octets()[..3]);

    let listener = b.bind_tcp(7000).unwrap();
    let server = std::thread::spawn(move || {
        let mut stream = common::accept_within(&listener, WAIT).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let mut buffer = [0u8; 5];
        stream.read_exact(&mut buffer).unwrap();
        stream.write_all(&buffer).unwrap();
        stream.peer_addr().unwrap()
    });
    let mut client = a.connect_tcp(b.socket_addr(7000), WAIT).unwrap();
    assert_eq!(round_trip(&mut client, b"hello"), b"hello");
    let peer = server.join().unwrap();
    assert_eq!(peer.ip(), a.address(), "b sees a by a's own address");
}

#[test]
fn a_host_has_lo_and_eth0_only_and_no_way_out() {
    if !lab_or_skip("a_host_has_lo_and_eth0_only_and_no_way_out") {
        return;
    }
    let lab = Lab::new(["a"]).unwrap();
    let a = lab["a"].clone();

    // The thread's own namespace (not the process's): /proc/thread-self.
    let devices = a.run(|| std::fs::read_to_string("/proc/thread-self/net/dev")).unwrap().unwrap();
    let mut names: Vec<&str> =
        devices.lines().skip(2).filter_map(|line| line.split(':').next()).map(str::trim).collect();
    names.sort_unstable();
    assert_eq!(names, ["eth0", "lo"], "{devices}");

    // Loopback is up.
    let looped = a
        .run(|| -> io::Result<()> {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let addr = listener.local_addr()?;
            let _client = std::net::TcpStream::connect_timeout(&addr, WAIT)?;
            listener.accept().map(|_| ())
        })
        .unwrap();
    looped.unwrap();

    // The address exists only inside: the test's own thread (the machine's namespace) cannot bind it.
    let outside = TcpListener::bind(a.socket_addr(0)).unwrap_err();
    assert_eq!(outside.kind(), io::ErrorKind::AddrNotAvailable, "{outside}");

    // No default route: anything off the lab's /24 (here TEST-NET-3) is unreachable at once,
    // nothing is sent.
    let target: SocketAddr = "203.0.113.1:9".parse().unwrap();
    let error =
        a.run(move || std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2))).unwrap().unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc::ENETUNREACH), "{error}");
}

#[tokio::test]
async fn sockets_made_in_a_host_serve_any_runtime_and_spawn_async_runs_inside() {
    if !lab_or_skip("sockets_made_in_a_host_serve_any_runtime_and_spawn_async_runs_inside") {
        return;
    }
    let lab = Lab::new(["a", "b"]).unwrap();
    let (a, b) = (lab["a"].clone(), lab["b"].clone());

    // A server on its own runtime inside b.
    let b_addr = b.socket_addr(7100);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = b
        .spawn_async(move || async move {
            let listener = tokio::net::TcpListener::bind(b_addr).await?;
            let _ = ready_tx.send(());
            let (mut stream, peer) = tokio::time::timeout(WAIT, listener.accept()).await??;
            use tokio::io::AsyncWriteExt;
            stream.write_all(b"from b").await?;
            io::Result::Ok(peer)
        })
        .unwrap();
    ready_rx.recv_timeout(WAIT).unwrap();

    // A socket of a's, connected from this test's runtime.
    let socket = a.tcp_socket().unwrap();
    let mut stream = tokio::time::timeout(WAIT, socket.connect(b_addr)).await.unwrap().unwrap();
    let mut text = Vec::new();
    use tokio::io::AsyncReadExt;
    tokio::time::timeout(WAIT, stream.read_to_end(&mut text)).await.unwrap().unwrap();
    assert_eq!(text, b"from b");
    let peer = tokio::task::spawn_blocking(move || server.join()).await.unwrap().unwrap().unwrap();
    assert_eq!(peer.ip(), a.address());
}

#[test]
fn link_down_partitions_a_host_and_link_up_heals_it() {
    if !lab_or_skip("link_down_partitions_a_host_and_link_up_heals_it") {
        return;
    }
    let lab = Lab::new(["a", "b"]).unwrap();
    let (a, b) = (lab["a"].clone(), lab["b"].clone());
    let server = echo_server(b.bind_tcp(7000).unwrap(), 2);
    let mut client = a.connect_tcp(b.socket_addr(7000), WAIT).unwrap();
    assert_eq!(round_trip(&mut client, b"1"), b"1");

    lab.link_down("b").unwrap();
    // Sent into the void: no answer, and no error either (the bytes wait for retransmission).
    client.write_all(b"2").unwrap();
    client.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut byte = [0u8; 1];
    let silent = read_once(&mut client, &mut byte).unwrap_err();
    assert!(matches!(silent.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{silent}");
    // A new connection's SYNs vanish too: it times out (not refused, not unreachable).
    let started = Instant::now();
    match a.connect_tcp(b.socket_addr(7000), Duration::from_secs(1)) {
        Err(LabError::Io { source, .. }) => assert_eq!(source.kind(), io::ErrorKind::TimedOut, "{source}"),
        other => panic!("a connect across a partition must time out, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(900));
    // The other direction too: b cannot reach a.
    let reverse = a.bind_tcp(7001).unwrap();
    assert!(b.connect_tcp(a.socket_addr(7001), Duration::from_millis(500)).is_err());
    drop(reverse);

    lab.link_up("b").unwrap();
    // TCP retransmits what was sent during the partition; the echo comes back.
    client.set_read_timeout(Some(WAIT)).unwrap();
    client.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"2");
    let mut fresh = a.connect_tcp(b.socket_addr(7000), WAIT).unwrap();
    assert_eq!(round_trip(&mut fresh, b"3"), b"3");
    drop((client, fresh));
    server.join().unwrap();
}

fn set_int_option(stream: &impl AsRawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: a valid socket and a c_int option value of the right size.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt {level}/{name}: {}", io::Error::last_os_error());
}

/// Hosts `a` and `b`, an echo server on `b`, and a connection from `a` to it that has made a round
/// trip.
fn connected_pair() -> (Lab, std::thread::JoinHandle<()>, TcpStream) {
    let lab = Lab::new(["a", "b"]).unwrap();
    let (a, b) = (lab["a"].clone(), lab["b"].clone());
    let server = echo_server(b.bind_tcp(7000).unwrap(), 1);
    let mut client = a.connect_tcp(b.socket_addr(7000), WAIT).unwrap();
    assert_eq!(round_trip(&mut client, b"x"), b"x");
    (lab, server, client)
}

#[test]
fn keepalives_fire_across_a_partition() {
    if !lab_or_skip("keepalives_fire_across_a_partition") {
        return;
    }
    let (lab, _server, mut client) = connected_pair();
    // Probe after 1 s idle, every 1 s, give up after 2 unanswered.
    set_int_option(&client, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set_int_option(&client, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 1);
    set_int_option(&client, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1);
    set_int_option(&client, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 2);

    lab.link_down("b").unwrap();
    let started = Instant::now();
    client.set_read_timeout(Some(WAIT)).unwrap();
    let mut byte = [0u8; 1];
    let error = read_once(&mut client, &mut byte).unwrap_err();
    eprintln!("keepalive gave up after {:?}: {error}", started.elapsed());
    assert_eq!(error.raw_os_error(), Some(libc::ETIMEDOUT), "the keepalive, not the read timeout, ends it: {error}");
}

#[test]
fn retransmissions_time_out_across_a_partition() {
    if !lab_or_skip("retransmissions_time_out_across_a_partition") {
        return;
    }
    let (lab, _server, mut client) = connected_pair();
    // Unacknowledged data for 1.5 s ends the connection.
    set_int_option(&client, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 1500);

    lab.link_down("b").unwrap();
    let started = Instant::now();
    client.write_all(b"lost").unwrap();
    client.set_read_timeout(Some(WAIT)).unwrap();
    let mut byte = [0u8; 1];
    let error = read_once(&mut client, &mut byte).unwrap_err();
    eprintln!("retransmissions gave up after {:?}: {error}", started.elapsed());
    assert_eq!(error.raw_os_error(), Some(libc::ETIMEDOUT), "{error}");
    assert!(started.elapsed() >= Duration::from_millis(1400));
}

#[test]
fn dropping_the_lab_removes_its_namespaces_even_with_threads_inside() {
    if !lab_or_skip("dropping_the_lab_removes_its_namespaces_even_with_threads_inside") {
        return;
    }
    let lab = Lab::new(["x", "y", "z"]).unwrap();
    let namespaces = lab.namespaces();
    assert_eq!(namespaces.len(), 4);
    let listed = netns_list();
    for netns in &namespaces {
        assert!(netns.starts_with(lab.prefix()), "{netns}");
        assert!(listed.contains(netns), "{netns} not in {listed:?}");
    }
    // A thread still inside a namespace does not stop the teardown.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let lingering = lab["y"].spawn(move || stop_rx.recv_timeout(WAIT)).unwrap();
    drop(lab);
    let listed = netns_list();
    for netns in &namespaces {
        assert!(!listed.contains(netns), "{netns} still listed after drop");
    }
    stop_tx.send(()).unwrap();
    lingering.join().unwrap().unwrap();

    // The explicit teardown says it went well.
    let lab = Lab::new(["only"]).unwrap();
    let namespaces = lab.namespaces();
    lab.teardown().unwrap();
    let listed = netns_list();
    assert!(namespaces.iter().all(|netns| !listed.contains(netns)));
}

#[test]
fn bad_names_are_refused_before_anything_is_created() {
    // No privileges needed: the names are checked first.
    assert!(matches!(Lab::new(["a b"]), Err(LabError::InvalidName { .. })));
    assert!(matches!(Lab::new(["a", "a"]), Err(LabError::InvalidName { .. })));
    assert!(matches!(Lab::new(Vec::<String>::new()), Err(LabError::HostCount { .. })));
}

#[test]
fn the_proxy_between_hosts_adds_its_delay_and_a_partition_still_works() {
    if !lab_or_skip("the_proxy_between_hosts_adds_its_delay_and_a_partition_still_works") {
        return;
    }
    let lab = Lab::new(["client", "db"]).unwrap();
    let (client, db) = (lab["client"].clone(), lab["db"].clone());
    let server = echo_server(db.bind_tcp(5432).unwrap(), 2);
    // On the database's host: agents reach the database through 15432, 1 ms each way.
    let proxy = DelayProxy::start_in(
        &db,
        db.socket_addr(15432),
        db.socket_addr(5432),
        ProxyConfig::delay(Duration::from_millis(1)),
    )
    .unwrap();
    assert_eq!(proxy.local_addr(), db.socket_addr(15432));

    let mut direct = client.connect_tcp(db.socket_addr(5432), WAIT).unwrap();
    direct.set_nodelay(true).unwrap();
    let mut proxied = client.connect_tcp(proxy.local_addr(), WAIT).unwrap();
    proxied.set_nodelay(true).unwrap();
    let mut direct_times = Vec::new();
    let mut proxied_times = Vec::new();
    for i in 0..30u8 {
        let started = Instant::now();
        assert_eq!(round_trip(&mut direct, &[i]), [i]);
        direct_times.push(started.elapsed());
        let started = Instant::now();
        assert_eq!(round_trip(&mut proxied, &[i]), [i]);
        proxied_times.push(started.elapsed());
    }
    direct_times.sort();
    proxied_times.sort();
    eprintln!(
        "round trip client -> db: direct median {:?}; through the 1 ms proxy min {:?} median {:?} max {:?}",
        direct_times[15], proxied_times[0], proxied_times[15], proxied_times[29]
    );
    assert!(proxied_times[0] >= Duration::from_millis(2), "{:?}", proxied_times[0]);

    // The client's link down: the proxy's connection to it is partitioned like any other.
    lab.link_down("client").unwrap();
    proxied.write_all(b"p").unwrap();
    proxied.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut byte = [0u8; 1];
    assert!(read_once(&mut proxied, &mut byte).is_err());
    lab.link_up("client").unwrap();
    proxied.set_read_timeout(Some(WAIT)).unwrap();
    proxied.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"p");
    let stats = proxy.stats();
    assert_eq!(stats.connections_accepted, 1);
    assert_eq!(stats.bytes_to_upstream, 31);
    drop((direct, proxied));
    drop(proxy);
    server.join().unwrap();
}

#[test]
fn a_pairwise_partition_cuts_one_path_and_leaves_the_others() {
    if !lab_or_skip("a_pairwise_partition_cuts_one_path_and_leaves_the_others") {
        return;
    }
    let lab = Lab::new(["agent", "db", "client"]).unwrap();
    let (agent, db, client) = (lab["agent"].clone(), lab["db"].clone(), lab["client"].clone());
    let db_server = echo_server(db.bind_tcp(5432).unwrap(), 2);
    let agent_server = echo_server(agent.bind_tcp(8080).unwrap(), 1);
    let mut to_db = agent.connect_tcp(db.socket_addr(5432), WAIT).unwrap();
    assert_eq!(round_trip(&mut to_db, b"1"), b"1");

    lab.partition("agent", "db").unwrap();
    to_db.write_all(b"2").unwrap();
    to_db.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut byte = [0u8; 1];
    assert!(read_once(&mut to_db, &mut byte).is_err(), "the agent still hears the database");
    assert!(agent.connect_tcp(db.socket_addr(5432), Duration::from_millis(500)).is_err());
    // The other paths are untouched: the client reaches the agent, and the database.
    let mut to_agent = client.connect_tcp(agent.socket_addr(8080), WAIT).unwrap();
    assert_eq!(round_trip(&mut to_agent, b"c"), b"c");
    let mut client_to_db = client.connect_tcp(db.socket_addr(5432), WAIT).unwrap();
    assert_eq!(round_trip(&mut client_to_db, b"d"), b"d");

    lab.heal_partition("agent", "db").unwrap();
    to_db.set_read_timeout(Some(WAIT)).unwrap();
    to_db.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"2", "retransmitted after the heal");
    assert!(matches!(lab.partition("db", "db"), Err(LabError::InvalidName { .. })));
    drop((to_db, to_agent, client_to_db));
    db_server.join().unwrap();
    agent_server.join().unwrap();
}
