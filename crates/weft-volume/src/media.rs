//! The devices a pool lives on, as the volume manager sees them: positioned
//! reads and writes, zeroing and sync per member. `FileMedia` is the real
//! thing (files or block devices, O_DIRECT where possible); tests use the
//! fault-injecting in-memory media in `testing`.
//!
//! The manager's I/O (metadata, copy-on-write, zeroing) is synchronous on its
//! own thread; the data plane does the volumes' I/O through io_uring on the
//! descriptors `FileMedia` exposes.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::PathBuf;
use weft_storage::{BlockDevice, DeviceError, FileDevice};
use weft_uring::IoBuf;

/// Storage members of a pool.
pub trait Media {
    /// Number of members.
    fn members(&self) -> usize;
    /// Size of member `member` in bytes.
    fn size_bytes(&self, member: usize) -> u64;
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&mut self, member: usize, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf` at `offset` (not durable until `sync`).
    fn write_at(&mut self, member: usize, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes `len` bytes at `offset` read back as zeroes (not durable until `sync`).
    fn zero(&mut self, member: usize, offset: u64, len: u64) -> io::Result<()>;
    /// Makes every completed write of the member durable.
    fn sync(&mut self, member: usize) -> io::Result<()>;
    /// What names a device to add: a path for files and block devices, a
    /// size for memory.
    type Device;
    /// Opens `device` as the new last member (writes nothing to it). Refuses
    /// (`AlreadyExists`) a device that is already a member of this media.
    fn add_member(&mut self, device: Self::Device) -> io::Result<()>;
    /// Closes the last member again (an addition that did not happen).
    fn remove_last_member(&mut self);
}

/// A device to add to [`FileMedia`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePath {
    /// A file or block device.
    pub path: PathBuf,
    /// Creates a missing regular file sparse with this size.
    pub create_bytes: Option<u64>,
}

/// Files or block devices.
#[derive(Debug)]
pub struct FileMedia {
    devices: Vec<FileDevice>,
    paths: Vec<PathBuf>,
    /// Aligned bounce buffer: O_DIRECT needs aligned memory.
    bounce: IoBuf,
}

const BOUNCE_BYTES: usize = 1 << 20;

impl FileMedia {
    /// Opens every path. A missing regular file is created sparse with
    /// `create_bytes`, if given.
    pub fn open(paths: &[PathBuf], create_bytes: Option<u64>) -> Result<FileMedia, DeviceError> {
        let devices = paths
            .iter()
            .map(|path| {
                let size = if path.exists() { None } else { create_bytes };
                FileDevice::open(path, size, 4096)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bounce = IoBuf::new(BOUNCE_BYTES).map_err(|source| DeviceError::Io {
            path: PathBuf::from("(buffer)"),
            source,
        })?;
        Ok(FileMedia {
            devices,
            paths: paths.to_vec(),
            bounce,
        })
    }

    /// Descriptor of each member, for the data plane.
    pub fn fds(&self) -> Vec<RawFd> {
        self.devices.iter().map(|d| d.fd()).collect()
    }

    /// Path of each member.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Human description of each member.
    pub fn describe(&self) -> Vec<String> {
        self.devices.iter().map(|d| d.describe()).collect()
    }
}

impl Media for FileMedia {
    fn members(&self) -> usize {
        self.devices.len()
    }

    fn size_bytes(&self, member: usize) -> u64 {
        self.devices[member].size_bytes()
    }

    fn read_at(&mut self, member: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let file = self.devices[member].file();
        let mut done = 0;
        while done < buf.len() {
            let len = (buf.len() - done).min(BOUNCE_BYTES);
            let bounce = &mut self.bounce.as_mut_slice()[..len];
            file.read_exact_at(bounce, offset + done as u64)?;
            buf[done..done + len].copy_from_slice(&bounce[..len]);
            done += len;
        }
        Ok(())
    }

    fn write_at(&mut self, member: usize, offset: u64, buf: &[u8]) -> io::Result<()> {
        let file = self.devices[member].file();
        let mut done = 0;
        while done < buf.len() {
            let len = (buf.len() - done).min(BOUNCE_BYTES);
            let bounce = &mut self.bounce.as_mut_slice()[..len];
            bounce.copy_from_slice(&buf[done..done + len]);
            file.write_all_at(bounce, offset + done as u64)?;
            done += len;
        }
        Ok(())
    }

    fn zero(&mut self, member: usize, offset: u64, len: u64) -> io::Result<()> {
        let fd = self.devices[member].fd();
        match weft_uring::fallocate(fd, weft_storage::ZERO_RANGE_MODE, offset, len) {
            Ok(()) => Ok(()),
            Err(error) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.write_zeroes(member, offset, len)
            }
            Err(error) => Err(error),
        }
    }

    fn sync(&mut self, member: usize) -> io::Result<()> {
        weft_uring::fdatasync(self.devices[member].fd())
    }

    type Device = DevicePath;

    fn add_member(&mut self, device: DevicePath) -> io::Result<()> {
        if let Ok(new) = std::fs::metadata(&device.path) {
            for (index, existing) in self.devices.iter().enumerate() {
                let old = existing.file().metadata()?;
                let same = if new.file_type().is_block_device() {
                    old.file_type().is_block_device() && old.rdev() == new.rdev()
                } else {
                    (old.dev(), old.ino()) == (new.dev(), new.ino())
                };
                if same {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!(
                            "{} is already device {} of this pool ({})",
                            device.path.display(),
                            index + 1,
                            self.paths[index].display()
                        ),
                    ));
                }
            }
        }
        let opened = FileDevice::open(&device.path, device.create_bytes, 4096)
            .map_err(|error| io::Error::other(error.to_string()))?;
        self.devices.push(opened);
        self.paths.push(device.path);
        Ok(())
    }

    fn remove_last_member(&mut self) {
        self.devices.pop();
        self.paths.pop();
    }
}

impl FileMedia {
    fn write_zeroes(&mut self, member: usize, offset: u64, len: u64) -> io::Result<()> {
        let file = self.devices[member].file();
        let zeroes = &mut self.bounce.as_mut_slice()[..];
        zeroes.fill(0);
        let mut done = 0u64;
        while done < len {
            let step = (len - done).min(BOUNCE_BYTES as u64) as usize;
            file.write_all_at(&zeroes[..step], offset + done)?;
            done += step as u64;
        }
        Ok(())
    }
}
