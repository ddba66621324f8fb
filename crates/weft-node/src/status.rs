//! What the node reports about its pools, volumes and hosts: plain domain
//! structs built from the pools (weft-volume), the desired state
//! (weft-control) and the data plane. They carry no wire or API form: the
//! API turns them into its JSON views.

use std::path::PathBuf;
use std::sync::Arc;
use weft_control::QosLimits;
use weft_volume::{MemberUsage, PoolInfo, VolumeInfo};

/// A pool: its capacity and usage, devices and state.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolStatus {
    /// Member devices, in stripe order (as the desired state records them).
    pub devices: Vec<PathBuf>,
    /// Capacity and usage.
    pub info: PoolInfo,
    /// Each member's share, in stripe order.
    pub members: Arc<[MemberUsage]>,
    /// Why it failed (every I/O on its volumes fails until cleared), if it did.
    pub failure: Option<String>,
}

/// A volume: its pool, shape and usage, who may use it and who does.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeStatus {
    /// Its pool.
    pub pool: String,
    /// The subsystem NQN it is served as.
    pub nqn: String,
    /// Size, block size, allocation, origin, snapshots.
    pub info: VolumeInfo,
    /// Names of the hosts attached to it.
    pub hosts: Vec<String>,
    /// Its I/O limits.
    pub qos: QosLimits,
    /// NQNs of the hosts connected to it now.
    pub connected_hosts: Vec<String>,
    /// Why its pool failed, if it did.
    pub failure: Option<String>,
}

/// A host that may be given volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStatus {
    /// Name.
    pub name: String,
    /// NQN.
    pub nqn: String,
    /// How it authenticates (its secrets are never reported).
    pub authentication: Authentication,
    /// Names of the volumes attached to it.
    pub volumes: Vec<String>,
}

/// Which DH-HMAC-CHAP secrets a host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authentication {
    /// None: it connects without authenticating.
    None,
    /// Its own: it proves it knows it.
    Host,
    /// Its own and the controller's: each side proves its secret.
    Bidirectional,
}
