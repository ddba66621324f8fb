//! fio's external I/O engine interface, over weft's user-space initiator
//! ([`weft_initiator::Job`]): `crates/weft-fio` builds it into
//! `libweft_fio.so`, which fio loads with `ioengine=external:PATH` and
//! drives with `filename=nvme-tcp\://HOST\:PORT/NQN` (fio splits file names
//! at unescaped colons).
//!
//! Only this translation is here (fio hands the engine raw pointers to its
//! own structures, so reading them is `unsafe`, and weft keeps `unsafe` in
//! this crate); what an I/O does is the initiator's.
//!
//! The layouts are fio 3.33's on x86-64 (`FIO_IOOPS_VERSION` 31, what
//! Debian 12 ships; fio refuses an engine of another version): `struct
//! ioengine_ops` (ioengines.h), and the few fields of `struct io_u` (io_u.h)
//! and `struct fio_file` (file.h) the engine reads or writes, by byte offset,
//! checked with `offsetof` against fio 3.33's headers. Nothing here reads
//! `struct thread_data` (its layout depends on fio's build options): an
//! engine's state is keyed by the thread_data's address instead, in a
//! thread-local map (fio calls an engine for one job from one thread; offload
//! submission, which would not, is refused with `FIO_NO_OFFLOAD`).
//!
//! One file per job (several jobs share nothing: `numjobs` scales); the
//! engine needs no options of its own. The connection is made at the file's
//! first open and kept until the job ends: fio closes and reopens files
//! between phases (before verifying, at each loop), and a reconnect there
//! could fail where fio would not report it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use weft_initiator::{probe_capacity_bytes, Job, JobError, JobIo, Outcome, Submitted};

/// fio's engine interface version this layout is (ioengines.h).
const FIO_IOOPS_VERSION: c_int = 31;

/// `enum fio_ioengine_flags`: no local disk (no file creation, no
/// invalidation, no disk statistics), no extending, aligned buffers, no
/// offloaded submission.
const ENGINE_FLAGS: c_int = (1 << 2) | (1 << 3) | (1 << 4) | (1 << 9) | (1 << 15);

/// `enum fio_q_status`.
const FIO_Q_COMPLETED: c_int = 0;
const FIO_Q_QUEUED: c_int = 1;
const FIO_Q_BUSY: c_int = 2;

/// `enum fio_ddir`.
const DDIR_READ: c_int = 0;
const DDIR_WRITE: c_int = 1;
const DDIR_TRIM: c_int = 2;
const DDIR_SYNC: c_int = 3;
const DDIR_DATASYNC: c_int = 4;

/// Byte offsets in fio 3.33's `struct io_u`.
mod io_u {
    pub(super) const DDIR: usize = 44;
    pub(super) const OFFSET: usize = 72;
    pub(super) const XFER_BUF: usize = 104;
    pub(super) const XFER_BUFLEN: usize = 112;
    pub(super) const RESID: usize = 136;
    pub(super) const ERROR: usize = 144;
}

/// Byte offsets in fio 3.33's `struct fio_file`.
mod fio_file {
    pub(super) const FILE_NAME: usize = 40;
    pub(super) const REAL_FILE_SIZE: usize = 48;
}

type Td = *mut c_void;
type IoU = *mut u8;
type FioFile = *mut u8;

/// fio 3.33's `struct ioengine_ops`; the hooks weft does not need stay null.
#[repr(C)]
pub struct IoengineOps {
    list: [*mut c_void; 2],
    name: *const c_char,
    version: c_int,
    flags: c_int,
    dlhandle: *mut c_void,
    setup: Option<unsafe extern "C" fn(Td) -> c_int>,
    init: Option<unsafe extern "C" fn(Td) -> c_int>,
    post_init: Option<unsafe extern "C" fn(Td) -> c_int>,
    prep: Option<unsafe extern "C" fn(Td, IoU) -> c_int>,
    queue: Option<unsafe extern "C" fn(Td, IoU) -> c_int>,
    commit: Option<unsafe extern "C" fn(Td) -> c_int>,
    getevents: Option<unsafe extern "C" fn(Td, c_uint, c_uint, *const c_void) -> c_int>,
    event: Option<unsafe extern "C" fn(Td, c_int) -> IoU>,
    errdetails: Option<unsafe extern "C" fn(IoU) -> *mut c_char>,
    cancel: Option<unsafe extern "C" fn(Td, IoU) -> c_int>,
    cleanup: Option<unsafe extern "C" fn(Td)>,
    open_file: Option<unsafe extern "C" fn(Td, FioFile) -> c_int>,
    close_file: Option<unsafe extern "C" fn(Td, FioFile) -> c_int>,
    invalidate: *const c_void,
    unlink_file: Option<unsafe extern "C" fn(Td, FioFile) -> c_int>,
    get_file_size: Option<unsafe extern "C" fn(Td, FioFile) -> c_int>,
    /// prepopulate_file, terminate, iomem_alloc, iomem_free, io_u_init,
    /// io_u_free, get_zoned_model, report_zones, reset_wp, get_max_open_zones.
    unused_hooks: [*const c_void; 10],
    option_struct_size: c_int,
    options: *mut c_void,
}

/// The engine's entry point: fio looks it up after `dlopen` and calls it
/// once per job for the operations table (which it then writes its handle into).
///
/// # Safety
/// `ops` must be valid for one pointer write (fio passes its local's address).
#[no_mangle]
pub unsafe extern "C" fn get_ioengine(ops: *mut *mut IoengineOps) {
    let table = Box::new(IoengineOps {
        list: [std::ptr::null_mut(); 2],
        name: c"weft".as_ptr(),
        version: FIO_IOOPS_VERSION,
        flags: ENGINE_FLAGS,
        dlhandle: std::ptr::null_mut(),
        setup: None,
        init: Some(init),
        post_init: None,
        prep: None,
        queue: Some(queue),
        commit: Some(commit),
        getevents: Some(getevents),
        event: Some(event),
        errdetails: None,
        cancel: None,
        cleanup: Some(cleanup),
        open_file: Some(open_file),
        close_file: Some(close_file),
        invalidate: std::ptr::null(),
        unlink_file: Some(unlink_file),
        get_file_size: Some(get_file_size),
        unused_hooks: [std::ptr::null(); 10],
        option_struct_size: 0,
        options: std::ptr::null_mut(),
    });
    // SAFETY: fio passes a valid `struct ioengine_ops **`; the table is
    // leaked on purpose (fio keeps using it until it exits; one per job).
    unsafe { ops.write(Box::into_raw(table)) };
}

/// One job's state.
#[derive(Default)]
struct Engine {
    /// The connection, with the target it was opened for.
    job: Option<(String, Job)>,
    /// The io_us the last `getevents` completed, for `event`.
    reaped: Vec<usize>,
}

thread_local! {
    /// By `struct thread_data` address.
    static ENGINES: RefCell<HashMap<usize, Engine>> = RefCell::new(HashMap::new());
}

fn with_engine<R>(td: Td, f: impl FnOnce(&mut Engine) -> R) -> R {
    ENGINES.with(|engines| f(engines.borrow_mut().entry(td as usize).or_default()))
}

/// Reads a `T` at `offset` in fio's structure `base`.
///
/// # Safety
/// `base` must point to a live structure of fio 3.33's layout with a `T` at `offset`.
unsafe fn field<T: Copy>(base: *const u8, offset: usize) -> T {
    // SAFETY: the caller's contract; the offsets above are fio's, aligned for T.
    unsafe { base.add(offset).cast::<T>().read() }
}

/// Writes a `T` at `offset` in fio's structure `base`.
///
/// # Safety
/// As [`field`], and fio must not be reading the structure meanwhile.
unsafe fn set_field<T: Copy>(base: *mut u8, offset: usize, value: T) {
    // SAFETY: the caller's contract.
    unsafe { base.add(offset).cast::<T>().write(value) }
}

/// The name of fio's file `f` (the target), if it is UTF-8.
///
/// # Safety
/// `f` must be a live `struct fio_file`.
unsafe fn file_name(f: FioFile) -> Option<String> {
    // SAFETY: `f` is live (the caller's contract); file_name is a C string fio owns.
    let name: *const c_char = unsafe { field(f, fio_file::FILE_NAME) };
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated (fio strdup()s it), alive as long as the file.
    let name = unsafe { CStr::from_ptr(name) };
    name.to_str().ok().map(str::to_string)
}

/// Finishes `io_u` with `errno` now, saying why (fio reports the errno).
///
/// # Safety
/// `io_u` must be a live io_u fio handed to `queue`.
unsafe fn fail_now(io_u: IoU, errno: c_int, why: &dyn std::fmt::Display) -> c_int {
    eprintln!("weft: {why}");
    // SAFETY: the caller's contract; fio reads the error after `queue` returns.
    unsafe { set_field::<c_uint>(io_u, io_u::ERROR, errno as c_uint) };
    FIO_Q_COMPLETED
}

fn errno_of(error: &JobError) -> c_int {
    match error {
        JobError::Misaligned { .. } | JobError::TooLarge { .. } | JobError::Nsid(_) => libc::EINVAL,
        _ => libc::EIO,
    }
}

unsafe extern "C" fn init(td: Td) -> c_int {
    with_engine(td, |_| 0)
}

/// # Safety
/// fio's contract: `io_u` is live and not in flight; its buffer holds `xfer_buflen` bytes.
unsafe extern "C" fn queue(td: Td, io_u: IoU) -> c_int {
    // SAFETY: fio's contract (above) for every field read here.
    let (ddir, offset, buf, len) = unsafe {
        (
            field::<c_int>(io_u, io_u::DDIR),
            field::<u64>(io_u, io_u::OFFSET),
            field::<*mut u8>(io_u, io_u::XFER_BUF),
            field::<u64>(io_u, io_u::XFER_BUFLEN),
        )
    };
    let io = match ddir {
        DDIR_READ => JobIo::Read {
            offset,
            len: u32::try_from(len).unwrap_or(u32::MAX),
        },
        DDIR_WRITE if buf.is_null() || len == 0 => JobIo::Write { offset, data: &[] },
        // SAFETY: fio's buffer (not null) holds `len` bytes while the io_u is
        // queued; the initiator copies them before `submit` returns.
        DDIR_WRITE => JobIo::Write {
            offset,
            data: unsafe { std::slice::from_raw_parts(buf, len as usize) },
        },
        DDIR_TRIM => JobIo::Trim { offset, len },
        DDIR_SYNC | DDIR_DATASYNC => JobIo::Flush,
        // SAFETY: fio's contract.
        _ => {
            return unsafe {
                fail_now(
                    io_u,
                    libc::EINVAL,
                    &format!("fio I/O kind {ddir} is not supported"),
                )
            }
        }
    };
    let submitted = with_engine(td, |engine| {
        engine
            .job
            .as_mut()
            .map(|(_, job)| job.submit(io_u as u64, io))
    });
    match submitted {
        Some(Ok(Submitted::Queued)) => FIO_Q_QUEUED,
        Some(Ok(Submitted::Busy)) => FIO_Q_BUSY,
        // SAFETY: fio's contract.
        Some(Err(error)) => unsafe { fail_now(io_u, errno_of(&error), &error) },
        // SAFETY: fio's contract.
        None => unsafe { fail_now(io_u, libc::EIO, &"an I/O before its target was opened") },
    }
}

unsafe extern "C" fn commit(td: Td) -> c_int {
    let sent = with_engine(td, |engine| {
        engine.job.as_mut().map(|(_, job)| job.transmit())
    });
    match sent {
        Some(Err(error)) => {
            eprintln!("weft: {error}");
            -libc::EIO
        }
        _ => 0,
    }
}

/// # Safety
/// fio's contract: the io_us in flight are live, their buffers as queued.
unsafe extern "C" fn getevents(td: Td, min: c_uint, max: c_uint, _wait: *const c_void) -> c_int {
    with_engine(td, |engine| {
        let Engine { job, reaped } = engine;
        reaped.clear();
        let Some((_, job)) = job.as_mut() else {
            return 0;
        };
        let mut lost = false;
        let count = job.reap(min as usize, max as usize, |token, outcome| {
            let io_u = token as IoU;
            // SAFETY: `token` is an io_u fio queued and has not had back;
            // a read asked for exactly its `xfer_buflen` bytes.
            unsafe {
                let errno = match outcome {
                    Outcome::Done(data) => {
                        if !data.is_empty() {
                            let buf = field::<*mut u8>(io_u, io_u::XFER_BUF);
                            std::ptr::copy_nonoverlapping(data.as_ptr(), buf, data.len());
                        }
                        0
                    }
                    Outcome::Failed(status) => {
                        eprintln!("weft: the target failed an I/O: {status}");
                        libc::EIO
                    }
                    Outcome::Lost => {
                        lost = true;
                        libc::EIO
                    }
                };
                set_field::<c_uint>(io_u, io_u::ERROR, errno as c_uint);
                set_field::<u64>(io_u, io_u::RESID, 0);
            }
            reaped.push(token as usize);
        });
        if lost {
            if let Err(error) = job.transmit() {
                eprintln!("weft: {error}");
            }
        }
        count as c_int
    })
}

unsafe extern "C" fn event(td: Td, index: c_int) -> IoU {
    with_engine(td, |engine| {
        usize::try_from(index)
            .ok()
            .and_then(|index| engine.reaped.get(index))
            .map_or(std::ptr::null_mut(), |&io_u| io_u as IoU)
    })
}

unsafe extern "C" fn cleanup(td: Td) {
    ENGINES.with(|engines| engines.borrow_mut().remove(&(td as usize)));
}

/// # Safety
/// fio's contract: `f` is a live file of the job.
unsafe extern "C" fn open_file(td: Td, f: FioFile) -> c_int {
    // SAFETY: fio's contract.
    let Some(name) = (unsafe { file_name(f) }) else {
        eprintln!("weft: the file name is not UTF-8");
        return 1;
    };
    with_engine(td, |engine| match &engine.job {
        Some((open, _)) if *open == name => 0,
        Some((open, _)) => {
            eprintln!("weft: one target per job ({open}, then {name}); use one job per target");
            1
        }
        None => match Job::open(&name) {
            Ok(job) => {
                engine.job = Some((name, job));
                0
            }
            Err(error) => {
                eprintln!("weft: {error}");
                1
            }
        },
    })
}

/// The connection stays (see the module's documentation); `cleanup` ends it.
unsafe extern "C" fn close_file(_td: Td, _f: FioFile) -> c_int {
    0
}

/// A target is not a file: `unlink=1` leaves it be.
unsafe extern "C" fn unlink_file(_td: Td, _f: FioFile) -> c_int {
    0
}

/// # Safety
/// fio's contract: `f` is a live file of the job.
unsafe extern "C" fn get_file_size(_td: Td, f: FioFile) -> c_int {
    // SAFETY: fio's contract.
    let Some(name) = (unsafe { file_name(f) }) else {
        eprintln!("weft: the file name is not UTF-8");
        return 1;
    };
    match probe_capacity_bytes(&name) {
        Ok(bytes) => {
            // SAFETY: fio's contract; it reads the size after this returns.
            unsafe { set_field::<u64>(f, fio_file::REAL_FILE_SIZE, bytes) };
            0
        }
        Err(error) => {
            eprintln!("weft: {error}");
            1
        }
    }
}
