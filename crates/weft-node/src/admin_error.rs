//! Why an admin operation failed: the one error type of the node's admin
//! path, shared by the volume manager and the replicators it starts (each
//! maps it once: the API to an HTTP status, the CLI to its message).

use weft_control::StoreError;
use weft_volume::VolumeError;

/// Why an admin operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The volume layer refused or failed.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// Hosts are connected to a volume being deleted.
    #[error("volume {volume} has connected hosts ({hosts}); disconnect them first (nvme disconnect -n {nqn}) or delete with --force")]
    Busy {
        /// The volume.
        volume: String,
        /// Their NQNs.
        hosts: String,
        /// The volume's NQN.
        nqn: String,
    },
    /// A volume of that name exists (in any pool of the node).
    #[error("volume {volume} already exists in pool {pool}; volume names are unique on a node (they name the NQN), choose another")]
    NameTaken {
        /// The name.
        volume: String,
        /// The pool that has it.
        pool: String,
    },
    /// In a cluster: another node holds (or is creating) a volume of that name.
    #[error("volume {volume} already exists on node {node}; volume names are unique in the cluster (they name the NQN), choose another")]
    NameTakenOnNode {
        /// The name.
        volume: String,
        /// The node that holds it.
        node: String,
    },
    /// A volume's chosen NQN, UUID or NGUID is another volume's.
    #[error("{what} {value} is already volume {volume}'s; hosts would take them for one volume: choose another")]
    IdentityTaken {
        /// "NQN", "UUID" or "NGUID".
        what: &'static str,
        /// The value.
        value: String,
        /// The volume that has it.
        volume: String,
    },
    /// A host is still attached to volumes.
    #[error("host {host} is attached to volumes {volumes}; detach it first (weft volume detach VOLUME --host {host})")]
    HostAttached {
        /// The host.
        host: String,
        /// Its volumes.
        volumes: String,
    },
    /// A host NQN is registered under two names.
    #[error("NQN {nqn} is already registered as host {existing}")]
    NqnTaken {
        /// The NQN.
        nqn: String,
        /// The host that has it.
        existing: String,
    },
    /// The desired state could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The volume manager's queue of admin operations is full.
    #[error("the node is busy: its volume manager has {queue} requests queued, its limit; retry in a moment")]
    ManagerBusy {
        /// The queue's limit.
        queue: u32,
    },
    /// The node's own files failed.
    #[error("{0}")]
    Node(String),
    /// The request cannot be served as asked.
    #[error("{0}")]
    Invalid(String),
    /// Not now (a replicated volume is failing over, or a replica did not
    /// answer in time): the same request may succeed in a moment.
    #[error("{0}")]
    Unavailable(String),
}
