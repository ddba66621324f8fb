//! Small libc helpers for the storage and reactor layers, kept here so that weft-uring is the
//! only crate with `unsafe`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `_IOR(0x12, 114, size_t)`; libc does not export it. The read direction bit differs per arch.
#[cfg(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
const BLKGETSIZE64: u64 = 0x4000_0000 | (8 << 16) | (0x12 << 8) | 114;
#[cfg(not(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
const BLKGETSIZE64: u64 = 0x8000_0000 | (8 << 16) | (0x12 << 8) | 114;

/// Turns a `-1`-on-error libc return value into a `File` owning the new descriptor.
fn file_from_new_fd(fd: libc::c_int) -> io::Result<File> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by a successful syscall, so it is open and owned by no
    // one else; ownership passes to the File.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Creates an anonymous in-memory file (`MFD_CLOEXEC`); `name` is only a debugging label.
pub fn memfd_create(name: &str) -> io::Result<File> {
    let name = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    file_from_new_fd(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })
}

/// Size in bytes of the block device open as `file` (`ioctl BLKGETSIZE64`).
pub fn block_device_size_bytes(file: &File) -> io::Result<u64> {
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes exactly one u64 through the pointer, which points to a live
    // local; the fd is valid for the duration of the borrow of `file`.
    check(unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut bytes as *mut u64) })?;
    Ok(bytes)
}

/// Logical block size of the block device open as `file` (`ioctl BLKSSZGET`).
pub fn block_device_logical_block_size(file: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes exactly one int through the pointer, which points to a live
    // local; the fd is valid for the duration of the borrow of `file`.
    check(unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::BLKSSZGET,
            &mut size as *mut libc::c_int,
        )
    })?;
    u32::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "negative block size"))
}

/// A blocking eventfd with counter 0 (`EFD_CLOEXEC`). Wake a reactor by writing 8 bytes
/// (`u64::to_ne_bytes`) with `std::io::Write`; the reactor reads it via `Op::ReadEventfd`.
pub fn eventfd() -> io::Result<File> {
    // SAFETY: plain syscall wrapper with no pointer arguments.
    file_from_new_fd(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) })
}

/// Restricts the calling thread to CPU `cpu` (`sched_setaffinity`).
pub fn pin_current_thread_to_cpu(cpu: usize) -> io::Result<()> {
    // CPU_SET would index out of the set's bit array for larger values.
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE was checked, so the bit lies within `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a live, initialised cpu_set_t of `size` bytes; pid 0 means this thread.
    check(unsafe { libc::sched_setaffinity(0, size, &set) })
}

/// The CPUs the calling thread may run on (`sched_getaffinity`), in order,
/// never empty: what `taskset` or a cpuset left this process.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set (zeroed
    // first: a C library may leave the bytes past the kernel's mask as they were).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a live cpu_set_t of `size` bytes the kernel fills; pid 0 means this thread.
    check(unsafe { libc::sched_getaffinity(0, size, &mut set) })?;
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: every index is below CPU_SETSIZE, within `set`.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect();
    if cpus.is_empty() {
        return Err(io::Error::other("the affinity mask allows no CPU"));
    }
    Ok(cpus)
}

/// Blocks SIGINT and SIGTERM in the calling thread, and so in every thread it
/// spawns afterwards: call it first in `main`, then collect the signal with
/// [`wait_for_termination_signal`].
pub fn block_termination_signals() -> io::Result<()> {
    let set = termination_signal_set();
    // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits until SIGINT or SIGTERM arrives (they must be blocked, see
/// [`block_termination_signals`]) and returns its number.
pub fn wait_for_termination_signal() -> io::Result<i32> {
    let set = termination_signal_set();
    let mut signal = 0;
    // SAFETY: both pointers refer to live, initialised locals.
    let rc = unsafe { libc::sigwait(&set, &mut signal) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(signal)
}

fn termination_signal_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use and
    // sigaddset only sets bits of valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// `fdatasync(2)` on a descriptor the caller keeps open.
pub fn fdatasync(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: fdatasync only reads the descriptor number; an invalid one yields EBADF.
    if unsafe { libc::fdatasync(fd) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fallocate(2)` on a descriptor the caller keeps open (for work too small to queue).
pub fn fallocate(fd: std::os::fd::RawFd, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    let (offset, len) = (to_off_t(offset)?, to_off_t(len)?);
    // SAFETY: fallocate only reads its integer arguments; an invalid descriptor yields EBADF.
    if unsafe { libc::fallocate(fd, mode, offset, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn to_off_t(value: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(value).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn memfd_is_a_usable_file() {
        let mut file = memfd_create("weft-test").unwrap();
        file.write_all(b"hello").unwrap();
        file.rewind().unwrap();
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello");
        assert!(memfd_create("bad\0name").is_err());
    }

    #[test]
    fn a_thread_pinned_to_an_allowed_cpu_is_allowed_that_one_only() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        assert!(allowed.windows(2).all(|w| w[0] < w[1]), "{allowed:?}");
        let last = *allowed.last().unwrap();
        let pinned = std::thread::spawn(move || {
            pin_current_thread_to_cpu(last).unwrap();
            assert!(pin_current_thread_to_cpu(usize::MAX).is_err());
            allowed_cpus().unwrap()
        });
        assert_eq!(pinned.join().unwrap(), vec![last]);
    }

    #[test]
    fn eventfd_counts_writes() {
        let mut efd = eventfd().unwrap();
        efd.write_all(&2u64.to_ne_bytes()).unwrap();
        efd.write_all(&3u64.to_ne_bytes()).unwrap();
        let mut counter = [0u8; 8];
        efd.read_exact(&mut counter).unwrap();
        assert_eq!(u64::from_ne_bytes(counter), 5);
    }

    #[test]
    fn block_ioctls_reject_regular_files() {
        let file = memfd_create("not-a-block-device").unwrap();
        assert!(block_device_size_bytes(&file).is_err());
        assert!(block_device_logical_block_size(&file).is_err());
    }
}
