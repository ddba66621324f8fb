//! The replicator's ring: the primary's writes to its own copy of a
//! replicated volume, all in flight at once on io_uring (as the reactors do
//! for a volume with one copy), and the replicator's wait, for those writes,
//! for its inbox (an eventfd its senders ring, see `super::Events`) and for
//! its tick, in one system call. A synchronous `pwrite` per worker thread
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

use super::local::{locate, writable, LocalResult};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;
use weft_proto::IoError;
use weft_replication::OpId;
use weft_target::VolumeBackend;
use weft_uring::{Completion, IoBuf, Op, Returned, Ring};

/// A write for the ring.
pub(crate) struct RingWrite {
    pub(crate) op: OpId,
    pub(crate) offset: u64,
    pub(crate) data: Arc<Vec<u8>>,
    pub(crate) fua: bool,
}

/// What woke the replicator.
#[derive(Debug, Default)]
pub(crate) struct Woken {
    /// Local writes finished, with their results.
    pub(crate) written: Vec<(OpId, LocalResult)>,
}

const RING_ENTRIES: u32 = 256;
const WAKE_TOKEN: u64 = u64::MAX;
const TICK_TOKEN: u64 = u64::MAX - 1;
/// Buffers kept for reuse (each mapped once, at least 128 KiB).
const SPARE_BUFS_MAX: usize = 64;
const BUF_BYTES_MIN: usize = 128 * 1024;

/// One write in flight: its pieces (one per chunk it touches) complete in any order.
struct InFlight {
    op: OpId,
    pieces_left: usize,
    error: Option<IoError>,
}

/// The ring, and the writes on it.
pub(crate) struct WriteRing {
    ring: Ring,
    backend: Arc<VolumeBackend>,
    /// The inbox's eventfd.
    wake: File,
    /// A tick is armed.
    ticking: bool,
    /// Writes in flight, by index (the ring's user data).
    writes: Vec<Option<InFlight>>,
    free_writes: Vec<usize>,
    spare_bufs: Vec<IoBuf>,
}

impl WriteRing {
    /// A ring for `backend`'s volume that also waits for `wake` (the inbox's eventfd).
    pub(crate) fn new(backend: &Arc<VolumeBackend>, wake: File) -> std::io::Result<WriteRing> {
        let mut ring = Ring::new(RING_ENTRIES)?;
        ring.push(
            Op::ReadEventfd {
                fd: wake.as_raw_fd(),
            },
            WAKE_TOKEN,
        )?;
        Ok(WriteRing {
            ring,
            backend: Arc::clone(backend),
            wake,
            ticking: false,
            writes: Vec::new(),
            free_writes: Vec::new(),
            spare_bufs: Vec::new(),
        })
    }

    /// Local writes in flight.
    pub(crate) fn writes_in_flight(&self) -> usize {
        self.writes.len() - self.free_writes.len()
    }

    /// Submits what was queued, then, if `sleep`, waits until the inbox
    /// is rung, a write completes or the tick fires (armed for `tick` when
    /// none is, so every `tick` while the caller sleeps); what finished.
    pub(crate) fn wait(&mut self, sleep: bool, tick: Duration) -> std::io::Result<Woken> {
        if sleep && !self.ticking {
            self.ring.push(Op::Timeout { after: tick }, TICK_TOKEN)?;
            self.ticking = true;
        }
        self.ring.submit_and_wait(usize::from(sleep))?;
        let mut woken = Woken::default();
        while let Some(completion) = self.ring.pop() {
            match completion.user_data {
                WAKE_TOKEN => {
                    let fd = self.wake.as_raw_fd();
                    self.ring.push(Op::ReadEventfd { fd }, WAKE_TOKEN)?;
                }
                TICK_TOKEN => self.ticking = false,
                _ => {
                    if let Some(written) = self.piece_done(completion) {
                        woken.written.push(written);
                    }
                }
            }
        }
        Ok(woken)
    }

    /// Queues `write`'s pieces (submitted at the next [`WriteRing::wait`]),
    /// or gives it back for the workers (also when none could be queued; a
    /// write queued in part fails when its queued pieces are done).
    pub(crate) fn write(&mut self, write: RingWrite) -> Result<(), RingWrite> {
        let len = write.data.len() as u64;
        if !self.backend.gate.enter() {
            return Err(write);
        }
        if self.backend.map.is_retired() || !writable(&self.backend, write.offset, len) {
            self.backend.gate.leave();
            return Err(write);
        }
        let index = self.free_writes.pop().unwrap_or_else(|| {
            self.writes.push(None);
            self.writes.len() - 1
        });
        let mut done = 0;
        let mut pieces = 0;
        while done < write.data.len() {
            let at = write.offset + done as u64;
            let (location, piece) = locate(&self.backend, at, (len - done as u64) as usize);
            let (member, file_offset) = location.expect("checked writable under the gate");
            let Some(mut buf) = self.buffer(piece) else {
                break;
            };
            buf.as_mut_slice()[..piece].copy_from_slice(&write.data[done..done + piece]);
            let op = Op::Write {
                fd: self.backend.member_fds[member],
                buf,
                buf_offset: 0,
                len: piece,
                file_offset,
                dsync: write.fua,
            };
            if let Err(error) = self.ring.push(op, index as u64) {
                log::warn!(
                    "volume {}: local write not queued: {error}",
                    self.backend.volume
                );
                break;
            }
            pieces += 1;
            done += piece;
        }
        if pieces == 0 {
            self.free_writes.push(index);
            self.backend.gate.leave();
            return Err(write);
        }
        let error = (done < write.data.len()).then_some(IoError::Other);
        self.writes[index] = Some(InFlight {
            op: write.op,
            pieces_left: pieces,
            error,
        });
        Ok(())
    }

    /// A piece's completion; the write's result once it was the last.
    fn piece_done(&mut self, completion: Completion) -> Option<(OpId, LocalResult)> {
        let index = completion.user_data as usize;
        if let Returned::Buf(buf) = completion.returned {
            if self.spare_bufs.len() < SPARE_BUFS_MAX {
                self.spare_bufs.push(buf);
            }
        }
        let write = self.writes[index].as_mut().expect("a write in flight");
        if let Err(error) = completion.result {
            log::warn!("replicated volume, local copy: {error}");
            write.error = Some(IoError::Media);
        }
        write.pieces_left -= 1;
        if write.pieces_left > 0 {
            return None;
        }
        let write = self.writes[index].take().expect("a write in flight");
        self.free_writes.push(index);
        self.backend.gate.leave();
        Some((write.op, write.error.map_or(Ok(None), Err)))
    }

    /// An aligned buffer of at least `len` bytes (none if none could be mapped).
    fn buffer(&mut self, len: usize) -> Option<IoBuf> {
        if let Some(at) = self.spare_bufs.iter().position(|b| b.capacity() >= len) {
            return Some(self.spare_bufs.swap_remove(at));
        }
        IoBuf::new(len.max(BUF_BYTES_MIN))
            .map_err(|error| log::warn!("local write: no buffer: {error}"))
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::time::Duration;
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
        })
    }

    /// Waits (a second at most) until `ring` reports a finished write.
    fn written(ring: &mut WriteRing) -> (OpId, LocalResult) {
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(1) {
            let woken = ring.wait(true, Duration::from_millis(10)).unwrap();
            if let Some(written) = woken.written.into_iter().next() {
                return written;
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
        let mut ring = WriteRing::new(&backend, weft_uring::eventfd().unwrap()).unwrap();
        // 8 KiB across the end of chunk 0: two pieces, on member chunks 2 and 3.
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let write = |op, offset, data: &[u8]| RingWrite {
            op: OpId(op),
            offset,
            data: Arc::new(data.to_vec()),
            fua: true,
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
        // A closed gate (a snapshot being taken): given back (the workers wait).
        let closed = backend.gate.quiesce(); // returns: every write left the gate
        assert!(ring.write(write(3, 0, &[1; 4096])).is_err());
        drop(closed);
        // A retired map (the volume grew): given back (the workers answer PathTransition).
        backend.map.retire();
        assert!(ring.write(write(4, 0, &[1; 4096])).is_err());
        assert_eq!(ring.writes_in_flight(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_rung_inbox_ends_the_wait_before_the_tick() {
        let member = weft_uring::memfd_create("member").unwrap();
        let wake = weft_uring::eventfd().unwrap();
        let mut bell = wake.try_clone().unwrap();
        let mut ring = WriteRing::new(&backend(&member), wake).unwrap();
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            std::io::Write::write_all(&mut bell, &1u64.to_ne_bytes()).unwrap();
        });
        let tick = Duration::from_secs(2);
        let start = std::time::Instant::now();
        let woken = ring.wait(true, tick).unwrap();
        assert!(woken.written.is_empty());
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "woken by the bell, not the tick"
        );
        ringer.join().unwrap();
        // The tick (still armed) ends the next, quiet wait.
        ring.wait(true, tick).unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
