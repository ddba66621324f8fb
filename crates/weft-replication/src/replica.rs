//! What a replica answers a primary. The replica's side itself is the
//! target's (`weft_proto::fence` for which primary session may write,
//! `weft_proto::intent` for the regions it may hold writes that are not on
//! every replica), which weft-sim runs as the node does.
//!
//! What this does not do: fence, keep an intent or apply data.

use crate::regions::RegionSet;
use crate::types::Token;

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
