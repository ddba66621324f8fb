//! A replicated volume's I/O on its primary, as the data plane sees it: the
//! reactor hands every write, Write Zeroes, Deallocate and Flush to the
//! volume's replicator (a write's data copied once, out of the connection's
//! buffer, which the next command reuses, into a shared buffer that the
//! local write and every replica's send then read in place), which
//! completes it once the local copy and every in-sync replica hold it, and answers through the
//! reactor's mailbox like the manager does. Reads stay in the reactor,
//! served from the local copy while the replicator says this node serves
//! (its lease is valid and it is the active primary): one atomic load.
//!
//! An erasure-coded volume's path takes its reads too ([`Replicated::with_reads`]):
//! no node holds the volume whole, and its primary reads each piece from
//! the member that keeps it (or rebuilds it from the others); the answer
//! carries the bytes, which the reactor copies into the command's buffer.
//!
//! What this does not do: talk to replicas, the store or the disk for
//! replicated writes (the replicator does, in `weft-node`).

use crate::volume::VolumeReply;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use weft_proto::IoError;

/// Whether this node serves a replicated volume's I/O now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Serving {
    /// Served (reads locally, writes through the replicator).
    Yes = 0,
    /// Not now: being set up, handed over, or the lease is in doubt (ANA Transition).
    Transition = 1,
    /// Not here: another node is the primary (ANA Inaccessible).
    Inaccessible = 2,
}

/// What the replicator does with an I/O.
#[derive(Debug)]
pub enum ReplicatedWork {
    /// Write `data` at byte `offset`.
    Write {
        /// Byte offset on the volume.
        offset: u64,
        /// The host's data (its one copy: the local write and every
        /// replica's send read it in place).
        data: weft_uring::SharedBuf,
        /// Force unit access.
        fua: bool,
    },
    /// Zero (or deallocate) a range.
    Zeroes {
        /// Byte offset on the volume.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// The range may be deallocated instead (it reads back as zeroes either way).
        deallocate: bool,
        /// Durable before completion.
        fua: bool,
    },
    /// Make every completed write durable, everywhere.
    Flush,
    /// Read `len` bytes at byte `offset` (a path that takes reads only):
    /// answered with [`crate::VolumeReply::send_read`].
    Read {
        /// Byte offset on the volume.
        offset: u64,
        /// Length in bytes.
        len: u32,
    },
}

/// A replicated I/O and where its answer goes.
#[derive(Debug)]
pub struct ReplicatedIo {
    /// What to do.
    pub work: ReplicatedWork,
    /// Where the result goes (`VolumeOutcome::Done`).
    pub reply: VolumeReply,
}

/// The replicator as the data plane sees it.
pub trait ReplicatedSink: Send + Sync {
    /// Takes an I/O; answers through its reply.
    fn submit(&self, io: ReplicatedIo);
}

/// A replicated volume's path through this node.
pub struct Replicated {
    serving: AtomicU8,
    sink: Box<dyn ReplicatedSink>,
    /// Reads go to the sink too.
    reads: bool,
}

impl fmt::Debug for Replicated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "replicated ({:?})", self.serving())
    }
}

impl Replicated {
    /// A path whose writes go to `sink`; it serves nothing until told.
    pub fn new(sink: Box<dyn ReplicatedSink>) -> Replicated {
        Replicated {
            serving: AtomicU8::new(Serving::Transition as u8),
            sink,
            reads: false,
        }
    }

    /// A path whose reads go to `sink` too (an erasure-coded volume's).
    pub fn with_reads(sink: Box<dyn ReplicatedSink>) -> Replicated {
        Replicated {
            reads: true,
            ..Replicated::new(sink)
        }
    }

    /// Whether reads go to the sink too.
    pub(crate) fn takes_reads(&self) -> bool {
        self.reads
    }

    /// Whether this node serves now.
    pub fn serving(&self) -> Serving {
        match self.serving.load(Ordering::Acquire) {
            0 => Serving::Yes,
            1 => Serving::Transition,
            _ => Serving::Inaccessible,
        }
    }

    /// The replicator says whether this node serves.
    pub fn set_serving(&self, serving: Serving) {
        self.serving.store(serving as u8, Ordering::Release);
    }

    /// The error an I/O gets when this node does not serve now.
    pub(crate) fn refusal(&self) -> Option<IoError> {
        match self.serving() {
            Serving::Yes => None,
            Serving::Transition => Some(IoError::PathTransition),
            Serving::Inaccessible => Some(IoError::PathInaccessible),
        }
    }

    /// Hands an I/O to the replicator.
    pub(crate) fn submit(&self, io: ReplicatedIo) {
        self.sink.submit(io);
    }
}
