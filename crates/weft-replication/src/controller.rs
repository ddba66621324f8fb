//! The cluster controller's part in failover: when a volume's primary has
//! been gone (its node's lease ended) for the promotion delay, promote an
//! in-sync replica on a live node under the next epoch.
//!
//! The delay after the lease's end is what makes reads safe: a primary
//! stops serving once its own view of its lease runs out, which is before
//! the store ends the lease, so by the time a new primary exists the old
//! one serves nothing. Writes do not rely on time: the new primary fences
//! every in-sync replica before it serves.

use crate::record::{MemberState, ReplicaSet};
use crate::types::NodeId;

/// The record after promoting a new primary, if the primary is down and an
/// in-sync replica's node is up. `up` says whether a node's lease is alive.
/// The old primary becomes a faulted replica of the new epoch.
pub fn promote(record: &ReplicaSet, up: impl Fn(NodeId) -> bool) -> Option<ReplicaSet> {
    if up(record.primary) {
        return None;
    }
    // A replica being retired only if no other can take over.
    let candidates = || record.in_sync_secondaries().filter(|&node| up(node));
    let candidate = candidates()
        .find(|node| !record.retire.contains(node))
        .or_else(|| candidates().next())?;
    let mut next = record.handed_over(candidate);
    next.set_state(record.primary, MemberState::Faulted { epoch: next.epoch });
    // Being retired, it may have been the only other copy: it serves now.
    next.retire.retain(|&node| node != candidate);
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Epoch;

    #[test]
    fn promotes_an_in_sync_replica_on_a_live_node() {
        let record = ReplicaSet::new(&[NodeId(0), NodeId(1), NodeId(2)]);
        assert_eq!(promote(&record, |_| true), None, "the primary is up");
        let mut faulted = record.clone();
        faulted.set_state(NodeId(1), MemberState::Faulted { epoch: Epoch(1) });
        let next = promote(&faulted, |n| n != NodeId(0)).expect("n2 is in sync and up");
        assert_eq!((next.epoch, next.primary), (Epoch(2), NodeId(2)));
        assert_eq!(
            next.state_of(NodeId(0)),
            Some(MemberState::Faulted { epoch: Epoch(2) })
        );
        assert_eq!(
            promote(&faulted, |n| n == NodeId(1)),
            None,
            "no in-sync replica is up"
        );
    }
}
