//! The host: an application issuing random writes, reads and flushes
//! through a multipath model, and the checker of what it reads.
//!
//! Multipath as Linux's nvme driver does it: a command goes to a path the
//! host believes ANA Optimized; a path error (ANA Inaccessible or
//! Transition) or a timeout sends it again, on whichever path is Optimized
//! by then, and makes the host ask every path for its ANA state; with no
//! Optimized path the command waits (queue while a path may come back).
//! Nodes also tell the host when their state changes (ANA change notices).
//!
//! The application never has two commands on one block at once (as a file
//! system or `fio --verify` does), so each block's expected content is the
//! value of its last acknowledged write, and a read must return exactly that.
//!
//! Unless the application gave up on a write: one write in ten that a path
//! fails or times out is given up, as an application whose I/O failed
//! does (an attempt may still land later, with the same data). The block
//! may then hold the old value or the given up one, on every copy alike
//! once the cluster settled: the replicas' write intents are what make the
//! copies agree (a new primary resyncs those regions). The application never writes such a block again, so
//! that the simulation's end check that every copy in sync is the
//! primary's catches an intent that missed a region.

use crate::rng::Rng;
use crate::world::{Endpoint, HostCmd, Msg, Outbox, SimConfig};
use std::collections::BTreeMap;
use std::time::Duration;
use weft_replication::{Extent, Geometry, HostResult, NodeId};

const ANA_QUERY_EVERY: Duration = Duration::from_millis(50);
const RETRY_AFTER: Duration = Duration::from_millis(2);
/// A write a path failed is given up in this many.
const GIVE_UP_PPM: u64 = 100_000;

struct Command {
    cmd: HostCmd,
    attempt: u32,
    /// The path the current attempt went to, if one is out.
    path: Option<NodeId>,
    sent_at: Duration,
    retry_at: Duration,
}

impl Command {
    fn extent(&self) -> Option<Extent> {
        match &self.cmd {
            HostCmd::Read(extent) | HostCmd::Write(extent, _, _) => Some(*extent),
            HostCmd::Flush => None,
        }
    }
}

/// What the host did.
#[derive(Debug, Default)]
pub struct HostStats {
    pub writes: u64,
    pub reads: u64,
    pub flushes: u64,
    pub retries: u64,
    pub given_up: u64,
    pub longest_pause: Duration,
}

/// After the faults: read every block once to check it.
#[derive(Debug, PartialEq, Eq)]
enum Verify {
    NotYet,
    Reading { next_block: u64 },
    Done,
}

pub struct Host {
    geometry: Geometry,
    queue_depth: usize,
    timeout: Duration,
    paths: Vec<NodeId>,
    optimized: BTreeMap<NodeId, bool>,
    last_query: Option<Duration>,
    acked: Vec<u64>,
    /// Per block, the values of writes given up since its last acknowledged one.
    given_up: Vec<Vec<u64>>,
    commands: BTreeMap<u64, Command>,
    next_op: u64,
    next_value: u64,
    last_completion: Duration,
    verify: Verify,
    pub stats: HostStats,
}

impl Host {
    pub fn new(geometry: Geometry, config: &SimConfig, paths: Vec<NodeId>) -> Host {
        Host {
            geometry,
            queue_depth: config.queue_depth,
            timeout: config.host_timeout,
            optimized: paths.iter().map(|&p| (p, false)).collect(),
            paths,
            last_query: None,
            acked: vec![0; geometry.blocks as usize],
            given_up: vec![Vec::new(); geometry.blocks as usize],
            commands: BTreeMap::new(),
            next_op: 0,
            next_value: 0,
            last_completion: Duration::ZERO,
            verify: Verify::NotYet,
            stats: HostStats::default(),
        }
    }

    /// Whether `block` has a write outstanding (its content is in flux).
    pub fn writing(&self, block: u64) -> bool {
        self.commands.values().any(
            |c| matches!(&c.cmd, HostCmd::Write(e, _, _) if e.block <= block && block < e.end()),
        )
    }

    /// The value of the last acknowledged write of `block`.
    pub fn acked(&self, block: u64) -> u64 {
        self.acked[block as usize]
    }

    /// Whether `block` may hold `value`: its last acknowledged write's, or
    /// one of a write given up since.
    pub fn may_hold(&self, block: u64, value: u64) -> bool {
        value == self.acked[block as usize] || self.given_up[block as usize].contains(&value)
    }

    pub fn verified(&self) -> bool {
        self.verify == Verify::Done
    }

    pub fn describe(&self) -> String {
        format!(
            "{} commands outstanding (oldest {:?}), verify {:?}, paths {:?}",
            self.commands.len(),
            self.commands
                .values()
                .next()
                .map(|c| (&c.cmd, c.attempt, c.path)),
            self.verify,
            self.optimized
        )
    }

    pub fn tick(
        &mut self,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
        generating: bool,
    ) -> Result<(), String> {
        if generating {
            while self.commands.len() < self.queue_depth {
                if !self.generate(rng) {
                    break;
                }
            }
        } else {
            self.verify_step();
        }
        if self.commands.is_empty() {
            self.last_completion = now;
        } else {
            self.stats.longest_pause = self.stats.longest_pause.max(now - self.last_completion);
        }
        self.send_due(now, rng, out);
        Ok(())
    }

    /// A random command on blocks no outstanding command touches.
    fn generate(&mut self, rng: &mut Rng) -> bool {
        let kind = rng.range(0, 20);
        if kind == 0 {
            self.push(HostCmd::Flush);
            return true;
        }
        let blocks = rng.range(1, 4) as u32;
        let block = rng.range(0, self.geometry.blocks - u64::from(blocks) + 1);
        let extent = Extent { block, blocks };
        if self.busy(&extent) {
            return false;
        }
        let cmd = if kind < 12 {
            if self.given_up[block as usize..(block + u64::from(blocks)) as usize]
                .iter()
                .any(|g| !g.is_empty())
            {
                // Never written again: its copies must agree by the end
                // on their own (the intents' resync), not by a rewrite.
                return false;
            }
            let values = (0..blocks)
                .map(|_| {
                    self.next_value += 1;
                    self.next_value
                })
                .collect();
            HostCmd::Write(extent, values, rng.chance(125_000))
        } else {
            HostCmd::Read(extent)
        };
        self.push(cmd);
        true
    }

    fn busy(&self, extent: &Extent) -> bool {
        self.commands
            .values()
            .any(|c| c.extent().is_some_and(|e| e.overlaps(extent)))
    }

    fn push(&mut self, cmd: HostCmd) {
        self.next_op += 1;
        self.commands.insert(
            self.next_op,
            Command {
                cmd,
                attempt: 0,
                path: None,
                sent_at: Duration::ZERO,
                retry_at: Duration::ZERO,
            },
        );
    }

    /// After the faults healed and the last commands completed: read the
    /// whole volume back.
    fn verify_step(&mut self) {
        match self.verify {
            Verify::NotYet if self.commands.is_empty() => {
                self.verify = Verify::Reading { next_block: 0 };
            }
            Verify::Reading { next_block } if self.commands.is_empty() => {
                if next_block >= self.geometry.blocks {
                    self.verify = Verify::Done;
                    return;
                }
                let blocks = (self.geometry.blocks - next_block).min(8) as u32;
                self.push(HostCmd::Read(Extent {
                    block: next_block,
                    blocks,
                }));
                self.verify = Verify::Reading {
                    next_block: next_block + u64::from(blocks),
                };
            }
            _ => {}
        }
    }

    fn send_due(&mut self, now: Duration, rng: &mut Rng, out: &mut Outbox) {
        let optimized: Vec<NodeId> = self
            .paths
            .iter()
            .copied()
            .filter(|p| self.optimized[p])
            .collect();
        let mut want_query = optimized.is_empty();
        let mut giving_up = Vec::new();
        for (&op, command) in self.commands.iter_mut() {
            if let Some(path) = command.path {
                if now >= command.sent_at + self.timeout {
                    // No answer: the path is in doubt, the command goes again.
                    self.optimized.insert(path, false);
                    command.path = None;
                    command.retry_at = now;
                    want_query = true;
                    if matches!(command.cmd, HostCmd::Write(..)) && rng.chance(GIVE_UP_PPM) {
                        giving_up.push(op);
                    }
                }
                continue;
            }
            if now < command.retry_at || optimized.is_empty() {
                continue;
            }
            let path = *rng.pick(&optimized);
            if command.attempt > 0 {
                self.stats.retries += 1;
            }
            command.attempt += 1;
            command.path = Some(path);
            command.sent_at = now;
            out.send(
                Endpoint::Node(path),
                Msg::Io {
                    op,
                    attempt: command.attempt,
                    cmd: command.cmd.clone(),
                },
            );
        }
        for op in giving_up {
            self.give_up(op, out);
        }
        if want_query && self.last_query.is_none_or(|t| now >= t + ANA_QUERY_EVERY) {
            self.last_query = Some(now);
            for &path in &self.paths {
                out.send(Endpoint::Node(path), Msg::AnaQuery);
            }
        }
    }

    pub fn receive(
        &mut self,
        from: Endpoint,
        msg: Msg,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
    ) -> Result<(), String> {
        let Endpoint::Node(node) = from else {
            return Ok(());
        };
        match msg {
            Msg::AnaState { optimized } => {
                self.optimized.insert(node, optimized);
            }
            Msg::IoDone {
                op,
                attempt,
                result,
                data,
            } => self.completed(node, op, attempt, result, data, now, rng, out)?,
            _ => {}
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn completed(
        &mut self,
        node: NodeId,
        op: u64,
        attempt: u32,
        result: HostResult,
        data: Vec<u64>,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
    ) -> Result<(), String> {
        let Some(command) = self.commands.get_mut(&op) else {
            return Ok(());
        };
        if result != HostResult::Ok {
            if command.attempt == attempt && command.path == Some(node) {
                self.optimized.insert(node, false);
                command.path = None;
                command.retry_at = now + RETRY_AFTER;
                if matches!(command.cmd, HostCmd::Write(..)) && rng.chance(GIVE_UP_PPM) {
                    self.give_up(op, out);
                }
            }
            return Ok(());
        }
        // Any attempt's success will do: every attempt carries the same data.
        let command = self.commands.remove(&op).expect("present");
        self.last_completion = now;
        match command.cmd {
            HostCmd::Write(extent, values, _) => {
                let start = extent.block as usize;
                self.acked[start..start + values.len()].copy_from_slice(&values);
                for given_up in &mut self.given_up[start..start + values.len()] {
                    given_up.clear();
                }
                self.stats.writes += 1;
                out.note(format!(
                    "host: write {op} {extent:?} = {values:?} acked by {node}"
                ));
            }
            HostCmd::Read(extent) => {
                let start = extent.block as usize;
                let expected = &self.acked[start..start + extent.blocks as usize];
                self.stats.reads += 1;
                let mut held = (extent.block..extent.end()).zip(&data);
                if data.len() != expected.len() || !held.all(|(b, &v)| self.may_hold(b, v)) {
                    return Err(format!(
                        "read {op} of {extent:?} from {node} (attempt {attempt}) returned {data:?}, the acknowledged writes are {expected:?}"
                    ));
                }
            }
            HostCmd::Flush => self.stats.flushes += 1,
        }
        Ok(())
    }

    /// The application gives write `op` up (its path failed it): the blocks
    /// may hold its values until they are written again.
    fn give_up(&mut self, op: u64, out: &mut Outbox) {
        let command = self.commands.remove(&op).expect("present");
        let HostCmd::Write(extent, values, _) = command.cmd else {
            unreachable!("only writes are given up");
        };
        let start = extent.block as usize;
        for (given_up, value) in self.given_up[start..].iter_mut().zip(values) {
            given_up.push(value);
        }
        self.stats.given_up += 1;
        out.note(format!("host: write {op} {extent:?} given up"));
    }
}
