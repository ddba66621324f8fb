//! What the data plane serves: the protocol core's target description plus
//! the device behind each namespace.

use std::sync::Arc;
use weft_proto::types::Nsid;
use weft_proto::Target;
use weft_storage::BlockDevice;

/// A namespace's device.
#[derive(Debug, Clone)]
pub struct NamespaceDevice {
    /// Namespace ID.
    pub nsid: Nsid,
    /// The device.
    pub device: Arc<dyn BlockDevice>,
}

/// The immutable exports: every reactor holds the same `Arc`.
#[derive(Debug)]
pub struct Exports {
    /// The protocol core's view (subsystems, listeners, limits, controllers).
    pub target: Arc<Target>,
    /// Devices per subsystem, in the order of `target.config.subsystems`.
    pub devices: Vec<Vec<NamespaceDevice>>,
}

impl Exports {
    /// The device of `nsid` in subsystem number `subsystem`.
    pub fn device(&self, subsystem: usize, nsid: Nsid) -> Option<&dyn BlockDevice> {
        self.devices
            .get(subsystem)?
            .iter()
            .find(|d| d.nsid == nsid)
            .map(|d| d.device.as_ref())
    }

    /// Every device, for a final flush.
    pub fn all_devices(&self) -> impl Iterator<Item = &dyn BlockDevice> {
        self.devices.iter().flatten().map(|d| d.device.as_ref())
    }
}
