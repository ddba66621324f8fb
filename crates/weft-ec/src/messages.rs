//! What an erasure-coded volume's primary says to its members and to its
//! driver, and what it hears back.
//!
//! A member is a shard volume behind its node's private subsystem, fenced
//! as a replica is (`weft_proto::fence`): it reads, writes (durably before
//! it answers when FUA) and flushes what it is told, for the session that
//! fenced it last, and nothing else. The journal, the parity and the
//! recovery are all the primary's: a member needs no code of its own.

use weft_replication::{HostResult, NodeId, OpId, ReplicaSet, Token};

/// One read or write the primary asked of a member (its number, unique
/// within the primary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberOp(pub u64);

/// What every in-sync member is asked to do at one point of the write
/// stream (`EcPrimary::control`), answered `Written`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberControl {
    /// Grow the shard volume to `shard_bytes` (before the volume grows).
    Grow {
        /// The shard volume's new size.
        shard_bytes: u64,
    },
    /// Take a snapshot of the shard volume, durably, under `name`
    /// (replacing one of that name left by an attempt that failed).
    Snapshot {
        /// The snapshot's name.
        name: String,
    },
}

/// A message from the primary to a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToMember {
    /// Take `token` as the fence: only it may read or write from now on.
    Fence {
        /// The new fence.
        token: Token,
    },
    /// Read `len` bytes at `offset` of the shard volume.
    Read {
        /// The session.
        token: Token,
        /// The op.
        op: MemberOp,
        /// Where, in bytes.
        offset: u64,
        /// How much, in bytes.
        len: u32,
    },
    /// Write `data` at `offset` of the shard volume (durably before it is
    /// answered if `fua`).
    Write {
        /// The session.
        token: Token,
        /// The op.
        op: MemberOp,
        /// Where, in bytes.
        offset: u64,
        /// What.
        data: Vec<u8>,
        /// Force unit access.
        fua: bool,
    },
    /// Make every write completed so far durable (answered `Written`).
    Flush {
        /// The session.
        token: Token,
        /// The op.
        op: MemberOp,
    },
    /// Carry out `control` (answered `Written`).
    Control {
        /// The session.
        token: Token,
        /// The op.
        op: MemberOp,
        /// What to do.
        control: MemberControl,
    },
}

/// What a member answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromMember {
    /// The fence was taken.
    Fenced {
        /// The fence.
        token: Token,
    },
    /// The read `op` gave `data`.
    Read {
        /// The session it was sent under.
        token: Token,
        /// The op.
        op: MemberOp,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The write `op` is done (durable if FUA), or the flush `op`.
    Written {
        /// The session it was sent under.
        token: Token,
        /// The op.
        op: MemberOp,
    },
    /// Refused: the member is fenced by `current`, not by the sender's
    /// session (a newer primary fenced it, or it restarted and awaits a fence).
    Refused {
        /// The sender's token, echoed.
        token: Token,
        /// The member's fence.
        current: Token,
    },
    /// The member's device failed the op (an I/O error, a failed pool).
    Failed {
        /// The session it was sent under.
        token: Token,
        /// The op.
        op: MemberOp,
    },
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EcAction {
    /// Send to member `member` (its place in the record), on node `node`.
    Send {
        /// The member's place.
        member: usize,
        /// Its node.
        node: NodeId,
        /// The message.
        msg: ToMember,
    },
    /// Replace the record at `base_revision` by `record` (compare-and-swap);
    /// answer with `committed` or `commit_failed`.
    Commit {
        /// The revision the change is based on.
        base_revision: u64,
        /// The record wanted.
        record: ReplicaSet,
    },
    /// The control asked for (`EcPrimary::control`) is over: `members`
    /// made it (each in sync in the record then); every other member in
    /// sync then did not (it was faulted first).
    ControlDone {
        /// The control.
        control: MemberControl,
        /// The members that made it, by place.
        members: Vec<usize>,
    },
    /// Complete the host command (a read's bytes in `data`).
    Complete {
        /// The op.
        op: OpId,
        /// How.
        result: HostResult,
        /// A read's bytes (empty otherwise).
        data: Vec<u8>,
    },
}
