//! A network the tests can partition: one TCP proxy in front of each
//! server (an etcd member, a node's NVMe/TCP listener), and a table of the
//! pairs of parties cut from each other. Each connection a proxy accepts is
//! attributed to the process that opened it (its socket's inode, found in
//! /proc/net/tcp, among the processes' open files): a registered process's
//! party, else a `weft serve` named by its data directory (`--data-dir
//! DIR/n2` is party `n2`, even before it is registered: a node connects to
//! etcd before its banner is out). So one proxy in front of a node serves
//! its hosts and its peers and still cuts only the pairs asked for.
//!
//! A cut pair: the connections between them stop forwarding (bytes wait in
//! the socket buffers, as dropped packets wait for retransmission), and new
//! connections between them are closed at once (the peer is unreachable).
//! Healing forwards again what waited. What this does not do: delay,
//! reorder or corrupt bytes, or cut traffic that does not go through a
//! proxy (etcd's members among themselves, the nodes' APIs).

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The party of connections no known process opened (never cut).
pub const UNKNOWN: &str = "?";

#[derive(Default)]
struct State {
    /// Process id -> party name.
    parties: HashMap<u32, String>,
    /// Cut (from, to) pairs, both directions recorded.
    cut: BTreeSet<(String, String)>,
    /// Connections accepted whose process was not found.
    unattributed: u64,
}

/// The proxies and the partition table they share.
#[derive(Clone, Default)]
pub struct Net {
    state: Arc<Mutex<State>>,
}

impl Net {
    /// A network in which this process is the party `host`.
    pub fn new() -> Net {
        let net = Net::default();
        net.set_party(std::process::id(), "host");
        net
    }

    /// Process `pid` is party `name` (a restarted node registers again).
    pub fn set_party(&self, pid: u32, name: &str) {
        let mut state = self.state.lock().unwrap();
        state.parties.retain(|_, party| party != name);
        state.parties.insert(pid, name.to_string());
    }

    /// Cuts `a` and `b` from each other.
    pub fn cut(&self, a: &str, b: &str) {
        let mut state = self.state.lock().unwrap();
        state.cut.insert((a.to_string(), b.to_string()));
        state.cut.insert((b.to_string(), a.to_string()));
    }

    /// Heals every cut.
    pub fn heal(&self) {
        self.state.lock().unwrap().cut.clear();
    }

    /// Connections no known process was found to have opened.
    pub fn unattributed(&self) -> u64 {
        self.state.lock().unwrap().unattributed
    }

    fn is_cut(&self, from: &str, to: &str) -> bool {
        let state = self.state.lock().unwrap();
        state.cut.contains(&(from.to_string(), to.to_string()))
    }

    /// A proxy for party `to` on `listen` (port 0: any) forwarding to
    /// `upstream`; the address it listens on.
    pub fn proxy(&self, to: &str, listen: SocketAddr, upstream: SocketAddr) -> SocketAddr {
        let listener = TcpListener::bind(listen)
            .unwrap_or_else(|error| panic!("proxy for {to} on {listen}: {error}"));
        let address = listener.local_addr().unwrap();
        let net = self.clone();
        let to = to.to_string();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let net = net.clone();
                let to = to.clone();
                std::thread::spawn(move || net.serve(client, &to, address, upstream));
            }
        });
        address
    }

    fn serve(&self, client: TcpStream, to: &str, address: SocketAddr, upstream: SocketAddr) {
        let Ok(peer) = client.peer_addr() else {
            return;
        };
        let from = self.owner(peer, address);
        if self.is_cut(&from, to) {
            return;
        }
        let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(client_reader), Ok(server_reader)) = (client.try_clone(), server.try_clone())
        else {
            return;
        };
        let there = (self.clone(), from.clone(), to.to_string());
        let back = (self.clone(), to.to_string(), from);
        std::thread::spawn(move || pump(client_reader, server, there));
        pump(server_reader, client, back);
    }

    /// The party whose process holds the client end (`peer`) of a
    /// connection to `address`.
    fn owner(&self, peer: SocketAddr, address: SocketAddr) -> String {
        let parties: Vec<(u32, String)> = {
            let state = self.state.lock().unwrap();
            state
                .parties
                .iter()
                .map(|(pid, name)| (*pid, name.clone()))
                .collect()
        };
        let found = socket_inode(peer, address).and_then(|inode| {
            let link = format!("socket:[{inode}]");
            let holds = |pid: u32| {
                let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
                    return false;
                };
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| l.to_str() == Some(&link))
                })
            };
            let known = parties.iter().find(|(pid, _)| holds(*pid));
            match known {
                Some((_, name)) => Some(name.clone()),
                None => all_pids().find(|&pid| holds(pid)).and_then(data_dir_name),
            }
        });
        found.unwrap_or_else(|| {
            self.state.lock().unwrap().unattributed += 1;
            UNKNOWN.to_string()
        })
    }
}

/// Every process's id.
fn all_pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

/// The last component of process `pid`'s `--data-dir` argument, if it has one.
fn data_dir_name(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let at = args.iter().position(|a| *a == b"--data-dir")?;
    let dir = std::str::from_utf8(args.get(at + 1)?).ok()?;
    Some(std::path::Path::new(dir).file_name()?.to_str()?.to_string())
}

/// Forwards `from` to `to` (the parties `(net, source, destination)`),
/// holding what it read while the pair is cut; shuts both down at the end.
fn pump(mut from: TcpStream, mut to: TcpStream, (net, source, destination): (Net, String, String)) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while net.is_cut(&source, &destination) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if to.write_all(&buffer[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// The inode of the IPv4 socket whose local end is `local` and remote end
/// `remote`, from /proc/net/tcp.
fn socket_inode(local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let (local, remote) = (hex_address(local)?, hex_address(remote)?);
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()) && fields.get(2) == Some(&remote.as_str()))
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

/// An address as /proc/net/tcp writes it: the IPv4 address's bytes as a
/// little-endian word, then the port, in hex.
fn hex_address(address: SocketAddr) -> Option<String> {
    let SocketAddr::V4(v4) = address else {
        return None;
    };
    let word = u32::from_le_bytes(v4.ip().octets());
    Some(format!("{word:08X}:{:04X}", v4.port()))
}
