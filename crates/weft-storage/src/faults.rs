//! A device that fails on command, for the data plane's tests (feature
//! `fault-injection`; never part of a shipped build). The data plane asks
//! [`BlockDevice::injected_fault`] before it submits each op of a device and
//! completes the op with the error given instead of running it.

use crate::{BlockDevice, FileDevice};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// An op as the fault switches see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceOp {
    /// A read.
    Read,
    /// A write; `fua` for Force Unit Access (RWF_DSYNC).
    Write {
        /// Force Unit Access.
        fua: bool,
    },
    /// fdatasync.
    Sync,
    /// fallocate(PUNCH_HOLE).
    PunchHole,
}

/// What to fail; flip them while the device serves.
#[derive(Debug, Default)]
pub struct FaultSwitches {
    /// Syncs fail with EIO.
    pub fail_syncs: AtomicBool,
    /// FUA writes fail with EIO.
    pub fail_fua_writes: AtomicBool,
    /// Hole punching fails with EOPNOTSUPP.
    pub refuse_punch_holes: AtomicBool,
    /// Hole punches attempted (refused or not).
    pub punches: AtomicU64,
}

/// A file device with fault switches.
#[derive(Debug)]
pub struct FaultyDevice {
    inner: FileDevice,
    switches: Arc<FaultSwitches>,
}

impl FaultyDevice {
    /// Wraps `inner`; the switches start off.
    pub fn new(inner: FileDevice) -> FaultyDevice {
        FaultyDevice {
            inner,
            switches: Arc::default(),
        }
    }

    /// The switches, to flip from the test.
    pub fn switches(&self) -> Arc<FaultSwitches> {
        Arc::clone(&self.switches)
    }
}

impl BlockDevice for FaultyDevice {
    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn fd(&self) -> RawFd {
        self.inner.fd()
    }
    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }
    fn is_thin(&self) -> bool {
        self.inner.is_thin()
    }
    fn can_punch_holes(&self) -> bool {
        self.inner.can_punch_holes()
    }
    fn cannot_punch_holes(&self) {
        self.inner.cannot_punch_holes()
    }
    fn injected_fault(&self, op: DeviceOp) -> Option<io::Error> {
        let on = |switch: &AtomicBool| switch.load(Ordering::SeqCst);
        let switches = &self.switches;
        match op {
            DeviceOp::Sync if on(&switches.fail_syncs) => {
                Some(io::Error::from_raw_os_error(libc::EIO))
            }
            DeviceOp::Write { fua: true } if on(&switches.fail_fua_writes) => {
                Some(io::Error::from_raw_os_error(libc::EIO))
            }
            DeviceOp::PunchHole => {
                switches.punches.fetch_add(1, Ordering::SeqCst);
                on(&switches.refuse_punch_holes)
                    .then(|| io::Error::from_raw_os_error(libc::EOPNOTSUPP))
            }
            _ => None,
        }
    }
}
