//! Real separate hosts on one machine, for tests and benches (issue 44).
//!
//! Two pieces:
//!
//! - [`Lab`]: a set of named hosts, each its own Linux network namespace with its own IPv4 address,
//!   all joined by veth pairs to one bridge in a dedicated "switch" namespace. A host runs programs
//!   ([`Host::command`]: `ip netns exec`) or Rust code of the current process ([`Host::spawn`],
//!   [`Host::spawn_async`], [`Host::run`]: a thread that `setns(2)`s into the namespace).
//!   [`Lab::link_down`] takes a host's veth link down at the switch: a partition, packets vanish
//!   both ways, so TCP retransmission timeouts and keepalives really fire; [`Lab::link_up`] heals it.
//!   [`Lab::partition`] cuts only the path between two hosts (an agent loses the database while its
//!   clients still reach it); [`Lab::heal_partition`] restores it.
//!   Dropping the lab removes every namespace and link it created; [`Lab::teardown_stale`] (which
//!   [`Lab::new`] also runs) removes what a crashed earlier run left behind.
//! - [`DelayProxy`]: a latency-injecting TCP proxy (what toxiproxy's latency toxic does), because
//!   the kernel here has no `netem`: a set one-way delay plus uniform jitter on each direction,
//!   never reordering bytes, with [`DelayProxy::cut`] / [`DelayProxy::heal`],
//!   [`DelayProxy::close_all`] and counters. It can run in any host's namespace
//!   ([`DelayProxy::start_in`]) or in the caller's ([`DelayProxy::start`], e.g. on loopback).
//!
//! # Addresses, and why traffic never leaves the lab
//!
//! Each lab picks a private `/24` in `10.213.0.0/16` (`10.213.N.0/24`, N a per-process lab
//! counter, so two labs of one process read differently in logs); host `i` (in the order given to
//! [`Lab::new`]) is `.i+1`. These addresses exist only inside the lab's namespaces: the switch
//! namespace has a bridge and the hosts' peer ends, no address and no link to anything else; each
//! host namespace has `lo` and one veth (`eth0`) to that bridge, and only the connected `/24`
//! route, no default route. No interface of the lab is in, or connected to, the machine's own
//! (root) namespace, so a packet has no path out: a connect to any other address fails at once
//! with "network unreachable". The machine's own interfaces, routes and firewall are never read or
//! changed: every `ip` command this crate runs is `ip netns add|del|list|pids` or `ip -n <lab
//! namespace> ...`. Two labs can therefore never collide on addresses either; what must be unique
//! machine-wide is the namespace names, which carry the owning process id and start time
//! (`netlab-<pid>-<start>-<serial>-...`).
//!
//! Neighbour (ARP) entries are static, so a downed link is a pure black hole (a connect times out
//! instead of failing fast with "no route to host" once ARP gives up), like a real partition
//! between hosts that knew each other.
//!
//! # Requirements
//!
//! Linux with network namespaces, veth and bridge support, iproute2's `ip` on `PATH`, and root (or
//! `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`). [`Lab::available`] checks all of it by building and
//! removing a probe namespace, and says what is missing and how to fix it
//! ([`LabError::NotAllowed`], [`LabError::IpMissing`], [`LabError::Unsupported`]). Tests call
//! [`testing::lab_or_skip`], which prints a loud banner when it skips and fails instead when
//! `NETLAB_REQUIRE=1` is set (CI and the project's machines, where labs are available).
//! [`DelayProxy`] alone needs no privileges.

mod error;
mod ip;
mod lab;
mod netns;
mod proxy;
pub mod testing;
mod timer;

pub use error::{LabError, ProxyError};
pub use lab::{process_prefix, Host, Lab, StaleCleanup};
pub use netns::NsThread;
pub use proxy::{DelayProxy, ProxyConfig, ProxyStats};
