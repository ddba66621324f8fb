//! A nemesis against the real processes (Jepsen-style, on loopback): etcd
//! (three members), three `weft serve` nodes and a host (weft's initiator,
//! several queues) writing two replicated volumes (two and three replicas)
//! while faults are injected at random, alone and in pairs: `kill -9` of a
//! node, a hung node (SIGSTOP/SIGCONT), partitions between a node and etcd,
//! between two nodes and between the host and a node (a proxy in front of
//! every etcd member and every node's NVMe/TCP listener, see
//! support/proxy.rs), an etcd member's loss (and a leader election), two of
//! three nodes down and back, every node restarted at once, and a node's
//! disk filling up (its data directory and pool on a tmpfs of their own, where
//! the test may mount one: root), healed by making room and `weft pool
//! clear-failure`.
//!
//! Meanwhile an operator keeps changing the volumes' QoS limits and
//! attaching and detaching another host through any node's API: the calls
//! that race the primaries' changes of the same records (a replica taken
//! out of the in-sync set, a rebuilt one put back).
//!
//! The writer keeps the history of every block (tests/nemesis/history.rs):
//! each read must return the newest acknowledged write or a newer failed
//! one. After each phase the nemesis heals everything, waits until every
//! volume has a primary on a live node and every replica in sync, and reads
//! every block back from whichever node now serves it.
//!
//! With `WEFT_NEMESIS_UPGRADE_FROM` (the weft binary of an earlier commit),
//! the nodes start on that version and the first phase is a rolling
//! upgrade: node by node, stopped (SIGTERM) and started on this build with
//! the writer and the operator running, the cluster converged before the
//! next; the other phases follow on this build.
//!
//! Run by harness/nemesis.sh (`--minutes N`, `--upgrade-from COMMIT`; a
//! short run in the test command); `WEFT_NEMESIS_SECONDS`,
//! `WEFT_NEMESIS_SEED` (the fault schedule replays, the timing does not)
//! and `WEFT_NEMESIS_JSON` (where the report goes) steer it.

#[path = "nemesis/history.rs"]
mod history;
mod support;

use history::{decode, pattern, BlockHistory, Violation, BLOCK};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::etcd::{free_port, Etcd};
use support::proxy::Net;
use support::{start_binary_on, Node, Tmpfs};
use weft_control::{ReplicaState, Store, VolumeRecord};
use weft_initiator::{ConnectOptions, Controller, Queue, TargetUrl};

const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000e5e51";
/// The volumes: name, replicas, the tag their blocks carry.
const VOLUMES: [(&str, &str, u8); 2] = [("r2", "2", 2), ("r3", "3", 3)];
/// Blocks written per volume.
const BLOCKS: u64 = 128;
/// Writer threads (each its own queue and blocks) per volume.
const WRITERS: u64 = 2;
/// A command the target does not answer fails after this.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the cluster may take to converge after a heal.
const CONVERGE_MAX: Duration = Duration::from_secs(120);
const NODES: usize = 3;

/// Node `i`'s address for hosts and peers (its proxy's) and its API's.
fn node_ip(i: usize) -> String {
    format!("127.0.0.{}", 11 + i)
}

fn node_name(i: usize) -> String {
    format!("n{}", i + 1)
}

/// A small deterministic generator (splitmix64): the fault schedule replays from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

/// One injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill(usize),
    Pause(usize),
    EtcdCut(usize),
    PeerCut(usize, usize),
    HostCut(usize),
    Isolate(usize),
    EtcdMemberLoss(usize),
    TwoDown(usize, usize),
    RestartAll,
    /// Killed, started again, and killed again shortly after (while it
    /// catches up: a reboot during its rebuild).
    KillTwice(usize),
    /// Its filesystem (pool and data directory, a tmpfs of its own) fills
    /// up; healed by making room and `weft pool clear-failure`.
    DiskFull(usize),
}

impl Fault {
    fn kind(&self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill -9 of a node",
            Fault::Pause(_) => "node hung (SIGSTOP)",
            Fault::EtcdCut(_) => "node cut from etcd",
            Fault::PeerCut(..) => "two nodes cut apart",
            Fault::HostCut(_) => "host cut from a node",
            Fault::Isolate(_) => "node isolated",
            Fault::EtcdMemberLoss(_) => "etcd member lost",
            Fault::TwoDown(..) => "two of three nodes down",
            Fault::RestartAll => "every node restarted",
            Fault::KillTwice(_) => "node killed again while catching up",
            Fault::DiskFull(_) => "node's disk full",
        }
    }

    /// The nodes it touches (a second fault of a phase picks others).
    fn nodes(&self) -> Vec<usize> {
        match *self {
            Fault::Kill(i) | Fault::Pause(i) | Fault::EtcdCut(i) | Fault::HostCut(i) => vec![i],
            Fault::KillTwice(i) | Fault::DiskFull(i) => vec![i],
            Fault::Isolate(i) => vec![i],
            Fault::PeerCut(a, b) | Fault::TwoDown(a, b) => vec![a, b],
            Fault::EtcdMemberLoss(_) => Vec::new(),
            Fault::RestartAll => (0..NODES).collect(),
        }
    }

    /// A fault at random (a full disk only where the disks are tmpfs mounts).
    fn pick(rng: &mut Rng, disks: bool) -> Fault {
        let node = rng.below(NODES as u64) as usize;
        let other = (node + 1 + rng.below(NODES as u64 - 1) as usize) % NODES;
        match rng.below(25) {
            22..=24 if disks => Fault::DiskFull(node),
            22..=24 => Fault::Kill(node),
            0..=3 => Fault::Kill(node),
            20..=21 => Fault::KillTwice(node),
            4..=6 => Fault::Pause(node),
            7..=8 => Fault::EtcdCut(node),
            9..=11 => Fault::PeerCut(node, other),
            12..=13 => Fault::HostCut(node),
            14..=15 => Fault::Isolate(node),
            16 => Fault::EtcdMemberLoss(node),
            17..=18 => Fault::TwoDown(node, other),
            _ => Fault::RestartAll,
        }
    }

    /// A second fault to run with `self`, on other nodes, if one fits.
    fn companion(&self, rng: &mut Rng) -> Option<Fault> {
        let busy = self.nodes();
        let free: Vec<usize> = (0..NODES).filter(|i| !busy.contains(i)).collect();
        if free.is_empty() || rng.below(3) != 0 {
            return None;
        }
        let node = free[rng.below(free.len() as u64) as usize];
        Some(match rng.below(4) {
            0 => Fault::Pause(node),
            1 => Fault::EtcdCut(node),
            2 => Fault::HostCut(node),
            _ => Fault::EtcdMemberLoss(rng.below(3) as usize),
        })
    }
}

/// A node's place in the test: its listener's port (kept across restarts) and the process, if up.
struct Slot {
    port: u16,
    node: Option<Node>,
    paused: bool,
    /// It runs (and restarts on) the earlier version's binary.
    old: bool,
    /// Its data directory (and pool) is a tmpfs of its own, unmounted on
    /// drop (after the process, declared before it, stopped).
    disk: Option<Tmpfs>,
}

/// etcd, the proxies and the nodes.
struct Cluster {
    dir: PathBuf,
    net: Net,
    etcd: Etcd,
    /// etcd's client URLs through the proxies (the nodes use these).
    proxied: Vec<String>,
    slots: Vec<Slot>,
    token_file: PathBuf,
    /// etcd, straight (the checks read the records there).
    store: Arc<dyn Store>,
    /// The earlier version's binary, for a rolling upgrade.
    old_binary: Option<PathBuf>,
}

impl Cluster {
    fn start(dir: &Path, old_binary: Option<PathBuf>) -> Cluster {
        let net = Net::new();
        let etcd = Etcd::start(3, dir);
        let direct: Vec<String> = etcd.endpoints().split(',').map(str::to_string).collect();
        let proxied = direct
            .iter()
            .enumerate()
            .map(|(k, url)| {
                let upstream: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
                let listen = "127.0.0.1:0".parse().unwrap();
                format!(
                    "http://{}",
                    net.proxy(&format!("etcd{k}"), listen, upstream)
                )
            })
            .collect();
        let store = weft_etcd::EtcdStore::connect(weft_etcd::EtcdConfig::new(direct)).unwrap();
        let slots = (0..NODES)
            .map(|i| {
                let port = free_port();
                let upstream = SocketAddr::from(([127, 0, 0, 1], port));
                let listen: SocketAddr = format!("{}:{port}", node_ip(i)).parse().unwrap();
                net.proxy(&node_name(i), listen, upstream);
                Slot {
                    port,
                    disk: Tmpfs::mount(&dir.join(node_name(i)), "96m"),
                    node: None,
                    paused: false,
                    old: old_binary.is_some(),
                }
            })
            .collect();
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            net,
            etcd,
            proxied,
            slots,
            token_file: dir.join("n1").join("api-token"),
            store: Arc::new(store),
            old_binary,
        };
        for i in 0..NODES {
            cluster.start_node(i);
        }
        cluster
    }

    fn start_node(&mut self, i: usize) {
        let name = node_name(i);
        let config = self.dir.join(format!("{name}.toml"));
        let endpoints: Vec<String> = self.proxied.iter().map(|e| format!("{e:?}")).collect();
        // An earlier version knows no peer_advertise: its peers reach it
        // at its listener, past the proxy (no partition between nodes).
        let old = self.old_binary.as_deref().filter(|_| self.slots[i].old);
        // Nor insecure_store: it took any store (the tests' etcd asks for no credential).
        let peer = match old {
            Some(_) => String::new(),
            None => format!("peer_advertise = {:?}\ninsecure_store = true\n", node_ip(i)),
        };
        let table = format!(
            "[cluster]\nendpoints = [{}]\nnode = {name:?}\nadvertise = {ip:?}\n{peer}lease_ttl_ms = 2000\n",
            endpoints.join(", "),
            ip = node_ip(i),
        );
        std::fs::write(&config, table).unwrap();
        let config = config.to_str().unwrap().to_string();
        let api = format!("{}:0", node_ip(i));
        let token = self.token_file.to_str().unwrap().to_string();
        let mut extra = vec!["--config", &config, "--api-listen", &api];
        if i > 0 || self.token_file.exists() {
            extra.extend(["--api-token-file", &token]);
        }
        let listen = format!("127.0.0.1:{}", self.slots[i].port);
        let binary = old.unwrap_or(support::WEFT.as_ref());
        let mut node = start_binary_on(binary, &self.dir.join(&name), &listen, &extra);
        node.token = std::fs::read_to_string(&self.token_file)
            .unwrap()
            .trim()
            .to_string();
        self.net.set_party(node.pid(), &name);
        self.slots[i].node = Some(node);
        self.slots[i].paused = false;
    }

    /// Stops node `i` as an operator does (SIGTERM) and starts it on this build.
    fn upgrade(&mut self, i: usize) {
        if let Some(node) = self.slots[i].node.take() {
            node.terminate();
        }
        self.slots[i].old = false;
        self.start_node(i);
    }

    /// Waits until the cluster converged; how long it took, or why it did not.
    fn converge(&self, since: Instant) -> Result<f64, String> {
        while let Some(reason) = self.unconverged() {
            if since.elapsed() > CONVERGE_MAX {
                return Err(reason);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(since.elapsed().as_secs_f64())
    }

    fn kill(&mut self, i: usize) {
        self.slots[i].node = None;
        self.slots[i].paused = false;
    }

    /// Whether the nodes' disks are tmpfs mounts (the full-disk fault needs them).
    fn disks(&self) -> bool {
        self.slots.iter().all(|s| s.disk.is_some())
    }

    fn signal(&mut self, i: usize, signal: &str) {
        if let Some(node) = &self.slots[i].node {
            let pid = node.pid().to_string();
            let sent = std::process::Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap();
            assert!(sent.success(), "kill {signal} {pid}");
            self.slots[i].paused = signal == "-STOP";
        }
    }

    /// A node that answers its API.
    fn api_node(&self) -> &Node {
        self.slots
            .iter()
            .filter(|s| !s.paused)
            .find_map(|s| s.node.as_ref())
            .expect("a node up")
    }

    fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::Kill(i) => self.kill(i),
            Fault::Pause(i) => self.signal(i, "-STOP"),
            Fault::EtcdCut(i) => {
                (0..3).for_each(|k| self.net.cut(&node_name(i), &format!("etcd{k}")))
            }
            Fault::PeerCut(a, b) => self.net.cut(&node_name(a), &node_name(b)),
            Fault::HostCut(i) => self.net.cut("host", &node_name(i)),
            Fault::Isolate(i) => {
                for k in 0..3 {
                    self.net.cut(&node_name(i), &format!("etcd{k}"));
                }
                for j in (0..NODES).filter(|&j| j != i) {
                    self.net.cut(&node_name(i), &node_name(j));
                }
                self.net.cut("host", &node_name(i));
            }
            // Half the time the leader, whichever it is (an election follows).
            Fault::EtcdMemberLoss(k) => match self.etcd.leader() {
                Some(leader) if k % 2 == 0 => self.etcd.stop_member(leader),
                _ => self.etcd.stop_member(k),
            },
            Fault::TwoDown(a, b) => {
                self.kill(a);
                self.kill(b);
            }
            Fault::RestartAll => (0..NODES).for_each(|i| self.kill(i)),
            Fault::KillTwice(i) => self.kill(i),
            Fault::DiskFull(i) => {
                self.slots[i].disk.as_ref().expect("mounted").fill(128);
                // The writer's blocks are allocated and their regions
                // marked: a snapshot makes every copy commit metadata, and
                // so the full node's pool fails (its primaries hand over,
                // its replicas fall out of sync).
                for (volume, _, _) in VOLUMES {
                    let snapshot = format!("{volume}@full");
                    let _ = support::weft(self.api_node(), &["snapshot", "create", &snapshot]);
                }
            }
        }
    }

    /// The part of a fault played halfway through its hold: a
    /// node killed twice is started again halfway and killed again soon after.
    fn midway(&mut self, fault: Fault, rng: &mut Rng) {
        if let Fault::KillTwice(i) = fault {
            self.start_node(i);
            std::thread::sleep(rng.millis(100, 1_500));
            self.kill(i);
        }
    }

    /// Undoes every fault: partitions healed, hung nodes resumed, dead
    /// nodes and etcd members started again.
    fn heal(&mut self, faults: &[Fault]) {
        self.net.heal();
        for fault in faults {
            if let Fault::EtcdMemberLoss(_) = *fault {
                self.etcd.start_stopped();
            }
        }
        for i in 0..NODES {
            if self.slots[i].paused {
                self.signal(i, "-CONT");
            }
        }
        for i in 0..NODES {
            if self.slots[i].node.is_none() {
                self.start_node(i);
            }
        }
        for fault in faults {
            if let Fault::DiskFull(i) = *fault {
                self.slots[i].disk.as_ref().expect("mounted").make_room();
                // Its pool failed if a write reached it meanwhile (else
                // the call says so, and nothing changes).
                let name = node_name(i);
                let args = ["pool", "clear-failure", "p", "--node", &name];
                let _ = support::weft(self.api_node(), &args);
                for (volume, _, _) in VOLUMES {
                    let snapshot = format!("{volume}@full");
                    let _ = support::weft(self.api_node(), &["snapshot", "delete", &snapshot]);
                }
            }
        }
    }

    /// Why the cluster has not converged yet: a volume without a primary on
    /// a live node, a replica not in sync, a planned move pending.
    fn unconverged(&self) -> Option<String> {
        for (volume, _, _) in VOLUMES {
            let record = match weft_control::records::read::<VolumeRecord>(
                self.store.as_ref(),
                &format!("volumes/{volume}"),
            ) {
                Ok(Some(found)) => found.record,
                Ok(None) => return Some(format!("{volume}: no record")),
                Err(error) => return Some(format!("{volume}: {error}")),
            };
            let Some(replication) = record.replication else {
                return Some(format!("{volume}: not replicated"));
            };
            let alive = self
                .store
                .get(&format!("cluster/alive/{}", replication.primary));
            if !matches!(alive, Ok(Some(_))) {
                return Some(format!("{volume}: primary {} is down", replication.primary));
            }
            if let Some(member) = replication
                .members
                .iter()
                .find(|m| m.state != ReplicaState::InSync)
            {
                return Some(format!(
                    "{volume}: the replica on {} is {:?}",
                    member.node, member.state
                ));
            }
        }
        None
    }

    /// Where the host reaches volume `volume` now: its primary's node.
    fn primary_url(&self, volume: &str) -> Option<TargetUrl> {
        primary_url(self.store.as_ref(), &self.ports(), volume)
    }

    fn ports(&self) -> Vec<u16> {
        self.slots.iter().map(|s| s.port).collect()
    }
}

/// The URL of volume `volume` on its primary's node (through its proxy), as the record names it.
fn primary_url(store: &dyn Store, ports: &[u16], volume: &str) -> Option<TargetUrl> {
    let found =
        weft_control::records::read::<VolumeRecord>(store, &format!("volumes/{volume}")).ok()??;
    let primary = found.record.replication?.primary;
    let i = (0..NODES).find(|&i| node_name(i) == primary)?;
    let url = format!(
        "nvme-tcp://{}:{}/nqn.2026-11.io.weft:vol:{volume}",
        node_ip(i),
        ports[i]
    );
    TargetUrl::parse(&url).ok()
}

/// An I/O queue to `url` as the host, its commands bounded by [`IO_TIMEOUT`].
fn connect(url: &TargetUrl) -> Option<(Controller, Queue)> {
    let options = ConnectOptions {
        host_nqn: HOST_NQN.into(),
        host_id: [0xe5; 16],
        ..ConnectOptions::default()
    };
    let controller = Controller::connect(url, options, 1).ok()?;
    let queue = controller.open_io_queue(1).ok()?;
    queue.set_io_timeout(Some(IO_TIMEOUT)).ok()?;
    Some((controller, queue))
}

/// The operator: QoS changes, attaches and detaches through the nodes'
/// APIs, as fast as they answer, until `stop`; (made, refused or failed).
fn operate(apis: Vec<String>, token: String, seed: u64, stop: Arc<AtomicBool>) -> (u64, u64) {
    let mut rng = Rng(seed);
    let (mut made, mut refused) = (0, 0);
    while !stop.load(Ordering::Relaxed) {
        let api = &apis[rng.below(apis.len() as u64) as usize];
        let (volume, _, _) = VOLUMES[rng.below(VOLUMES.len() as u64) as usize];
        let (method, path, body) = match rng.below(3) {
            0 => (
                "PATCH",
                format!("/api/v1/volumes/{volume}/qos"),
                format!("{{\"iops_max\": {}}}", 1_000_000 + rng.below(1_000_000)),
            ),
            1 => (
                "POST",
                format!("/api/v1/volumes/{volume}/hosts"),
                "{\"host\": \"other\"}".to_string(),
            ),
            _ => (
                "DELETE",
                format!("/api/v1/volumes/{volume}/hosts/other"),
                String::new(),
            ),
        };
        match call(api, &token, method, &path, &body) {
            Some(status) if status < 300 => made += 1,
            _ => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        std::thread::sleep(rng.millis(10, 60));
    }
    (made, refused)
}

/// One API call to `api` (host:port), bounded in time; its status.
fn call(api: &str, token: &str, method: &str, path: &str, body: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let address: SocketAddr = api.parse().ok()?;
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {api}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// What a writer did.
#[derive(Debug, Default, Clone)]
struct Counts {
    acknowledged: u64,
    failed: u64,
    reads: u64,
    connects: u64,
}

/// One writer: its volume, its blocks and their histories.
struct Writer {
    volume: &'static str,
    tag: u8,
    blocks: BTreeMap<u64, BlockHistory>,
    rng: Rng,
    counts: Counts,
    /// Reads that broke the model, and whether each was made after convergence.
    violations: Vec<(Violation, bool)>,
}

impl Writer {
    /// Writes and reads its blocks at random on the volume's primary until `stop`.
    fn run(mut self, store: Arc<dyn Store>, ports: Vec<u16>, stop: Arc<AtomicBool>) -> Writer {
        let mut connection: Option<(Controller, Queue)> = None;
        let blocks: Vec<u64> = self.blocks.keys().copied().collect();
        while !stop.load(Ordering::Relaxed) {
            let Some((_, queue)) = connection.as_mut() else {
                connection =
                    primary_url(store.as_ref(), &ports, self.volume).and_then(|u| connect(&u));
                self.counts.connects += 1;
                if connection.is_none() {
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            };
            let block = blocks[self.rng.below(blocks.len() as u64) as usize];
            let history = self.blocks.get_mut(&block).unwrap();
            let ok = if self.rng.below(5) == 0 {
                match queue.read(1, block, BLOCK, BLOCK) {
                    Ok(data) => {
                        self.counts.reads += 1;
                        let read = decode(self.tag, block, data);
                        if let Err(violation) = history.check(block, read) {
                            eprintln!(
                                "nemesis: {} {violation:?} (read while running)",
                                self.volume
                            );
                            self.violations.push((violation, false));
                        }
                        true
                    }
                    Err(_) => false,
                }
            } else {
                let generation = history.next();
                let data = pattern(self.tag, block, generation);
                match queue.write(1, block, BLOCK, &data) {
                    Ok(()) => {
                        history.acknowledged(generation);
                        self.counts.acknowledged += 1;
                        true
                    }
                    Err(_) => {
                        history.indeterminate(generation);
                        self.counts.failed += 1;
                        false
                    }
                }
            };
            if !ok {
                // A path error (ANA), a timeout, a lost connection: find the
                // primary again, as a multipath host moves to another path.
                connection = None;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self
    }

    /// Reads every block it wrote back from the volume's primary; violations found.
    fn verify(&mut self, cluster: &Cluster) -> Result<u64, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut pending: Vec<u64> = self.blocks.keys().copied().collect();
        let mut connection = None;
        while let Some(&block) = pending.last() {
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: blocks unreadable for 60 s after convergence",
                    self.volume
                ));
            }
            let Some((_, queue)) = connection.as_mut() else {
                connection = cluster.primary_url(self.volume).and_then(|u| connect(&u));
                if connection.is_none() {
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            };
            match queue.read(1, block, BLOCK, BLOCK) {
                Ok(data) => {
                    let read = decode(self.tag, block, data);
                    let history = self.blocks.get_mut(&block).unwrap();
                    if let Err(violation) = history.check(block, read) {
                        eprintln!(
                            "nemesis: {} {violation:?} (read after convergence)",
                            self.volume
                        );
                        self.violations.push((violation, true));
                    }
                    pending.pop();
                }
                Err(_) => {
                    connection = None;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Ok(self.blocks.values().filter(|h| h.written()).count() as u64)
    }
}

/// The report of a run.
#[derive(Debug, Default)]
struct Report {
    seed: u64,
    seconds: f64,
    phases: u64,
    faults: BTreeMap<&'static str, u64>,
    counts: Counts,
    blocks_verified: u64,
    lost: u64,
    stale: u64,
    corrupt: u64,
    converge_s: Vec<f64>,
    not_converged: Vec<String>,
    unattributed: u64,
    /// The operator's API calls: made, and refused or failed.
    api_calls: (u64, u64),
    /// From the nodes' logs: pools failed, and primaries that handed their
    /// volume over because their copy failed or their files could not be written.
    pools_failed: u64,
    handovers: u64,
}

impl Report {
    fn add(&mut self, writer: &Writer) {
        self.counts.acknowledged += writer.counts.acknowledged;
        self.counts.failed += writer.counts.failed;
        self.counts.reads += writer.counts.reads;
        self.counts.connects += writer.counts.connects;
    }

    fn converge_quantile(&self, q: f64) -> f64 {
        let mut sorted = self.converge_s.clone();
        sorted.sort_by(f64::total_cmp);
        if sorted.is_empty() {
            return 0.0;
        }
        sorted[((sorted.len() - 1) as f64 * q).round() as usize]
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "seed": self.seed,
            "seconds": self.seconds,
            "phases": self.phases,
            "faults": self.faults,
            "writes_acknowledged": self.counts.acknowledged,
            "writes_failed": self.counts.failed,
            "reads_checked": self.counts.reads,
            "blocks_verified": self.blocks_verified,
            "lost": self.lost,
            "stale_reads": self.stale,
            "corrupt_reads": self.corrupt,
            "converge_s_p50": self.converge_quantile(0.5),
            "converge_s_max": self.converge_quantile(1.0),
            "not_converged": self.not_converged,
            "unattributed_connections": self.unattributed,
            "api_changes_made": self.api_calls.0,
            "api_changes_refused": self.api_calls.1,
            "pools_failed": self.pools_failed,
            "handovers_after_disk_faults": self.handovers,
        })
    }

    fn table(&self) -> String {
        let mut out = format!(
            "nemesis: seed {}, {:.0} s, {} phases\n\n| fault | injected |\n|---|---|\n",
            self.seed, self.seconds, self.phases
        );
        for (kind, count) in &self.faults {
            out.push_str(&format!("| {kind} | {count} |\n"));
        }
        out.push_str(&format!(
            "\n| measure | value |\n|---|---|\n\
             | writes acknowledged | {} |\n| writes failed (indeterminate) | {} |\n\
             | reads checked while running | {} |\n| blocks verified after each phase | {} |\n\
             | QoS, attach and detach calls made / refused | {} / {} |\n\
             | lost (acknowledged, read older) | {} |\n| stale reads while running | {} |\n\
             | corrupt reads | {} |\n| time to converge p50 / max | {:.1} s / {:.1} s |\n\
             | phases that did not converge | {} |\n\
             | proxied connections not attributed to a process | {} |\n\
             | pools failed / primaries handed over after a disk fault | {} / {} |\n",
            self.counts.acknowledged,
            self.counts.failed,
            self.counts.reads,
            self.blocks_verified,
            self.api_calls.0,
            self.api_calls.1,
            self.lost,
            self.stale,
            self.corrupt,
            self.converge_quantile(0.5),
            self.converge_quantile(1.0),
            self.not_converged.len(),
            self.unattributed,
            self.pools_failed,
            self.handovers,
        ));
        out
    }
}

/// Through `node`: a pool on every node, the host, and the two volumes attached to it.
fn volumes(node: &Node, dir: &Path) {
    for i in 0..NODES {
        let name = node_name(i);
        let device = dir.join(&name).join("p.img");
        let device = device.to_str().unwrap();
        let args = ["pool", "create", "p", "--node", &name, "--device", device];
        let args = [&args[..], &["--device-size", "256MiB"]].concat();
        eventually("a pool", || support::weft(node, &args).0);
    }
    support::ok(node, &["host", "add", "tester", "--nqn", HOST_NQN]);
    let other = format!("{HOST_NQN}0");
    support::ok(node, &["host", "add", "other", "--nqn", &other]);
    for (volume, replicas, _) in VOLUMES {
        let create = [
            "volume",
            "create",
            volume,
            "--size",
            "16MiB",
            "--replicas",
            replicas,
        ];
        eventually("a volume", || support::weft(node, &create).0);
        support::ok(node, &["volume", "attach", volume, "--host", "tester"]);
    }
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn writers(seed: u64) -> Vec<Writer> {
    let mut writers = Vec::new();
    for (v, (volume, _, tag)) in VOLUMES.into_iter().enumerate() {
        for w in 0..WRITERS {
            writers.push(Writer {
                volume,
                tag,
                blocks: (0..BLOCKS)
                    .filter(|b| b % WRITERS == w)
                    .map(|b| (b, BlockHistory::default()))
                    .collect(),
                rng: Rng(seed ^ ((v as u64) << 32 | w)),
                counts: Counts::default(),
                violations: Vec::new(),
            });
        }
    }
    writers
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
#[ignore = "minutes long: run by harness/nemesis.sh (the test command runs a short one)"]
fn no_acknowledged_write_is_lost_whatever_fails() {
    let seconds = env_u64("WEFT_NEMESIS_SECONDS").unwrap_or(60);
    let seed = env_u64("WEFT_NEMESIS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    eprintln!("nemesis: seed {seed} (WEFT_NEMESIS_SEED={seed} replays the schedule), {seconds} s");
    let dir = support::temp_dir("nemesis");
    let old_binary = std::env::var_os("WEFT_NEMESIS_UPGRADE_FROM").map(PathBuf::from);
    let mut upgrading = old_binary.is_some();
    let mut cluster = Cluster::start(&dir, old_binary);
    volumes(cluster.api_node(), &dir);
    eventually("every replica in sync", || cluster.unconverged().is_none());

    let mut rng = Rng(seed);
    let mut report = Report {
        seed,
        ..Report::default()
    };
    let mut writers = writers(seed);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        report.phases += 1;
        let stop = Arc::new(AtomicBool::new(false));
        let running: Vec<_> = writers
            .drain(..)
            .map(|writer| {
                let (store, ports, stop) = (
                    Arc::clone(&cluster.store),
                    cluster.ports(),
                    Arc::clone(&stop),
                );
                std::thread::spawn(move || writer.run(store, ports, stop))
            })
            .collect();
        let apis: Vec<String> = cluster
            .slots
            .iter()
            .filter_map(|s| Some(s.node.as_ref()?.api.clone()))
            .collect();
        let token = cluster.api_node().token.clone();
        let operator = {
            let (stop, seed) = (Arc::clone(&stop), rng.next());
            std::thread::spawn(move || operate(apis, token, seed, stop))
        };
        std::thread::sleep(rng.millis(500, 1500));
        if std::mem::take(&mut upgrading) {
            *report
                .faults
                .entry("rolling upgrade, node by node")
                .or_default() += 1;
            for i in 0..NODES {
                cluster.upgrade(i);
                let result = cluster.converge(Instant::now());
                eprintln!("nemesis: {} upgraded: converged {result:?}", node_name(i));
                if let Err(reason) = result {
                    report
                        .not_converged
                        .push(format!("upgrade of {}: {reason}", node_name(i)));
                }
            }
        }
        let first = Fault::pick(&mut rng, cluster.disks());
        let faults: Vec<Fault> = std::iter::once(first)
            .chain(first.companion(&mut rng))
            .collect();
        let hold = match first {
            Fault::TwoDown(..) => rng.millis(6_000, 15_000),
            _ => rng.millis(1_500, 6_000),
        };
        for fault in &faults {
            *report.faults.entry(fault.kind()).or_default() += 1;
            cluster.inject(*fault);
        }
        std::thread::sleep(hold / 2);
        for fault in &faults {
            cluster.midway(*fault, &mut rng);
        }
        std::thread::sleep(hold / 2);
        // Convergence counts from the heal's start: dead nodes start again within it.
        let healed = Instant::now();
        cluster.heal(&faults);
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        writers = running.into_iter().map(|t| t.join().unwrap()).collect();
        let (made, refused) = operator.join().unwrap();
        report.api_calls.0 += made;
        report.api_calls.1 += refused;
        let converged = cluster.converge(healed);
        let converge = healed.elapsed().as_secs_f64();
        let (acknowledged, failed) = writers.iter().fold((0, 0), |(a, f), w| {
            (a + w.counts.acknowledged, f + w.counts.failed)
        });
        let mut verified = 0;
        match converged {
            Err(reason) => report
                .not_converged
                .push(format!("phase {}: {faults:?}: {reason}", report.phases)),
            Ok(_) => {
                report.converge_s.push(converge);
                for writer in &mut writers {
                    match writer.verify(&cluster) {
                        Ok(blocks) => verified += blocks,
                        Err(error) => report
                            .not_converged
                            .push(format!("phase {}: {error}", report.phases)),
                    }
                }
            }
        }
        report.blocks_verified += verified;
        let primaries: Vec<String> = VOLUMES
            .iter()
            .map(|(volume, _, _)| {
                let url = cluster.primary_url(volume).map(|u| u.address.to_string());
                format!("{volume}@{}", url.unwrap_or_default())
            })
            .collect();
        eprintln!(
            "nemesis: phase {} {faults:?} held {hold:?}: converged {converge:.1} s after the heal began, {verified} blocks verified; so far {acknowledged} writes acknowledged, {failed} failed; primaries {primaries:?}",
            report.phases
        );
    }
    report.seconds = started.elapsed().as_secs_f64();
    for writer in &writers {
        report.add(writer);
        for (violation, converged) in &writer.violations {
            match (violation.is_stale(), converged) {
                (true, true) => report.lost += 1,
                (true, false) => report.stale += 1,
                (false, _) => report.corrupt += 1,
            }
        }
    }
    report.unattributed = cluster.net.unattributed();
    for i in 0..NODES {
        let log = std::fs::read_to_string(dir.join(format!("{}.log", node_name(i))));
        let log = log.unwrap_or_default();
        let count = |what: &str| log.matches(what).count() as u64;
        report.pools_failed += count("metadata write failed");
        report.handovers +=
            count("it hands the volume to an in-sync replica") + count("it handed the volume to");
    }
    let table = report.table();
    eprintln!("{table}");
    if let Ok(path) = std::env::var("WEFT_NEMESIS_JSON") {
        let json = serde_json::to_string_pretty(&report.json()).unwrap();
        std::fs::write(&path, json + "\n").unwrap();
    }
    let clean = report.lost == 0
        && report.stale == 0
        && report.corrupt == 0
        && report.not_converged.is_empty();
    assert!(
        clean,
        "nemesis found a problem (seed {seed}; logs in {}): {:?}",
        dir.display(),
        report.not_converged
    );
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
