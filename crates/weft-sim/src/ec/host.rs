//! The erasure-coded simulation's host: an application issuing random
//! reads and writes through a multipath model, and the checker of what it
//! reads.
//!
//! A command goes to the path the host last found serving; a path error
//! (ANA Inaccessible or Transition) or a lost connection sends it again,
//! on the next path for Inaccessible, until it is acknowledged. The
//! application never has two commands on one block at once (as a file
//! system or `fio --verify` does), and every block a write writes gets a
//! value of its own (its eight bytes repeated over the block), so a read
//! must find in each block exactly the value of its last acknowledged write.

use super::world::{Cmd, EcReport, EcSimConfig, Endpoint, Msg, Outbox};
use crate::rng::Rng;
use std::collections::BTreeMap;
use std::time::Duration;
use weft_replication::{HostResult, NodeId};

const RETRY_AFTER: Duration = Duration::from_millis(2);

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Blocks `block..block + count`, values `first..first + count`.
    Write {
        block: u64,
        count: u64,
        first: u64,
    },
    Read {
        block: u64,
        count: u64,
    },
}

struct Command {
    kind: Kind,
    attempt: u32,
    /// The path the current attempt went to, if one is out.
    at: Option<NodeId>,
    retry_at: Duration,
}

pub(crate) struct Host {
    block_bytes: u64,
    blocks: u64,
    /// The most blocks a command spans: two stripes.
    most: u64,
    queue_depth: usize,
    paths: u16,
    acked: Vec<u64>,
    under_way: Vec<Option<u64>>,
    /// Reads outstanding per block.
    reading: Vec<u32>,
    next_value: u64,
    next_op: u64,
    commands: BTreeMap<u64, Command>,
    path: u16,
    issuing: bool,
}

impl Host {
    pub fn new(config: &EcSimConfig, paths: usize) -> Host {
        let block_bytes = u64::from(config.block_bytes);
        let blocks = config.volume_bytes() / block_bytes;
        Host {
            block_bytes,
            blocks,
            most: 2 * config.layout.data() as u64 * u64::from(config.chunk_bytes) / block_bytes,
            queue_depth: config.queue_depth,
            paths: paths as u16,
            acked: vec![0; blocks as usize],
            under_way: vec![None; blocks as usize],
            reading: vec![0; blocks as usize],
            next_value: 1,
            next_op: 0,
            commands: BTreeMap::new(),
            path: 0,
            issuing: true,
        }
    }

    pub fn stop_issuing(&mut self) {
        self.issuing = false;
    }

    pub fn is_done(&self) -> bool {
        self.commands.is_empty()
    }

    pub fn describe(&self) -> String {
        format!(
            "host: {} commands out, path {}",
            self.commands.len(),
            self.path
        )
    }

    pub fn tick(&mut self, now: Duration, rng: &mut Rng, out: &mut Outbox) {
        while self.issuing && self.commands.len() < self.queue_depth {
            let Some(kind) = self.pick(rng) else {
                break;
            };
            self.commands.insert(
                self.next_op,
                Command {
                    kind,
                    attempt: 0,
                    at: None,
                    retry_at: now,
                },
            );
            self.next_op += 1;
        }
        let due: Vec<u64> = self
            .commands
            .iter()
            .filter(|(_, c)| c.at.is_none() && c.retry_at <= now)
            .map(|(&op, _)| op)
            .collect();
        for op in due {
            self.send(op, out);
        }
    }

    /// A new command: a read, or a write of blocks no write is under way on.
    fn pick(&mut self, rng: &mut Rng) -> Option<Kind> {
        // Mostly small; now and then up to two stripes (whole stripes too).
        let count = if rng.chance(200_000) {
            rng.range(1, self.most + 1)
        } else {
            rng.range(1, 9)
        }
        .min(self.blocks);
        let block = rng.range(0, self.blocks - count + 1);
        let range = block as usize..(block + count) as usize;
        let busy = self.under_way[range.clone()].iter().any(Option::is_some)
            || self.reading[range.clone()].iter().any(|&r| r > 0);
        if busy {
            return None;
        }
        if rng.chance(400_000) {
            for r in &mut self.reading[range] {
                *r += 1;
            }
            return Some(Kind::Read { block, count });
        }
        let first = self.next_value;
        self.next_value += count;
        for (i, slot) in self.under_way[range].iter_mut().enumerate() {
            *slot = Some(first + i as u64);
        }
        Some(Kind::Write {
            block,
            count,
            first,
        })
    }

    fn send(&mut self, op: u64, out: &mut Outbox) {
        let command = self.commands.get_mut(&op).expect("the command");
        let path = NodeId(self.path);
        command.at = Some(path);
        let cmd = match command.kind {
            Kind::Read { block, count } => Cmd::Read {
                offset: block * self.block_bytes,
                len: (count * self.block_bytes) as u32,
            },
            Kind::Write {
                block,
                count,
                first,
            } => {
                let mut data = Vec::with_capacity((count * self.block_bytes) as usize);
                for value in first..first + count {
                    for _ in 0..self.block_bytes / 8 {
                        data.extend_from_slice(&value.to_le_bytes());
                    }
                }
                Cmd::Write {
                    offset: block * self.block_bytes,
                    data,
                }
            }
        };
        let attempt = command.attempt;
        out.note(format!(
            "host: op {op} {:?} attempt {attempt} to {path}",
            command.kind
        ));
        out.send(Endpoint::Node(path), Msg::Io { op, attempt, cmd });
    }

    /// The attempt's connection broke: it is sent again.
    pub fn connection_lost(&mut self, op: u64, attempt: u32, _node: NodeId) {
        if let Some(c) = self.commands.get_mut(&op) {
            if c.attempt == attempt && c.at.is_some() {
                c.at = None;
                c.attempt += 1;
                self.path = (self.path + 1) % self.paths;
            }
        }
    }

    /// `node` died: every attempt out on it is sent again.
    pub fn node_lost(&mut self, node: NodeId) {
        for c in self.commands.values_mut() {
            if c.at == Some(node) {
                c.at = None;
                c.attempt += 1;
            }
        }
        if self.path == node.0 {
            self.path = (self.path + 1) % self.paths;
        }
    }

    pub fn receive(
        &mut self,
        _from: Endpoint,
        msg: Msg,
        now: Duration,
        report: &mut EcReport,
        out: &mut Outbox,
    ) -> Result<(), String> {
        let Msg::IoDone {
            op,
            attempt,
            result,
            data,
        } = msg
        else {
            return Ok(());
        };
        let Some(command) = self.commands.get_mut(&op) else {
            return Ok(());
        };
        if command.attempt != attempt {
            return Ok(());
        }
        if result != HostResult::Ok {
            if result == HostResult::Inaccessible && command.at == Some(NodeId(self.path)) {
                self.path = (self.path + 1) % self.paths;
            }
            command.at = None;
            command.attempt += 1;
            command.retry_at = now + RETRY_AFTER;
            report.retries += 1;
            return Ok(());
        }
        let kind = command.kind;
        self.commands.remove(&op);
        out.note(format!("host: op {op} {kind:?} done"));
        match kind {
            Kind::Write {
                block,
                count,
                first,
            } => {
                for i in 0..count {
                    let b = (block + i) as usize;
                    self.acked[b] = first + i;
                    self.under_way[b] = None;
                }
                report.writes += 1;
            }
            Kind::Read { block, count } => {
                for i in 0..count {
                    let at = (i * self.block_bytes) as usize;
                    let bytes = &data[at..at + self.block_bytes as usize];
                    self.check(block + i, bytes)
                        .map_err(|e| format!("read op {op} (blocks {block}+{count}): {e}"))?;
                    self.reading[(block + i) as usize] -= 1;
                }
                report.reads += 1;
            }
        }
        Ok(())
    }

    /// Whether `bytes` is what block `block` holds: its last acknowledged value.
    fn check(&self, block: u64, bytes: &[u8]) -> Result<(), String> {
        let value = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        if bytes.chunks(8).any(|c| c != value.to_le_bytes()) {
            return Err(format!("block {block} holds a torn or foreign block"));
        }
        let acked = self.acked[block as usize];
        if value != acked {
            return Err(format!(
                "block {block} reads value {value}: its last acknowledged write wrote {acked}"
            ));
        }
        Ok(())
    }

    /// What each block may hold in a snapshot taken now: its last
    /// acknowledged value, or the value of a write under way on it.
    pub fn expected(&self) -> Vec<(u64, Option<u64>)> {
        self.acked
            .iter()
            .copied()
            .zip(self.under_way.iter().copied())
            .collect()
    }

    /// The `bytes` at volume offset `base` of a snapshot hold, block by
    /// block, one of the values `expected` allows.
    pub fn check_snapshot(
        &self,
        expected: &[(u64, Option<u64>)],
        base: u64,
        bytes: &[u8],
    ) -> Result<(), String> {
        for (i, block_bytes) in bytes.chunks(self.block_bytes as usize).enumerate() {
            let block = base / self.block_bytes + i as u64;
            let Some(&(acked, under_way)) = expected.get(block as usize) else {
                continue;
            };
            let value = u64::from_le_bytes(block_bytes[..8].try_into().expect("8 bytes"));
            if block_bytes.chunks(8).any(|c| c != value.to_le_bytes()) {
                return Err(format!("block {block} holds a torn or foreign block"));
            }
            if value != acked && Some(value) != under_way {
                return Err(format!(
                    "block {block} holds value {value}: when it was taken, its last acknowledged write wrote {acked} (and {under_way:?} was under way)"
                ));
            }
        }
        Ok(())
    }

    /// At the end: the `bytes` at volume offset `base` hold every block's
    /// last acknowledged value.
    pub fn check_end(&self, base: u64, bytes: &[u8]) -> Result<(), String> {
        for (i, block_bytes) in bytes.chunks(self.block_bytes as usize).enumerate() {
            let block = base / self.block_bytes + i as u64;
            if block < self.blocks {
                self.check(block, block_bytes)
                    .map_err(|e| format!("at the end, {e}"))?;
            }
        }
        Ok(())
    }
}
