//! Sticky failure of a backing store (a file namespace, or a pool and every
//! volume in it). Once an fdatasync or a FUA write has failed, data that a
//! host was told is durable, or will be after its next Flush, may be gone: on
//! Linux a retried fsync after EIO succeeds while the dirty pages are lost.
//! So the first such failure marks the store failed, and from then on every
//! I/O on it, Flush included, completes with an error until an operator
//! clears the failure on purpose (`weft pool clear-failure`,
//! `weft namespace clear-failure`).
//!
//! The data plane checks the flag before every I/O (one relaxed load: the
//! flag only ever guards against new I/O, it orders no data); setting and
//! clearing are rare and happen on any thread.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// What failed, for the log, the API and /metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedOperation {
    /// fdatasync (a Flush, or the sync before a metadata commit).
    Sync = 1,
    /// A write with Force Unit Access.
    FuaWrite = 2,
    /// A metadata write of a pool.
    Metadata = 3,
}

impl FailedOperation {
    fn from_code(code: u8) -> Option<FailedOperation> {
        match code {
            1 => Some(FailedOperation::Sync),
            2 => Some(FailedOperation::FuaWrite),
            3 => Some(FailedOperation::Metadata),
            _ => None,
        }
    }
}

/// Why a store is failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// What failed.
    pub operation: FailedOperation,
    /// The OS error number (0 when there was none, e.g. a short write).
    pub errno: i32,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.operation {
            FailedOperation::Sync => "fdatasync failed",
            FailedOperation::FuaWrite => "a FUA write failed",
            FailedOperation::Metadata => "a metadata write failed",
        };
        match self.errno {
            0 => write!(f, "{what}"),
            errno => write!(f, "{what}: {}", io::Error::from_raw_os_error(errno)),
        }
    }
}

/// The failure flag of one backing store, shared by the reactors and the
/// volume manager.
#[derive(Debug, Default)]
pub struct Health {
    /// 0 while healthy, else the `FailedOperation` code in the high half
    /// and the errno in the low half (one word: read and set together).
    state: AtomicU64,
}

impl Health {
    /// Marks the store failed; true for the first failure (the caller logs
    /// it then, and only then), false if it had failed already (the first
    /// reason is kept).
    pub fn fail(&self, operation: FailedOperation, error: &io::Error) -> bool {
        let errno = error.raw_os_error().unwrap_or(0) as u32;
        let state = (u64::from(operation as u8) << 32) | u64::from(errno);
        self.state
            .compare_exchange(0, state, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the store has failed (the data plane's per-I/O check).
    pub fn is_failed(&self) -> bool {
        self.state.load(Ordering::Relaxed) != 0
    }

    /// Why the store failed, if it has.
    pub fn failure(&self) -> Option<Failure> {
        decode(self.state.load(Ordering::Acquire))
    }

    /// Clears the failure (an operator's decision); returns what it was.
    pub fn clear(&self) -> Option<Failure> {
        decode(self.state.swap(0, Ordering::AcqRel))
    }
}

fn decode(state: u64) -> Option<Failure> {
    Some(Failure {
        operation: FailedOperation::from_code((state >> 32) as u8)?,
        errno: state as u32 as i32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_sticks_until_cleared() {
        let health = Health::default();
        assert!(!health.is_failed());
        assert!(health.fail(
            FailedOperation::Sync,
            &io::Error::from_raw_os_error(libc_eio())
        ));
        assert!(!health.fail(FailedOperation::FuaWrite, &io::Error::other("again")));
        let failure = health.failure().unwrap();
        assert_eq!(failure.operation, FailedOperation::Sync);
        assert!(
            failure.to_string().starts_with("fdatasync failed: "),
            "{failure}"
        );
        assert_eq!(health.clear(), Some(failure));
        assert!(!health.is_failed());
        assert_eq!(health.failure(), None);
    }

    fn libc_eio() -> i32 {
        5
    }
}
