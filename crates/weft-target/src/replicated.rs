//! A replicated volume's I/O on its primary, as the data plane sees it: the
//! reactor hands every write, Write Zeroes, Deallocate and Flush to the
//! volume's replicator (a write's data copied once, out of the connection's
//! buffer, which the next command reuses, into a shared buffer that the
//! local write and every replica's send then read in place), which
//! completes it once the local copy and every in-sync replica hold it, and answers through the
//! reactor's mailbox like the manager does. Reads stay in the reactor,
//! served from the local copy while the replicator says this node serves
//! (its lease is valid, its replicas granted it reads, and it is the active
//! primary), and only until the time it gave for that ([`Replicated::reads_until`]):
//! two atomic loads and the reactor's clock. The time is what keeps a
//! process that was frozen (SIGSTOP, a long pause) from serving a read
//! from its copy before its replicator wakes to say it no longer serves:
//! by then another primary may have taken writes.
//! While a new primary's resync copies the regions the replicas may
//! disagree on, reads go to the replicator too ([`Serving::Resyncing`]),
//! which holds those of regions not yet copied.
//!
//! A volume of a pool with a write tier ([`Replicated::tiered`]) sends its
//! writes to the node's manager, and its reads too unless the tier holds
//! none of their blocks (`weft_volume`'s `TierPresence`): those read the
//! pool's devices in the reactor, as an untiered volume's do.
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
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use weft_proto::IoError;
use weft_volume::tier::{TierPresence, VolumeId};

/// Whether this node serves a replicated volume's I/O now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Serving {
    /// Served (reads locally, writes through the replicator).
    Yes = 0,
    /// Served, reads through the replicator too (a promotion's resync is
    /// under way; ANA Optimized all the same).
    Resyncing = 3,
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
    /// Read `len` bytes at byte `offset` (a path that takes reads, or any
    /// replicated path while its primary resyncs):
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
    /// Direct reads until then (nanoseconds on the data plane's clock).
    reads_until_ns: AtomicU64,
    sink: Box<dyn ReplicatedSink>,
    reads: Reads,
}

/// Where a path's reads go while it serves.
enum Reads {
    /// The local copy, until the replicator's time.
    Local,
    /// The sink (an erasure-coded volume's: no copy here is whole).
    Sink,
    /// The pool's devices, unless its write tier may hold a block of the
    /// range (then the sink).
    UnlessTiered {
        presence: Arc<TierPresence>,
        volume: VolumeId,
    },
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
            reads_until_ns: AtomicU64::new(0),
            sink,
            reads: Reads::Local,
        }
    }

    /// A path whose reads go to `sink` too (an erasure-coded volume's).
    pub fn with_reads(sink: Box<dyn ReplicatedSink>) -> Replicated {
        Replicated {
            reads: Reads::Sink,
            ..Replicated::new(sink)
        }
    }

    /// The path of volume `volume` of a pool with a write tier: writes go
    /// to `sink`, and reads too unless `presence` says the tier holds no
    /// block of their range (they then read the pool's devices in the
    /// reactor).
    pub fn tiered(
        sink: Box<dyn ReplicatedSink>,
        presence: Arc<TierPresence>,
        volume: VolumeId,
    ) -> Replicated {
        Replicated {
            reads: Reads::UnlessTiered { presence, volume },
            ..Replicated::new(sink)
        }
    }

    /// Whether this node serves now.
    pub fn serving(&self) -> Serving {
        match self.serving.load(Ordering::Acquire) {
            0 => Serving::Yes,
            1 => Serving::Transition,
            3 => Serving::Resyncing,
            _ => Serving::Inaccessible,
        }
    }

    /// The replicator says whether this node serves.
    pub fn set_serving(&self, serving: Serving) {
        self.serving.store(serving as u8, Ordering::Release);
    }

    /// Until when (nanoseconds on the data plane's clock) the reactor may
    /// read the local copy itself while [`Serving::Yes`]: the end of the
    /// lease and of the replicas' grants as the replicator last saw them.
    pub fn reads_until(&self, ns: u64) {
        self.reads_until_ns.store(ns, Ordering::Release);
    }

    /// Where an I/O goes at `now_ns` (the data plane's clock): `read`, the
    /// range of a read (None: any other I/O). The error it gets when this
    /// node does not serve, else whether the replicator takes it (`true`)
    /// or the reactor serves it from the local copy.
    pub fn route(&self, read: Option<(u64, u64)>, now_ns: u64) -> Result<bool, IoError> {
        match self.serving() {
            Serving::Yes => Ok(match (read, &self.reads) {
                (None, _) | (Some(_), Reads::Sink) => true,
                (Some(_), Reads::Local) => now_ns >= self.reads_until_ns.load(Ordering::Acquire),
                (Some((offset, len)), Reads::UnlessTiered { presence, volume }) => {
                    presence.may_hold(volume, offset, len)
                }
            }),
            Serving::Resyncing => Ok(true),
            Serving::Transition => Err(IoError::PathTransition),
            Serving::Inaccessible => Err(IoError::PathInaccessible),
        }
    }

    /// Hands an I/O to the replicator.
    pub(crate) fn submit(&self, io: ReplicatedIo) {
        self.sink.submit(io);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;

    impl ReplicatedSink for Nowhere {
        fn submit(&self, _io: ReplicatedIo) {}
    }

    #[test]
    fn reads_stay_in_the_reactor_only_once_every_region_is_settled_and_until_the_time_given() {
        let path = Replicated::new(Box::new(Nowhere));
        let route = |read: bool| path.route(read.then_some((0, 4096)), 500);
        assert_eq!(route(true), Err(IoError::PathTransition), "not yet");
        path.set_serving(Serving::Resyncing);
        assert_eq!(route(true), Ok(true), "a resync's reads may wait");
        assert_eq!(route(false), Ok(true));
        path.set_serving(Serving::Yes);
        assert_eq!(route(true), Ok(true), "no time given yet");
        path.reads_until(501);
        assert_eq!(route(true), Ok(false), "from the local copy");
        assert_eq!(route(false), Ok(true));
        path.reads_until(500);
        assert_eq!(
            route(true),
            Ok(true),
            "past its time (a frozen process woken): the replicator decides"
        );
        path.set_serving(Serving::Inaccessible);
        assert_eq!(route(true), Err(IoError::PathInaccessible));
        let erasure = Replicated::with_reads(Box::new(Nowhere));
        erasure.set_serving(Serving::Yes);
        erasure.reads_until(u64::MAX);
        assert_eq!(
            erasure.route(Some((0, 4096)), 0),
            Ok(true),
            "no copy here is whole"
        );
    }

    #[test]
    fn a_tiered_volumes_reads_go_to_the_devices_while_the_tier_holds_none_of_their_blocks() {
        let presence = Arc::new(TierPresence::default());
        let path = Replicated::tiered(Box::new(Nowhere), presence, [7; 16]);
        path.set_serving(Serving::Yes);
        assert_eq!(path.route(Some((8192, 4096)), 0), Ok(false), "none held");
        assert_eq!(path.route(None, 0), Ok(true), "writes to the manager");
        path.set_serving(Serving::Transition);
        assert_eq!(
            path.route(Some((8192, 4096)), 0),
            Err(IoError::PathTransition)
        );
    }
}
