//! The data plane: thread-per-core reactors that drive the protocol core's
//! connections over io_uring (sockets and disks alike), and the listeners
//! that hand accepted connections to them.
//!
//! Each reactor owns its ring, its connections and their buffers; nothing is
//! shared between reactors but the exports (an immutable snapshot of the
//! target configuration and the devices, replaced whole by an update) and the
//! target (controller registry and current configuration), which the core
//! touches only at connection creation, Connect and updates. New connections
//! and new exports reach a reactor as messages through a channel plus an
//! eventfd wake-up.

mod exports;
pub mod guest;
pub mod health;
pub mod limit;
mod listener;
pub mod meter;
mod peers;
mod reactor;
pub mod replicated;
mod spin;
pub mod stages;
mod tls;
mod volume;

pub use exports::{Backend, Exports, NamespaceDevice};
pub use health::{FailedOperation, Failure, Health};
pub use limit::LimitReached;
pub use listener::{DataPlane, StartError};
pub use meter::Meter;
pub use peers::PeerLimits;
pub use reactor::QueuePlacement;
pub use volume::{
    Piece, SnapshotName, VolumeBackend, VolumeManager, VolumeOutcome, VolumeReply, VolumeRequest,
    VolumeWork,
};
