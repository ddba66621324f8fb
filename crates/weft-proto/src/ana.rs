//! Asymmetric Namespace Access (NVMe Base 2.0, section 8.1): how a host that
//! reaches one subsystem through several controllers learns which of them
//! should carry the I/O.
//!
//! Several weft nodes export the same subsystem (same NQN, same namespace
//! identities), and each node's controllers report the namespaces in that
//! node's ANA group. The group's state says what a path through this node
//! does with I/O: Optimized and Non-optimized paths serve it; Inaccessible,
//! Persistent Loss and Change paths fail it with a path status, without Do
//! Not Retry, so that a Linux host's multipath retries it on another path
//! (see [`AnaState::io_status`]).
//!
//! weft puts every namespace of a subsystem in one group, and a node has one
//! group (its own), so the configuration carries one [`AnaConfig`] per
//! subsystem: the state of the (subsystem, node) pair. The ANA log page
//! (log identifier 0Ch, [`crate::identify::ana_header`]) and the ANA Change
//! asynchronous event ([`crate::admin::ANA_CHANGED`]) report it.

use crate::status::Status;
use std::fmt;
use std::num::NonZeroU32;

/// ANA group identifiers a controller may report: 1 to this (ANAGRPMAX, and
/// NANAGRPID, in Identify Controller). A Linux host rejects an ANA log page
/// whose group identifier is 0 or above ANAGRPMAX.
pub const ANA_GROUPS_MAX: u32 = 64;

/// An ANA group identifier (ANAGRPID), 1 to [`ANA_GROUPS_MAX`]: "ANA Group
/// Identifiers ... shall be ... greater than 0h and less than or equal to
/// ANAGRPMAX" (NVMe Base 2.0, section 8.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AnaGroupId(NonZeroU32);

impl AnaGroupId {
    /// Group 1, where a node that is not part of a cluster puts everything.
    pub const FIRST: AnaGroupId = match AnaGroupId::new(1) {
        Some(group) => group,
        None => unreachable!(),
    };

    /// The group `id`, if it is one a controller may report (1 to [`ANA_GROUPS_MAX`]).
    pub const fn new(id: u32) -> Option<AnaGroupId> {
        if id > ANA_GROUPS_MAX {
            return None;
        }
        match NonZeroU32::new(id) {
            Some(id) => Some(AnaGroupId(id)),
            None => None,
        }
    }

    /// The identifier as it goes on the wire.
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

impl fmt::Display for AnaGroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The ANA state of a group (NVMe Base 2.0, section 8.1.3; the ANAS field of
/// an ANA Group Descriptor, Figure 224).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AnaState {
    /// ANA Optimized: the preferred path.
    Optimized = 0x01,
    /// ANA Non-Optimized: serves I/O, but a host prefers an optimized path.
    NonOptimized = 0x02,
    /// ANA Inaccessible: fails I/O with Asymmetric Access Inaccessible.
    Inaccessible = 0x03,
    /// ANA Persistent Loss: fails I/O with Asymmetric Access Persistent Loss.
    PersistentLoss = 0x04,
    /// ANA Change: in transition; fails I/O with Asymmetric Access Transition.
    Change = 0x0F,
}

impl AnaState {
    /// The ANAS value.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The state with ANAS value `code`.
    pub const fn from_code(code: u8) -> Option<AnaState> {
        Some(match code {
            0x01 => AnaState::Optimized,
            0x02 => AnaState::NonOptimized,
            0x03 => AnaState::Inaccessible,
            0x04 => AnaState::PersistentLoss,
            0x0F => AnaState::Change,
            _ => return None,
        })
    }

    /// The status a command that accesses a namespace of a group in this
    /// state completes with, or `None` if the path serves it. "Commands
    /// that ... access user data ... shall be aborted with status
    /// Asymmetric Access Inaccessible" (section 8.1.3.3; Persistent Loss
    /// 8.1.3.4, Change 8.1.3.5 with Asymmetric Access Transition). None of
    /// them sets DNR: the host retries on another path, as with nvmet.
    pub const fn io_status(self) -> Option<Status> {
        match self {
            AnaState::Optimized | AnaState::NonOptimized => None,
            AnaState::Inaccessible => Some(Status::ANA_INACCESSIBLE),
            AnaState::PersistentLoss => Some(Status::ANA_PERSISTENT_LOSS),
            AnaState::Change => Some(Status::ANA_TRANSITION),
        }
    }

    /// Lower-case name, as Linux shows it in `ana_state`.
    pub const fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }
}

impl fmt::Display for AnaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The ANA group of a subsystem's namespaces on this target, and its state.
///
/// The group must not change while the subsystem is served: Identify
/// Controller reports ANACAP bit 6 ("the ANAGRPID field in the Identify
/// Namespace data structure does not change while the namespace is
/// attached"). The state changes freely; each change is reported to the
/// subsystem's controllers by an ANA Change event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AnaConfig {
    /// The group every namespace of the subsystem is in.
    pub group: AnaGroupId,
    /// Its state.
    pub state: AnaState,
}

impl AnaConfig {
    /// Group 1, Optimized: a target that is the only path to its subsystems.
    pub const DEFAULT: AnaConfig = AnaConfig {
        group: AnaGroupId::FIRST,
        state: AnaState::Optimized,
    };
}

impl Default for AnaConfig {
    fn default() -> AnaConfig {
        AnaConfig::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::StatusCodeType;

    #[test]
    fn group_ids_are_1_to_the_maximum() {
        assert_eq!(AnaGroupId::new(0), None);
        assert_eq!(AnaGroupId::new(1), Some(AnaGroupId::FIRST));
        assert_eq!(AnaGroupId::new(64).map(AnaGroupId::get), Some(64));
        assert_eq!(AnaGroupId::new(65), None);
        assert_eq!(AnaGroupId::new(u32::MAX), None);
    }

    #[test]
    fn state_codes_round_trip() {
        let states = [
            AnaState::Optimized,
            AnaState::NonOptimized,
            AnaState::Inaccessible,
            AnaState::PersistentLoss,
            AnaState::Change,
        ];
        for state in states {
            assert_eq!(AnaState::from_code(state.code()), Some(state));
        }
        let codes: Vec<u8> = states.iter().map(|s| s.code()).collect();
        assert_eq!(codes, [0x01, 0x02, 0x03, 0x04, 0x0F]);
        assert_eq!(AnaState::from_code(0), None);
        assert_eq!(AnaState::from_code(0x05), None);
    }

    /// Path related status (SCT 3h), SC 01h to 03h, never DNR: Linux's
    /// nvme_is_path_error() fails the command over to another path only
    /// when DNR is clear.
    #[test]
    fn only_optimized_and_non_optimized_serve_io() {
        assert_eq!(AnaState::Optimized.io_status(), None);
        assert_eq!(AnaState::NonOptimized.io_status(), None);
        for (state, sc) in [
            (AnaState::PersistentLoss, 0x01),
            (AnaState::Inaccessible, 0x02),
            (AnaState::Change, 0x03),
        ] {
            let status = state.io_status().expect("a path error");
            assert_eq!(
                (status.sct, status.sc, status.dnr),
                (StatusCodeType::Path, sc, false)
            );
            assert_eq!(status.field() & 0x700, 0x300, "{state}");
        }
    }
}
