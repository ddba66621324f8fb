//! The store (etcd's part): the volume's record under compare-and-swap,
//! node leases, and the cluster controller that promotes a new primary
//! once the old one's lease has been gone for the promotion delay.
//!
//! The controller runs beside the store and sees it directly: which node
//! is controller, and its election, is `weft-cluster`'s business and tested
//! there.

use crate::world::{Endpoint, Msg, Outbox, SimConfig, StoreReq, StoreResp};
use std::collections::BTreeMap;
use std::time::Duration;
use weft_replication::{controller, Epoch, Member, MemberState, NodeId, ReplicaSet};

pub struct Store {
    record: ReplicaSet,
    revision: u64,
    lease_ends: BTreeMap<NodeId, Duration>,
    lease_ttl: Duration,
    promotion_delay: Duration,
    /// Planned moves asked for, and done.
    pub moves: (u64, u64),
    /// Replicas added and removed by the operator.
    pub member_changes: u64,
    nodes: Vec<NodeId>,
}

impl Store {
    pub fn new(record: ReplicaSet, nodes: &[NodeId], config: &SimConfig) -> Store {
        Store {
            record,
            revision: 1,
            lease_ends: nodes.iter().map(|&n| (n, config.lease_ttl)).collect(),
            lease_ttl: config.lease_ttl,
            promotion_delay: config.promotion_delay,
            moves: (0, 0),
            member_changes: 0,
            nodes: nodes.to_vec(),
        }
    }

    pub fn record(&self) -> &ReplicaSet {
        &self.record
    }

    fn up(&self, node: NodeId, now: Duration) -> bool {
        self.lease_ends.get(&node).is_some_and(|&end| now < end)
    }

    pub fn receive(&mut self, from: NodeId, msg: Msg, now: Duration, out: &mut Outbox) {
        let Msg::StoreReq { tag, req } = msg else {
            return;
        };
        let resp = match req {
            StoreReq::Renew => {
                self.lease_ends.insert(from, now + self.lease_ttl);
                StoreResp::Renewed
            }
            StoreReq::Get => StoreResp::Record {
                revision: self.revision,
                record: self.record.clone(),
            },
            StoreReq::Cas { base, record } => {
                if base == self.revision {
                    if self.record.move_to == Some(record.primary) {
                        self.moves.1 += 1;
                    }
                    self.revision += 1;
                    out.note(format!("commit r{} by {from}: {record:?}", self.revision));
                    self.record = record;
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
        self.record.move_to = Some(target);
        self.moves.0 += 1;
        self.revision += 1;
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
        self.revision += 1;
        self.member_changes += 1;
        out.note(format!("r{}: members change: {next:?}", self.revision));
        self.record = next;
    }

    /// The controller: drop retired replicas once out of sync; promote when
    /// the primary's lease ended a promotion delay ago.
    pub fn tick(&mut self, now: Duration, out: &mut Outbox) {
        // Retired replicas the primary took out of the in-sync set leave.
        if let Some(next) = self.record.without_retired() {
            self.revision += 1;
            out.note(format!(
                "r{}: retired replicas leave: {next:?}",
                self.revision
            ));
            self.record = next;
        }
        let ended = self
            .lease_ends
            .get(&self.record.primary)
            .is_none_or(|&end| now >= end + self.promotion_delay);
        if !ended {
            return;
        }
        if let Some(next) = controller::promote(&self.record, |n| self.up(n, now)) {
            self.revision += 1;
            out.note(format!("promote r{}: {next:?}", self.revision));
            self.record = next;
        }
    }
}
