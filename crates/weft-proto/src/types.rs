//! Newtypes for the identifiers and units that cross the wire, so that a
//! command identifier can never be passed where a namespace ID is expected.

use std::fmt;
use std::time::Duration;

/// A UUID in its text form, 8-4-4-4-12 lower-case hex digits (as a host NQN
/// `nqn.2014-08.org.nvmexpress:uuid:...` and `nvme id-ns` write it).
pub fn uuid_text(bytes: &[u8; 16]) -> String {
    let mut text = String::with_capacity(36);
    for (index, byte) in bytes.iter().enumerate() {
        if matches!(index, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_written_8_4_4_4_12() {
        let bytes: [u8; 16] = core::array::from_fn(|i| i as u8 * 0x11);
        assert_eq!(uuid_text(&bytes), "00112233-4455-6677-8899-aabbccddeeff");
    }
}
