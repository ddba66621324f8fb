//! The cleaner of compressed volumes' segments, run when the manager is
//! idle: a few sparse segments a turn, so that what overwrites left dead
//! is free again before a writer has to wait for it (a writer that finds
//! no free allocation unit cleans one itself).

use super::Manager;

/// Segments a pool's cleaner empties per idle turn at most.
const SEGMENTS_PER_TURN: usize = 4;

impl Manager {
    /// Runs the cleaner on every usable pool holding compressed extents,
    /// and publishes what it freed.
    pub(super) fn clean_segments(&mut self) {
        let mut touched = super::publish::Touched::default();
        for (name, pool) in &mut self.pools {
            let failed = pool.failure().is_some() || self.health[name].is_failed();
            if failed || pool.segment_bytes() == 0 {
                continue;
            }
            match pool.clean_segments(SEGMENTS_PER_TURN) {
                Ok(0) => {}
                // No room to move into (or to name the segment it would
                // open): the writers will say so.
                Err(
                    weft_volume::VolumeError::PoolFull { .. }
                    | weft_volume::VolumeError::MetadataFull { .. },
                ) => {}
                Ok(emptied) => {
                    log::debug!("pool {name}: the cleaner emptied {emptied} segment(s)");
                    touched.note_pool(name);
                }
                Err(error) => {
                    log::error!("pool {name}: cleaning segments: {error}");
                    super::note_pool_failure(pool, &self.health[name]);
                }
            }
        }
        self.publish_touched(&touched);
    }
}
