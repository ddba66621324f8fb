//! Volumes as the data plane serves them: a namespace backed by a volume
//! reads and writes the pool's member devices directly when its chunk map
//! allows (one atomic load per chunk), and hands everything else to the
//! volume manager — first writes and copy-on-write (allocation), I/O while
//! the manager drains the volume, deallocation, flush. The manager answers
//! through the reactor's mailbox: "retry" (now the map allows it) or the
//! I/O's final result.
//!
//! What this module does not do: change any metadata (only the manager does),
//! or block the reactor.

use crate::health::Health;
use crate::reactor::{Mailbox, Message};
use crate::replicated::Replicated;
use std::fmt;
use std::os::fd::RawFd;
use std::sync::{mpsc, Arc};
use weft_proto::intent::WriteIntent;
use weft_proto::reservation::{HostIdentifier, ReservationCommand};
use weft_proto::{IoError, IoRequest};
use weft_volume::crypt::VolumeCipher;
use weft_volume::format::Layout;
use weft_volume::{ChunkMap, Lookup, WriteGate};

/// A volume behind a namespace.
#[derive(Clone)]
pub struct VolumeBackend {
    /// Pool name.
    pub pool: String,
    /// Volume name.
    pub volume: String,
    /// The volume's chunk map (replaced, and this one retired, on resize).
    pub map: Arc<ChunkMap>,
    /// The volume's I/O gate.
    pub gate: Arc<WriteGate>,
    /// The pool's stripe geometry.
    pub layout: Arc<Layout>,
    /// Descriptors of the pool's members, in stripe order; open as long as the pool is.
    pub member_fds: Vec<RawFd>,
    /// Where slow-path work goes.
    pub manager: Arc<dyn VolumeManager>,
    /// The pool's failure flag (shared by its volumes and the manager).
    pub health: Arc<Health>,
    /// On a replica subsystem: the replica's write intent. A write to a
    /// region it does not cover goes to the manager first, which marks the
    /// region durably (see `weft_proto::intent`).
    pub intent: Option<Arc<WriteIntent>>,
    /// On a replicated volume's primary: where its writes and flushes go
    /// (see [`crate::replicated`]).
    pub replicated: Option<Arc<Replicated>>,
    /// An encrypted volume's cipher: what it writes to the devices is
    /// encrypted first, what it reads from them decrypted after.
    pub cipher: Option<Arc<VolumeCipher>>,
}

impl fmt::Debug for VolumeBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "volume {}/{}", self.pool, self.volume)
    }
}

/// Where a piece of a volume I/O goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// Unwritten: reads as zeroes.
    Zeroes,
    /// On member `fd` at byte `offset`.
    Device {
        /// Member descriptor.
        fd: RawFd,
        /// Byte offset on the member.
        offset: u64,
    },
}

impl VolumeBackend {
    /// The piece of `[offset, offset + len)` that lies in its first chunk:
    /// where it is and how many bytes it covers.
    pub fn piece(&self, offset: u64, len: u32) -> (Piece, u32) {
        let (place, piece_len) = self.place(offset, len);
        let piece = place.map_or(Piece::Zeroes, |(member, offset)| Piece::Device {
            fd: self.member_fds[member],
            offset,
        });
        (piece, piece_len)
    }

    /// As [`VolumeBackend::piece`], by the member's index in the pool (for
    /// callers with descriptors of their own): the member and byte offset
    /// (none if unwritten) and how many bytes the piece covers.
    pub fn place(&self, offset: u64, len: u32) -> (Option<(usize, u64)>, u32) {
        let shift = self.layout.chunk_shift();
        let within = offset & ((1u64 << shift) - 1);
        let piece_len = ((1u64 << shift) - within).min(u64::from(len)) as u32;
        let place = match self.map.lookup((offset >> shift) as usize) {
            Lookup::Unmapped => None,
            Lookup::Mapped { chunk, .. } => {
                let (member, base) = self.layout.locate(chunk);
                Some((member, base + within))
            }
        };
        (place, piece_len)
    }

    /// Whether every chunk under the range may be written directly.
    pub fn writable(&self, offset: u64, len: u32) -> bool {
        let shift = self.layout.chunk_shift();
        let first = offset >> shift;
        let last = (offset + u64::from(len).max(1) - 1) >> shift;
        (first..=last).all(|index| {
            matches!(
                self.map.lookup(index as usize),
                Lookup::Mapped { writable: true, .. }
            )
        })
    }
}

/// The volume manager as the data plane sees it.
pub trait VolumeManager: Send + Sync {
    /// Queues slow-path work; the manager answers through `request.reply`.
    fn submit(&self, request: VolumeRequest);
}

/// Slow-path work for the manager.
#[derive(Debug)]
pub struct VolumeRequest {
    /// Pool name.
    pub pool: String,
    /// Volume name.
    pub volume: String,
    /// What to do.
    pub work: VolumeWork,
    /// Where the answer goes.
    pub reply: VolumeReply,
}

/// What the manager is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeWork {
    /// Map (allocate or copy) every chunk under the range writable, then say retry.
    PrepareWrite {
        /// Byte offset on the volume.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Mark the replica's write-intent regions under the range, durably,
    /// then (`allocate`: a data write) make its chunks writable as
    /// [`VolumeWork::PrepareWrite`] does, in the same trip; then say retry.
    MarkIntent {
        /// Byte offset on the volume.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// The write carries data (not Write Zeroes or Deallocate).
        allocate: bool,
    },
    /// Nothing to change: say retry once the volume's gate is open and the
    /// reactor holds the current map (answers are ordered after exports updates).
    Wait,
    /// Deallocate (or zero) the range, then give the result.
    Deallocate {
        /// Byte offset on the volume.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Write Zeroes with FUA: durable before the result.
        fua: bool,
    },
    /// Make every completed write durable, then give the result.
    Flush,
    /// Take a snapshot of the volume called `name` (replacing one of that
    /// name), then give the result: a replica's copy, at the point of the
    /// write stream where its primary asked.
    Snapshot(SnapshotName),
    /// Grow the volume to `size_bytes` (no smaller), then give the result:
    /// a replica's copy, before its primary writes past the old end.
    Grow {
        /// The new size in bytes.
        size_bytes: u64,
    },
    /// Change the volume's reservations as `host` asked, durably, install
    /// the new state in the namespace's cell, then give the result.
    Reserve {
        /// The host that sent the command.
        host: HostIdentifier,
        /// The command with its keys.
        command: ReservationCommand,
    },
}

/// A snapshot's name, carried inline so that slow-path work stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SnapshotName {
    bytes: [u8; SnapshotName::BYTES_MAX],
    len: u8,
}

impl SnapshotName {
    /// The longest name (the volume manager's limit).
    pub const BYTES_MAX: usize = weft_proto::intent::SNAPSHOT_NAME_BYTES_MAX as usize;

    /// The name in `bytes`: none if empty, too long or not UTF-8 (the
    /// manager checks it as it checks any name).
    pub fn new(bytes: &[u8]) -> Option<SnapshotName> {
        if bytes.is_empty() || bytes.len() > Self::BYTES_MAX || std::str::from_utf8(bytes).is_err()
        {
            return None;
        }
        let mut name = SnapshotName {
            bytes: [0; Self::BYTES_MAX],
            len: bytes.len() as u8,
        };
        name.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(name)
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).expect("checked in new")
    }
}

impl fmt::Debug for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// The manager's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeOutcome {
    /// Submit the I/O again.
    Retry,
    /// The I/O is done with this result.
    Done(Result<(), IoError>),
}

/// Return address of a slow-path request: the reactor, connection and I/O
/// that asked, or a channel (the replicator of a replicated volume asks the
/// manager too).
///
/// A reply to a reactor that is dropped unsent answers ANA Inaccessible
/// (the host retries on another path): whoever held it went away (a
/// replicator that ended with the I/O still in its inbox, a manager that
/// stopped), and the connection must not wait for its command forever. A
/// channel's receiver learns of the drop by its disconnection.
#[derive(Debug)]
pub struct VolumeReply {
    /// Taken when the answer is sent.
    to: Option<ReplyTo>,
}

#[derive(Debug)]
enum ReplyTo {
    Reactor {
        mailbox: Arc<Mailbox>,
        connection: usize,
        request: IoRequest,
    },
    Channel(mpsc::Sender<VolumeOutcome>),
}

impl VolumeReply {
    pub(crate) fn reactor(mailbox: Arc<Mailbox>, connection: usize, request: IoRequest) -> Self {
        VolumeReply {
            to: Some(ReplyTo::Reactor {
                mailbox,
                connection,
                request,
            }),
        }
    }

    /// An answer sent to `sender`.
    pub fn channel(sender: mpsc::Sender<VolumeOutcome>) -> VolumeReply {
        VolumeReply {
            to: Some(ReplyTo::Channel(sender)),
        }
    }

    /// Sends the answer to whoever asked.
    pub fn send(mut self, outcome: VolumeOutcome) {
        if let Some(to) = self.to.take() {
            to.send(outcome);
        }
    }

    /// Answers a read handed to a path that takes reads with its bytes
    /// (a channel hears only that it succeeded).
    pub fn send_read(mut self, data: Vec<u8>) {
        match self.to.take() {
            Some(ReplyTo::Reactor {
                mailbox,
                connection,
                request,
            }) => mailbox.send(Message::VolumeRead {
                connection,
                request,
                data,
            }),
            Some(to) => to.send(VolumeOutcome::Done(Ok(()))),
            None => {}
        }
    }
}

impl Drop for VolumeReply {
    fn drop(&mut self) {
        if let Some(to @ ReplyTo::Reactor { .. }) = self.to.take() {
            to.send(VolumeOutcome::Done(Err(IoError::PathInaccessible)));
        }
    }
}

impl ReplyTo {
    fn send(self, outcome: VolumeOutcome) {
        match self {
            ReplyTo::Reactor {
                mailbox,
                connection,
                request,
            } => mailbox.send(Message::VolumeDone {
                connection,
                request,
                outcome,
            }),
            ReplyTo::Channel(sender) => {
                let _ = sender.send(outcome);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;
    impl VolumeManager for Nowhere {
        fn submit(&self, _request: VolumeRequest) {}
    }

    #[test]
    fn a_reply_to_a_reactor_dropped_unsent_answers_inaccessible() {
        let (mailbox, inbox) = Mailbox::detached().expect("an eventfd");
        let mailbox = Arc::new(mailbox);
        let request = IoRequest {
            slot: weft_proto::types::SlotId(7),
            nsid: weft_proto::types::Nsid(1),
            kind: weft_proto::IoKind::Flush,
        };
        VolumeReply::reactor(Arc::clone(&mailbox), 3, request).send(VolumeOutcome::Retry);
        drop(VolumeReply::reactor(mailbox, 4, request));
        let outcomes: Vec<_> = inbox
            .try_iter()
            .map(|message| match message {
                Message::VolumeDone {
                    connection,
                    request: answered,
                    outcome,
                } => (connection, answered.slot, outcome),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        let inaccessible = VolumeOutcome::Done(Err(IoError::PathInaccessible));
        assert_eq!(
            outcomes,
            [
                (3, request.slot, VolumeOutcome::Retry),
                (4, request.slot, inaccessible)
            ],
            "one answer each: the one sent, then the drop's"
        );
    }

    #[test]
    fn a_reply_to_a_channel_dropped_unsent_disconnects() {
        let (sender, answers) = mpsc::channel();
        drop(VolumeReply::channel(sender));
        assert_eq!(answers.recv(), Err(mpsc::RecvError));
    }

    #[test]
    fn snapshot_names_are_carried_inline_within_the_limit() {
        assert_eq!(SnapshotName::new(b"s1").unwrap().as_str(), "s1");
        let longest = [b'a'; 64];
        assert_eq!(SnapshotName::new(&longest).unwrap().as_str().len(), 64);
        assert!(SnapshotName::new(&[b'a'; 65]).is_none());
        assert!(SnapshotName::new(b"").is_none());
        assert!(SnapshotName::new(&[0xFF, 0xFE]).is_none(), "not UTF-8");
    }

    #[test]
    fn pieces_follow_chunks_and_stripes() {
        let layout = Layout::plan(2, 64 << 20, 1 << 20).unwrap();
        let map = Arc::new(ChunkMap::new(4));
        map.set(
            1,
            Lookup::Mapped {
                chunk: 3,
                writable: true,
            },
        );
        let backend = VolumeBackend {
            pool: "p".into(),
            volume: "v".into(),
            map,
            gate: Arc::default(),
            layout: Arc::new(layout),
            member_fds: vec![10, 11],
            manager: Arc::new(Nowhere),
            health: Arc::default(),
            intent: None,
            replicated: None,
            cipher: None,
        };
        assert_eq!(backend.piece(4096, 8192), (Piece::Zeroes, 8192));
        // Straddles chunks 0 and 1: only the part in chunk 0 first.
        assert_eq!(backend.piece((1 << 20) - 4096, 8192), (Piece::Zeroes, 4096));
        let (member, base) = layout.locate(3);
        assert_eq!(member, 1);
        assert_eq!(
            backend.piece((1 << 20) + 512, 4096),
            (
                Piece::Device {
                    fd: 11,
                    offset: base + 512
                },
                4096
            )
        );
        assert!(backend.writable(1 << 20, 128 << 10));
        assert!(
            !backend.writable((1 << 20) - 4096, 8192),
            "chunk 0 unmapped"
        );
    }
}
