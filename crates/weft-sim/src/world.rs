//! The simulated world: the event queue and its clock, the network with its
//! faults, and the chaos that crashes, pauses and partitions.

use crate::host::Host;
use crate::node::Node;
use crate::rng::Rng;
use crate::store::Store;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::fmt;
use std::time::Duration;
use weft_replication::{Extent, FromReplica, Geometry, HostResult, NodeId, ReplicaSet, ToReplica};

/// What a run simulates and for how long.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Storage nodes, each holding a replica.
    pub nodes: u16,
    /// Volume size in blocks.
    pub blocks: u64,
    /// Blocks per region.
    pub region_blocks: u64,
    /// How long faults are injected.
    pub chaos: Duration,
    /// Host commands outstanding at once.
    pub queue_depth: usize,
    /// Node lease time to live (etcd's lease).
    pub lease_ttl: Duration,
    /// The controller promotes this long after a primary's lease ended.
    pub promotion_delay: Duration,
    /// A replica that does not answer within this long is faulted.
    pub replica_timeout: Duration,
    /// A host command not answered within this long is retried on another path.
    pub host_timeout: Duration,
    /// How long regions stay in the write intents after their last write.
    pub clean_delay: Duration,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            nodes: 3,
            blocks: 48,
            region_blocks: 4,
            chaos: Duration::from_secs(20),
            queue_depth: 8,
            lease_ttl: Duration::from_millis(3000),
            promotion_delay: Duration::from_millis(300),
            replica_timeout: Duration::from_millis(200),
            host_timeout: Duration::from_millis(800),
            clean_delay: Duration::from_millis(100),
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Writes the host had acknowledged.
    pub writes: u64,
    /// Reads checked.
    pub reads: u64,
    /// Flushes acknowledged.
    pub flushes: u64,
    /// Commands sent again after a path error or timeout.
    pub retries: u64,
    /// Writes the application gave up after a path failed them.
    pub given_up: u64,
    /// Faults injected.
    pub faults: u64,
    /// Of which power losses.
    pub power_losses: u64,
    /// Of which disks failing (a failed pool), cleared later.
    pub disk_failures: u64,
    /// Of which data directories filling up, with room again later.
    pub files_full: u64,
    /// Promotions and planned moves (epochs after the first).
    pub promotions: u64,
    /// Replicas that took over from a primary they had not heard for a
    /// read grant, before its lease ended.
    pub takeovers: u64,
    /// Planned moves of the primary asked for.
    pub moves_asked: u64,
    /// Planned moves done by the primary handing over.
    pub moves_done: u64,
    /// Replicas added or removed by the operator.
    pub member_changes: u64,
    /// Reads answered from a lagging watch (an older revision).
    pub lagging_reads: u64,
    /// Compare-and-swap answers lost after the change was made.
    pub lost_answers: u64,
    /// Changes to a primary's files that could not be made durable.
    pub files_failed: u64,
    /// Local writes held seconds in the manager's queue.
    pub writes_held: u64,
    /// Longest time without any host completion while commands were outstanding.
    pub longest_pause: Duration,
}

impl Report {
    /// Adds `other`'s counts to these (the longest pause is the longer).
    pub fn add(&mut self, other: &Report) {
        self.writes += other.writes;
        self.reads += other.reads;
        self.flushes += other.flushes;
        self.retries += other.retries;
        self.given_up += other.given_up;
        self.faults += other.faults;
        self.power_losses += other.power_losses;
        self.disk_failures += other.disk_failures;
        self.files_full += other.files_full;
        self.promotions += other.promotions;
        self.moves_asked += other.moves_asked;
        self.takeovers += other.takeovers;
        self.moves_done += other.moves_done;
        self.member_changes += other.member_changes;
        self.lagging_reads += other.lagging_reads;
        self.lost_answers += other.lost_answers;
        self.files_failed += other.files_failed;
        self.writes_held += other.writes_held;
        self.longest_pause = self.longest_pause.max(other.longest_pause);
    }
}

/// A run that broke a rule: its seed, what broke, and the last events.
#[derive(Debug)]
pub struct Failure {
    /// The seed that replays it.
    pub seed: u64,
    /// What broke.
    pub message: String,
    /// The last events before it.
    pub trace: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "simulation seed {} failed: {}", self.seed, self.message)?;
        writeln!(f, "last events:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(
            f,
            "replay with: WEFT_SIM_SEED={} cargo test -p weft-sim --test vopr replay -- --nocapture",
            self.seed
        )
    }
}

/// Who sends and receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    Host,
    Store,
    Node(NodeId),
}

/// A host command's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostCmd {
    Read(Extent),
    /// A write; with force unit access when the flag is set.
    Write(Extent, Vec<u64>, bool),
    Flush,
}

/// What the store is asked.
#[derive(Debug, Clone)]
pub enum StoreReq {
    Renew,
    /// A read of the node's watch-fed mirror (it may lag).
    Get,
    /// A read from the store itself (linearizable), as a node makes before
    /// it joins after a power loss.
    GetLatest,
    Cas {
        base: u64,
        record: ReplicaSet,
    },
}

/// What the store answers.
#[derive(Debug, Clone)]
pub enum StoreResp {
    Renewed,
    Record { revision: u64, record: ReplicaSet },
    CasOk { revision: u64, record: ReplicaSet },
    CasFailed { revision: u64, record: ReplicaSet },
}

/// A message on the simulated network.
#[derive(Debug, Clone)]
pub enum Msg {
    Io {
        op: u64,
        attempt: u32,
        cmd: HostCmd,
    },
    IoDone {
        op: u64,
        attempt: u32,
        result: HostResult,
        data: Vec<u64>,
    },
    AnaQuery,
    AnaState {
        optimized: bool,
    },
    ToReplica {
        msg: ToReplica,
        data: Vec<u64>,
    },
    FromReplica(FromReplica),
    StoreReq {
        tag: u64,
        req: StoreReq,
    },
    StoreResp {
        tag: u64,
        resp: StoreResp,
    },
}

/// Something that happens at a time.
#[derive(Debug)]
pub enum Event {
    /// A message arrives. Messages to a node travel on a connection to one
    /// incarnation of it: if it restarted meanwhile, they are lost (as TCP's
    /// are when the process at the other end dies).
    Deliver {
        from: Endpoint,
        to: Endpoint,
        to_incarnation: u64,
        msg: Msg,
    },
    NodeTick {
        node: NodeId,
    },
    /// A node's local disk completes `op` (a node-internal event, of one incarnation).
    LocalDone {
        node: NodeId,
        incarnation: u64,
        op: u64,
    },
    /// A node's change to its files reached its disk (or failed), of one incarnation.
    FilesDone {
        node: NodeId,
        incarnation: u64,
    },
    /// A replica's answer leaves after its disk completed.
    ReplicaAnswer {
        node: NodeId,
        incarnation: u64,
        to: NodeId,
        reply: FromReplica,
    },
    HostTick,
    StoreTick,
    Chaos,
    Restart {
        node: NodeId,
    },
    Resume {
        node: NodeId,
    },
    /// The operator clears a node's disk failure.
    ClearDisk {
        node: NodeId,
    },
    /// The operator makes room in a node's data directory.
    FilesRoom {
        node: NodeId,
    },
    Heal {
        a: Endpoint,
        b: Endpoint,
    },
    Unslow {
        a: Endpoint,
        b: Endpoint,
    },
}

struct Scheduled {
    at: Duration,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: the earliest first.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// What nodes, the host and the store hand back to the world.
#[derive(Default)]
pub struct Outbox {
    pub sends: Vec<(Endpoint, Msg)>,
    pub later: Vec<(Duration, Event)>,
    pub trace: Vec<String>,
}

impl Outbox {
    pub fn send(&mut self, to: Endpoint, msg: Msg) {
        self.sends.push((to, msg));
    }

    pub fn after(&mut self, delay: Duration, event: Event) {
        self.later.push((delay, event));
    }

    pub fn note(&mut self, line: String) {
        self.trace.push(line);
    }
}

/// The state of a node process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Up,
    Down,
    Paused,
}

struct World {
    config: SimConfig,
    rng: Rng,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    nodes: Vec<Node>,
    liveness: Vec<Liveness>,
    /// Events that reached a paused node, in order.
    backlog: Vec<VecDeque<Event>>,
    store: Store,
    host: Host,
    partitions: BTreeSet<(Endpoint, Endpoint)>,
    slow: BTreeMap<(Endpoint, Endpoint), Duration>,
    /// Per direction, when its last message arrives (TCP keeps order).
    last_arrival: BTreeMap<(Endpoint, Endpoint), Duration>,
    trace: VecDeque<String>,
    report: Report,
}

/// Trace lines a failure shows (`WEFT_SIM_TRACE` sets another number).
const TRACE_KEPT: usize = 400;

/// Runs one simulation.
pub fn run(seed: u64, config: &SimConfig) -> Result<Report, Failure> {
    let mut world = World::new(seed, config.clone());
    match world.run() {
        Ok(()) => Ok(world.report),
        Err(message) => Err(Failure {
            seed,
            message,
            trace: world.trace.into_iter().collect(),
        }),
    }
}

impl World {
    fn new(seed: u64, config: SimConfig) -> World {
        let geometry = Geometry {
            blocks: config.blocks,
            region_blocks: config.region_blocks,
        };
        let ids: Vec<NodeId> = (0..config.nodes).map(NodeId).collect();
        let record = ReplicaSet::new(&ids);
        let nodes = ids
            .iter()
            .map(|&id| Node::new(id, geometry, &config))
            .collect();
        World {
            rng: Rng::new(seed),
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes,
            liveness: vec![Liveness::Up; ids.len()],
            backlog: (0..ids.len()).map(|_| VecDeque::new()).collect(),
            store: Store::new(record, &ids, &config),
            host: Host::new(geometry, &config, ids.clone()),
            partitions: BTreeSet::new(),
            slow: BTreeMap::new(),
            last_arrival: BTreeMap::new(),
            trace: VecDeque::new(),
            report: Report::default(),
            config,
        }
    }

    fn schedule(&mut self, delay: Duration, event: Event) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at: self.now + delay,
            seq: self.seq,
            event,
        });
    }

    fn note(&mut self, line: String) {
        let kept = std::env::var("WEFT_SIM_TRACE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(TRACE_KEPT);
        if self.trace.len() >= kept {
            self.trace.pop_front();
        }
        let at = self.now.as_micros();
        self.trace
            .push_back(format!("{:>6}.{:03} ms {line}", at / 1000, at % 1000));
    }

    fn run(&mut self) -> Result<(), String> {
        for id in 0..self.config.nodes {
            self.schedule(Duration::ZERO, Event::NodeTick { node: NodeId(id) });
        }
        self.schedule(Duration::ZERO, Event::HostTick);
        self.schedule(Duration::ZERO, Event::StoreTick);
        self.schedule(Duration::from_millis(500), Event::Chaos);
        let chaos_end = self.config.chaos;
        let deadline = chaos_end + Duration::from_secs(60);
        let mut healed = false;
        while let Some(next) = self.queue.pop() {
            self.now = next.at;
            if !healed && self.now >= chaos_end {
                healed = true;
                self.heal_all();
            }
            if self.now >= deadline {
                return Err(self.stuck());
            }
            self.dispatch(next.event)?;
            self.check_in_sync()?;
            if healed && self.finished()? {
                return Ok(());
            }
        }
        Err("the event queue ran dry".to_string())
    }

    /// After every step: every replica the store calls in sync holds the
    /// last acknowledged write of every block that has no write outstanding
    /// (but one whose node lost power: it may have lost unflushed writes
    /// until it leaves the in-sync set and is rebuilt; the reads check that
    /// nobody relies on it meanwhile).
    fn check_in_sync(&self) -> Result<(), String> {
        let record = self.store.record();
        let trusted =
            |node: NodeId| record.is_in_sync(node) && !self.nodes[node.0 as usize].is_unclean();
        for member in record.members.iter().filter(|m| trusted(m.node)) {
            let disk = &self.nodes[member.node.0 as usize].disk;
            for (block, &value) in disk.iter().enumerate() {
                let block = block as u64;
                if !self.host.may_hold(block, value) && !self.host.writing(block) {
                    return Err(format!(
                        "{} is in sync in the store's record (epoch {}) but holds {value} in block {block}, whose last acknowledged write is {}",
                        member.node,
                        record.epoch.0,
                        self.host.acked(block)
                    ));
                }
            }
        }
        Ok(())
    }

    /// After the faults: the host drained and verified everything, and every
    /// replica is back in sync with the primary's data.
    fn finished(&mut self) -> Result<bool, String> {
        if !self.host.verified() {
            return Ok(false);
        }
        let record = self.store.record().clone();
        // Nodes the operator took out of the volume are never rebuilt.
        let rebuilt = !record
            .members
            .iter()
            .any(|m| self.nodes[m.node.0 as usize].is_unclean());
        if !rebuilt || record.members.iter().any(|m| !record.is_in_sync(m.node)) {
            return Ok(false);
        }
        let primary = &self.nodes[record.primary.0 as usize];
        if !primary.is_active_primary() || !primary.is_settled() {
            return Ok(false);
        }
        for member in &record.members {
            let disk = &self.nodes[member.node.0 as usize].disk;
            if *disk != primary.disk {
                let block = (0..disk.len()).find(|&b| disk[b] != primary.disk[b]);
                return Err(format!(
                    "in-sync replica {} differs from primary {} at block {:?} ({:?} against {:?})",
                    member.node,
                    record.primary,
                    block,
                    block.map(|b| disk[b]),
                    block.map(|b| primary.disk[b]),
                ));
            }
        }
        self.report.writes = self.host.stats.writes;
        self.report.reads = self.host.stats.reads;
        self.report.flushes = self.host.stats.flushes;
        self.report.retries = self.host.stats.retries;
        self.report.given_up = self.host.stats.given_up;
        self.report.longest_pause = self.host.stats.longest_pause;
        self.report.promotions = record.epoch.0 - 1;
        (self.report.moves_asked, self.report.moves_done) = self.store.moves;
        self.report.takeovers = self.store.takeovers;
        self.report.member_changes = self.store.member_changes;
        self.report.lagging_reads = self.store.lagging_reads;
        self.report.lost_answers = self.store.lost_answers;
        self.report.files_failed = self.nodes.iter().map(|n| n.faults.files_failed).sum();
        self.report.writes_held = self.nodes.iter().map(|n| n.faults.writes_held).sum();
        Ok(true)
    }

    fn stuck(&self) -> String {
        let record = self.store.record();
        format!(
            "not done 60 s after the faults healed: host {}; record epoch {} primary {} members {:?}; nodes {}",
            self.host.describe(),
            record.epoch.0,
            record.primary,
            record.members,
            self.nodes
                .iter()
                .map(|n| n.describe())
                .collect::<Vec<_>>()
                .join("; ")
        )
    }

    fn dispatch(&mut self, event: Event) -> Result<(), String> {
        if let Some(node) = event_node(&event) {
            match self.liveness[node.0 as usize] {
                Liveness::Down => return Ok(()),
                Liveness::Paused => {
                    self.backlog[node.0 as usize].push_back(event);
                    return Ok(());
                }
                Liveness::Up => {}
            }
        }
        let mut out = Outbox::default();
        let actor = match event {
            Event::Deliver {
                from,
                to,
                to_incarnation,
                msg,
            } => {
                if let Endpoint::Node(node) = to {
                    if self.nodes[node.0 as usize].incarnation() != to_incarnation {
                        return Ok(());
                    }
                }
                match to {
                    Endpoint::Host => {
                        self.host
                            .receive(from, msg, self.now, &mut self.rng, &mut out)?
                    }
                    Endpoint::Store => {
                        let Endpoint::Node(node) = from else {
                            unreachable!("only nodes ask the store")
                        };
                        self.store
                            .receive(node, msg, self.now, &mut self.rng, &mut out);
                    }
                    Endpoint::Node(node) => self.nodes[node.0 as usize].receive(
                        from,
                        msg,
                        self.now,
                        &mut self.rng,
                        &mut out,
                    ),
                }
                to
            }
            Event::NodeTick { node } => {
                self.nodes[node.0 as usize].tick(self.now, &mut self.rng, &mut out);
                out.after(Duration::from_millis(10), Event::NodeTick { node });
                Endpoint::Node(node)
            }
            Event::LocalDone {
                node,
                incarnation,
                op,
            } => {
                let now = self.now;
                self.nodes[node.0 as usize].local_done(
                    incarnation,
                    op,
                    now,
                    &mut self.rng,
                    &mut out,
                );
                Endpoint::Node(node)
            }
            Event::FilesDone { node, incarnation } => {
                let now = self.now;
                self.nodes[node.0 as usize].files_done(incarnation, now, &mut self.rng, &mut out);
                Endpoint::Node(node)
            }
            Event::ReplicaAnswer {
                node,
                incarnation,
                to,
                reply,
            } => {
                if self.nodes[node.0 as usize].incarnation() == incarnation {
                    out.send(Endpoint::Node(to), Msg::FromReplica(reply));
                }
                Endpoint::Node(node)
            }
            Event::HostTick => {
                let generating = self.now < self.config.chaos;
                self.host
                    .tick(self.now, &mut self.rng, &mut out, generating)?;
                out.after(Duration::from_millis(1), Event::HostTick);
                Endpoint::Host
            }
            Event::StoreTick => {
                self.store.tick(self.now, &mut out);
                out.after(Duration::from_millis(50), Event::StoreTick);
                Endpoint::Store
            }
            Event::Chaos => {
                if self.now < self.config.chaos {
                    self.chaos();
                    let next = Duration::from_millis(self.rng.range(100, 800));
                    self.schedule(next, Event::Chaos);
                }
                return Ok(());
            }
            Event::Restart { node } => {
                self.restart(node);
                return Ok(());
            }
            Event::Resume { node } => {
                self.resume(node);
                return Ok(());
            }
            Event::ClearDisk { node } => {
                self.nodes[node.0 as usize].clear_disk();
                self.note(format!("clear {node}'s disk failure"));
                return Ok(());
            }
            Event::FilesRoom { node } => {
                self.nodes[node.0 as usize].set_files_full(false);
                self.note(format!("room again in {node}'s data directory"));
                return Ok(());
            }
            Event::Heal { a, b } => {
                self.partitions.remove(&(a, b));
                self.partitions.remove(&(b, a));
                self.note(format!("heal {a:?} <-> {b:?}"));
                return Ok(());
            }
            Event::Unslow { a, b } => {
                self.slow.remove(&(a, b));
                self.slow.remove(&(b, a));
                return Ok(());
            }
        };
        self.flush_outbox(actor, out);
        Ok(())
    }

    /// Sends what `actor` sent (through partitions, delays and losses) and
    /// schedules what it asked for later.
    fn flush_outbox(&mut self, actor: Endpoint, out: Outbox) {
        for line in out.trace {
            self.note(format!("{actor:?}: {line}"));
        }
        for (delay, event) in out.later {
            self.schedule(delay, event);
        }
        for (to, msg) in out.sends {
            if self.partitions.contains(&(actor, to)) || self.rng.chance(1_000) {
                continue;
            }
            let mut delay = Duration::from_micros(self.rng.range(50, 500));
            if self.rng.chance(3_000) {
                delay += Duration::from_millis(self.rng.range(50, 500));
            }
            delay += self.slow.get(&(actor, to)).copied().unwrap_or_default();
            let key = (actor, to);
            let arrival =
                (self.now + delay).max(self.last_arrival.get(&key).copied().unwrap_or_default());
            self.last_arrival.insert(key, arrival);
            let to_incarnation = match to {
                Endpoint::Node(node) => self.nodes[node.0 as usize].incarnation(),
                _ => 0,
            };
            self.seq += 1;
            self.queue.push(Scheduled {
                at: arrival,
                seq: self.seq,
                event: Event::Deliver {
                    from: actor,
                    to,
                    to_incarnation,
                    msg,
                },
            });
        }
    }

    fn power_loss_safe(&self) -> bool {
        let record = self.store.record();
        let in_sync = record
            .members
            .iter()
            .filter(|m| record.is_in_sync(m.node))
            .count();
        in_sync >= 2 && !self.nodes.iter().any(Node::is_unclean)
    }

    fn unwell(&self) -> usize {
        let down = self.liveness.iter().filter(|&&l| l != Liveness::Up).count();
        let disks = self.nodes.iter().filter(|n| n.is_disk_failed()).count();
        down + disks
    }

    fn random_endpoint(&mut self) -> Endpoint {
        let n = u64::from(self.config.nodes);
        match self.rng.range(0, n + 2) {
            x if x < n => Endpoint::Node(NodeId(x as u16)),
            x if x == n => Endpoint::Host,
            _ => Endpoint::Store,
        }
    }

    /// One fault.
    fn chaos(&mut self) {
        self.report.faults += 1;
        let node = NodeId(self.rng.range(0, u64::from(self.config.nodes)) as u16);
        let index = node.0 as usize;
        let may_fail = self.unwell() + 1 < usize::from(self.config.nodes)
            && self.liveness[index] == Liveness::Up;
        match self.rng.range(0, 13) {
            0..=2 if may_fail => {
                self.liveness[index] = Liveness::Down;
                let now = self.now;
                self.nodes[index].crash(now, &mut self.rng);
                self.backlog[index].clear();
                let back = Duration::from_millis(self.rng.range(200, 4000));
                self.note(format!("crash {node}, restart in {back:?}"));
                self.schedule(back, Event::Restart { node });
            }
            // Power loss: only while another replica holds every
            // acknowledged write (two in sync, nobody else unclean), or an
            // unflushed acknowledged write may be lost for good, as NVMe allows.
            9 if may_fail && self.power_loss_safe() => {
                self.liveness[index] = Liveness::Down;
                let now = self.now;
                self.nodes[index].power_loss(now, &mut self.rng);
                self.report.power_losses += 1;
                self.backlog[index].clear();
                let back = Duration::from_millis(self.rng.range(200, 4000));
                self.note(format!("power loss {node}, back in {back:?}"));
                self.schedule(back, Event::Restart { node });
            }
            // A disk that fails (a failed pool): only while another replica
            // holds every acknowledged write, as for a power loss.
            11 if may_fail && self.power_loss_safe() => {
                self.nodes[index].fail_disk();
                self.report.disk_failures += 1;
                let back = Duration::from_millis(self.rng.range(300, 4000));
                self.note(format!("{node}'s disk fails, cleared in {back:?}"));
                self.schedule(back, Event::ClearDisk { node });
            }
            12 => {
                self.nodes[index].set_files_full(true);
                self.report.files_full += 1;
                let back = Duration::from_millis(self.rng.range(300, 4000));
                self.note(format!("{node}'s data directory is full for {back:?}"));
                self.schedule(back, Event::FilesRoom { node });
            }
            3..=4 if may_fail => {
                self.liveness[index] = Liveness::Paused;
                let back = Duration::from_millis(self.rng.range(100, 2500));
                self.note(format!("pause {node} for {back:?}"));
                self.schedule(back, Event::Resume { node });
            }
            5..=7 => {
                let a = self.random_endpoint();
                let b = self.random_endpoint();
                if a != b {
                    self.partitions.insert((a, b));
                    let one_way = self.rng.chance(300_000);
                    if !one_way {
                        self.partitions.insert((b, a));
                    }
                    let back = Duration::from_millis(self.rng.range(100, 3000));
                    self.note(format!(
                        "partition {a:?} -> {b:?} (both ways: {}) for {back:?}",
                        !one_way
                    ));
                    self.schedule(back, Event::Heal { a, b });
                }
            }
            8 if self.rng.chance(500_000) => {
                let pick = self.rng.next_u64();
                let mut out = Outbox::default();
                self.store.ask_move(pick, &mut out);
                self.flush_outbox(Endpoint::Store, out);
            }
            10 if self.rng.chance(300_000) => {
                let pick = self.rng.next_u64();
                let now = self.now;
                let mut out = Outbox::default();
                self.store.change_members(pick, now, &mut out);
                self.flush_outbox(Endpoint::Store, out);
            }
            _ => {
                let a = self.random_endpoint();
                let b = self.random_endpoint();
                if a != b {
                    let extra = Duration::from_millis(self.rng.range(20, 400));
                    self.slow.insert((a, b), extra);
                    self.slow.insert((b, a), extra);
                    let back = Duration::from_millis(self.rng.range(500, 3000));
                    self.note(format!("slow {a:?} <-> {b:?} by {extra:?} for {back:?}"));
                    self.schedule(back, Event::Unslow { a, b });
                }
            }
        }
    }

    fn restart(&mut self, node: NodeId) {
        let index = node.0 as usize;
        if self.liveness[index] != Liveness::Down {
            return;
        }
        self.liveness[index] = Liveness::Up;
        self.nodes[index].restart(self.now);
        self.note(format!("restart {node}"));
        self.schedule(Duration::ZERO, Event::NodeTick { node });
    }

    fn resume(&mut self, node: NodeId) {
        let index = node.0 as usize;
        if self.liveness[index] != Liveness::Paused {
            return;
        }
        self.liveness[index] = Liveness::Up;
        self.note(format!("resume {node}"));
        let backlog: Vec<Event> = self.backlog[index].drain(..).collect();
        for event in backlog {
            self.schedule(Duration::ZERO, event);
        }
    }

    fn heal_all(&mut self) {
        self.note("faults end: heal everything".to_string());
        self.partitions.clear();
        self.slow.clear();
        for node in &mut self.nodes {
            node.clear_disk();
            node.set_files_full(false);
        }
        for id in 0..self.config.nodes {
            let node = NodeId(id);
            match self.liveness[id as usize] {
                Liveness::Down => self.restart(node),
                Liveness::Paused => self.resume(node),
                Liveness::Up => {}
            }
        }
    }
}

fn event_node(event: &Event) -> Option<NodeId> {
    match event {
        Event::Deliver {
            to: Endpoint::Node(node),
            ..
        }
        | Event::NodeTick { node }
        | Event::LocalDone { node, .. }
        | Event::FilesDone { node, .. }
        | Event::ReplicaAnswer { node, .. } => Some(*node),
        _ => None,
    }
}
