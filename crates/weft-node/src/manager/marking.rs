//! The volume manager's side of its replicas' write intents
//! ([`crate::intents`]): a region marked, durably, before a replica's
//! write to it is let through, and the cleared regions persisted lazily.

use super::Manager;
use crate::intents::REGION_SHIFT;
use weft_proto::IoError;
use weft_target::VolumeOutcome;

impl Manager {
    /// The slow path of a replica write to regions its intent lacks: marks
    /// them durably, then the write may retry.
    pub(super) fn mark_intent(&mut self, volume: &str, offset: u64, len: u64) -> VolumeOutcome {
        let Some(file) = self.intents.get(volume) else {
            log::error!("volume {volume}: a replica write without a write intent");
            return VolumeOutcome::Done(Err(IoError::Other));
        };
        let last = (offset + len.max(1) - 1) >> REGION_SHIFT;
        if last >= u64::from(file.intent().regions()) {
            log::error!("volume {volume}: a replica write past the end of its write intent");
            return VolumeOutcome::Done(Err(IoError::Other));
        }
        let regions = file.intent().regions_of(offset, len);
        match file.mark(regions) {
            Ok(()) => VolumeOutcome::Retry,
            Err(error) => {
                log::warn!("volume {volume}: cannot persist its write intent: {error}");
                VolumeOutcome::Done(Err(IoError::Media))
            }
        }
    }

    /// Writes the intents whose regions were cleared since the last time.
    pub(super) fn persist_cleared_intents(&mut self) {
        for (volume, file) in &self.intents {
            if let Err(error) = file.persist_cleared() {
                log::warn!("volume {volume}: cannot persist its write intent: {error}");
            }
        }
    }
}
