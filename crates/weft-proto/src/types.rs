//! Newtypes for the identifiers and units that cross the wire, so that a
//! command identifier can never be passed where a namespace ID is expected.

use std::fmt;
use std::time::Duration;

/// Namespace identifier (NSID). 0 is invalid, 0xFFFF_FFFF means "all namespaces".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nsid(pub u32);

impl Nsid {
    /// The broadcast value that addresses every namespace.
    pub const BROADCAST: Nsid = Nsid(0xFFFF_FFFF);
}

impl fmt::Display for Nsid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Command identifier chosen by the host, unique among its outstanding commands on one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cid(pub u16);

/// Controller identifier, allocated by the target at admin Connect (dynamic controller model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cntlid(pub u16);

impl Cntlid {
    /// Highest controller ID the dynamic model may hand out (NVMe base spec: FFF0h..FFFFh are reserved).
    pub const MAX_DYNAMIC: u16 = 0xFFEF;
}

/// Queue identifier: 0 is the admin queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Qid(pub u16);

impl Qid {
    /// The admin queue.
    pub const ADMIN: Qid = Qid(0);
}

/// Logical block address within a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lba(pub u64);

/// Index of a per-queue command slot (request state plus its data buffer), also
/// used as the R2T transfer tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(pub u16);

/// A point on the caller's monotonic clock. The core never reads a clock: the
/// driver passes `now` into every call that may depend on time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub Duration);

impl Timestamp {
    /// `self + duration`.
    pub fn after(self, duration: Duration) -> Timestamp {
        Timestamp(self.0 + duration)
    }
}
