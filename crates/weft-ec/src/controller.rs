//! The cluster controller's part in an erasure-coded volume's failover:
//! when its primary has been gone for the promotion delay, another member's
//! node on a live node serves it under the next epoch.
//!
//! Unlike a replicated volume's (`weft_replication::controller`), the old
//! primary's member is not faulted here: it holds one shard of every stripe
//! like any other member, not a copy the new primary could do without, and
//! faulting it could leave fewer than `k` members in sync, which no rebuild
//! comes back from. The new primary faults it itself, under its epoch, if
//! it cannot fence it and `k` others are in sync.

use weft_replication::{NodeId, ReplicaSet};

/// The record after promoting a new primary, if the primary's node is down
/// and an in-sync member's node is up (`up` says whether a node's lease is
/// alive).
pub fn promote(record: &ReplicaSet, up: impl Fn(NodeId) -> bool) -> Option<ReplicaSet> {
    if up(record.primary) {
        return None;
    }
    let candidate = record.in_sync_secondaries().find(|&node| up(node))?;
    Some(record.handed_over(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_replication::{Epoch, MemberState};

    #[test]
    fn promotes_an_in_sync_member_and_keeps_the_old_primarys_shard_in_sync() {
        let nodes: Vec<NodeId> = (0..3).map(NodeId).collect();
        let mut record = ReplicaSet::new(&nodes);
        assert_eq!(promote(&record, |_| true), None, "the primary is up");
        record.members[1].state = MemberState::Faulted { epoch: Epoch(1) };
        let next = promote(&record, |n| n != NodeId(0)).expect("n2 is in sync and up");
        assert_eq!((next.epoch, next.primary), (Epoch(2), NodeId(2)));
        assert!(next.is_in_sync(NodeId(0)));
        assert_eq!(
            promote(&record, |n| n == NodeId(1)),
            None,
            "n1 is out of sync"
        );
    }
}
