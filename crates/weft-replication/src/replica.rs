//! A replica's side: which primary session may write to it (its fence) and
//! which regions it may hold writes that are not on every replica (its
//! write-intent bitmap). Both are persistent; the driver writes them to
//! stable storage before it answers the message that changed them.
//!
//! What this does not do: apply the data (the driver does, after
//! [`Replica::admits`] said yes).

use crate::regions::RegionSet;
use crate::types::{Geometry, Token};

/// What a replica answers the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromReplica {
    /// The fence was accepted: from now on only `token` may write. Carries
    /// the regions the replica may hold unconfirmed writes in, which the
    /// primary copies over before relying on the replica.
    Fenced {
        /// The fence.
        token: Token,
        /// The replica's write-intent bitmap.
        intent: RegionSet,
        /// Its node lost power since a primary last wrote to it: it may
        /// lack writes it had acknowledged (they were not flushed), so it
        /// must be rebuilt in full.
        unclean: bool,
    },
    /// The write, copy or flush `op` of session `token` is done (durably for a flush or FUA).
    Done {
        /// The session it was sent under.
        token: Token,
        /// The primary's op.
        op: crate::OpId,
    },
    /// Refused: the replica is fenced by `current`, not by the sender's
    /// session (a newer primary or session fenced it, or the replica
    /// restarted and awaits a new fence).
    Refused {
        /// The sender's token, echoed.
        token: Token,
        /// The replica's fence.
        current: Token,
    },
}

/// The fence and write intent of one replica.
#[derive(Debug, Clone)]
pub struct Replica {
    fence: Token,
    /// Whether the fencing session is this process's: after a restart the
    /// replica lost what it had in flight, so the old session may not go on.
    attached: bool,
    intent: RegionSet,
    geometry: Geometry,
    /// Power was lost: reported in every fence until a primary writes or
    /// copies to it under a fence that reported it (it then knows).
    unclean: bool,
    unclean_reported_to: Option<Token>,
}

impl Replica {
    /// A replica as it starts: its fence and persisted write intent, no
    /// live session; `unclean` if its node lost power since a primary last
    /// wrote to it (persisted by the driver: a boot whose id differs from
    /// the one recorded at the last write).
    pub fn new(geometry: Geometry, fence: Token, intent: RegionSet, unclean: bool) -> Replica {
        assert_eq!(intent.capacity(), geometry.regions());
        Replica {
            fence,
            attached: false,
            intent,
            geometry,
            unclean,
            unclean_reported_to: None,
        }
    }

    /// Whether it is still to be rebuilt in full after a power loss (the
    /// driver persists this).
    pub fn unclean(&self) -> bool {
        self.unclean
    }

    /// A fence request. Accepted only with a larger token (tokens only
    /// grow), which the driver persists before answering.
    pub fn fence(&mut self, token: Token) -> FromReplica {
        if token <= self.fence {
            return FromReplica::Refused {
                token,
                current: self.fence,
            };
        }
        self.fence = token;
        self.attached = true;
        if self.unclean {
            self.unclean_reported_to = Some(token);
        }
        FromReplica::Fenced {
            token,
            intent: self.intent.clone(),
            unclean: self.unclean,
        }
    }

    /// Whether a write, copy, flush or clean of session `token` may be applied.
    pub fn admits(&self, token: Token) -> bool {
        self.attached && token == self.fence
    }

    /// The refusal of a message of session `token`.
    pub fn refusal(&self, token: Token) -> FromReplica {
        FromReplica::Refused {
            token,
            current: self.fence,
        }
    }

    /// Records the regions of a write about to be applied (before it is:
    /// the driver persists the intent first). Returns whether the intent changed.
    pub fn will_write(&mut self, extent: &crate::Extent) -> bool {
        if self.unclean && self.unclean_reported_to == Some(self.fence) {
            // The primary writing to it knows it must rebuild it in full.
            self.unclean = false;
        }
        let mut changed = false;
        for region in self.geometry.regions_of(extent) {
            changed |= self.intent.insert(region);
        }
        changed
    }

    /// The primary confirmed that every replica holds the writes of these
    /// regions. Returns whether the intent changed.
    pub fn clean(&mut self, regions: &[u32]) -> bool {
        let mut changed = false;
        for &region in regions {
            changed |= self.intent.remove(region);
        }
        changed
    }

    /// The fence, to persist.
    pub fn fence_token(&self) -> Token {
        self.fence
    }

    /// The write intent, to persist.
    pub fn intent(&self) -> &RegionSet {
        &self.intent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Epoch;

    fn token(epoch: u64, session: u32) -> Token {
        Token {
            epoch: Epoch(epoch),
            session,
        }
    }

    #[test]
    fn only_the_latest_fence_writes_and_fences_only_grow() {
        let geometry = Geometry {
            blocks: 8,
            region_blocks: 4,
        };
        let mut replica = Replica::new(geometry, token(1, 1), RegionSet::new(2), false);
        assert!(
            !replica.admits(token(1, 1)),
            "a restarted replica awaits a new fence"
        );
        assert!(matches!(
            replica.fence(token(1, 1)),
            FromReplica::Refused { .. }
        ));
        assert!(matches!(
            replica.fence(token(1, 2)),
            FromReplica::Fenced { .. }
        ));
        assert!(replica.admits(token(1, 2)));
        assert!(matches!(
            replica.fence(token(2, 1)),
            FromReplica::Fenced { .. }
        ));
        assert!(
            !replica.admits(token(1, 2)),
            "the deposed primary is shut out"
        );
        assert!(matches!(
            replica.fence(token(1, 3)),
            FromReplica::Refused { .. }
        ));
    }
}
