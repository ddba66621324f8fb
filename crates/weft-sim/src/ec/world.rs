//! The erasure-coded simulation's world: the event queue and its clock, the
//! network and its faults, the store and its controller, the chaos, and the
//! end check.

use super::host::Host;
use super::node::Node;
use super::snapshots::Taken;
use crate::rng::Rng;
use crate::Failure;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;
use weft_ec::{encode, EcConfig, EcPhase, FromMember, Geometry, JournalLayout, Layout, ToMember};
use weft_replication::{HostResult, MemberState, NodeId, ReplicaSet};

/// What a run simulates.
#[derive(Debug, Clone)]
pub struct EcSimConfig {
    /// The stripe's shape (`k + m` nodes).
    pub layout: Layout,
    /// Stripes in the volume.
    pub stripes: u64,
    /// A block's bytes.
    pub block_bytes: u32,
    /// A chunk's bytes.
    pub chunk_bytes: u32,
    /// Journal slots per member.
    pub slots: u32,
    /// How long faults are injected.
    pub chaos: Duration,
    /// Host commands outstanding at once.
    pub queue_depth: usize,
    /// Node lease time to live.
    pub lease_ttl: Duration,
    /// The controller promotes this long after a primary's lease ended.
    pub promotion_delay: Duration,
    /// A member that does not answer within this long is faulted.
    pub member_timeout: Duration,
}

impl EcSimConfig {
    /// The default run for `layout`.
    pub fn new(layout: Layout) -> EcSimConfig {
        EcSimConfig {
            layout,
            stripes: 4,
            block_bytes: 512,
            chunk_bytes: 4096,
            slots: 4,
            chaos: Duration::from_secs(20),
            queue_depth: 6,
            lease_ttl: Duration::from_millis(1000),
            promotion_delay: Duration::from_millis(300),
            member_timeout: Duration::from_millis(200),
        }
    }

    /// The primary's configuration on node `me`.
    pub(crate) fn primary(&self, me: NodeId) -> EcConfig {
        let geometry = Geometry::new(self.layout, self.chunk_bytes).expect("a geometry");
        EcConfig {
            me,
            geometry,
            journal: self.journal(),
            volume_bytes: self.volume_bytes(),
            member_timeout: self.member_timeout,
            reattach_interval: Duration::from_millis(300),
            rebuild_bytes_per_sec: 4 * 1024 * 1024,
        }
    }

    pub(crate) fn journal(&self) -> JournalLayout {
        JournalLayout {
            slots: self.slots,
            block_bytes: self.block_bytes,
            chunk_bytes: self.chunk_bytes,
        }
    }

    pub(crate) fn volume_bytes(&self) -> u64 {
        self.stripes * self.layout.data() as u64 * u64::from(self.chunk_bytes)
    }

    /// A member's shard volume's bytes.
    pub(crate) fn shard_bytes(&self) -> u64 {
        self.journal().data_base() + self.stripes * u64::from(self.chunk_bytes)
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct EcReport {
    /// Writes acknowledged.
    pub writes: u64,
    /// Reads checked.
    pub reads: u64,
    /// Commands sent again after a path error or a lost connection.
    pub retries: u64,
    /// Node crashes (each tears the write its disk was doing).
    pub crashes: u64,
    /// Writes torn by a crash.
    pub torn_writes: u64,
    /// Pauses and cuts from the network.
    pub pauses: u64,
    /// Cuts from the network.
    pub cuts: u64,
    /// Disks failing every op for a while.
    pub disk_failures: u64,
    /// Epochs after the first.
    pub promotions: u64,
    /// Members rebuilt back into sync.
    pub rejoins: u64,
    /// Planned moves of the primary asked for.
    pub moves_asked: u64,
    /// Planned moves the primary carried out.
    pub moves_done: u64,
    /// Snapshots asked of the primary.
    pub snapshots_asked: u64,
    /// Snapshots taken (each checked at the end).
    pub snapshots_taken: u64,
}

impl EcReport {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &EcReport) {
        self.writes += other.writes;
        self.reads += other.reads;
        self.retries += other.retries;
        self.crashes += other.crashes;
        self.torn_writes += other.torn_writes;
        self.pauses += other.pauses;
        self.cuts += other.cuts;
        self.disk_failures += other.disk_failures;
        self.promotions += other.promotions;
        self.rejoins += other.rejoins;
        self.moves_asked += other.moves_asked;
        self.moves_done += other.moves_done;
        self.snapshots_asked += other.snapshots_asked;
        self.snapshots_taken += other.snapshots_taken;
    }
}

/// Who sends and receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Endpoint {
    Host,
    Store,
    Node(NodeId),
}

/// A host command.
#[derive(Debug, Clone)]
pub(crate) enum Cmd {
    Read { offset: u64, len: u32 },
    Write { offset: u64, data: Vec<u8> },
}

/// A message on the simulated network.
#[derive(Debug, Clone)]
pub(crate) enum Msg {
    Io {
        op: u64,
        attempt: u32,
        cmd: Cmd,
    },
    IoDone {
        op: u64,
        attempt: u32,
        result: HostResult,
        data: Vec<u8>,
    },
    ToMember(ToMember),
    FromMember(FromMember),
    Renew {
        sent: Duration,
    },
    Renewed {
        sent: Duration,
    },
    Get,
    Record {
        revision: u64,
        record: ReplicaSet,
    },
    Cas {
        base: u64,
        record: ReplicaSet,
    },
    CasDone {
        ok: bool,
        revision: u64,
        record: ReplicaSet,
    },
}

/// Something that happens at a time.
#[derive(Debug)]
pub(crate) enum Event {
    /// A message arrives, on a connection to one incarnation of a node.
    Deliver {
        from: Endpoint,
        to: Endpoint,
        to_incarnation: u64,
        msg: Msg,
    },
    /// A node's disk finishes the op at the head of its queue.
    DiskDone {
        node: NodeId,
        incarnation: u64,
    },
    NodeTick {
        node: NodeId,
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
    Reconnect {
        node: NodeId,
    },
    DiskBack {
        node: NodeId,
    },
}

/// What nodes and the host hand back to the world.
pub(crate) struct Outbox {
    /// Who sends.
    from: Endpoint,
    pub sends: Vec<(Endpoint, Msg)>,
    pub later: Vec<(Duration, Event)>,
    pub trace: Vec<String>,
    /// Snapshots a primary took: their names and the members that did.
    pub taken: Vec<(String, Vec<usize>)>,
}

impl Outbox {
    fn new(from: Endpoint) -> Outbox {
        Outbox {
            from,
            sends: Vec::new(),
            later: Vec::new(),
            trace: Vec::new(),
            taken: Vec::new(),
        }
    }

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
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    Up,
    Down,
    Paused,
}

const NODE_TICK: Duration = Duration::from_millis(20);
const HOST_TICK: Duration = Duration::from_millis(1);
const STORE_TICK: Duration = Duration::from_millis(50);
const CHAOS_EVERY_MS: (u64, u64) = (200, 1200);
/// After the chaos, how long the cluster has to settle.
const SETTLE: Duration = Duration::from_secs(60);
const TRACE_KEPT: usize = 300;

fn trace_kept() -> usize {
    std::env::var("WEFT_SIM_TRACE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TRACE_KEPT)
}

struct World {
    config: EcSimConfig,
    rng: Rng,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    nodes: Vec<Node>,
    liveness: Vec<Liveness>,
    /// Nodes cut off from the network.
    cut: Vec<bool>,
    backlog: Vec<VecDeque<Event>>,
    host: Host,
    // The store.
    record: ReplicaSet,
    revision: u64,
    lease_ends: BTreeMap<NodeId, Duration>,
    /// The snapshots taken, to check at the end.
    snapshots: Vec<Taken>,
    /// Per direction, when its last message arrives (TCP keeps order).
    last_arrival: BTreeMap<(Endpoint, Endpoint), Duration>,
    trace: VecDeque<String>,
    report: EcReport,
}

/// Runs one simulation of an erasure-coded volume.
pub fn run_ec(seed: u64, config: &EcSimConfig) -> Result<EcReport, Failure> {
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
    fn new(seed: u64, config: EcSimConfig) -> World {
        let n = config.layout.shards();
        let ids: Vec<NodeId> = (0..n as u16).map(NodeId).collect();
        World {
            rng: Rng::new(seed),
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes: ids.iter().map(|&id| Node::new(id, &config)).collect(),
            liveness: vec![Liveness::Up; n],
            cut: vec![false; n],
            backlog: (0..n).map(|_| VecDeque::new()).collect(),
            host: Host::new(&config, n),
            record: ReplicaSet::new(&ids),
            revision: 1,
            lease_ends: ids.iter().map(|&id| (id, config.lease_ttl)).collect(),
            snapshots: Vec::new(),
            last_arrival: BTreeMap::new(),
            trace: VecDeque::new(),
            report: EcReport::default(),
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
        if self.trace.len() >= trace_kept() {
            self.trace.pop_front();
        }
        let at = self.now.as_micros();
        self.trace.push_back(format!("{at:>10}us {line}"));
    }

    fn run(&mut self) -> Result<(), String> {
        for i in 0..self.nodes.len() {
            self.schedule(
                Duration::ZERO,
                Event::NodeTick {
                    node: NodeId(i as u16),
                },
            );
        }
        self.schedule(Duration::ZERO, Event::HostTick);
        self.schedule(Duration::ZERO, Event::StoreTick);
        self.schedule(Duration::from_millis(500), Event::Chaos);
        let end = self.config.chaos + SETTLE;
        let mut healed = false;
        while let Some(next) = self.queue.pop() {
            self.now = next.at;
            if !healed && self.now >= self.config.chaos {
                healed = true;
                self.heal_all();
                self.host.stop_issuing();
            }
            if healed && self.settled() {
                return self.check_end();
            }
            if self.now > end {
                return Err(format!(
                    "not settled {SETTLE:?} after the chaos: {}; {}",
                    self.describe(),
                    self.host.describe()
                ));
            }
            self.handle(next.event)?;
        }
        Err("the event queue ran dry".into())
    }

    fn describe(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(Node::describe).collect();
        format!(
            "record r{} {:?}; nodes {}",
            self.revision,
            self.record,
            nodes.join(", ")
        )
    }

    fn handle(&mut self, event: Event) -> Result<(), String> {
        // Events for a node that is paused wait; for one that is down, are lost.
        let node_of = match &event {
            Event::Deliver {
                to: Endpoint::Node(n),
                ..
            } => Some(*n),
            Event::DiskDone { node, .. } | Event::NodeTick { node } => Some(*node),
            _ => None,
        };
        if let Some(node) = node_of {
            match self.liveness[node.0 as usize] {
                Liveness::Paused => {
                    self.backlog[node.0 as usize].push_back(event);
                    return Ok(());
                }
                Liveness::Down => {
                    match event {
                        Event::NodeTick { .. } => self.schedule(NODE_TICK, event),
                        Event::Deliver {
                            msg: Msg::Io { op, attempt, .. },
                            ..
                        } => self.host.connection_lost(op, attempt, node),
                        _ => {}
                    }
                    return Ok(());
                }
                Liveness::Up => {}
            }
        }
        let mut out = Outbox::new(match &event {
            Event::Deliver { to, .. } => *to,
            Event::DiskDone { node, .. } | Event::NodeTick { node } => Endpoint::Node(*node),
            Event::HostTick => Endpoint::Host,
            _ => Endpoint::Store,
        });
        match event {
            Event::Deliver {
                from,
                to,
                to_incarnation,
                msg,
            } => match to {
                Endpoint::Host => {
                    self.host
                        .receive(from, msg, self.now, &mut self.report, &mut out)?
                }
                Endpoint::Store => self.store_receive(from, msg, &mut out),
                Endpoint::Node(node) => {
                    let n = &mut self.nodes[node.0 as usize];
                    if n.incarnation() == to_incarnation {
                        n.receive(from, msg, self.now, &mut self.rng, &mut out);
                    } else if let Msg::Io { op, attempt, .. } = msg {
                        self.host.connection_lost(op, attempt, node);
                    }
                }
            },
            Event::DiskDone { node, incarnation } => {
                self.nodes[node.0 as usize].disk_done(incarnation, &mut self.rng, &mut out)
            }
            Event::NodeTick { node } => {
                self.nodes[node.0 as usize].tick(self.now, &mut out);
                out.after(NODE_TICK, Event::NodeTick { node });
            }
            Event::HostTick => {
                self.host.tick(self.now, &mut self.rng, &mut out);
                out.after(HOST_TICK, Event::HostTick);
            }
            Event::StoreTick => {
                self.store_tick(&mut out);
                out.after(STORE_TICK, Event::StoreTick);
            }
            Event::Chaos => self.chaos(&mut out),
            // Healed at the chaos's end already.
            Event::Restart { node } if self.liveness[node.0 as usize] != Liveness::Down => {}
            Event::Resume { node } if self.liveness[node.0 as usize] != Liveness::Paused => {}
            Event::Restart { node } => {
                self.liveness[node.0 as usize] = Liveness::Up;
                self.nodes[node.0 as usize].restart(self.now);
                out.note(format!("{node} restarts"));
            }
            Event::Resume { node } => self.resume(node, &mut out),
            Event::Reconnect { node } => {
                self.cut[node.0 as usize] = false;
                out.note(format!("{node} is reconnected"));
            }
            Event::DiskBack { node } => {
                self.nodes[node.0 as usize].disk_failed = false;
                out.note(format!("{node}'s disk works again"));
            }
        }
        self.dispatch(out);
        Ok(())
    }

    fn dispatch(&mut self, out: Outbox) {
        for line in out.trace {
            self.note(line);
        }
        for (name, members) in out.taken {
            // What each block may hold: what the host knows now.
            let expected = self.host.expected();
            self.snapshots.push(Taken {
                name,
                members,
                expected,
            });
            self.report.snapshots_taken += 1;
        }
        for (delay, event) in out.later {
            self.schedule(delay, event);
        }
        for (to, msg) in out.sends {
            self.transmit(out.from, to, msg);
        }
    }

    /// Sends `msg` on the network: it arrives after a delay, in order per
    /// direction, unless either end is cut off (the connection breaks: the
    /// host hears of it, as a reset connection).
    fn transmit(&mut self, from: Endpoint, to: Endpoint, msg: Msg) {
        let is_cut = |e: Endpoint| match e {
            Endpoint::Node(n) => self.cut[n.0 as usize],
            _ => false,
        };
        if is_cut(from) || is_cut(to) {
            if let (Endpoint::Host, Endpoint::Node(node), Msg::Io { op, attempt, .. })
            | (Endpoint::Node(node), Endpoint::Host, Msg::IoDone { op, attempt, .. }) =
                (from, to, &msg)
            {
                self.host.connection_lost(*op, *attempt, node);
            }
            return;
        }
        let delay = if from == to {
            Duration::from_micros(5)
        } else {
            Duration::from_micros(self.rng.range(20, 400))
        };
        let last = self
            .last_arrival
            .get(&(from, to))
            .copied()
            .unwrap_or_default();
        let at = (self.now + delay).max(last);
        self.last_arrival.insert((from, to), at);
        let to_incarnation = match to {
            Endpoint::Node(n) => self.nodes[n.0 as usize].incarnation(),
            _ => 0,
        };
        self.seq += 1;
        self.queue.push(Scheduled {
            at,
            seq: self.seq,
            event: Event::Deliver {
                from,
                to,
                to_incarnation,
                msg,
            },
        });
    }

    // ---- The store and its controller.

    fn store_receive(&mut self, from: Endpoint, msg: Msg, out: &mut Outbox) {
        let Endpoint::Node(node) = from else {
            return;
        };
        let reply = match msg {
            Msg::Renew { sent } => {
                self.lease_ends
                    .insert(node, self.now + self.config.lease_ttl);
                Msg::Renewed { sent }
            }
            Msg::Get => Msg::Record {
                revision: self.revision,
                record: self.record.clone(),
            },
            Msg::Cas { base, record } => {
                let ok = base == self.revision;
                if ok {
                    self.commit(record, out);
                }
                Msg::CasDone {
                    ok,
                    revision: self.revision,
                    record: self.record.clone(),
                }
            }
            _ => return,
        };
        out.send(from, reply);
    }

    fn commit(&mut self, record: ReplicaSet, out: &mut Outbox) {
        if record.epoch > self.record.epoch {
            self.report.promotions += 1;
        }
        if self.record.move_to.is_some() && self.record.move_to == Some(record.primary) {
            self.report.moves_done += 1;
        }
        for (old, new) in self.record.members.iter().zip(&record.members) {
            if old.state != MemberState::InSync && new.state == MemberState::InSync {
                self.report.rejoins += 1;
            }
        }
        self.revision += 1;
        self.record = record;
        out.note(format!("commit r{}: {:?}", self.revision, self.record));
    }

    fn store_tick(&mut self, out: &mut Outbox) {
        let now = self.now;
        let up = |n: NodeId| self.lease_ends.get(&n).is_some_and(|&end| now < end);
        let gone = self
            .lease_ends
            .get(&self.record.primary)
            .is_none_or(|&end| now >= end + self.config.promotion_delay);
        if !gone {
            return;
        }
        if let Some(next) = weft_ec::controller::promote(&self.record, up) {
            out.note(format!("promote {}", next.primary));
            self.commit(next, out);
        }
    }

    // ---- Chaos.

    fn chaos(&mut self, out: &mut Outbox) {
        if self.now >= self.config.chaos {
            return;
        }
        let (low, high) = CHAOS_EVERY_MS;
        out.after(
            Duration::from_millis(self.rng.range(low, high)),
            Event::Chaos,
        );
        // Now and then the operator moves the primary (`move-primary`, a
        // drain), or takes a snapshot.
        if self.rng.chance(150_000) {
            return self.ask_move(out);
        }
        if self.rng.chance(100_000) {
            return self.ask_snapshot();
        }
        let n = self.nodes.len() as u64;
        // The primary's node one time in three.
        let index = if self.rng.chance(333_333) {
            self.record.primary.0 as usize
        } else {
            self.rng.range(0, n) as usize
        };
        let node = NodeId(index as u16);
        if self.liveness[index] != Liveness::Up {
            return;
        }
        match self.rng.range(0, 4) {
            0 => {
                self.liveness[index] = Liveness::Down;
                if self.nodes[index].crash(&mut self.rng) {
                    self.report.torn_writes += 1;
                }
                self.host.node_lost(node);
                self.report.crashes += 1;
                out.note(format!("{node} crashes"));
                let back = Duration::from_millis(self.rng.range(50, 3000));
                out.after(back, Event::Restart { node });
            }
            1 => {
                self.liveness[index] = Liveness::Paused;
                self.report.pauses += 1;
                out.note(format!("{node} pauses"));
                let back = Duration::from_millis(self.rng.range(10, 2500));
                out.after(back, Event::Resume { node });
            }
            2 => {
                if !self.cut[index] {
                    self.cut[index] = true;
                    self.report.cuts += 1;
                    out.note(format!("{node} is cut off"));
                    let back = Duration::from_millis(self.rng.range(10, 2500));
                    out.after(back, Event::Reconnect { node });
                }
            }
            _ => {
                if !self.nodes[index].disk_failed {
                    self.nodes[index].disk_failed = true;
                    self.report.disk_failures += 1;
                    out.note(format!("{node}'s disk fails"));
                    let back = Duration::from_millis(self.rng.range(10, 2000));
                    out.after(back, Event::DiskBack { node });
                }
            }
        }
    }

    /// Asks the primary to hand over to another in-sync member, unless a
    /// move is pending.
    fn ask_move(&mut self, out: &mut Outbox) {
        let candidates: Vec<NodeId> = self.record.in_sync_secondaries().collect();
        if self.record.move_to.is_some() || candidates.is_empty() {
            return;
        }
        let to = *self.rng.pick(&candidates);
        let mut next = self.record.clone();
        next.move_to = Some(to);
        out.note(format!("the operator moves the primary to {to}"));
        self.report.moves_asked += 1;
        self.commit(next, out);
    }

    /// Asks the primary's node for a snapshot, if it is up (what it sends
    /// then is the node's).
    fn ask_snapshot(&mut self) {
        let primary = self.record.primary;
        if self.liveness[primary.0 as usize] != Liveness::Up {
            return;
        }
        let name = format!("s{}", self.report.snapshots_asked);
        self.report.snapshots_asked += 1;
        let mut out = Outbox::new(Endpoint::Node(primary));
        self.nodes[primary.0 as usize].ask_snapshot(name, self.now, &mut out);
        self.dispatch(out);
    }

    fn resume(&mut self, node: NodeId, out: &mut Outbox) {
        self.liveness[node.0 as usize] = Liveness::Up;
        out.note(format!("{node} resumes"));
        for event in std::mem::take(&mut self.backlog[node.0 as usize]) {
            self.schedule(Duration::ZERO, event);
        }
    }

    fn heal_all(&mut self) {
        let mut out = Outbox::new(Endpoint::Store);
        out.note("the chaos ends: every fault heals".into());
        for i in 0..self.nodes.len() {
            let node = NodeId(i as u16);
            match self.liveness[i] {
                Liveness::Down => {
                    self.liveness[i] = Liveness::Up;
                    self.nodes[i].restart(self.now);
                }
                Liveness::Paused => self.resume(node, &mut out),
                Liveness::Up => {}
            }
            self.cut[i] = false;
            self.nodes[i].disk_failed = false;
        }
        self.dispatch(out);
    }

    // ---- The end.

    fn settled(&self) -> bool {
        let primary = &self.nodes[self.record.primary.0 as usize];
        self.host.is_done()
            && primary.primary_phase() == Some(EcPhase::Active)
            && primary.primary_idle()
            && self
                .record
                .members
                .iter()
                .all(|m| m.state == MemberState::InSync)
    }

    /// Every stripe's parity is its data's, and every block holds its last
    /// acknowledged value.
    fn check_end(&mut self) -> Result<(), String> {
        let config = self.config.primary(NodeId(0));
        let layout = self.config.layout;
        let chunk = self.config.chunk_bytes as usize;
        for stripe in 0..self.config.stripes {
            let at = (config.journal.data_base() + stripe * chunk as u64) as usize;
            let shard = |s: usize| {
                let member = config.geometry.member_of(stripe, s);
                &self.nodes[member].disk[at..at + chunk]
            };
            let data: Vec<&[u8]> = (0..layout.data()).map(shard).collect();
            let mut parity = vec![vec![0u8; chunk]; layout.parity()];
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            encode(layout, &data, &mut p).expect("a stripe");
            for (j, expected) in parity.iter().enumerate() {
                if shard(layout.data() + j) != expected.as_slice() {
                    return Err(format!(
                        "stripe {stripe}'s parity {j} is not its data's: a torn stripe"
                    ));
                }
            }
            for (s, bytes) in data.iter().enumerate() {
                let base = stripe * config.geometry.stripe_bytes() + (s * chunk) as u64;
                self.host.check_end(base, bytes)?;
            }
        }
        super::snapshots::check(&self.snapshots, &self.nodes, &self.config, &self.host)
    }
}
