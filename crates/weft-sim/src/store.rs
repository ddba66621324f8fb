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
use weft_replication::{controller, NodeId, ReplicaSet};

pub struct Store {
    record: ReplicaSet,
    revision: u64,
    lease_ends: BTreeMap<NodeId, Duration>,
    lease_ttl: Duration,
    promotion_delay: Duration,
    /// Planned moves asked for, and done.
    pub moves: (u64, u64),
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

    /// The controller: promote when the primary's lease ended a promotion delay ago.
    pub fn tick(&mut self, now: Duration, out: &mut Outbox) {
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
