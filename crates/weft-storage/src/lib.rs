//! Block devices that namespaces are served from: RAM (an anonymous memory
//! file) and files or raw block devices (O_DIRECT where the filesystem allows
//! it). A device is opened and sized here; its I/O goes through the data
//! plane's io_uring by file descriptor, so this crate does no I/O per request.
//!
//! What the data plane may rely on: offsets and lengths it submits are
//! multiples of `block_size()`, and buffers are 4 KiB aligned, which satisfies
//! O_DIRECT; `WriteZeroes` and deallocation use `fallocate(PUNCH_HOLE |
//! KEEP_SIZE)`, after which the range reads back as zeroes on every backend,
//! and where a device refuses that (EOPNOTSUPP) the data plane writes zeroes.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use thiserror::Error;

#[cfg(feature = "fault-injection")]
pub mod faults;

/// `fallocate` mode that zeroes (and frees, where the backend can) a range without changing the size.
pub const ZERO_RANGE_MODE: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;

/// A device a namespace can be served from.
pub trait BlockDevice: Send + Sync + fmt::Debug {
    /// What it is, for logs and the startup banner (e.g. "file ./weft-data/default.img").
    fn describe(&self) -> String;
    /// Capacity in bytes (a multiple of `block_size()`).
    fn size_bytes(&self) -> u64;
    /// Logical block size in bytes.
    fn block_size(&self) -> u32;
    /// Descriptor to submit I/O on; valid as long as the device lives.
    fn fd(&self) -> RawFd;
    /// Whether the page cache is bypassed (O_DIRECT).
    fn is_direct(&self) -> bool;
    /// Whether unwritten and deallocated ranges cost no space (sparse file, RAM).
    fn is_thin(&self) -> bool;
    /// Whether I/O is a memory copy that the reactor should do inline rather
    /// than through io_uring (which would hand it to a worker thread: shmem
    /// files do not support non-blocking reads on older kernels).
    fn is_memory(&self) -> bool {
        false
    }
    /// Inline read of a memory device (see [`BlockDevice::is_memory`]).
    fn read_inline(&self, _buf: &mut [u8], _offset: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Inline write of a memory device.
    fn write_inline(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Inline zeroing (hole punching) of a memory device.
    fn zero_inline(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Whether `fallocate(PUNCH_HOLE)` may work here; false once the device
    /// refused it (then zeroing writes zeroes).
    fn can_punch_holes(&self) -> bool {
        true
    }
    /// Notes that the device refused to punch holes (EOPNOTSUPP).
    fn cannot_punch_holes(&self) {}
    /// The error an op should fail with instead of running (tests only).
    #[cfg(feature = "fault-injection")]
    fn injected_fault(&self, _op: faults::DeviceOp) -> Option<io::Error> {
        None
    }
}

/// Why a device could not be opened.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// The OS refused.
    #[error("{path}: {source}")]
    Io {
        /// The device path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An existing file's size differs from the configured one.
    #[error("{path} is {actual} bytes but the configuration says {configured}; set size to match or move the file away")]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// Its size.
        actual: u64,
        /// The configured size.
        configured: u64,
    },
    /// Sizes and block sizes that cannot be served.
    #[error("{0}")]
    Invalid(String),
}

/// A RAM device: an anonymous memory file, sparse until written. Its content
/// is lost when weft exits.
#[derive(Debug)]
pub struct RamDevice {
    file: File,
    size_bytes: u64,
    block_size: u32,
}

impl RamDevice {
    /// A zeroed RAM device of `size_bytes`.
    pub fn new(size_bytes: u64, block_size: u32) -> Result<RamDevice, DeviceError> {
        check_geometry(size_bytes, block_size)?;
        let io_error = |source| DeviceError::Io {
            path: PathBuf::from("(ram)"),
            source,
        };
        let file = weft_uring::memfd_create("weft-ram").map_err(io_error)?;
        file.set_len(size_bytes).map_err(io_error)?;
        Ok(RamDevice {
            file,
            size_bytes,
            block_size,
        })
    }
}

impl BlockDevice for RamDevice {
    fn describe(&self) -> String {
        format!("ram {}", human_bytes(self.size_bytes))
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
    fn is_direct(&self) -> bool {
        false
    }
    fn is_thin(&self) -> bool {
        true
    }
    fn is_memory(&self) -> bool {
        true
    }
    fn read_inline(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_inline(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn zero_inline(&self, offset: u64, len: u64) -> io::Result<()> {
        weft_uring::fallocate(self.file.as_raw_fd(), ZERO_RANGE_MODE, offset, len)
    }
}

/// A regular file (created sparse if missing) or a raw block device.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size_bytes: u64,
    block_size: u32,
    direct: bool,
    block_device: bool,
    /// Set when `fallocate(PUNCH_HOLE)` was refused (a block device without
    /// Write Zeroes, a filesystem that cannot punch holes).
    punch_refused: AtomicBool,
}

impl FileDevice {
    /// Opens `path`. A regular file that does not exist is created sparse with
    /// `size_bytes`; an existing one must have that size. A block device uses
    /// its own size (`size_bytes`, if given, must not exceed it) and its
    /// logical block size if that is larger than `block_size`.
    pub fn open(
        path: &Path,
        size_bytes: Option<u64>,
        block_size: u32,
    ) -> Result<FileDevice, DeviceError> {
        let io_error = |source| DeviceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let block_device = std::fs::metadata(path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        if !block_device && !path.exists() {
            let size = size_bytes.ok_or_else(|| {
                DeviceError::Invalid(format!(
                    "{} does not exist and no size is configured to create it",
                    path.display()
                ))
            })?;
            check_geometry(size, block_size)?;
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io_error)?;
            }
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(io_error)?;
            file.set_len(size).map_err(io_error)?;
        }
        let (file, direct) = open_preferring_direct(path).map_err(io_error)?;
        let (actual, block_size) = if block_device {
            let actual = weft_uring::block_device_size_bytes(&file).map_err(io_error)?;
            let device_block =
                weft_uring::block_device_logical_block_size(&file).map_err(io_error)?;
            (actual, block_size.max(device_block))
        } else {
            (file.metadata().map_err(io_error)?.len(), block_size)
        };
        let size = match size_bytes {
            Some(configured) if block_device && configured > actual => {
                return Err(DeviceError::SizeMismatch {
                    path: path.to_path_buf(),
                    actual,
                    configured,
                })
            }
            Some(configured) if !block_device && configured != actual => {
                return Err(DeviceError::SizeMismatch {
                    path: path.to_path_buf(),
                    actual,
                    configured,
                })
            }
            Some(configured) => configured,
            None => actual,
        };
        check_geometry(size, block_size)?;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            size_bytes: size,
            block_size,
            direct,
            block_device,
            punch_refused: AtomicBool::new(false),
        })
    }
}

impl FileDevice {
    /// The open file, for synchronous positioned I/O off the data path
    /// (buffers and offsets must then meet O_DIRECT's alignment).
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// Opens read-write with O_DIRECT, falling back to buffered I/O (with one
/// warning) where the filesystem refuses O_DIRECT, e.g. tmpfs on older kernels.
fn open_preferring_direct(path: &Path) -> io::Result<(File, bool)> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => Ok((file, true)),
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
            log::warn!("{}: O_DIRECT is not supported here; serving through the page cache (Flush and FUA still reach stable storage)", path.display());
            Ok((OpenOptions::new().read(true).write(true).open(path)?, false))
        }
        Err(error) => Err(error),
    }
}

impl BlockDevice for FileDevice {
    fn describe(&self) -> String {
        let kind = if self.block_device {
            "block device"
        } else {
            "file"
        };
        let mode = if self.direct { "O_DIRECT" } else { "buffered" };
        format!(
            "{kind} {} ({}, {mode})",
            self.path.display(),
            human_bytes(self.size_bytes)
        )
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
    fn is_direct(&self) -> bool {
        self.direct
    }
    fn is_thin(&self) -> bool {
        !self.block_device
    }
    fn can_punch_holes(&self) -> bool {
        !self.punch_refused.load(Ordering::Relaxed)
    }
    fn cannot_punch_holes(&self) {
        self.punch_refused.store(true, Ordering::Relaxed);
    }
}

fn check_geometry(size_bytes: u64, block_size: u32) -> Result<(), DeviceError> {
    if !matches!(block_size, 512 | 4096) {
        return Err(DeviceError::Invalid(format!(
            "block size {block_size} is not supported: use 512 or 4096"
        )));
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(u64::from(block_size)) {
        return Err(DeviceError::Invalid(format!(
            "size {size_bytes} is not a positive multiple of the block size {block_size}"
        )));
    }
    Ok(())
}

/// Formats a byte count with binary units, e.g. "4 GiB" or "1.5 MiB".
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-storage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn file_is_created_sparse_and_reopened_with_its_size() {
        let dir = temp_dir("create");
        let path = dir.join("sub/disk.img");
        let device = FileDevice::open(&path, Some(1 << 30), 4096).unwrap();
        assert_eq!(device.size_bytes(), 1 << 30);
        assert!(std::fs::metadata(&path).unwrap().len() == 1 << 30);
        drop(device);
        assert_eq!(
            FileDevice::open(&path, None, 4096).unwrap().size_bytes(),
            1 << 30
        );
        let error = FileDevice::open(&path, Some(1 << 20), 4096).unwrap_err();
        assert!(error.to_string().contains("set size to match"), "{error}");
    }

    /// A raw block device (a loop device over a file): size and logical block
    /// size come from the device. Skipped where loop devices cannot be made.
    #[test]
    fn block_device_geometry_comes_from_the_device() {
        let dir = temp_dir("loop");
        let backing = dir.join("backing.img");
        File::create(&backing).unwrap().set_len(8 << 20).unwrap();
        let attach = std::process::Command::new("losetup")
            .args(["--find", "--show", "--sector-size", "4096"])
            .arg(&backing)
            .output();
        let device = match attach {
            Ok(output) if output.status.success() => {
                PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
            }
            _ => {
                eprintln!("skipped: cannot attach a loop device here");
                return;
            }
        };
        let opened = FileDevice::open(&device, None, 512);
        let too_big = FileDevice::open(&device, Some(16 << 20), 512);
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&device)
            .status();
        let opened = opened.unwrap();
        assert_eq!(opened.size_bytes(), 8 << 20);
        assert_eq!(
            opened.block_size(),
            4096,
            "the device's logical block size wins over a smaller one"
        );
        assert!(!opened.is_thin());
        assert!(opened.describe().starts_with("block device"));
        assert!(too_big
            .unwrap_err()
            .to_string()
            .contains("set size to match"));
    }

    #[test]
    fn geometry_is_checked() {
        assert!(RamDevice::new(1000, 512).is_err());
        assert!(RamDevice::new(4096, 1024).is_err());
        let ram = RamDevice::new(1 << 20, 512).unwrap();
        assert_eq!(ram.describe(), "ram 1 MiB");
        assert!(FileDevice::open(Path::new("/nonexistent-weft/x.img"), None, 4096).is_err());
    }

    #[test]
    fn ram_device_does_inline_io() {
        let ram = RamDevice::new(1 << 20, 4096).unwrap();
        ram.write_inline(&[7u8; 4096], 8192).unwrap();
        let mut back = [0u8; 4096];
        ram.read_inline(&mut back, 8192).unwrap();
        assert_eq!(back, [7u8; 4096]);
        ram.zero_inline(8192, 4096).unwrap();
        ram.read_inline(&mut back, 8192).unwrap();
        assert_eq!(back, [0u8; 4096]);
    }

    #[test]
    fn human_bytes_formats() {
        assert_eq!(human_bytes(4 << 30), "4 GiB");
        assert_eq!(human_bytes(1536 * 1024), "1.5 MiB");
        assert_eq!(human_bytes(100), "100 B");
    }
}
