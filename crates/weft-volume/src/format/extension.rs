//! Checkpoint extensions (format version 3): allocation units a pool's
//! checkpoint slots continue into once its state outgrows the slots sized
//! at creation (a pool grown many times, many snapshots), so that metadata
//! grows with the pool instead of running out before its space does.
//!
//! The superblock names the units, per metadata copy and per slot, so a
//! reader knows where a checkpoint lives before reading it. A checkpoint
//! frame is then written and read as one byte string over its slot and that
//! slot's extents in order; its CRC covers it all, so a torn write anywhere
//! in it is caught as it is in the slot. Units named here are never mapped
//! by a volume (the pool holds them as it holds mapped ones).
//!
//! A copy's extents are on its own member where it has room, else on
//! another member (preferably one no other copy uses): copies are kept
//! against damaged metadata; a striped pool that loses a device has lost
//! data anyway. What this module does not do: choose the units (the pool
//! does, from its free ones) or any I/O.

use super::{FormatError, Layout};
use crate::codec::{Decoder, Encoder};

/// Extents per slot of one copy, at most (bounds the superblock's size).
pub const EXTENTS_MAX: usize = 16;

/// Consecutive allocation units on one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The member holding them.
    pub member: u16,
    /// Byte offset of the first on that member.
    pub offset: u64,
    /// How many.
    pub chunks: u32,
}

/// Where the checkpoint slots continue: for each metadata copy, for each of
/// its two slots, extents adding up to `chunks` allocation units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extension {
    /// Allocation units every slot of every copy gains (0: none, version 2).
    pub chunks: u32,
    /// Per metadata copy: the extents of slot 0 and of slot 1.
    pub copies: Vec<[Vec<Extent>; 2]>,
}

impl Extension {
    /// Whether the slots are as sized at creation.
    pub fn is_empty(&self) -> bool {
        self.chunks == 0
    }

    /// Bytes one checkpoint may take: the slot and its extents.
    pub fn room(&self, layout: &Layout) -> u64 {
        layout.checkpoint_bytes + (u64::from(self.chunks) << layout.chunk_shift())
    }

    /// Where checkpoint slot `slot` of metadata copy `copy` lives, in order:
    /// (member, byte offset, bytes).
    pub fn pieces(&self, layout: &Layout, copy: usize, slot: usize) -> Vec<(usize, u64, u64)> {
        let mut pieces = vec![(
            copy,
            layout.checkpoint_offset(slot),
            layout.checkpoint_bytes,
        )];
        if let Some(slots) = self.copies.get(copy) {
            pieces.extend(slots[slot].iter().map(|extent| {
                (
                    usize::from(extent.member),
                    extent.offset,
                    u64::from(extent.chunks) << layout.chunk_shift(),
                )
            }));
        }
        pieces
    }

    /// Every allocation unit the extents hold.
    pub fn chunks_held(&self, layout: &Layout) -> Vec<u32> {
        let mut held = Vec::new();
        for extent in self.copies.iter().flatten().flatten() {
            for index in 0..extent.chunks {
                let offset = extent.offset + (u64::from(index) << layout.chunk_shift());
                held.extend(layout.chunk_at(usize::from(extent.member), offset));
            }
        }
        held
    }

    /// The members copy `copy` uses: its own and those of its extents.
    pub fn devices(&self, copy: usize) -> Vec<usize> {
        let mut devices = vec![copy];
        if let Some(slots) = self.copies.get(copy) {
            devices.extend(slots.iter().flatten().map(|e| usize::from(e.member)));
        }
        devices.sort_unstable();
        devices.dedup();
        devices
    }

    /// Appends the version 3 section of a superblock.
    pub(super) fn encode(&self, e: &mut Encoder) {
        e.u32(self.chunks);
        e.u8(self.copies.len() as u8);
        for extent_list in self.copies.iter().flatten() {
            e.u8(extent_list.len() as u8);
            for extent in extent_list {
                e.u16(extent.member);
                e.u64(extent.offset);
                e.u32(extent.chunks);
            }
        }
    }

    /// Reads and checks the version 3 section against `layout`.
    pub(super) fn decode(d: &mut Decoder<'_>, layout: &Layout) -> Result<Extension, FormatError> {
        let chunks = d.u32()?;
        let copy_count = usize::from(d.u8()?);
        let mut copies = Vec::with_capacity(copy_count.min(layout.metadata_copies()));
        for _ in 0..copy_count {
            let mut slots: [Vec<Extent>; 2] = Default::default();
            for slot in &mut slots {
                let count = usize::from(d.u8()?);
                if count > EXTENTS_MAX {
                    return Err(malformed());
                }
                for _ in 0..count {
                    slot.push(Extent {
                        member: d.u16()?,
                        offset: d.u64()?,
                        chunks: d.u32()?,
                    });
                }
            }
            copies.push(slots);
        }
        let extension = Extension { chunks, copies };
        extension.check(layout)?;
        Ok(extension)
    }

    /// Every extent lies on allocation units of its member, each slot adds
    /// up to `chunks` and no unit is named twice. Works on extents (at most
    /// 96), never on units one by one: a damaged but sealed superblock on a
    /// device offered to a pool must not cost memory in proportion to what
    /// it claims.
    fn check(&self, layout: &Layout) -> Result<(), FormatError> {
        let copies = self.copies.len() as u64;
        if self.chunks == 0
            || self.copies.len() != layout.metadata_copies()
            || 2 * copies * u64::from(self.chunks) > u64::from(layout.chunks())
        {
            return Err(malformed());
        }
        let mut spans = Vec::new();
        for extent_list in self.copies.iter().flatten() {
            let mut sum = 0u64;
            for extent in extent_list {
                let member = usize::from(extent.member);
                let last = u64::from(extent.chunks.checked_sub(1).ok_or_else(malformed)?);
                let end = (last << layout.chunk_shift())
                    .checked_add(extent.offset)
                    .ok_or_else(malformed)?;
                if layout.chunk_at(member, extent.offset).is_none()
                    || layout.chunk_at(member, end).is_none()
                {
                    return Err(malformed());
                }
                spans.push((member, extent.offset, end));
                sum += u64::from(extent.chunks);
            }
            if sum != u64::from(self.chunks) {
                return Err(malformed());
            }
        }
        spans.sort_unstable();
        let overlap = spans
            .windows(2)
            .any(|pair| pair[0].0 == pair[1].0 && pair[1].1 <= pair[0].2);
        if overlap {
            return Err(malformed());
        }
        Ok(())
    }
}

fn malformed() -> FormatError {
    FormatError::Malformed("superblock checkpoint extension is inconsistent")
}
