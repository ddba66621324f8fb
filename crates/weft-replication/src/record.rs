//! A replicated volume's replica set as the store holds it: who is primary,
//! under which epoch, and which replicas are in sync. Every change is a
//! compare-and-swap on the record's revision: a promotion by the controller
//! (new epoch, new primary), a replica leaving or rejoining the in-sync set
//! by the primary of the current epoch.

use crate::types::{Epoch, NodeId};
use serde::{Deserialize, Serialize};

/// A replica's standing in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Holds every acknowledged write; its acknowledgement is required.
    InSync,
    /// Out of the in-sync set since `epoch`: it missed writes and must be
    /// rebuilt. Only the primary that faulted it (the same epoch) knows
    /// which regions it missed; under a later epoch it is rebuilt in full.
    Faulted {
        /// The epoch under which it was faulted.
        epoch: Epoch,
    },
}

/// One replica of the volume (the primary is one too, always in sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The node that holds it.
    pub node: NodeId,
    /// Its standing.
    pub state: MemberState,
}

/// The replica set of one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaSet {
    /// The primary's term.
    pub epoch: Epoch,
    /// The node that serves the volume.
    pub primary: NodeId,
    /// Every replica, the primary's included, by node.
    pub members: Vec<Member>,
    /// A planned move of the primary role to this in-sync replica, asked for
    /// by the operator (`move-primary`, `node drain`). The primary drains
    /// and hands over itself, without waiting for any lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_to: Option<NodeId>,
    /// The primary of the epoch before (promoted from, or handed over
    /// from): a new primary that never served and lost power gives the
    /// role back to it, the one copy known to hold every acknowledged write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<NodeId>,
    /// Replicas the operator (or the controller, for a lost node) removes.
    /// An in-sync one cannot simply leave the record: it may hold the only
    /// other copy of writes the primary acknowledged but has not flushed
    /// (a power loss of the primary then loses them). The primary takes it
    /// out of the in-sync set itself, flushing first if it is left the only
    /// copy in sync; a faulted one then leaves the record, whoever writes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retire: Vec<NodeId>,
}

impl ReplicaSet {
    /// Whether the previous primary handed the role over itself (a planned
    /// move: it stays in sync), having stopped serving before it committed
    /// the record; not a promotion over it, nor a record whose previous
    /// primary was forgotten. Only then need a new primary's fences not
    /// wait out the read grants its replicas gave (`weft_proto::fence`).
    pub fn handed_over_by_previous(&self) -> bool {
        self.previous
            .is_some_and(|p| p != self.primary && self.state_of(p) == Some(MemberState::InSync))
    }

    /// A new volume's replica set: every replica in sync (they are all
    /// empty), `nodes[0]` primary, epoch 1.
    pub fn new(nodes: &[NodeId]) -> ReplicaSet {
        assert!(!nodes.is_empty(), "a volume has a replica");
        ReplicaSet {
            epoch: Epoch(1),
            primary: nodes[0],
            members: nodes
                .iter()
                .map(|&node| Member {
                    node,
                    state: MemberState::InSync,
                })
                .collect(),
            move_to: None,
            previous: None,
            retire: Vec::new(),
        }
    }

    /// Whether `other` names the same nodes as replicas (in any order,
    /// whatever their standing). Meaningful where node ids are stable
    /// across records (the simulation's); a driver that numbers nodes by
    /// their place in a list compares their names too.
    pub fn same_members(&self, other: &ReplicaSet) -> bool {
        self.members.len() == other.members.len()
            && self
                .members
                .iter()
                .all(|m| other.state_of(m.node).is_some())
    }

    /// The standing of `node`'s replica, if it holds one.
    pub fn state_of(&self, node: NodeId) -> Option<MemberState> {
        self.members
            .iter()
            .find(|m| m.node == node)
            .map(|m| m.state)
    }

    /// Whether `node` is in the in-sync set.
    pub fn is_in_sync(&self, node: NodeId) -> bool {
        self.state_of(node) == Some(MemberState::InSync)
    }

    /// Sets `node`'s standing.
    ///
    /// # Panics
    /// If `node` holds no replica, or is the primary and `state` is not in sync.
    pub fn set_state(&mut self, node: NodeId, state: MemberState) {
        assert!(
            node != self.primary || state == MemberState::InSync,
            "the primary is in sync"
        );
        let member = self
            .members
            .iter_mut()
            .find(|m| m.node == node)
            .expect("a member");
        member.state = state;
    }

    /// The record without the retired replicas that left the in-sync set
    /// (none: nothing to drop).
    pub fn without_retired(&self) -> Option<ReplicaSet> {
        // Never the previous primary: it may hold writes the primary lost
        // (a primary that lost power before it served gives it the role back).
        let gone = |node: NodeId| {
            node != self.primary
                && Some(node) != self.previous
                && self.retire.contains(&node)
                && !self.is_in_sync(node)
        };
        if !self.members.iter().any(|m| gone(m.node)) {
            return None;
        }
        let mut next = self.clone();
        next.members.retain(|m| !gone(m.node));
        next.retire.retain(|&node| !gone(node));
        Some(next)
    }

    /// The record once the volume passes from its primary to `to` under
    /// the next epoch: a planned move, a promotion, or a primary that cannot
    /// go on. The old primary is recorded as the previous one (a new primary
    /// that lost power before it served gives it the role back, see
    /// `without_retired`), and a move under way ends. The old primary's copy
    /// stays in sync: the caller faults it when it may lack writes.
    ///
    /// # Panics
    /// If `to` is not a replica in sync.
    pub fn handed_over(&self, to: NodeId) -> ReplicaSet {
        assert!(
            to != self.primary && self.is_in_sync(to),
            "the volume passes to another replica in sync"
        );
        let mut next = self.clone();
        next.epoch = self.epoch.next();
        next.primary = to;
        next.previous = Some(self.primary);
        next.move_to = None;
        next
    }

    /// The in-sync replicas other than the primary.
    pub fn in_sync_secondaries(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.members
            .iter()
            .filter(|m| m.node != self.primary && m.state == MemberState::InSync)
            .map(|m| m.node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_handed_over_has_the_next_epoch_its_new_primary_and_no_move() {
        let mut record = ReplicaSet::new(&[NodeId(0), NodeId(1), NodeId(2)]);
        record.move_to = Some(NodeId(2));
        let next = record.handed_over(NodeId(1));
        assert_eq!(next.epoch, record.epoch.next());
        assert_eq!(next.primary, NodeId(1));
        assert_eq!(next.previous, Some(NodeId(0)));
        assert_eq!(next.move_to, None);
        assert!(next.is_in_sync(NodeId(0)), "the caller faults the old copy");
        assert!(next.same_members(&record));
    }

    #[test]
    #[should_panic(expected = "another replica in sync")]
    fn a_volume_is_never_handed_to_a_replica_out_of_sync() {
        let mut record = ReplicaSet::new(&[NodeId(0), NodeId(1)]);
        let epoch = record.epoch;
        record.set_state(NodeId(1), MemberState::Faulted { epoch });
        record.handed_over(NodeId(1));
    }

    #[test]
    fn only_retired_replicas_out_of_sync_leave_and_never_the_previous_primary() {
        let mut record = ReplicaSet::new(&[NodeId(0), NodeId(1), NodeId(2)]);
        record.retire = vec![NodeId(1), NodeId(2)];
        assert_eq!(record.without_retired(), None, "both still in sync");
        record.set_state(NodeId(1), MemberState::Faulted { epoch: Epoch(1) });
        record.set_state(NodeId(2), MemberState::Faulted { epoch: Epoch(1) });
        record.previous = Some(NodeId(2));
        let next = record.without_retired().unwrap();
        assert!(next.state_of(NodeId(1)).is_none());
        assert_eq!(
            next.retire,
            vec![NodeId(2)],
            "it may hold writes the primary lost"
        );
        assert!(next.state_of(NodeId(2)).is_some());
        assert!(!next.same_members(&record) && record.same_members(&record));
    }
}
