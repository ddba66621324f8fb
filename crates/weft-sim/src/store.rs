//! The store (etcd's part): the volume's record under compare-and-swap,
//! node leases, and the cluster controller that promotes a new primary
//! once the old one's lease has been gone for the promotion delay. (A
//! replica that has not heard its primary for a read grant takes over by
//! its own compare-and-swap, before that lease ends: the node's.)
//!
//! The controller runs beside the store and sees it directly: which node
//! is controller, and its election, is `weft-cluster`'s business and tested
//! there.
//!
//! It answers as etcd does to a node reading through its own watch-fed
//! mirror: a read may return an older revision than the store's (the
//! watch lags), never older than one that node was given already; and the
//! answer to a compare-and-swap may be lost after it was made (the node
//! times out and learns what became of it from a later read).

use crate::rng::Rng;
use crate::world::{Endpoint, Msg, Outbox, SimConfig, StoreReq, StoreResp};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use weft_replication::{controller, Epoch, Member, MemberState, NodeId, ReplicaSet};

/// Revisions kept for lagging reads.
const HISTORY: usize = 16;
/// Reads answered from a lagging watch, per million.
const LAGGING_READ_PPM: u64 = 200_000;
/// Compare-and-swap answers lost after the change was made, per million.
const LOST_ANSWER_PPM: u64 = 20_000;

pub struct Store {
    record: ReplicaSet,
    revision: u64,
    /// The last revisions, oldest first (the current one last).
    history: VecDeque<(u64, ReplicaSet)>,
    /// The revision each node was last given.
    given: BTreeMap<NodeId, u64>,
    /// Reads answered with an older revision than the store's.
    pub lagging_reads: u64,
    /// Compare-and-swap answers lost after the change was made.
    pub lost_answers: u64,
    lease_ends: BTreeMap<NodeId, Duration>,
    lease_ttl: Duration,
    promotion_delay: Duration,
    /// Planned moves asked for, and done.
    pub moves: (u64, u64),
    /// Replicas added and removed by the operator.
    pub member_changes: u64,
    nodes: Vec<NodeId>,
    /// Replicas' compare-and-swaps that made themselves primary in place
    /// of another (taking over from a silent primary).
    pub takeovers: u64,
}

impl Store {
    pub fn new(record: ReplicaSet, nodes: &[NodeId], config: &SimConfig) -> Store {
        Store {
            history: VecDeque::from([(1, record.clone())]),
            given: BTreeMap::new(),
            lagging_reads: 0,
            lost_answers: 0,
            record,
            revision: 1,
            lease_ends: nodes.iter().map(|&n| (n, config.lease_ttl)).collect(),
            lease_ttl: config.lease_ttl,
            promotion_delay: config.promotion_delay,
            moves: (0, 0),
            member_changes: 0,
            nodes: nodes.to_vec(),
            takeovers: 0,
        }
    }

    pub fn record(&self) -> &ReplicaSet {
        &self.record
    }

    fn up(&self, node: NodeId, now: Duration) -> bool {
        self.lease_ends.get(&node).is_some_and(|&end| now < end)
    }

    /// Makes `next` the record, at the next revision.
    fn commit(&mut self, next: ReplicaSet) {
        self.revision += 1;
        self.record = next;
        self.history.push_back((self.revision, self.record.clone()));
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
    }

    /// What `from`'s mirror answers a read with: the store's record, or
    /// now and then an older one it was not given yet (its watch lags).
    fn read(&mut self, from: NodeId, rng: &mut Rng) -> (u64, ReplicaSet) {
        let given = self.given.get(&from).copied().unwrap_or(0);
        let newer: Vec<&(u64, ReplicaSet)> =
            self.history.iter().filter(|(r, _)| *r >= given).collect();
        let (revision, record) = if newer.len() > 1 && rng.chance(LAGGING_READ_PPM) {
            self.lagging_reads += 1;
            newer[rng.range(0, newer.len() as u64) as usize].clone()
        } else {
            (self.revision, self.record.clone())
        };
        self.given.insert(from, revision);
        (revision, record)
    }

    pub fn receive(
        &mut self,
        from: NodeId,
        msg: Msg,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
    ) {
        let Msg::StoreReq { tag, req } = msg else {
            return;
        };
        let resp = match req {
            StoreReq::Renew => {
                self.lease_ends.insert(from, now + self.lease_ttl);
                StoreResp::Renewed
            }
            StoreReq::Get => {
                let (revision, record) = self.read(from, rng);
                StoreResp::Record { revision, record }
            }
            StoreReq::GetLatest => {
                self.given.insert(from, self.revision);
                let (revision, record) = (self.revision, self.record.clone());
                StoreResp::Record { revision, record }
            }
            StoreReq::Cas { base, record } => {
                if base == self.revision {
                    if self.record.move_to == Some(record.primary) {
                        self.moves.1 += 1;
                    }
                    if record.primary == from && self.record.primary != from {
                        self.takeovers += 1;
                    }
                    self.commit(record);
                    out.note(format!(
                        "commit r{} by {from}: {:?}",
                        self.revision, self.record
                    ));
                    if rng.chance(LOST_ANSWER_PPM) {
                        self.lost_answers += 1;
                        out.note(format!("the answer to r{} is lost", self.revision));
                        return;
                    }
                    StoreResp::CasOk {
                        revision: self.revision,
                        record: self.record.clone(),
                    }
                } else {
                    StoreResp::CasFailed {
                        revision: self.revision,
                        record: self.record.clone(),
                    }
                }
            }
        };
        if let StoreResp::CasOk { revision, .. } | StoreResp::CasFailed { revision, .. } = &resp {
            self.given.insert(from, *revision);
        }
        out.send(Endpoint::Node(from), Msg::StoreResp { tag, resp });
    }

    /// The operator asks to move the primary role to another in-sync
    /// replica (`weft volume move-primary`), unless a move is pending.
    pub fn ask_move(&mut self, pick: u64, out: &mut Outbox) {
        let candidates: Vec<NodeId> = self.record.in_sync_secondaries().collect();
        if self.record.move_to.is_some() || candidates.is_empty() {
            return;
        }
        let target = candidates[pick as usize % candidates.len()];
        let mut next = self.record.clone();
        next.move_to = Some(target);
        self.commit(next);
        self.moves.0 += 1;
        out.note(format!("r{}: move the primary to {target}", self.revision));
    }

    /// The operator removes a replica other than the primary (`weft volume
    /// set --replicas`, keeping two), or adds one on a node that holds none
    /// (faulted under epoch 0: never held anything); only while the
    /// primary's lease holds, as weft-cluster's `replica_members` does. A
    /// removed replica is retired: the primary takes it out of the in-sync
    /// set, and [`Store::tick`] drops it then.
    pub fn change_members(&mut self, pick: u64, now: Duration, out: &mut Outbox) {
        if !self.up(self.record.primary, now) || self.record.move_to.is_some() {
            return;
        }
        let outside: Vec<NodeId> = self
            .nodes
            .iter()
            .copied()
            .filter(|&n| self.record.state_of(n).is_none())
            .collect();
        let staying: Vec<NodeId> = self
            .record
            .members
            .iter()
            .map(|m| m.node)
            .filter(|&n| n != self.record.primary && !self.record.retire.contains(&n))
            .collect();
        let mut next = self.record.clone();
        if !outside.is_empty() && (staying.len() < 2 || pick.is_multiple_of(2)) {
            let node = outside[(pick / 2) as usize % outside.len()];
            next.members.push(Member {
                node,
                state: MemberState::Faulted { epoch: Epoch(0) },
            });
        } else if staying.len() >= 2 {
            let node = staying[(pick / 2) as usize % staying.len()];
            next.retire.push(node);
        } else {
            return;
        }
        self.commit(next);
        self.member_changes += 1;
        out.note(format!(
            "r{}: members change: {:?}",
            self.revision, self.record
        ));
    }

    /// The controller: drop retired replicas once out of sync; promote when
    /// the primary's lease ended a promotion delay ago.
    pub fn tick(&mut self, now: Duration, out: &mut Outbox) {
        // Retired replicas the primary took out of the in-sync set leave.
        if let Some(next) = self.record.without_retired() {
            self.commit(next);
            out.note(format!(
                "r{}: retired replicas leave: {:?}",
                self.revision, self.record
            ));
        }
        let ended = self
            .lease_ends
            .get(&self.record.primary)
            .is_none_or(|&end| now >= end + self.promotion_delay);
        if !ended {
            return;
        }
        if let Some(next) = controller::promote(&self.record, |n| self.up(n, now)) {
            self.commit(next);
            out.note(format!("promote r{}: {:?}", self.revision, self.record));
        }
    }
}
