//! Room for checkpoints: a change that would not fit the checkpoint slots
//! first extends them into free allocation units (format version 3, see
//! `format::extension`), so a pool's metadata grows with what it holds.
//!
//! An extension commits as a growth does: the superblock naming the new
//! units is written (copy A on every member, each synced, then copy B) with
//! the next generation, and the units are held from then on. Before that
//! commit the units were free and unwritten; after it a checkpoint that
//! does not reach them yet reads as before, since an extension only appends
//! to a slot. A failed superblock write fails the pool (the outcome is in
//! doubt) until `reload` opens whichever generation committed.
//!
//! Also here: reading and writing a checkpoint frame over its slot and
//! extents.

use super::{write_superblocks, Pool, OBJECT_BYTES};
use crate::format::{Extension, Extent, FormatError, Frame, Layout, Superblock, EXTENTS_MAX};
use crate::format::{CHECKPOINT_MAGIC, FRAME_HEADER_BYTES, META_BLOCK};
use crate::media::Media;
use crate::VolumeError;
use std::collections::BTreeSet;
use std::io;

impl<M: Media> Pool<M> {
    /// Makes sure a checkpoint still fits once `added` references are added
    /// (and those the destage of compressed units waiting in the write tier
    /// may add), extending the slots if it would not; refuses the change
    /// only when the pool has no free units left to extend them with.
    pub(super) fn check_references(&mut self, added: u64) -> Result<(), VolumeError> {
        self.check_checkpoint_room(added.saturating_add(self.tier_pending_references()))
    }

    /// As [`Pool::check_references`], for `added` references alone (a
    /// destage round's units, kept room for since their writes).
    pub(super) fn check_checkpoint_room(&mut self, added: u64) -> Result<(), VolumeError> {
        let needed = self.state.encoded_len_bound()
            + OBJECT_BYTES
            + 12u64.saturating_mul(added)
            + FRAME_HEADER_BYTES as u64;
        let room = self.superblock.checkpoint_room();
        if needed <= room {
            return Ok(());
        }
        if needed > u64::from(u32::MAX) {
            // A frame's payload length is 32 bits.
            return Err(VolumeError::MetadataFull {
                pool: self.name().to_string(),
            });
        }
        self.extend_checkpoints(needed - room)
    }

    /// Adds units to every slot of every copy: enough to double the room,
    /// or at least `missing` bytes.
    fn extend_checkpoints(&mut self, missing: u64) -> Result<(), VolumeError> {
        let layout = *self.layout();
        let chunk_bytes = u64::from(layout.chunk_bytes);
        let least = u32::try_from(missing.div_ceil(chunk_bytes)).unwrap_or(u32::MAX);
        let doubling = u32::try_from(self.superblock.checkpoint_room() / chunk_bytes)
            .unwrap_or(u32::MAX)
            .max(least);
        let full = || VolumeError::MetadataFull {
            pool: self.name().to_string(),
        };
        // The units kept for the write tier's compressed units are not
        // free for this.
        let available = self
            .state
            .free_now()
            .saturating_sub(self.chunks_kept_for_tier()) as usize;
        let fits = |plan: &(Extension, Vec<u32>)| plan.1.len() <= available;
        let (extension, taken) = self
            .plan_extension(doubling)
            .filter(fits)
            .or_else(|| self.plan_extension(least).filter(fits))
            .ok_or_else(full)?;
        self.state
            .reserve(&taken)
            .expect("extension units are chosen from the free ones");
        let extended = Superblock {
            generation: self.superblock.generation + 1,
            extension,
            ..self.superblock.clone()
        };
        let members: Vec<usize> = (0..usize::from(layout.members)).collect();
        if let Err(error) = write_superblocks(&mut self.media, &extended, &members) {
            let reason = format!("extending the checkpoints in doubt: {error}");
            log::error!("pool {}: {reason}", self.name());
            self.failed = Some(reason);
            return Err(self.failed_error());
        }
        self.superblock = extended;
        log::info!(
            "pool {}: checkpoints extended by {} allocation units each, to {} bytes (generation {})",
            self.name(),
            taken.len() / (2 * layout.metadata_copies()),
            self.superblock.checkpoint_room(),
            self.superblock.generation
        );
        Ok(())
    }

    /// The extension with `add` more free units for each slot of each copy,
    /// and the units it takes; None if some copy cannot have them.
    ///
    /// A copy takes its units from its own member if it can, else from the
    /// member with the most free units, preferring one no other copy uses;
    /// each slot's from as few runs of consecutive units as it can (the 16
    /// extents a slot may have then last: with the room doubling each
    /// time, they hold 2^16 times the room sized at creation).
    fn plan_extension(&self, add: u32) -> Option<(Extension, Vec<u32>)> {
        let layout = self.layout();
        let members = usize::from(layout.members);
        let copies = layout.metadata_copies();
        let mut free: Vec<Vec<(u64, u32)>> = vec![Vec::new(); members];
        for &chunk in self.state.free_chunks() {
            let (member, offset) = layout.locate(chunk);
            free[member].push((offset, chunk));
        }
        for units in &mut free {
            units.sort_unstable();
        }
        let wanted = 2 * add as usize;
        let mut extension = self.superblock.extension.clone();
        extension.copies.resize_with(copies, Default::default);
        let mut taken = Vec::new();
        for copy in 0..copies {
            let others: Vec<usize> = (0..copies)
                .filter(|&other| other != copy)
                .flat_map(|other| extension.devices(other))
                .collect();
            let mut elsewhere: Vec<usize> = (0..members).filter(|&m| m != copy).collect();
            elsewhere.sort_by_key(|m| (others.contains(m), std::cmp::Reverse(free[*m].len())));
            let (member, slots, chosen) = std::iter::once(copy)
                .chain(elsewhere)
                .filter(|&member| free[member].len() >= wanted)
                .find_map(|member| {
                    let picked = pick_runs(&free[member], add, layout.chunk_bytes);
                    let slots = extend_slots(&extension.copies[copy], member, &picked, layout)?;
                    Some((member, slots, picked))
                })?;
            extension.copies[copy] = slots;
            let chosen: BTreeSet<u32> = chosen.iter().flatten().map(|&(_, chunk)| chunk).collect();
            free[member].retain(|(_, chunk)| !chosen.contains(chunk));
            taken.extend(chosen);
        }
        extension.chunks = extension.chunks.checked_add(add)?;
        Some((extension, taken))
    }

    /// The extension a growth to `grown` carries: as now, plus units for the
    /// metadata copies it adds (on each new copy's own device, the first of
    /// its units), and those units. Refuses a device too small to hold them.
    pub(super) fn extension_for_growth(
        &self,
        grown: &Layout,
    ) -> Result<(Extension, Vec<u32>), VolumeError> {
        let mut extension = self.superblock.extension.clone();
        let mut taken = Vec::new();
        if extension.is_empty() {
            return Ok((extension, taken));
        }
        let per_slot = extension.chunks;
        let chunk = u64::from(grown.chunk_bytes);
        for copy in extension.copies.len()..grown.metadata_copies() {
            let mut slots: [Vec<Extent>; 2] = Default::default();
            for (slot, extents) in slots.iter_mut().enumerate() {
                let offset = grown.meta_bytes + slot as u64 * u64::from(per_slot) * chunk;
                let last = offset + u64::from(per_slot - 1) * chunk;
                let (Some(_), Some(_)) = (grown.chunk_at(copy, offset), grown.chunk_at(copy, last))
                else {
                    return Err(VolumeError::invalid(
                        format!("device {}", copy - usize::from(self.layout().members) + 1),
                        format!(
                            "it becomes a copy of pool {}'s metadata, which needs {} bytes on it; use a larger device",
                            self.name(),
                            grown.meta_bytes + 2 * u64::from(per_slot) * chunk
                        ),
                    ));
                };
                for index in 0..per_slot {
                    let at = offset + u64::from(index) * chunk;
                    taken.extend(grown.chunk_at(copy, at));
                }
                extents.push(Extent {
                    member: copy as u16,
                    offset,
                    chunks: per_slot,
                });
            }
            extension.copies.push(slots);
        }
        Ok((extension, taken))
    }
}

/// `add` units for each slot from `units` (free units of one member, by
/// offset; at least `2 * add` of them): for each slot, the smallest run of
/// consecutive units that holds what is still needed, else the longest.
fn pick_runs(units: &[(u64, u32)], add: u32, chunk_bytes: u32) -> [Vec<(u64, u32)>; 2] {
    let mut runs: Vec<&[(u64, u32)]> = Vec::new();
    let mut start = 0;
    for index in 1..=units.len() {
        let follows =
            index < units.len() && units[index].0 == units[index - 1].0 + u64::from(chunk_bytes);
        if !follows {
            runs.push(&units[start..index]);
            start = index;
        }
    }
    let mut picked: [Vec<(u64, u32)>; 2] = Default::default();
    for slot in &mut picked {
        let mut need = add as usize;
        while need > 0 {
            let fits = (0..runs.len())
                .filter(|&r| runs[r].len() >= need)
                .min_by_key(|&r| runs[r].len());
            let index = fits
                .or_else(|| (0..runs.len()).max_by_key(|&r| runs[r].len()))
                .expect("at least 2 * add units were given");
            let take = need.min(runs[index].len());
            slot.extend_from_slice(&runs[index][..take]);
            runs[index] = &runs[index][take..];
            need -= take;
        }
        slot.sort_unstable();
    }
    picked
}

/// `slots` with `picked` units of `member` added (the first list to slot
/// 0, the second to slot 1); None if a slot would have too many extents.
fn extend_slots(
    slots: &[Vec<Extent>; 2],
    member: usize,
    picked: &[Vec<(u64, u32)>; 2],
    layout: &Layout,
) -> Option<[Vec<Extent>; 2]> {
    let mut grown = slots.clone();
    for (slot, part) in grown.iter_mut().zip(picked) {
        for &(offset, _) in part {
            append(slot, member as u16, offset, layout.chunk_bytes);
        }
        if slot.len() > EXTENTS_MAX {
            return None;
        }
    }
    Some(grown)
}

/// Adds the unit at `offset` of `member` to `extents`, joining the last
/// extent when it follows it.
fn append(extents: &mut Vec<Extent>, member: u16, offset: u64, chunk_bytes: u32) {
    if let Some(last) = extents.last_mut() {
        let end = last.offset + u64::from(last.chunks) * u64::from(chunk_bytes);
        if last.member == member && end == offset {
            last.chunks += 1;
            return;
        }
    }
    extents.push(Extent {
        member,
        offset,
        chunks: 1,
    });
}

/// Writes checkpoint frame `bytes` into slot `slot` of metadata copy `copy`
/// (over the slot and its extents, in order), with `whole` writing zeroes
/// over the rest of them; then syncs every device written.
pub(super) fn write_checkpoint_frame<M: Media>(
    media: &mut M,
    superblock: &Superblock,
    copy: usize,
    slot: usize,
    bytes: &[u8],
    whole: bool,
) -> io::Result<()> {
    assert!(
        bytes.len() as u64 <= superblock.checkpoint_room(),
        "checkpoint room is made before references are added"
    );
    let pieces = superblock.extension.pieces(&superblock.layout, copy, slot);
    let mut rest = bytes;
    let mut written = Vec::new();
    for (member, offset, len) in pieces {
        let part = rest.len().min(len as usize);
        if part == 0 && !whole {
            break;
        }
        if part > 0 {
            media.write_at(member, offset, &rest[..part])?;
            rest = &rest[part..];
        }
        if whole && (part as u64) < len {
            write_zeroes(media, member, offset + part as u64, len - part as u64)?;
        }
        written.push(member);
    }
    written.sort_unstable();
    written.dedup();
    for member in written {
        media.sync(member)?;
    }
    Ok(())
}

/// Overwrites `len` bytes at `offset` of `member` with zeroes, written
/// (not punched or marked unwritten: what was there must be gone).
pub(super) fn write_zeroes<M: Media>(
    media: &mut M,
    member: usize,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    const PIECE_BYTES: u64 = 1 << 20;
    let zeroes = vec![0u8; PIECE_BYTES.min(len) as usize];
    let mut done = 0;
    while done < len {
        let piece = PIECE_BYTES.min(len - done);
        media.write_at(member, offset + done, &zeroes[..piece as usize])?;
        done += piece;
    }
    Ok(())
}

/// Reads the checkpoint in slot `slot` of metadata copy `copy`.
pub(super) fn read_checkpoint<M: Media>(
    media: &mut M,
    superblock: &Superblock,
    copy: usize,
    slot: usize,
) -> Result<Frame, FormatError> {
    let uuid = &superblock.pool_uuid;
    let pieces = superblock.extension.pieces(&superblock.layout, copy, slot);
    let (member, offset, _) = pieces[0];
    let mut first = vec![0u8; META_BLOCK];
    media
        .read_at(member, offset, &mut first)
        .map_err(|_| FormatError::Truncated)?;
    let total = Frame::peek_len(&first, CHECKPOINT_MAGIC, uuid)?;
    if total as u64 > superblock.checkpoint_room() {
        return Err(FormatError::Truncated);
    }
    let mut bytes = vec![0u8; total];
    let mut filled = 0;
    for (member, offset, len) in pieces {
        let part = (total - filled).min(len as usize);
        if part == 0 {
            break;
        }
        media
            .read_at(member, offset, &mut bytes[filled..filled + part])
            .map_err(|_| FormatError::Truncated)?;
        filled += part;
    }
    Frame::decode(&bytes, CHECKPOINT_MAGIC, uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each slot takes the smallest run that holds what it needs: few
    /// extents, and long runs kept for later.
    #[test]
    fn slots_take_whole_runs_best_fit_first() {
        let unit = 1u32 << 16;
        let units: Vec<(u64, u32)> = [0u32, 1, 2, 5, 6, 7, 8, 9, 20]
            .iter()
            .map(|&index| (u64::from(index * unit), 100 + index))
            .collect();
        let [first, second] = pick_runs(&units, 3, unit);
        assert_eq!(first, units[..3], "the run of exactly 3");
        assert_eq!(second, units[3..6], "the start of the run of 5");
        let [first, second] = pick_runs(&units, 4, unit);
        assert_eq!(first, units[3..7], "the run of 5 holds 4");
        let mut expected = units[..3].to_vec();
        expected.push(units[7]);
        assert_eq!(second, expected, "the longest runs left, 3 then 1");
    }
}
