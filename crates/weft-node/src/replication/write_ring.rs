//! The replicator's ring: the primary's writes to its own copy of a
//! replicated volume, all in flight at once on io_uring (as the reactors do
//! for a volume with one copy), and the replicator's wait, for those writes,
//! for its inbox (an eventfd its senders ring, see `super::Events`), for
//! its links' sockets (see `super::link_socket`) and for its tick, in one
//! system call. A synchronous `pwrite` per worker thread
//! cost 21-25 us of CPU per 4 KiB write on this machine kind (a thread put
//! to sleep and woken, one device notification per write), a separate
//! ring thread 7-9 us (a hand-over each way): more than the whole one-copy
//! path through a reactor.
//!
//! A write takes this path only while the volume's gate is open and every
//! chunk under it is mapped and writable; anything else (a first write to a
//! chunk, a closed gate, a retired map) is given back for
//! [`super::local`]'s workers, which ask the volume manager and wait. The
//! gate is held from submission to completion, as the reactors hold it.
//!
//! What this does not do: reads, Write Zeroes, Deallocate or Flush (the
//! workers do), or order writes (the replication core never has two
//! overlapping writes in flight).

use super::local::LocalResult;
use super::Doorbell;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;
use weft_proto::fence::FencedIo;
use weft_proto::IoError;
use weft_replication::OpId;
use weft_target::{Piece, VolumeBackend};
use weft_uring::{Completion, Op, Ring, SharedBuf};

/// A write for the ring.
pub(crate) struct RingWrite {
    pub(crate) op: OpId,
    pub(crate) offset: u64,
    /// The host's data, written from where it is (a piece per chunk).
    pub(crate) data: SharedBuf,
    pub(crate) fua: bool,
    /// Counted against the node's fence of its copy until it completed.
    pub(crate) fenced: FencedIo,
}

/// Local writes finished, with their results.
pub(crate) type Written = Vec<(OpId, LocalResult)>;

/// What a wait brought (the caller's, reused: no allocation per wake-up
/// once grown).
#[derive(Default)]
pub(crate) struct Woken {
    /// Local writes finished.
    pub(crate) written: Written,
    /// The links' socket operations finished, their tokens as pushed.
    pub(crate) sockets: Vec<Completion>,
}

const RING_ENTRIES: u32 = 256;
/// Write pieces in flight at most: within the completion queue (twice the
/// entries, with room for the eventfd read, the tick and the links' sockets,
/// two operations each); beyond, writes go to the workers.
const PIECES_IN_FLIGHT_MAX: usize = RING_ENTRIES as usize;
const WAKE_TOKEN: u64 = u64::MAX;
const TICK_TOKEN: u64 = u64::MAX - 1;
/// Set in the tokens of socket operations (a write's token is its index, far below).
const SOCKET_BIT: u64 = 1 << 62;

/// One write in flight: its pieces (one per chunk it touches) complete in any order.
struct InFlight {
    op: OpId,
    pieces_left: usize,
    error: Option<IoError>,
    /// Dropped once its last piece completed.
    _fenced: FencedIo,
}

/// The ring, and the writes on it.
pub(crate) struct WriteRing {
    ring: Ring,
    backend: Arc<VolumeBackend>,
    /// The inbox's doorbell.
    wake: Arc<Doorbell>,
    /// A tick is armed.
    ticking: bool,
    /// Writes in flight, by index (the ring's user data).
    writes: Vec<Option<InFlight>>,
    free_writes: Vec<usize>,
    pieces_in_flight: usize,
    /// A write's pieces before they are queued (kept: no allocation per write).
    staged: Vec<Op>,
    /// The eventfd read could not be re-armed: reported by the next wait.
    broken: Option<std::io::Error>,
}

impl WriteRing {
    /// A ring for `backend`'s volume that also waits for `wake` (the inbox's eventfd).
    pub(crate) fn new(
        backend: &Arc<VolumeBackend>,
        wake: Arc<Doorbell>,
    ) -> std::io::Result<WriteRing> {
        let mut ring = Ring::new(RING_ENTRIES)?;
        ring.push(Op::ReadEventfd { fd: wake.fd() }, WAKE_TOKEN)?;
        Ok(WriteRing {
            ring,
            backend: Arc::clone(backend),
            wake,
            ticking: false,
            writes: Vec::new(),
            free_writes: Vec::new(),
            pieces_in_flight: 0,
            staged: Vec::new(),
            broken: None,
        })
    }

    /// Local writes in flight.
    pub(crate) fn writes_in_flight(&self) -> usize {
        self.writes.len() - self.free_writes.len()
    }

    /// Queues a socket operation (submitted at the next [`WriteRing::wait`]);
    /// its completion comes back in [`Woken::sockets`] with `token`.
    pub(crate) fn push_socket(&mut self, op: Op, token: u64) -> std::io::Result<()> {
        debug_assert!(token < SOCKET_BIT, "a token too large: {token}");
        self.ring.push(op, SOCKET_BIT | token)
    }

    /// Has the ring signal `eventfd` whenever completions arrive (its
    /// reactor's doorbell, when the replicator is a reactor's guest).
    pub(crate) fn signal(&mut self, eventfd: RawFd) -> std::io::Result<()> {
        self.ring.register_eventfd(eventfd)
    }

    /// Whether a wait would find something without sleeping.
    pub(crate) fn has_work(&mut self) -> bool {
        self.ring.has_work()
    }

    /// Submits what was queued, then, if `sleep`, waits until the inbox
    /// is rung, a write or socket operation completes or the tick fires
    /// (armed for `tick` when none is, so every `tick` whether the caller
    /// sleeps or not: a guest of a reactor is woken by it); appends what
    /// finished to `woken`.
    pub(crate) fn wait(
        &mut self,
        sleep: bool,
        tick: Duration,
        woken: &mut Woken,
    ) -> std::io::Result<()> {
        self.arm_tick(tick)?;
        // Not sleeping, the kernel is entered only for something to submit
        // or complete (a guest of a reactor turns often).
        if sleep || self.ring.has_work() {
            self.ring.submit_and_wait(usize::from(sleep))?;
        }
        let before = woken.written.len() + woken.sockets.len();
        let mut rung = false;
        while let Some(mut completion) = self.ring.pop() {
            match completion.user_data {
                WAKE_TOKEN => rung = true,
                TICK_TOKEN => self.ticking = false,
                token if token & SOCKET_BIT != 0 => {
                    completion.user_data = token & !SOCKET_BIT;
                    woken.sockets.push(completion);
                }
                _ => woken.written.extend(self.piece_done(completion)),
            }
        }
        if rung {
            // Before the inbox is read again (at the next turn).
            self.wake.heard();
            // Re-armed after the results are in hand: a failure loses none.
            let fd = self.wake.fd();
            if let Err(error) = self.ring.push(Op::ReadEventfd { fd }, WAKE_TOKEN) {
                self.broken = Some(error);
            }
        }
        match self.broken.take() {
            Some(error) if woken.written.len() + woken.sockets.len() == before => Err(error),
            broken => {
                self.broken = broken;
                Ok(())
            }
        }
    }

    /// Submits what was queued (and the tick, armed for `tick` if it
    /// fired), without waiting or reaping.
    pub(crate) fn submit(&mut self, tick: Duration) -> std::io::Result<()> {
        self.arm_tick(tick)?;
        if self.ring.has_work() {
            self.ring.submit_and_wait(0)?;
        }
        Ok(())
    }

    fn arm_tick(&mut self, tick: Duration) -> std::io::Result<()> {
        if !self.ticking {
            self.ring.push(Op::Timeout { after: tick }, TICK_TOKEN)?;
            self.ticking = true;
        }
        Ok(())
    }

    /// Queues `write`'s pieces (submitted at the next [`WriteRing::wait`]),
    /// or gives it back for the workers: when the gate is closed, a chunk
    /// under it is not mapped writable, the map is retired or the ring is
    /// full.
    pub(crate) fn write(&mut self, write: RingWrite) -> Result<(), RingWrite> {
        // Within a command's transfer size: never near 4 GiB.
        let Ok(len) = u32::try_from(write.data.len()) else {
            return Err(write);
        };
        if self.pieces_in_flight >= PIECES_IN_FLIGHT_MAX || !self.backend.gate.enter() {
            return Err(write);
        }
        if self.backend.map.is_retired() || !self.backend.writable(write.offset, len) {
            self.backend.gate.leave();
            return Err(write);
        }
        // Taken out while the ring is pushed to, put back with its allocation.
        let mut pieces = std::mem::take(&mut self.staged);
        self.stage(&write, &mut pieces);
        let index = self.free_writes.pop().unwrap_or_else(|| {
            self.writes.push(None);
            self.writes.len() - 1
        });
        let (mut pieces_left, mut error) = (0, None);
        for op in pieces.drain(..) {
            if let Err(pushed) = self.ring.push(op, index as u64) {
                // Only when the kernel takes no more work: the pieces queued
                // finish, and the write fails with them.
                log::warn!(
                    "volume {}: a local write not queued: {pushed}",
                    self.backend.volume
                );
                error = Some(IoError::Other);
                break;
            }
            pieces_left += 1;
        }
        pieces.clear();
        self.staged = pieces;
        self.pieces_in_flight += pieces_left;
        if pieces_left == 0 {
            self.free_writes.push(index);
            self.backend.gate.leave();
            return Err(write);
        }
        self.writes[index] = Some(InFlight {
            op: write.op,
            pieces_left,
            error,
            _fenced: write.fenced,
        });
        Ok(())
    }

    /// Fills `pieces` with `write`'s, one per chunk (mapped writable:
    /// checked), each written from its range of the write's data.
    fn stage(&self, write: &RingWrite, pieces: &mut Vec<Op>) {
        let mut done = 0;
        while done < write.data.len() {
            let at = write.offset + done as u64;
            let (piece, len) = self.backend.piece(at, (write.data.len() - done) as u32);
            let Piece::Device { fd, offset } = piece else {
                unreachable!("checked writable under the gate");
            };
            let len = len as usize;
            pieces.push(Op::WriteShared {
                fd,
                buf: write.data.clone(),
                buf_offset: done,
                len,
                file_offset: offset,
                dsync: write.fua,
            });
            done += len;
        }
    }

    /// Waits until no write is in flight: a write's gate is left only once
    /// it completed (the manager's quiesce waits for it), and a deposed
    /// primary's writes must be on its copy before it serves as a replica.
    pub(crate) fn reap(&mut self) {
        let mut woken = Woken::default();
        while self.writes_in_flight() > 0 {
            woken.written.clear();
            woken.sockets.clear();
            if let Err(error) = self.wait(true, Duration::from_millis(100), &mut woken) {
                log::error!(
                    "volume {}: {} local writes cannot be reaped: {error}; its gate stays held",
                    self.backend.volume,
                    self.writes_in_flight()
                );
                return;
            }
        }
    }

    /// A piece's completion; the write's result once it was the last.
    fn piece_done(&mut self, completion: Completion) -> Option<(OpId, LocalResult)> {
        let index = completion.user_data as usize;
        // (Its reference to the write's data drops with the completion.)
        let write = self.writes[index].as_mut().expect("a write in flight");
        if let Err(error) = completion.result {
            log::warn!("replicated volume, local copy: {error}");
            write.error = Some(IoError::Media);
        }
        write.pieces_left -= 1;
        self.pieces_in_flight -= 1;
        if write.pieces_left > 0 {
            return None;
        }
        let write = self.writes[index].take().expect("a write in flight");
        self.free_writes.push(index);
        self.backend.gate.leave();
        Some((write.op, write.error.map_or(Ok(None), Err)))
    }
}

impl Drop for WriteRing {
    /// Blocks until the writes in flight completed (disk writes do).
    fn drop(&mut self) {
        self.reap();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    use std::time::Duration;
    use weft_proto::fence::{FenceToken, Fences};
    use weft_target::{VolumeManager, VolumeRequest};
    use weft_volume::format::Layout;
    use weft_volume::{ChunkMap, Lookup};

    struct Nowhere;
    impl VolumeManager for Nowhere {
        fn submit(&self, _request: VolumeRequest) {}
    }

    const CHUNK: u64 = 1 << 20;

    /// A volume of four chunks on one member file: chunk 0 at member
    /// chunk 2 and chunk 1 at member chunk 3, writable; chunks 2 and 3 unmapped.
    fn backend(member: &File) -> Arc<VolumeBackend> {
        let map = Arc::new(ChunkMap::new(4));
        for (index, chunk) in [(0, 2), (1, 3)] {
            let writable = true;
            map.set(index, Lookup::Mapped { chunk, writable });
        }
        Arc::new(VolumeBackend {
            pool: "p".into(),
            volume: "v".into(),
            map,
            gate: Arc::default(),
            layout: Arc::new(Layout::plan(1, 64 * CHUNK, CHUNK as u32).unwrap()),
            member_fds: vec![member.as_raw_fd()],
            manager: Arc::new(Nowhere),
            health: Arc::default(),
            intent: None,
            replicated: None,
            cipher: None,
        })
    }

    /// A ring with a volume nobody writes to (for the links' sockets).
    pub(crate) fn ring_for_sockets() -> WriteRing {
        let member = weft_uring::memfd_create("member").unwrap();
        WriteRing::new(
            &backend(&member),
            crate::replication::Events::channel().unwrap().1.doorbell,
        )
        .unwrap()
    }

    /// Waits (a second at most) until `ring` reports a finished write.
    fn written(ring: &mut WriteRing) -> (OpId, LocalResult) {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(1) {
            let mut woken = Woken::default();
            ring.wait(true, Duration::from_millis(10), &mut woken)
                .unwrap();
            if let Some(first) = woken.written.into_iter().next() {
                return first;
            }
        }
        panic!("no write finished");
    }

    #[test]
    fn mapped_writes_land_where_the_map_says_and_the_rest_are_given_back() {
        let dir = std::env::temp_dir().join(format!("weft-write-ring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let member = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("member"))
            .unwrap();
        member.set_len(64 * CHUNK).unwrap();
        let backend = backend(&member);
        let mut ring = WriteRing::new(
            &backend,
            crate::replication::Events::channel().unwrap().1.doorbell,
        )
        .unwrap();
        // 8 KiB across the end of chunk 0: two pieces, on member chunks 2 and 3.
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let fences = Arc::new(Fences::default());
        let token = |epoch| FenceToken { epoch, session: 0 };
        let own = fences.fence_local("nqn.r", token(1)).unwrap();
        let write = |op, offset, data: &[u8]| RingWrite {
            op: OpId(op),
            offset,
            data: SharedBuf::copy_from(data),
            fua: true,
            fenced: own.enter().unwrap(),
        };
        assert!(ring.write(write(1, CHUNK - 4096, &data)).is_ok());
        assert_eq!(ring.writes_in_flight(), 1);
        assert_eq!(written(&mut ring), (OpId(1), Ok(None)));
        assert_eq!(ring.writes_in_flight(), 0);
        let mut read = vec![0; 4096];
        let (_, chunk_2) = backend.layout.locate(2);
        member
            .read_exact_at(&mut read, chunk_2 + CHUNK - 4096)
            .unwrap();
        assert!(
            read == data[..4096],
            "the first piece at the end of member chunk 2"
        );
        let (_, chunk_3) = backend.layout.locate(3);
        member.read_exact_at(&mut read, chunk_3).unwrap();
        assert!(
            read == data[4096..],
            "the second at the start of member chunk 3"
        );
        // Unmapped: given back, for the workers to allocate (through the manager).
        let given_back = ring.write(write(2, 2 * CHUNK, &[7; 4096])).err().unwrap();
        assert_eq!(given_back.op, OpId(2));
        drop(given_back); // (its count against the fence with it)
                          // A closed gate (a snapshot being taken): given back (the workers wait).
        let closed = backend.gate.quiesce(); // returns: every write left the gate
        assert!(ring.write(write(3, 0, &[1; 4096])).is_err());
        drop(closed);
        // Mapped but not writable (shared with a snapshot): given back (the manager copies it).
        backend.map.set(
            1,
            Lookup::Mapped {
                chunk: 3,
                writable: false,
            },
        );
        assert!(ring.write(write(4, CHUNK, &[1; 4096])).is_err());
        // Not FUA, within one chunk: one piece.
        let plain = RingWrite {
            fua: false,
            ..write(5, 4096, &data[..4096])
        };
        assert!(ring.write(plain).is_ok());
        assert_eq!(written(&mut ring), (OpId(5), Ok(None)));
        let (_, chunk_2) = backend.layout.locate(2);
        member.read_exact_at(&mut read, chunk_2 + 4096).unwrap();
        assert!(read == data[..4096]);
        // A retired map (the volume grew): given back (the workers answer PathTransition).
        backend.map.retire();
        assert!(ring.write(write(6, 0, &[1; 4096])).is_err());
        assert_eq!(ring.writes_in_flight(), 0);
        let newer = fences.fence_local("nqn.r", token(2)).unwrap();
        assert!(newer.drained(), "every write's count was given back");
        drop(backend.gate.quiesce()); // returns: every write left the gate
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_event_sent_ends_the_wait_before_the_tick() {
        let member = weft_uring::memfd_create("member").unwrap();
        let (events, inbox) = crate::replication::Events::channel().unwrap();
        let mut ring = WriteRing::new(&backend(&member), inbox.doorbell).unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            events.send(crate::replication::Event::Stop).unwrap();
        });
        let tick = Duration::from_secs(10);
        let start = std::time::Instant::now();
        let mut woken = Woken::default();
        ring.wait(true, tick, &mut woken).unwrap();
        assert!(woken.written.is_empty());
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "woken by the event, not the tick"
        );
        assert!(matches!(
            inbox.receiver.try_recv(),
            Ok(crate::replication::Event::Stop)
        ));
        sender.join().unwrap();
        assert!(ring.ticking, "the tick stays armed for the next wait");
    }

    #[test]
    fn a_quiet_wait_ends_at_the_tick() {
        let member = weft_uring::memfd_create("member").unwrap();
        let mut ring = WriteRing::new(
            &backend(&member),
            crate::replication::Events::channel().unwrap().1.doorbell,
        )
        .unwrap();
        let start = std::time::Instant::now();
        let mut woken = Woken::default();
        ring.wait(true, Duration::from_millis(20), &mut woken)
            .unwrap();
        assert!(woken.written.is_empty());
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(!ring.ticking, "fired: armed again by the next wait");
    }
}
