//! The primary's own copy of a replicated volume, as its replicator reads
//! and writes it: mapped writes on the replicator's ring
//! (`super::write_ring`, all in flight at once), everything else on
//! [`LocalPool`]'s worker threads, each a [`LocalVolume`]
//! doing synchronous I/O through descriptors of its own on the pool's
//! members (O_DIRECT, as the reactors'), after the volume's chunk map says
//! where each piece lives. What the map cannot serve yet (a first write to
//! a chunk, a closed gate) and what changes metadata (Write Zeroes,
//! Deallocate, Flush) goes to the volume manager, as the reactors' slow
//! path does, and the worker waits for its answer.
//!
//! Host reads come here only during a promotion's resync (the reactors
//! serve them otherwise); like copies, they enter the volume's gate, so a
//! Deallocate that frees a chunk waits for them (the chunk may go to
//! another volume). A host read is not ordered against writes: concurrent
//! commands, as NVMe allows.
//!
//! What this does not do: allocate or commit metadata itself (only the
//! manager does).

use super::{Event, Events};
use std::sync::mpsc;
use std::sync::Arc;
use weft_proto::fence::FencedIo;
use weft_proto::IoError;
use weft_target::{VolumeBackend, VolumeOutcome, VolumeReply, VolumeRequest, VolumeWork};
use weft_volume::crypt::VolumeCipher;
use weft_volume::{FileMedia, Media};

/// A volume's local copy.
pub(crate) struct LocalVolume {
    backend: Arc<VolumeBackend>,
    media: FileMedia,
}

impl LocalVolume {
    /// The copy `backend` serves, through new descriptors on `members` (the
    /// pool's member paths, in order).
    pub(crate) fn open(
        backend: Arc<VolumeBackend>,
        members: &[std::path::PathBuf],
    ) -> Result<LocalVolume, String> {
        let media = FileMedia::open(members, None).map_err(|e| e.to_string())?;
        Ok(LocalVolume { backend, media })
    }

    /// Writes `data` at `offset`; durable first if `fua`.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        let len = data.len() as u64;
        // A host write is within the transfer size: never near 4 GiB.
        let len_u32 = u32::try_from(len).map_err(|_| IoError::Other)?;
        loop {
            if !self.backend.gate.enter() {
                self.ask(VolumeWork::Wait)?;
                continue;
            }
            if self.backend.map.is_retired() {
                // The copy changed under this primary (grown): only the
                // next one knows where its chunks are.
                self.backend.gate.leave();
                return Err(IoError::PathTransition);
            }
            if !self.backend.writable(offset, len_u32) {
                self.backend.gate.leave();
                self.ask(VolumeWork::PrepareWrite { offset, len })?;
                continue;
            }
            let written = self.write_mapped(offset, data, fua);
            self.backend.gate.leave();
            return written;
        }
    }

    fn write_mapped(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), IoError> {
        let mut done = 0;
        let mut members = Vec::new();
        while done < data.len() {
            let (location, piece) = locate(&self.backend, offset + done as u64, data.len() - done);
            let (member, at) = location.expect("checked writable");
            self.media
                .write_at(member, at, &data[done..done + piece])
                .map_err(|e| media_error(&e))?;
            members.push(member);
            done += piece;
        }
        if fua {
            members.sort_unstable();
            members.dedup();
            for member in members {
                self.media.sync(member).map_err(|e| media_error(&e))?;
            }
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` (unwritten chunks read as zeroes).
    pub(crate) fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, IoError> {
        while !self.backend.gate.enter() {
            self.ask(VolumeWork::Wait)?;
        }
        let read = self.read_mapped(offset, len);
        self.backend.gate.leave();
        read
    }

    fn read_mapped(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, IoError> {
        if self.backend.map.is_retired() {
            return Err(IoError::PathTransition);
        }
        let mut data = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let (location, piece) = locate(&self.backend, offset + done as u64, len - done);
            if let Some((member, at)) = location {
                self.media
                    .read_at(member, at, &mut data[done..done + piece])
                    .map_err(|e| media_error(&e))?;
            }
            done += piece;
        }
        if let Some(cipher) = &self.backend.cipher {
            // Unwritten pieces stayed zeroes, which decrypt to themselves.
            cipher.decrypt(offset, &mut data);
        }
        Ok(data)
    }

    /// Zeroes (or deallocates) a range, through the manager.
    pub(crate) fn zeroes(&mut self, offset: u64, len: u64, fua: bool) -> Result<(), IoError> {
        self.ask(VolumeWork::Deallocate { offset, len, fua })
    }

    /// Makes every completed write durable, through the manager (which
    /// also commits the volume's metadata).
    pub(crate) fn flush(&mut self) -> Result<(), IoError> {
        self.ask(VolumeWork::Flush)
    }

    /// Asks the manager and waits for its answer: `Retry` is success here.
    fn ask(&self, work: VolumeWork) -> Result<(), IoError> {
        let (sender, answer) = mpsc::channel();
        self.backend.manager.submit(VolumeRequest {
            pool: self.backend.pool.clone(),
            volume: self.backend.volume.clone(),
            work,
            reply: VolumeReply::channel(sender),
        });
        match answer.recv() {
            Ok(VolumeOutcome::Retry) => Ok(()),
            Ok(VolumeOutcome::Done(result)) => result,
            Err(mpsc::RecvError) => Err(IoError::Other),
        }
    }
}

/// What the local copy stores of `data` written at `offset`: the data
/// itself, or an encrypted volume's ciphertext of it (in a copy: the links
/// send the host's data to the replicas, which encrypt with their own keys).
pub(crate) fn stored_form(
    cipher: Option<&VolumeCipher>,
    offset: u64,
    data: weft_uring::SharedBuf,
) -> weft_uring::SharedBuf {
    let Some(cipher) = cipher else {
        return data;
    };
    let mut stored = data.as_slice().to_vec();
    cipher.encrypt(offset, &mut stored);
    weft_uring::SharedBuf::copy_from(&stored)
}

/// Where the piece of `[offset, offset + len)` in its first chunk lies on
/// `backend`'s pool (member and byte offset, or none if unwritten), and its
/// length: the backend's own lookup, in this module's units.
fn locate(backend: &VolumeBackend, offset: u64, len: usize) -> (Option<(usize, u64)>, usize) {
    // A piece ends at its chunk's end anyway: a longer range is cut there.
    let (place, piece) = backend.place(offset, u32::try_from(len).unwrap_or(u32::MAX));
    (place, piece as usize)
}

fn media_error(error: &std::io::Error) -> IoError {
    log::warn!("replicated volume, local copy: {error}");
    IoError::Media
}

/// What a local I/O worker does.
#[derive(Debug)]
pub(crate) enum LocalWork {
    /// Write `data` at byte `offset` (counted against the node's fence of
    /// its copy until done: `fenced` drops then).
    Write {
        offset: u64,
        data: weft_uring::SharedBuf,
        fua: bool,
        fenced: FencedIo,
    },
    /// Zero (or deallocate) `len` bytes at `offset` (counted as a write).
    Zeroes {
        offset: u64,
        len: u64,
        fua: bool,
        fenced: FencedIo,
    },
    /// Read `len` bytes at `offset` (a copy's, or a host's during a resync).
    Read { offset: u64, len: usize },
    /// Make every completed write durable.
    Flush,
}

/// A local I/O's result: the data of a read.
pub(crate) type LocalResult = Result<Option<Vec<u8>>, IoError>;

/// The replicator's local I/O but its mapped writes (the replicator's
/// [`super::write_ring`] does those): a few threads in parallel, each with
/// descriptors of its own; results come back to the replicator as events.
/// The replication core never has two overlapping writes (or a write and a
/// copy of one region) in flight, so their order among threads and the
/// ring is free; a Flush covers the writes completed before it, as NVMe's does.
pub(crate) struct LocalPool {
    jobs: mpsc::Sender<(weft_replication::OpId, LocalWork)>,
    /// Jobs queued or running.
    pending: Arc<std::sync::atomic::AtomicUsize>,
}

/// Local I/O workers per replicated volume.
const WORKERS: usize = 4;

impl LocalPool {
    /// Starts the workers on `backend`'s volume; each result goes to
    /// `done` as an [`Event::LocalDone`].
    pub(crate) fn start(
        backend: &Arc<VolumeBackend>,
        members: &[std::path::PathBuf],
        done: &Events,
    ) -> Result<LocalPool, String> {
        let (jobs, queue) = mpsc::channel::<(weft_replication::OpId, LocalWork)>();
        let queue = Arc::new(std::sync::Mutex::new(queue));
        let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for index in 0..WORKERS {
            let mut volume = LocalVolume::open(Arc::clone(backend), members)?;
            let (queue, done) = (Arc::clone(&queue), done.clone());
            let pending = Arc::clone(&pending);
            std::thread::Builder::new()
                .name(format!("local-io-{index}"))
                .spawn(move || loop {
                    let job = queue
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .recv();
                    let Ok((op, work)) = job else {
                        return;
                    };
                    let result = volume.run(work);
                    pending.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    if done.send(Event::LocalDone { op, result }).is_err() {
                        return;
                    }
                })
                .map_err(|e| e.to_string())?;
        }
        Ok(LocalPool { jobs, pending })
    }

    /// Queues `work` for op `op`.
    pub(crate) fn submit(&self, op: weft_replication::OpId, work: LocalWork) {
        self.pending
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let _ = self.jobs.send((op, work));
    }

    /// Whether no local I/O is queued or running.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.load(std::sync::atomic::Ordering::Acquire) == 0
    }
}

impl LocalVolume {
    fn run(&mut self, work: LocalWork) -> LocalResult {
        match work {
            // (`_fenced` drops once the write is done.)
            LocalWork::Write {
                offset,
                data,
                fua,
                fenced: _fenced,
            } => self.write(offset, &data, fua).map(|()| None),
            LocalWork::Zeroes {
                offset,
                len,
                fua,
                fenced: _fenced,
            } => self.zeroes(offset, len, fua).map(|()| None),
            LocalWork::Read { offset, len } => self.read(offset, len).map(Some),
            LocalWork::Flush => self.flush().map(|()| None),
        }
    }
}
