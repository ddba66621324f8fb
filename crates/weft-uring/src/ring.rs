//! The ring: queues [`Op`]s, owns their memory while in flight, hands it back on completion.

use crate::batch::SendBatch;
use crate::buf::{assert_range_fits, IoBuf};
use crate::shared::SharedBuf;
use io_uring::{opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// One operation. Buffers are moved into the ring and come back in [`Completion::returned`].
///
/// File descriptors are borrowed by number: the caller must keep them open until the op
/// completes (closing early only makes the op fail or hit another file, never unsound).
// Fields are named as in the syscalls and explained by each variant's doc.
#[allow(missing_docs)]
#[derive(Debug)]
pub enum Op {
    /// `recv(2)` into `buf[offset..offset + len]`.
    Recv {
        fd: RawFd,
        buf: IoBuf,
        offset: usize,
        len: usize,
    },
    /// `sendmsg(2)` of the batch's remaining segments with `MSG_NOSIGNAL`; the result is the
    /// number of bytes sent, which may be short: the batch comes back unconsumed, so call
    /// [`SendBatch::consume`] and push it again for the rest.
    /// More than 1024 (`UIO_MAXIOV`) non-empty segments fail with `EMSGSIZE`.
    Send { fd: RawFd, batch: SendBatch },
    /// `pread` into `buf[buf_offset..buf_offset + len]` from `file_offset`.
    Read {
        fd: RawFd,
        buf: IoBuf,
        buf_offset: usize,
        len: usize,
        file_offset: u64,
    },
    /// `pwrite` from `buf[buf_offset..buf_offset + len]` at `file_offset`; `dsync` sets
    /// `RWF_DSYNC` (FUA semantics).
    Write {
        fd: RawFd,
        buf: IoBuf,
        buf_offset: usize,
        len: usize,
        file_offset: u64,
        dsync: bool,
    },
    /// As `Write`, from a buffer others may hold too (it only reads it).
    WriteShared {
        fd: RawFd,
        buf: SharedBuf,
        buf_offset: usize,
        len: usize,
        file_offset: u64,
        dsync: bool,
    },
    /// `fsync`, or `fdatasync` when `datasync` is set.
    Fsync { fd: RawFd, datasync: bool },
    /// `fallocate(fd, mode, offset, len)`.
    Fallocate {
        fd: RawFd,
        mode: i32,
        offset: u64,
        len: u64,
    },
    /// Read (and thereby reset) the 8-byte counter of an eventfd; used to wake a reactor.
    ReadEventfd { fd: RawFd },
    /// Completes with `Err(ETIME)` once `after` has elapsed.
    Timeout { after: Duration },
}

/// The outcome of one op.
#[derive(Debug)]
pub struct Completion {
    /// The value given to [`Ring::push`].
    pub user_data: u64,
    /// `Ok(n)` for a non-negative kernel result, otherwise the errno as an `io::Error`.
    pub result: io::Result<usize>,
    /// The buffers the op owned, handed back.
    pub returned: Returned,
}

/// Buffers handed back by a completed op.
#[derive(Debug)]
pub enum Returned {
    /// The op owned no buffer.
    Nothing,
    /// The buffer of a `Recv`, `Read` or `Write`.
    Buf(IoBuf),
    /// The batch of a `Send`, not yet consumed.
    Batch(SendBatch),
    /// The buffer of a `WriteShared`.
    Shared(SharedBuf),
}

/// Everything the kernel may read or write for one in-flight op.
///
/// Slots are boxed so that pointers into them (msghdr, iovecs, timespec, eventfd counter)
/// survive the slab `Vec` growing. Rust code touches a slot only before its SQE is queued and
/// after its CQE was reaped, never in between.
struct Slot {
    busy: bool,
    user_data: u64,
    owned: Returned,
    /// Reused across sends; only reallocates when a batch has more segments than ever before.
    iovecs: Vec<libc::iovec>,
    msghdr: libc::msghdr,
    timespec: types::Timespec,
    eventfd_counter: u64,
}

// SAFETY: the raw pointers inside `iovecs` and `msghdr` only point into memory owned by this
// same slot (its iovec Vec, the IoBufs of its batch and the SharedBufs it holds references to),
// which moves with it; nothing is tied to a thread.
unsafe impl Send for Slot {}

impl Slot {
    fn idle() -> Box<Slot> {
        Box::new(Slot {
            busy: false,
            user_data: 0,
            owned: Returned::Nothing,
            iovecs: Vec::new(),
            // SAFETY: msghdr is a plain C struct; all-zero (null pointers, zero lengths) is a
            // valid, empty message header. Zeroing also covers private padding fields.
            msghdr: unsafe { std::mem::zeroed() },
            timespec: types::Timespec::new(),
            eventfd_counter: 0,
        })
    }

    /// Takes ownership of `op`'s memory and builds the SQE pointing at it.
    /// Validates bounds before storing anything, so a panic leaves the slot idle.
    fn prepare(&mut self, op: Op) -> squeue::Entry {
        match op {
            Op::Recv {
                fd,
                mut buf,
                offset,
                len,
            } => {
                let ptr = buf.kernel_ptr(offset, len);
                let entry = opcode::Recv::new(types::Fd(fd), ptr, kernel_len(len)).build();
                self.owned = Returned::Buf(buf);
                entry
            }
            Op::Send { fd, batch } => self.prepare_send(fd, batch),
            Op::Read {
                fd,
                mut buf,
                buf_offset,
                len,
                file_offset,
            } => {
                let ptr = buf.kernel_ptr(buf_offset, len);
                let read = opcode::Read::new(types::Fd(fd), ptr, kernel_len(len));
                self.owned = Returned::Buf(buf);
                read.offset(file_offset).build()
            }
            Op::Write {
                fd,
                buf,
                buf_offset,
                len,
                file_offset,
                dsync,
            } => {
                let ptr = buf.kernel_const_ptr(buf_offset, len);
                self.owned = Returned::Buf(buf);
                pwrite(fd, ptr, len, file_offset, dsync)
            }
            Op::WriteShared {
                fd,
                buf,
                buf_offset,
                len,
                file_offset,
                dsync,
            } => {
                let ptr = buf.kernel_const_ptr(buf_offset, len);
                // Held by the slot: the bytes live while the kernel reads them.
                self.owned = Returned::Shared(buf);
                pwrite(fd, ptr, len, file_offset, dsync)
            }
            Op::Fsync { fd, datasync } => {
                let flags = if datasync {
                    types::FsyncFlags::DATASYNC
                } else {
                    types::FsyncFlags::empty()
                };
                opcode::Fsync::new(types::Fd(fd)).flags(flags).build()
            }
            Op::Fallocate {
                fd,
                mode,
                offset,
                len,
            } => opcode::Fallocate::new(types::Fd(fd), len)
                .offset(offset)
                .mode(mode)
                .build(),
            Op::ReadEventfd { fd } => {
                let counter = std::ptr::addr_of_mut!(self.eventfd_counter).cast::<u8>();
                // Offset -1 means "current position", the convention for non-seekable files.
                opcode::Read::new(types::Fd(fd), counter, 8)
                    .offset(u64::MAX)
                    .build()
            }
            Op::Timeout { after } => {
                self.timespec = types::Timespec::from(after);
                opcode::Timeout::new(&self.timespec).build()
            }
        }
    }

    /// Builds the iovec array and msghdr in the slot, from the batch's remaining segments.
    fn prepare_send(&mut self, fd: RawFd, batch: SendBatch) -> squeue::Entry {
        batch.fill_iovecs(&mut self.iovecs);
        self.msghdr.msg_iov = self.iovecs.as_mut_ptr();
        self.msghdr.msg_iovlen = self.iovecs.len() as _;
        // Storing the batch moves only its Vec headers; the IoBuf memory the iovecs point at
        // stays put.
        self.owned = Returned::Batch(batch);
        let flags = libc::MSG_NOSIGNAL as u32;
        opcode::SendMsg::new(types::Fd(fd), &self.msghdr)
            .flags(flags)
            .build()
    }
}

/// The SQE of a `pwrite` of `len` bytes at `ptr` (in a buffer the slot now
/// owns or holds) to `file_offset`, with `RWF_DSYNC` if `dsync`.
fn pwrite(fd: RawFd, ptr: *const u8, len: usize, file_offset: u64, dsync: bool) -> squeue::Entry {
    let flags = if dsync { libc::RWF_DSYNC } else { 0 };
    opcode::Write::new(types::Fd(fd), ptr, kernel_len(len))
        .offset(file_offset)
        .rw_flags(flags)
        .build()
}

/// Kernel SQEs carry 32-bit lengths; refuse (panic) rather than silently truncate.
fn kernel_len(len: usize) -> u32 {
    u32::try_from(len).expect("op length exceeds u32::MAX")
}

/// Validates an op's buffer bounds up front so that nothing panics halfway through a push.
fn assert_op_bounds(op: &Op) {
    let (capacity, offset, len) = match op {
        Op::Recv {
            buf, offset, len, ..
        } => (buf.capacity(), *offset, *len),
        Op::Read {
            buf,
            buf_offset,
            len,
            ..
        }
        | Op::Write {
            buf,
            buf_offset,
            len,
            ..
        } => (buf.capacity(), *buf_offset, *len),
        Op::WriteShared {
            buf,
            buf_offset,
            len,
            ..
        } => (buf.len(), *buf_offset, *len),
        _ => return,
    };
    assert_range_fits(offset, len, capacity);
    kernel_len(len);
}

/// An `io_uring` instance plus a slab of in-flight ops.
///
/// Dropping a ring with ops still in flight leaks those ops' slots and buffers (the kernel
/// might still touch them after the ring fd is closed); everything else is freed normally.
pub struct Ring {
    ring: IoUring,
    // Boxed on purpose: the kernel holds pointers into slots, which must not move when the
    // Vec grows.
    #[allow(clippy::vec_box)]
    slots: Vec<Box<Slot>>,
    /// Indices of idle slots; `push` takes from the end.
    free: Vec<usize>,
    in_flight: usize,
}

impl Ring {
    /// Creates a ring with `entries` submission queue entries and a slab for `2 * entries`
    /// in-flight ops (the default completion queue size).
    ///
    /// Where the kernel supports it (5.19+) the ring runs completion task work
    /// cooperatively, when the owning thread next enters the kernel, instead of
    /// interrupting it; older kernels get a plain ring.
    pub fn new(entries: u32) -> io::Result<Ring> {
        // Cooperative task work (no interrupting the thread to post a
        // completion), flagged in the shared ring (IORING_SQ_TASKRUN): a
        // spinning reactor sees a completion waiting in the kernel without a
        // syscall, where it would otherwise wait for its next kernel entry (a
        // timer tick: milliseconds). Kernels before 5.19 lack the flag.
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)
            .or_else(|_| IoUring::builder().setup_coop_taskrun().build(entries))
            .or_else(|_| IoUring::new(entries))?;
        let capacity = entries as usize * 2;
        let slots = (0..capacity).map(|_| Slot::idle()).collect();
        let free = (0..capacity).rev().collect();
        Ok(Ring {
            ring,
            slots,
            free,
            in_flight: 0,
        })
    }

    /// Queues `op`; its completion will carry `user_data`. If the submission queue is full,
    /// pending entries are submitted first. On error the op (and its buffers) is dropped.
    ///
    /// Panics if a buffer range is out of bounds or longer than `u32::MAX`.
    pub fn push(&mut self, op: Op, user_data: u64) -> io::Result<()> {
        assert_op_bounds(&op);
        self.make_room_in_submission_queue()?;
        let index = self.idle_slot_index();
        let slot = &mut self.slots[index];
        let entry = slot.prepare(op).user_data(index as u64);
        slot.user_data = user_data;
        slot.busy = true;
        self.free.pop();
        self.in_flight += 1;
        // SAFETY: every pointer in `entry` points into the boxed slot or into buffers it now
        // owns (mmap memory that never moves). The slot is marked busy, so nothing reuses,
        // mutates or frees it until `pop` reaps this entry's CQE; `Drop` leaks busy slots.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        pushed.expect("submission queue has room: checked above");
        Ok(())
    }

    /// Submits queued entries and waits until at least `min_complete` completions are
    /// available (0 = just submit). `min_complete` is capped at [`in_flight`](Ring::in_flight)
    /// so this cannot wait for completions that will never come. Interrupted waits are retried;
    /// `EBUSY` (completion queue backlog) returns `Ok` so the caller can reap with `pop`.
    pub fn submit_and_wait(&mut self, min_complete: usize) -> io::Result<()> {
        self.submit_retrying(min_complete.min(self.in_flight))
    }

    /// Whether `submit_and_wait(0)` would find something to do without sleeping:
    /// operations pushed but not submitted yet (a spinning reactor must not sit
    /// on them: they would wait for the end of its spin), a completion is
    /// queued, or the kernel has completion work waiting for this thread
    /// (IORING_SQ_TASKRUN, with cooperative task work). Only reads shared
    /// memory, so a reactor can poll it in a short spin before it sleeps.
    pub fn has_work(&mut self) -> bool {
        let submission = self.ring.submission();
        let pending = !submission.is_empty() || submission.taskrun();
        drop(submission);
        pending || !self.ring.completion().is_empty()
    }

    /// Next completion, if any, with its buffers returned.
    pub fn pop(&mut self) -> Option<Completion> {
        let cqe = self.ring.completion().next()?;
        let index = cqe.user_data() as usize;
        let slot = &mut self.slots[index];
        debug_assert!(slot.busy, "completion for idle slot {index}");
        slot.busy = false;
        let returned = std::mem::replace(&mut slot.owned, Returned::Nothing);
        let user_data = slot.user_data;
        self.free.push(index);
        self.in_flight -= 1;
        Some(Completion {
            user_data,
            result: result_of(cqe.result()),
            returned,
        })
    }

    /// Has the kernel signal `eventfd` whenever it posts completions here, so
    /// that another thread's or ring's read of it tells this ring has work.
    pub fn register_eventfd(&mut self, eventfd: RawFd) -> io::Result<()> {
        self.ring.submitter().register_eventfd(eventfd)
    }

    /// Ops pushed whose completion has not been popped yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn make_room_in_submission_queue(&mut self) -> io::Result<()> {
        if !self.ring.submission().is_full() {
            return Ok(());
        }
        self.submit_retrying(0)?;
        if self.ring.submission().is_full() {
            // The kernel refused new work (e.g. completion backlog); the caller must reap first.
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        Ok(())
    }

    /// Index of an idle slot, growing the slab only when more ops are in flight than ever.
    fn idle_slot_index(&mut self) -> usize {
        if let Some(&index) = self.free.last() {
            return index;
        }
        self.slots.push(Slot::idle());
        self.free.push(self.slots.len() - 1);
        self.slots.len() - 1
    }

    fn submit_retrying(&mut self, want: usize) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel may keep using an in-flight op's memory after the ring fd closes, so those
        // slots (and their buffers) are leaked, not freed. Idle slots are freed as usual.
        for slot in self.slots.drain(..) {
            if slot.busy {
                std::mem::forget(slot);
            }
        }
    }
}

fn result_of(res: i32) -> io::Result<usize> {
    if res >= 0 {
        Ok(res as usize)
    } else {
        Err(io::Error::from_raw_os_error(-res))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{File, OpenOptions};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    /// A file in the temp dir that is removed on drop.
    struct TempPath(PathBuf);

    impl TempPath {
        fn new() -> TempPath {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = format!("weft-uring-{}-{n}", std::process::id());
            TempPath(std::env::temp_dir().join(name))
        }

        fn open(&self, flags: i32) -> io::Result<File> {
            let mut options = OpenOptions::new();
            options
                .read(true)
                .write(true)
                .create(true)
                .custom_flags(flags);
            options.open(&self.0)
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Pushes one op, waits for it and returns its completion.
    fn run(ring: &mut Ring, op: Op) -> Completion {
        ring.push(op, 7).unwrap();
        ring.submit_and_wait(1).unwrap();
        let completion = ring.pop().expect("a completion after waiting for one");
        assert_eq!(completion.user_data, 7);
        completion
    }

    fn returned_buf(returned: Returned) -> IoBuf {
        match returned {
            Returned::Buf(buf) => buf,
            other => panic!("expected a buffer back, got {other:?}"),
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Writes 8 KiB at file offset 4096 from a non-zero buffer offset, then reads it back.
    fn write_read_roundtrip(ring: &mut Ring, file: &File) -> io::Result<()> {
        let fd = file.as_raw_fd();
        let data = pattern(8192, 5);
        let mut buf = IoBuf::new(3 * 4096)?;
        buf.as_mut_slice()[4096..4096 + 8192].copy_from_slice(&data);
        let write = Op::Write {
            fd,
            buf,
            buf_offset: 4096,
            len: 8192,
            file_offset: 4096,
            dsync: true,
        };
        let done = run(ring, write);
        assert_eq!(done.result?, 8192);
        let buf = returned_buf(done.returned);
        let read = Op::Read {
            fd,
            buf: IoBuf::new(8192)?,
            buf_offset: 0,
            len: 8192,
            file_offset: 4096,
        };
        let done = run(ring, read);
        assert_eq!(done.result?, 8192);
        assert_eq!(returned_buf(done.returned).as_slice(), &data[..]);
        drop(buf);
        Ok(())
    }

    #[test]
    fn buffered_read_write_roundtrip() {
        let mut ring = Ring::new(8).unwrap();
        let path = TempPath::new();
        write_read_roundtrip(&mut ring, &path.open(0).unwrap()).unwrap();
        assert_eq!(ring.in_flight(), 0);
    }

    #[test]
    fn direct_read_write_roundtrip() {
        let mut ring = Ring::new(8).unwrap();
        let path = TempPath::new();
        let result = path
            .open(libc::O_DIRECT)
            .and_then(|file| write_read_roundtrip(&mut ring, &file));
        match result {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!(
                    "O_DIRECT unsupported on {:?}; skipped",
                    std::env::temp_dir()
                );
            }
            other => other.unwrap(),
        }
    }

    #[test]
    fn a_shared_buffer_is_written_from_and_held_until_done() {
        let mut ring = Ring::new(8).unwrap();
        let file = crate::memfd_create("shared").unwrap();
        let data = pattern(8192, 3);
        let buf = SharedBuf::copy_from(&data);
        let write = Op::WriteShared {
            fd: file.as_raw_fd(),
            buf: buf.clone(),
            buf_offset: 4096,
            len: 4096,
            file_offset: 0,
            dsync: false,
        };
        let done = run(&mut ring, write);
        assert_eq!(done.result.unwrap(), 4096);
        assert!(
            matches!(done.returned, Returned::Shared(ref back) if back.as_ptr() == buf.as_ptr())
        );
        let read = Op::Read {
            fd: file.as_raw_fd(),
            buf: IoBuf::new(4096).unwrap(),
            buf_offset: 0,
            len: 4096,
            file_offset: 0,
        };
        let done = run(&mut ring, read);
        assert_eq!(returned_buf(done.returned).as_slice(), &data[4096..]);
    }

    /// An op pushed but not submitted is work: a reactor spinning on
    /// `has_work` must submit it rather than hold it for its whole spin.
    #[test]
    fn an_op_not_submitted_yet_is_work() {
        let mut ring = Ring::new(4).unwrap();
        assert!(!ring.has_work());
        let wait = Op::Timeout {
            after: std::time::Duration::from_secs(60),
        };
        ring.push(wait, 1).unwrap();
        assert!(ring.has_work(), "pushed, not submitted");
        ring.submit_and_wait(0).unwrap();
        assert!(!ring.has_work(), "submitted, nothing completed");
    }

    #[test]
    fn zero_length_read_completes() {
        let mut ring = Ring::new(4).unwrap();
        let file = crate::memfd_create("zero").unwrap();
        let read = Op::Read {
            fd: file.as_raw_fd(),
            buf: IoBuf::new(0).unwrap(),
            buf_offset: 4096,
            len: 0,
            file_offset: 0,
        };
        assert_eq!(run(&mut ring, read).result.unwrap(), 0);
    }

    #[test]
    fn out_of_bounds_op_panics_and_ring_stays_usable() {
        let mut ring = Ring::new(4).unwrap();
        let file = crate::memfd_create("oob").unwrap();
        let fd = file.as_raw_fd();
        let bad = Op::Read {
            fd,
            buf: IoBuf::new(4096).unwrap(),
            buf_offset: 1,
            len: 4096,
            file_offset: 0,
        };
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ring.push(bad, 1)));
        assert!(panicked.is_err());
        assert_eq!(ring.in_flight(), 0);
        let good = Op::Read {
            fd,
            buf: IoBuf::new(4096).unwrap(),
            buf_offset: 0,
            len: 4096,
            file_offset: 0,
        };
        assert_eq!(run(&mut ring, good).result.unwrap(), 0);
    }

    /// Three segments from two buffers: header, data, trailer (the trailer shares the header
    /// buffer). The data is large enough that sendmsg is likely to be partial.
    fn header_data_trailer(data: &[u8]) -> SendBatch {
        let mut headers = IoBuf::new(64).unwrap();
        headers.as_mut_slice()[..16].copy_from_slice(b"HEAD----TRAILER!");
        let mut payload = IoBuf::new(data.len()).unwrap();
        payload.as_mut_slice()[..data.len()].copy_from_slice(data);
        let mut batch = SendBatch::new();
        let h = batch.push_buf(headers);
        let d = batch.push_buf(payload);
        batch.push_segment(h, 0..8);
        batch.push_segment(d, 0..data.len());
        batch.push_segment(h, 8..16);
        batch
    }

    const SEND: u64 = 1;
    const RECV: u64 = 2;

    #[test]
    fn send_and_recv_until_complete_on_one_ring() {
        let (left, right) = UnixStream::pair().unwrap();
        let data = pattern(1 << 20, 9);
        let mut expected = b"HEAD----".to_vec();
        expected.extend_from_slice(&data);
        expected.extend_from_slice(b"TRAILER!");

        let mut ring = Ring::new(4).unwrap();
        let recv = |buf| Op::Recv {
            fd: right.as_raw_fd(),
            buf,
            offset: 100,
            len: 60_000,
        };
        ring.push(
            Op::Send {
                fd: left.as_raw_fd(),
                batch: header_data_trailer(&data),
            },
            SEND,
        )
        .unwrap();
        ring.push(recv(IoBuf::new(65536).unwrap()), RECV).unwrap();
        let (mut received, mut sends, mut sending) = (Vec::new(), 0, true);
        while received.len() < expected.len() {
            ring.submit_and_wait(1).unwrap();
            while let Some(done) = ring.pop() {
                let n = done.result.unwrap();
                match (done.user_data, done.returned) {
                    (SEND, Returned::Batch(mut batch)) => {
                        sends += 1;
                        batch.consume(n);
                        sending = !batch.is_empty();
                        if sending {
                            ring.push(
                                Op::Send {
                                    fd: left.as_raw_fd(),
                                    batch,
                                },
                                SEND,
                            )
                            .unwrap();
                        }
                    }
                    (RECV, Returned::Buf(buf)) => {
                        received.extend_from_slice(&buf.as_slice()[100..100 + n]);
                        if received.len() < expected.len() {
                            ring.push(recv(buf), RECV).unwrap();
                        }
                    }
                    other => panic!("unexpected completion {other:?}"),
                }
            }
        }
        assert!(!sending);
        assert!(
            received == expected,
            "received bytes differ from the gathered segments"
        );
        eprintln!("1 MiB batch went out in {sends} sendmsg calls");
    }

    #[test]
    fn send_reports_broken_pipe_without_signal() {
        let (left, right) = UnixStream::pair().unwrap();
        drop(right);
        let mut ring = Ring::new(4).unwrap();
        let done = run(
            &mut ring,
            Op::Send {
                fd: left.as_raw_fd(),
                batch: header_data_trailer(b"x"),
            },
        );
        assert_eq!(done.result.unwrap_err().raw_os_error(), Some(libc::EPIPE));
        let Returned::Batch(mut batch) = done.returned else {
            panic!("batch not returned")
        };
        assert_eq!(batch.total_len(), 17);
        assert_eq!(batch.take_bufs().count(), 2);
    }

    #[test]
    fn fsync_and_punch_hole() {
        let mut ring = Ring::new(4).unwrap();
        let path = TempPath::new();
        let mut file = path.open(0).unwrap();
        file.write_all(&[0xAB; 8192]).unwrap();
        let fd = file.as_raw_fd();
        assert_eq!(
            run(
                &mut ring,
                Op::Fsync {
                    fd,
                    datasync: false
                }
            )
            .result
            .unwrap(),
            0
        );
        assert_eq!(
            run(&mut ring, Op::Fsync { fd, datasync: true })
                .result
                .unwrap(),
            0
        );

        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        match run(
            &mut ring,
            Op::Fallocate {
                fd,
                mode,
                offset: 0,
                len: 4096,
            },
        )
        .result
        {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                eprintln!(
                    "punch hole unsupported on {:?}; skipped",
                    std::env::temp_dir()
                );
                return;
            }
            other => assert_eq!(other.unwrap(), 0),
        }
        let read = Op::Read {
            fd,
            buf: IoBuf::new(8192).unwrap(),
            buf_offset: 0,
            len: 8192,
            file_offset: 0,
        };
        let done = run(&mut ring, read);
        assert_eq!(done.result.unwrap(), 8192);
        let buf = returned_buf(done.returned);
        assert!(buf.as_slice()[..4096].iter().all(|&b| b == 0));
        assert!(buf.as_slice()[4096..].iter().all(|&b| b == 0xAB));
        assert_eq!(file.metadata().unwrap().len(), 8192);
    }

    #[test]
    fn eventfd_write_wakes_ring() {
        let mut ring = Ring::new(4).unwrap();
        let efd = crate::eventfd().unwrap();
        ring.push(
            Op::ReadEventfd {
                fd: efd.as_raw_fd(),
            },
            3,
        )
        .unwrap();
        ring.submit_and_wait(0).unwrap();
        let mut waker = efd.try_clone().unwrap();
        let wake = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            waker.write_all(&1u64.to_ne_bytes()).unwrap();
        });
        ring.submit_and_wait(1).unwrap();
        let done = ring.pop().unwrap();
        assert_eq!((done.user_data, done.result.unwrap()), (3, 8));
        wake.join().unwrap();
    }

    #[test]
    fn timeout_completes_after_duration() {
        let mut ring = Ring::new(4).unwrap();
        let start = Instant::now();
        let done = run(
            &mut ring,
            Op::Timeout {
                after: Duration::from_millis(15),
            },
        );
        assert!(start.elapsed() >= Duration::from_millis(15));
        assert_eq!(done.result.unwrap_err().raw_os_error(), Some(libc::ETIME));
        assert!(matches!(done.returned, Returned::Nothing));
    }

    #[test]
    fn more_ops_than_entries_fill_and_flush_the_queue() {
        const OPS: usize = 100;
        let mut ring = Ring::new(4).unwrap();
        let file = crate::memfd_create("many").unwrap();
        let fd = file.as_raw_fd();
        for round in 0..2 {
            for i in 0..OPS {
                let mut buf = IoBuf::new(4096).unwrap();
                buf.as_mut_slice().fill(i as u8 ^ round);
                let file_offset = (i * 4096) as u64;
                let write = Op::Write {
                    fd,
                    buf,
                    buf_offset: 0,
                    len: 4096,
                    file_offset,
                    dsync: false,
                };
                ring.push(write, i as u64).unwrap();
            }
            assert_eq!(ring.in_flight(), OPS);
            let mut seen = [false; OPS];
            while ring.in_flight() > 0 {
                ring.submit_and_wait(ring.in_flight()).unwrap();
                while let Some(done) = ring.pop() {
                    assert_eq!(done.result.unwrap(), 4096);
                    let buf = returned_buf(done.returned);
                    assert!(buf
                        .as_slice()
                        .iter()
                        .all(|&b| b == done.user_data as u8 ^ round));
                    seen[done.user_data as usize] = true;
                }
            }
            assert!(seen.iter().all(|&s| s));
            // The slab grew once to the peak and is reused, not grown, in the second round.
            assert_eq!(ring.slots.len(), OPS);
        }
    }

    #[test]
    fn dropping_ring_with_ops_in_flight_is_sound() {
        let (left, right) = UnixStream::pair().unwrap();
        let mut ring = Ring::new(4).unwrap();
        let recv = Op::Recv {
            fd: right.as_raw_fd(),
            buf: IoBuf::new(4096).unwrap(),
            offset: 0,
            len: 4096,
        };
        ring.push(recv, 1).unwrap();
        ring.push(
            Op::Timeout {
                after: Duration::from_secs(60),
            },
            2,
        )
        .unwrap();
        ring.submit_and_wait(0).unwrap();
        assert_eq!(ring.in_flight(), 2);
        drop(ring);
        drop((left, right));
    }

    #[test]
    fn wait_is_capped_at_in_flight() {
        let mut ring = Ring::new(4).unwrap();
        ring.submit_and_wait(5).unwrap();
        assert!(ring.pop().is_none());
    }

    #[test]
    fn ring_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Ring>();
        assert_send::<Op>();
        assert_send::<Completion>();
    }
}
