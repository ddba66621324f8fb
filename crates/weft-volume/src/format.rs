//! The pool's on-disk format, versions 1 to 4 (docs/VOLUME-FORMAT.md
//! describes it for humans; this module is the normative encoder and decoder).
//!
//! Every member device starts with a metadata region of `meta_bytes`
//! (a multiple of the allocation unit); data chunks follow. The region holds
//! two copies of the superblock on every member and, on the first three
//! members, two checkpoint slots and the journal:
//!
//! ```text
//! 0        4 KiB     8 KiB   64 KiB          +checkpoint_bytes   +checkpoint_bytes   +journal_bytes
//! | super A | super B | ...  | checkpoint 0   | checkpoint 1      | journal (records) | (pad) | chunks...
//! ```
//!
//! The chunks are striped over groups of members, one after the other: the
//! devices the pool was created on, then those of each growth (version 2
//! superblocks list the groups and a generation number). Checkpoints that
//! outgrow their slots continue into allocation units the superblock names
//! (version 3, see `extension`). A pool with a write tier names the tier
//! (version 4), so that it never opens without it.
//!
//! Superblocks, checkpoints and journal records each carry a CRC-32C, and
//! checkpoints and records carry the pool UUID and a sequence number, so a
//! torn or stale block is recognised and never applied. What this module
//! does not do: decide what the records mean (see `state`) or any I/O.

use crate::codec::{Decoder, Encoder};
use thiserror::Error;

mod extension;
pub use extension::{Extension, Extent, EXTENTS_MAX};

/// Newest format version: written while a pool has a write tier; version 3
/// once its checkpoints extend past their slots, version 2 once it has
/// grown, version 1 before. This code opens versions 1 to 4.
pub const FORMAT_VERSION: u32 = 4;
/// Superblock flag (version 4): the pool has a write tier, whose identity
/// ends the superblock's fields.
const FLAG_WRITE_TIER: u32 = 1;
/// Superblock flag (version 4): the checkpoint extension section follows
/// the groups (version 3 always has one).
const FLAG_EXTENSION: u32 = 2;
/// Superblock magic.
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"WEFTPOOL";
/// Journal record magic.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"WJR1");
/// Checkpoint magic.
pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"WCK1");
/// Unit of every metadata write and its alignment.
pub const META_BLOCK: usize = 4096;
/// Bytes of a superblock copy (one metadata block).
pub const SUPERBLOCK_BYTES: usize = META_BLOCK;
/// Where the checkpoint slots start on member 0.
pub const CHECKPOINTS_OFFSET: u64 = 64 * 1024;
/// Header of a journal record or checkpoint: magic, payload length, sequence,
/// pool UUID, CRC-32C, reserved.
pub const FRAME_HEADER_BYTES: usize = 40;

/// Why bytes read from a device are not a valid structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FormatError {
    /// The structure ends early.
    #[error("structure is truncated")]
    Truncated,
    /// Wrong magic: not a weft structure (or never written).
    #[error("no weft magic")]
    BadMagic,
    /// The checksum does not match: torn or corrupted.
    #[error("checksum mismatch")]
    BadChecksum,
    /// Written by a newer (or unknown) format version.
    #[error("format version {0} is not supported (this weft reads versions 1 to 4)")]
    UnsupportedVersion(u32),
    /// Belongs to another pool (a stale block from a pool created earlier on the same device).
    #[error("belongs to another pool")]
    ForeignPool,
    /// A field holds an impossible value.
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

/// Copies of a pool's metadata at most (see [`Layout::metadata_copies`]).
pub const METADATA_COPIES_MAX: usize = 3;
/// Members of a pool at most; also the most stripe groups it can have.
pub const MEMBERS_MAX: usize = 64;

/// Members added together and the chunks striped over them. A pool's chunk
/// space is its groups one after the other: group 0 is the devices the pool
/// was created on, each growth appends one, so no existing chunk ever moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Number of the group's first chunk (the chunks of the groups before it).
    pub first_chunk: u32,
    /// Data chunks on each member of the group.
    pub chunks_per_member: u32,
    /// Index of the group's first member (the members of the groups before it).
    pub first_member: u16,
    /// Members in the group (at least one).
    pub members: u16,
    /// Chosen when the group is added (0 for group 0): a device left over from
    /// an interrupted growth carries another tag than the group that took its
    /// place, so it is never mistaken for a member.
    pub tag: u32,
}

impl Group {
    const EMPTY: Group = Group {
        first_chunk: 0,
        chunks_per_member: 0,
        first_member: 0,
        members: 0,
        tag: 0,
    };

    /// Chunks in the group.
    pub fn chunks(&self) -> u32 {
        self.chunks_per_member * u32::from(self.members)
    }
}

/// Sizes of the pool's regions (fixed at creation) and its stripe groups.
///
/// `Copy` and without heap memory: the data plane keeps one per volume and
/// calls [`Layout::locate`] for every piece of every I/O.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Allocation unit in bytes (a power of two).
    pub chunk_bytes: u32,
    /// Members (devices) in all groups.
    pub members: u16,
    /// Metadata region at the start of every member; data starts here.
    pub meta_bytes: u64,
    /// Bytes of each of the two checkpoint slots.
    pub checkpoint_bytes: u64,
    /// Bytes of the journal.
    pub journal_bytes: u64,
    /// The first `group_count` are the groups; the rest stay `Group::EMPTY`
    /// (so that equality compares only the groups).
    groups: [Group; MEMBERS_MAX],
    group_count: u8,
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layout")
            .field("chunk_bytes", &self.chunk_bytes)
            .field("members", &self.members)
            .field("meta_bytes", &self.meta_bytes)
            .field("checkpoint_bytes", &self.checkpoint_bytes)
            .field("journal_bytes", &self.journal_bytes)
            .field("groups", &self.groups())
            .finish()
    }
}

impl Layout {
    /// The layout for `members` devices of at least `member_bytes` each.
    /// Checkpoints are sized to hold about eight chunk references per
    /// physical chunk at the worst-case encoding (12 bytes per reference).
    pub fn plan(members: u16, member_bytes: u64, chunk_bytes: u32) -> Result<Layout, String> {
        let rough_chunks = member_bytes / u64::from(chunk_bytes) * u64::from(members);
        let checkpoint_bytes = round_up(64 * 1024 + rough_chunks * 96, 1 << 20);
        Layout::plan_with_checkpoints(members, member_bytes, chunk_bytes, checkpoint_bytes)
    }

    /// As [`Layout::plan`], with checkpoint slots of `checkpoint_bytes` (a
    /// multiple of 4 KiB; the crash tests use small ones, so that
    /// checkpoints outgrow their slots early).
    pub fn plan_with_checkpoints(
        members: u16,
        member_bytes: u64,
        chunk_bytes: u32,
        checkpoint_bytes: u64,
    ) -> Result<Layout, String> {
        assert!(chunk_bytes.is_power_of_two(), "validated by the caller");
        assert!(checkpoint_bytes.is_multiple_of(META_BLOCK as u64) && checkpoint_bytes > 0);
        let chunk = u64::from(chunk_bytes);
        let rough_chunks = member_bytes / chunk * u64::from(members);
        let journal_bytes = round_up((rough_chunks * 16).clamp(1 << 20, 64 << 20), 1 << 20);
        let meta_bytes = round_up(
            CHECKPOINTS_OFFSET + 2 * checkpoint_bytes + journal_bytes,
            chunk,
        );
        let empty = Layout {
            chunk_bytes,
            members: 0,
            meta_bytes,
            checkpoint_bytes,
            journal_bytes,
            groups: [Group::EMPTY; MEMBERS_MAX],
            group_count: 0,
        };
        empty.grow(members, member_bytes, 0)
    }

    /// This layout with a new group of `members` devices of at least
    /// `member_bytes` each appended: its chunks are numbered after every
    /// existing one, which keeps its place.
    pub fn grow(&self, members: u16, member_bytes: u64, tag: u32) -> Result<Layout, String> {
        let chunk = u64::from(self.chunk_bytes);
        let total_members = usize::from(self.members) + usize::from(members);
        if members == 0 || total_members > MEMBERS_MAX {
            return Err(format!(
                "a pool has at most {MEMBERS_MAX} devices ({} now, {members} to add)",
                self.members
            ));
        }
        let data_bytes = member_bytes.saturating_sub(self.meta_bytes);
        let chunks_per_member = u32::try_from(data_bytes / chunk).unwrap_or(u32::MAX);
        if chunks_per_member == 0 {
            return Err(format!(
                "a device of {member_bytes} bytes leaves no room for data after {} bytes of metadata; use devices of at least {} bytes",
                self.meta_bytes,
                self.meta_bytes + chunk
            ));
        }
        let total = u64::from(self.chunks()) + u64::from(chunks_per_member) * u64::from(members);
        if total >= u64::from(u32::MAX) {
            return Err(format!(
                "{total} allocation units are more than a pool can address (fewer than 2^32); choose a larger allocation unit or smaller devices"
            ));
        }
        let mut layout = *self;
        layout.groups[usize::from(self.group_count)] = Group {
            first_chunk: self.chunks(),
            chunks_per_member,
            first_member: self.members,
            members,
            tag,
        };
        layout.group_count += 1;
        layout.members += members;
        Ok(layout)
    }

    /// The stripe groups, in chunk order.
    pub fn groups(&self) -> &[Group] {
        &self.groups[..usize::from(self.group_count)]
    }

    /// The group added last.
    pub fn last_group(&self) -> &Group {
        self.groups().last().expect("a layout has a group")
    }

    /// Whether `self` is `newer` before its last groups were added (the
    /// layout an earlier generation of the same pool had).
    pub fn is_prefix_of(&self, newer: &Layout) -> bool {
        let groups = self.groups();
        self.chunk_bytes == newer.chunk_bytes
            && self.meta_bytes == newer.meta_bytes
            && self.checkpoint_bytes == newer.checkpoint_bytes
            && self.journal_bytes == newer.journal_bytes
            && groups.len() <= newer.groups().len()
            && groups == &newer.groups()[..groups.len()]
    }

    /// Chunks in the pool.
    pub fn chunks(&self) -> u32 {
        self.groups()
            .last()
            .map_or(0, |g| g.first_chunk + g.chunks())
    }

    /// log2 of the allocation unit.
    pub fn chunk_shift(&self) -> u32 {
        self.chunk_bytes.trailing_zeros()
    }

    /// Member and byte offset of physical chunk `chunk`: a binary search
    /// for its group (at most 64), then round-robin over the group's members.
    pub fn locate(&self, chunk: u32) -> (usize, u64) {
        debug_assert!(chunk < self.chunks(), "chunk {chunk} beyond the pool");
        let groups = self.groups();
        let index = groups
            .partition_point(|g| g.first_chunk <= chunk)
            .saturating_sub(1);
        let group = &groups[index];
        let within = chunk - group.first_chunk;
        let members = u32::from(group.members);
        let member = usize::from(group.first_member) + (within % members) as usize;
        let offset = self.meta_bytes + (u64::from(within / members) << self.chunk_shift());
        (member, offset)
    }

    /// The physical chunk that starts at byte `offset` of `member`, if one does.
    pub fn chunk_at(&self, member: usize, offset: u64) -> Option<u32> {
        let group = self.groups().iter().find(|g| {
            let first = usize::from(g.first_member);
            (first..first + usize::from(g.members)).contains(&member)
        })?;
        let data = offset.checked_sub(self.meta_bytes)?;
        let index = data >> self.chunk_shift();
        if data & (u64::from(self.chunk_bytes) - 1) != 0
            || index >= u64::from(group.chunks_per_member)
        {
            return None;
        }
        let within = index as u32 * u32::from(group.members)
            + (member - usize::from(group.first_member)) as u32;
        Some(group.first_chunk + within)
    }

    /// Byte offset of checkpoint slot `slot` (0 or 1) on each metadata member.
    pub fn checkpoint_offset(&self, slot: usize) -> u64 {
        CHECKPOINTS_OFFSET + slot as u64 * self.checkpoint_bytes
    }

    /// Byte offset of the journal on each metadata member.
    pub fn journal_offset(&self) -> u64 {
        CHECKPOINTS_OFFSET + 2 * self.checkpoint_bytes
    }

    /// Members that carry a copy of the checkpoints and the journal: the
    /// first three, or every member of a smaller pool (a pool that grows
    /// past three members keeps them where they are; one that grows from
    /// one or two members gains copies on its new members). Losing the
    /// metadata of one member then loses no volume.
    pub fn metadata_copies(&self) -> usize {
        usize::from(self.members).min(METADATA_COPIES_MAX)
    }

    /// Smallest size member `member` needs in this layout.
    pub fn member_bytes_needed(&self, member: usize) -> u64 {
        let group = self
            .groups()
            .iter()
            .rev()
            .find(|g| usize::from(g.first_member) <= member)
            .expect("group 0 starts at member 0");
        self.meta_bytes + (u64::from(group.chunks_per_member) << self.chunk_shift())
    }
}

/// Rounds `value` up to a multiple of `unit` (a power of two).
pub fn round_up(value: u64, unit: u64) -> u64 {
    (value + unit - 1) & !(unit - 1)
}

/// What every member's superblock says (identical on all members but `member`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Pool identity; checkpoints and records carry it too.
    pub pool_uuid: [u8; 16],
    /// Pool name.
    pub pool_name: String,
    /// This device's position in the pool.
    pub member: u16,
    /// Incremented by every change of the layout (growth); 0 at creation.
    pub generation: u64,
    /// Region sizes and groups.
    pub layout: Layout,
    /// Where the checkpoint slots continue (empty until they outgrow their size).
    pub extension: Extension,
    /// The pool's write tier, if it has one: the identity its device's
    /// superblock and batches carry.
    pub tier: Option<crate::tier::format::TierId>,
}

impl Superblock {
    /// One superblock copy, padded to [`SUPERBLOCK_BYTES`], CRC last. Written
    /// in the oldest version that holds it (older builds open a pool that
    /// never grew, and one whose checkpoints never outgrew their slots).
    pub fn encode(&self) -> Vec<u8> {
        let layout = &self.layout;
        let version_1 =
            self.generation == 0 && layout.groups().len() == 1 && layout.groups()[0].tag == 0;
        let version = match (version_1, self.extension.is_empty(), self.tier.is_some()) {
            (_, _, true) => FORMAT_VERSION,
            (true, true, false) => 1,
            (false, true, false) => 2,
            (_, false, false) => 3,
        };
        let mut e = Encoder::new();
        e.bytes(&SUPERBLOCK_MAGIC);
        e.u32(version);
        e.u32(self.flags(version));
        e.bytes(&self.pool_uuid);
        e.name(&self.pool_name);
        e.u16(self.member);
        e.u16(layout.members);
        e.u32(layout.chunk_bytes);
        if version == 1 {
            e.u32(layout.groups()[0].chunks_per_member);
        }
        e.u64(layout.meta_bytes);
        e.u64(layout.checkpoint_bytes);
        e.u64(layout.journal_bytes);
        if version > 1 {
            e.u64(self.generation);
            e.u16(layout.groups().len() as u16);
            for group in layout.groups() {
                e.u16(group.members);
                e.u32(group.chunks_per_member);
                e.u32(group.tag);
            }
        }
        if version == 3 || !self.extension.is_empty() && version > 3 {
            self.extension.encode(&mut e);
        }
        if let Some(tier) = &self.tier {
            e.bytes(tier);
        }
        let mut bytes = e.into_bytes();
        assert!(
            bytes.len() <= SUPERBLOCK_BYTES - 4,
            "64 groups and 3 x 2 x 16 extents fit"
        );
        bytes.resize(SUPERBLOCK_BYTES - 4, 0);
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The flags field of a superblock of `version` (none before 4).
    fn flags(&self, version: u32) -> u32 {
        if version < 4 {
            return 0;
        }
        let tier = if self.tier.is_some() {
            FLAG_WRITE_TIER
        } else {
            0
        };
        let extension = if self.extension.is_empty() {
            0
        } else {
            FLAG_EXTENSION
        };
        tier | extension
    }

    /// Decodes and checks one superblock copy (version 1 to 4).
    pub fn decode(block: &[u8]) -> Result<Superblock, FormatError> {
        if block.len() < SUPERBLOCK_BYTES {
            return Err(FormatError::Truncated);
        }
        let block = &block[..SUPERBLOCK_BYTES];
        if block[..8] != SUPERBLOCK_MAGIC {
            return Err(FormatError::BadMagic);
        }
        let stored = u32::from_le_bytes(block[SUPERBLOCK_BYTES - 4..].try_into().expect("4"));
        if crc32c::crc32c(&block[..SUPERBLOCK_BYTES - 4]) != stored {
            return Err(FormatError::BadChecksum);
        }
        let mut d = Decoder::new(&block[8..]);
        let version = d.u32()?;
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let flags = d.u32()?;
        if flags & !(FLAG_WRITE_TIER | FLAG_EXTENSION) != 0 || (flags != 0 && version < 4) {
            return Err(FormatError::Malformed("unknown superblock flags"));
        }
        let pool_uuid = d.array()?;
        let pool_name = d.name()?;
        let member = d.u16()?;
        let members = d.u16()?;
        let chunk_bytes = d.u32()?;
        let v1_chunks_per_member = if version == 1 { d.u32()? } else { 0 };
        let mut layout = Layout {
            chunk_bytes,
            members: 0,
            meta_bytes: d.u64()?,
            checkpoint_bytes: d.u64()?,
            journal_bytes: d.u64()?,
            groups: [Group::EMPTY; MEMBERS_MAX],
            group_count: 0,
        };
        check_regions(&layout)?;
        let inconsistent = || FormatError::Malformed("superblock groups are inconsistent");
        let mut generation = 0;
        if version == 1 {
            layout = layout
                .grow_exactly(members, v1_chunks_per_member, 0)
                .ok_or_else(inconsistent)?;
        } else {
            generation = d.u64()?;
            let groups = d.u16()?;
            if groups == 0 || usize::from(groups) > MEMBERS_MAX {
                return Err(inconsistent());
            }
            for _ in 0..groups {
                let (group_members, chunks_per_member, tag) = (d.u16()?, d.u32()?, d.u32()?);
                layout = layout
                    .grow_exactly(group_members, chunks_per_member, tag)
                    .ok_or_else(inconsistent)?;
            }
        }
        if layout.members != members || member >= members {
            return Err(inconsistent());
        }
        let extension = match version == 3 || flags & FLAG_EXTENSION != 0 {
            true => Extension::decode(&mut d, &layout)?,
            false => Extension::default(),
        };
        let tier = match flags & FLAG_WRITE_TIER {
            0 => None,
            _ => Some(d.array()?),
        };
        if version == 4 && tier.is_none() {
            return Err(FormatError::Malformed(
                "a version 4 superblock names no write tier",
            ));
        }
        Ok(Superblock {
            pool_uuid,
            pool_name,
            member,
            generation,
            layout,
            extension,
            tier,
        })
    }

    /// Bytes one checkpoint may take (its slot and the slot's extents).
    pub fn checkpoint_room(&self) -> u64 {
        self.extension.room(&self.layout)
    }
}

impl Layout {
    /// Appends a group with exactly `chunks_per_member` (decoding), or None
    /// if it breaks a limit.
    fn grow_exactly(&self, members: u16, chunks_per_member: u32, tag: u32) -> Option<Layout> {
        let member_bytes = self
            .meta_bytes
            .checked_add(u64::from(chunks_per_member).checked_mul(u64::from(self.chunk_bytes))?)?;
        let layout = self.grow(members, member_bytes, tag).ok()?;
        (layout.last_group().chunks_per_member == chunks_per_member).then_some(layout)
    }
}

fn check_regions(layout: &Layout) -> Result<(), FormatError> {
    let chunk = u64::from(layout.chunk_bytes);
    let sane = layout.chunk_bytes.is_power_of_two()
        && layout.chunk_bytes >= 4096
        && layout.checkpoint_bytes.is_multiple_of(META_BLOCK as u64)
        && layout.journal_bytes.is_multiple_of(META_BLOCK as u64)
        && layout.meta_bytes.is_multiple_of(chunk)
        && layout
            .checkpoint_bytes
            .checked_mul(2)
            .and_then(|c| c.checked_add(CHECKPOINTS_OFFSET))
            .and_then(|c| c.checked_add(layout.journal_bytes))
            .is_some_and(|end| end <= layout.meta_bytes);
    if sane {
        Ok(())
    } else {
        Err(FormatError::Malformed("superblock layout is inconsistent"))
    }
}

/// A checksummed, sequenced frame: the envelope of journal records and checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Sequence number: records are numbered 1, 2, ...; a checkpoint carries
    /// the number of the last record it includes.
    pub sequence: u64,
    /// The content.
    pub payload: Vec<u8>,
}

impl Frame {
    /// Encodes with `magic` for `pool_uuid`, padded to whole metadata blocks.
    pub fn encode(&self, magic: u32, pool_uuid: &[u8; 16]) -> Vec<u8> {
        let payload_len = u32::try_from(self.payload.len()).expect("frames are bounded");
        let mut bytes = Vec::with_capacity(FRAME_HEADER_BYTES + self.payload.len());
        bytes.extend_from_slice(&magic.to_le_bytes());
        bytes.extend_from_slice(&payload_len.to_le_bytes());
        bytes.extend_from_slice(&self.sequence.to_le_bytes());
        bytes.extend_from_slice(pool_uuid);
        bytes.extend_from_slice(&[0; 8]); // CRC and reserved
        bytes.extend_from_slice(&self.payload);
        let crc = crc32c::crc32c(&bytes);
        bytes[32..36].copy_from_slice(&crc.to_le_bytes());
        bytes.resize(round_up(bytes.len() as u64, META_BLOCK as u64) as usize, 0);
        bytes
    }

    /// Bytes a frame with `payload_len` bytes of payload occupies.
    pub fn encoded_len(payload_len: usize) -> usize {
        round_up((FRAME_HEADER_BYTES + payload_len) as u64, META_BLOCK as u64) as usize
    }

    /// Reads the header from the first block: the full frame length, to read the rest.
    pub fn peek_len(
        first_block: &[u8],
        magic: u32,
        pool_uuid: &[u8; 16],
    ) -> Result<usize, FormatError> {
        let mut d = Decoder::new(first_block);
        if d.u32()? != magic {
            return Err(FormatError::BadMagic);
        }
        let payload_len = d.u32()? as usize;
        let _sequence = d.u64()?;
        if &d.array::<16>()? != pool_uuid {
            return Err(FormatError::ForeignPool);
        }
        Ok(Frame::encoded_len(payload_len))
    }

    /// Decodes a whole frame (as many blocks as `peek_len` said).
    pub fn decode(bytes: &[u8], magic: u32, pool_uuid: &[u8; 16]) -> Result<Frame, FormatError> {
        let total = Frame::peek_len(bytes, magic, pool_uuid)?;
        if bytes.len() < total {
            return Err(FormatError::Truncated);
        }
        let payload_len = u32::from_le_bytes(bytes[4..8].try_into().expect("4")) as usize;
        let end = FRAME_HEADER_BYTES + payload_len;
        let stored = u32::from_le_bytes(bytes[32..36].try_into().expect("4"));
        let mut header = [0u8; FRAME_HEADER_BYTES];
        header.copy_from_slice(&bytes[..FRAME_HEADER_BYTES]);
        header[32..36].fill(0);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&header), &bytes[FRAME_HEADER_BYTES..end]);
        if crc != stored {
            return Err(FormatError::BadChecksum);
        }
        Ok(Frame {
            sequence: u64::from_le_bytes(bytes[8..16].try_into().expect("8")),
            payload: bytes[FRAME_HEADER_BYTES..end].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn superblock() -> Superblock {
        Superblock {
            pool_uuid: [0xAB; 16],
            pool_name: "fast".into(),
            member: 1,
            generation: 0,
            layout: Layout::plan(2, 256 << 20, 1 << 20).unwrap(),
            extension: Extension::default(),
            tier: None,
        }
    }

    /// `superblock()` grown by a group of three devices of 128 MiB.
    fn grown() -> Superblock {
        let base = superblock();
        Superblock {
            member: 3,
            generation: 1,
            layout: base.layout.grow(3, 128 << 20, 0xC0FFEE).unwrap(),
            ..base
        }
    }

    #[test]
    fn layout_stripes_chunks_over_members_after_the_metadata() {
        let layout = Layout::plan(2, 256 << 20, 1 << 20).unwrap();
        assert_eq!(layout.checkpoint_bytes, 1 << 20);
        assert_eq!(layout.journal_bytes, 1 << 20);
        assert_eq!(
            layout.meta_bytes,
            4 << 20,
            "64 KiB + 2 x 1 MiB + 1 MiB, rounded to a chunk"
        );
        assert_eq!(layout.groups()[0].chunks_per_member, 252);
        assert_eq!(layout.chunks(), 504);
        assert_eq!(layout.locate(0), (0, 4 << 20));
        assert_eq!(layout.locate(1), (1, 4 << 20));
        assert_eq!(layout.locate(2), (0, 5 << 20));
        assert_eq!(layout.journal_offset(), (64 << 10) + (2 << 20));
        assert!(
            Layout::plan(1, 4 << 20, 1 << 20).is_err(),
            "no room for data"
        );
    }

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let block = superblock().encode();
        assert_eq!(block.len(), SUPERBLOCK_BYTES);
        assert_eq!(&block[..8], b"WEFTPOOL");
        assert_eq!(hex(&block[8..16]), "0100000000000000", "version 1, flags 0");
        assert_eq!(Superblock::decode(&block).unwrap(), superblock());
        let mut torn = block.clone();
        torn[100] ^= 1;
        assert_eq!(Superblock::decode(&torn), Err(FormatError::BadChecksum));
        assert_eq!(
            Superblock::decode(&[0u8; SUPERBLOCK_BYTES]),
            Err(FormatError::BadMagic)
        );
        let mut newer = superblock().encode();
        newer[8] = 5;
        let crc = crc32c::crc32c(&newer[..SUPERBLOCK_BYTES - 4]);
        newer[SUPERBLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Superblock::decode(&newer),
            Err(FormatError::UnsupportedVersion(5))
        );
    }

    /// Growth appends a group: every existing chunk stays where it was, the
    /// new chunks are numbered after them and striped over the new members.
    #[test]
    fn growing_appends_a_group_and_moves_no_chunk() {
        let old = Layout::plan(2, 256 << 20, 1 << 20).unwrap();
        let new = old.grow(3, 128 << 20, 7).unwrap();
        assert_eq!(new.members, 5);
        assert_eq!(new.groups().len(), 2);
        assert_eq!(
            new.groups()[1].chunks_per_member,
            124,
            "128 MiB - 4 MiB metadata"
        );
        assert_eq!(new.chunks(), 504 + 3 * 124);
        for chunk in 0..old.chunks() {
            assert_eq!(new.locate(chunk), old.locate(chunk), "chunk {chunk} moved");
        }
        assert_eq!(new.locate(504), (2, 4 << 20));
        assert_eq!(new.locate(505), (3, 4 << 20));
        assert_eq!(new.locate(507), (2, 5 << 20));
        assert_eq!(new.locate(new.chunks() - 1), (4, (4 << 20) + (123 << 20)));
        assert_eq!(new.member_bytes_needed(1), 256 << 20);
        assert_eq!(new.member_bytes_needed(4), 128 << 20);
        assert!(old.is_prefix_of(&new) && !new.is_prefix_of(&old));
        assert!(
            !old.grow(3, 128 << 20, 8).unwrap().is_prefix_of(&new),
            "another tag"
        );
        assert_eq!(new.metadata_copies(), 3);
    }

    #[test]
    fn growth_keeps_the_member_and_chunk_limits() {
        let layout = Layout::plan(60, 8 << 20, 1 << 20).unwrap();
        let error = layout.grow(5, 8 << 20, 1).unwrap_err();
        assert!(error.contains("at most 64 devices"), "{error}");
        assert_eq!(layout.grow(4, 8 << 20, 1).unwrap().members, 64);
        let error = layout.grow(1, 4 << 20, 1).unwrap_err();
        assert!(error.contains("no room for data"), "{error}");
        // 64 KiB units: 2^32 chunks are 256 TiB; two 200 TiB members exceed it.
        let small = Layout::plan(1, 200 << 40, 64 << 10).unwrap();
        let error = small.grow(1, 200 << 40, 1).unwrap_err();
        assert!(error.contains("more than a pool can address"), "{error}");
    }

    /// A pool that grew is written in version 2 (generation and groups); one
    /// that never grew stays in version 1, which older builds open.
    #[test]
    fn grown_superblocks_are_version_2_and_round_trip() {
        let block = grown().encode();
        assert_eq!(hex(&block[8..16]), "0200000000000000", "version 2, flags 0");
        assert_eq!(Superblock::decode(&block).unwrap(), grown());
        let groups_at = 8 + 8 + 16 + 5 + 2 + 2 + 4 + 24;
        assert_eq!(
            hex(&block[groups_at..groups_at + 10]),
            "01000000000000000200",
            "generation 1, two groups"
        );
        assert_eq!(
            hex(&block[groups_at + 10..groups_at + 30]),
            "0200fc00000000000000".to_owned() + "0300" + "7c000000" + "eeffc000",
            "2 members of 252 units, tag 0; 3 members of 124 units, tag 0xC0FFEE"
        );
        let mut bad = grown().encode();
        bad[groups_at + 10] = 3; // group 0 claims 3 members: 6 in all, not 5
        let crc = crc32c::crc32c(&bad[..SUPERBLOCK_BYTES - 4]);
        bad[SUPERBLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Superblock::decode(&bad),
            Err(FormatError::Malformed(_))
        ));
        let v1 = superblock().encode();
        assert_eq!(hex(&v1[8..12]), "01000000");
        assert_eq!(Superblock::decode(&v1).unwrap().layout.groups().len(), 1);
    }

    /// `grown()` with checkpoints extended by 2 units per slot: copies 0
    /// and 1 on their own members, copy 2 on member 3 (not a copy).
    fn extended() -> Superblock {
        let base = grown();
        let layout = base.layout;
        let unit = |member: usize, index: u64| Extent {
            member: member as u16,
            offset: layout.meta_bytes + (index << 20),
            chunks: 1,
        };
        let extension = Extension {
            chunks: 2,
            copies: vec![
                [
                    vec![unit(0, 10), unit(0, 20)],
                    vec![unit(0, 11), unit(0, 21)],
                ],
                [
                    vec![Extent {
                        chunks: 2,
                        ..unit(1, 0)
                    }],
                    vec![Extent {
                        chunks: 2,
                        ..unit(1, 2)
                    }],
                ],
                [
                    vec![Extent {
                        chunks: 2,
                        ..unit(3, 0)
                    }],
                    vec![Extent {
                        chunks: 2,
                        ..unit(3, 2)
                    }],
                ],
            ],
        };
        Superblock {
            generation: 2,
            extension,
            ..base
        }
    }

    /// A pool with a write tier has a version 4 superblock (flag 1) that
    /// names the tier after the extension section; older builds refuse it,
    /// so no build opens the pool without its tier.
    #[test]
    fn a_superblock_naming_a_write_tier_is_version_4() {
        let tiered = Superblock {
            tier: Some([0x7E; 16]),
            ..extended()
        };
        let block = tiered.encode();
        assert_eq!(
            hex(&block[8..16]),
            "0400000003000000",
            "version 4, flags: a tier, an extension"
        );
        assert_eq!(Superblock::decode(&block).unwrap(), tiered);
        let tiered = Superblock {
            tier: Some([0x7E; 16]),
            ..superblock()
        }
        .encode();
        let end = SUPERBLOCK_BYTES - 4;
        let tail = tiered[..end].iter().rposition(|&b| b != 0).unwrap();
        assert_eq!(
            hex(&tiered[tail - 15..=tail]),
            "7e".repeat(16),
            "the tier's identity ends the fields"
        );
        // An extension flagged that is not there, and version 4 without a
        // tier: both resealed, both refused.
        for flags in [3, 0] {
            let mut block = tiered.clone();
            block[12] = flags;
            let crc = crc32c::crc32c(&block[..end]);
            block[end..].copy_from_slice(&crc.to_le_bytes());
            assert!(matches!(
                Superblock::decode(&block),
                Err(FormatError::Malformed(_))
            ));
        }
    }

    /// Checkpoints that outgrew their slots make a version 3 superblock
    /// naming the units they continue into; version 2 builds refuse it.
    #[test]
    fn extended_superblocks_are_version_3_and_are_checked() {
        let superblock = extended();
        let block = superblock.encode();
        assert_eq!(hex(&block[8..16]), "0300000000000000", "version 3, flags 0");
        assert_eq!(Superblock::decode(&block).unwrap(), superblock);
        let at = 8 + 8 + 16 + 5 + 2 + 2 + 4 + 24 + 10 + 20;
        assert_eq!(
            hex(&block[at..at + 6 + 14]),
            "02000000".to_owned() + "03" + "02" + "0000" + "0000e00000000000" + "01000000",
            "2 units per slot, 3 copies; copy 0 slot 0: 2 extents, member 0 at 14 MiB, 1 unit"
        );
        let layout = superblock.layout;
        assert_eq!(
            superblock.checkpoint_room(),
            layout.checkpoint_bytes + (2 << 20)
        );
        assert_eq!(
            superblock.extension.pieces(&layout, 2, 1),
            vec![
                (2, layout.checkpoint_offset(1), layout.checkpoint_bytes),
                (3, layout.meta_bytes + (2 << 20), 2 << 20)
            ]
        );
        let mut held = superblock.extension.chunks_held(&layout);
        held.sort_unstable();
        assert_eq!(held.len(), 12);
        assert_eq!(layout.chunk_at(0, layout.meta_bytes + (10 << 20)), Some(20));
        assert_eq!(
            layout.chunk_at(3, layout.meta_bytes + (2 << 20)),
            Some(504 + 1 + 3 * 2)
        );
        assert_eq!(
            layout.chunk_at(3, layout.meta_bytes + 4096),
            None,
            "not a unit's start"
        );
        assert_eq!(
            layout.chunk_at(4, layout.meta_bytes + (124 << 20)),
            None,
            "past the device's units"
        );

        let rejected = |change: &dyn Fn(&mut Extension)| {
            let mut bad = extended();
            change(&mut bad.extension);
            Superblock::decode(&bad.encode())
        };
        let malformed = Err(FormatError::Malformed(
            "superblock checkpoint extension is inconsistent",
        ));
        assert_eq!(rejected(&|e| e.chunks = 3), malformed, "slots add up to 2");
        assert_eq!(
            rejected(&|e| e.copies[2][0][0].member = 5),
            malformed,
            "a member beyond the pool"
        );
        assert_eq!(
            rejected(&|e| e.copies[1][1][0].offset = layout.meta_bytes),
            malformed,
            "a unit named twice"
        );
        assert_eq!(
            rejected(&|e| e.copies[0][0][0].offset = layout.meta_bytes + (251 << 20)),
            Ok(Superblock {
                extension: {
                    let mut e = extended().extension;
                    e.copies[0][0][0].offset = layout.meta_bytes + (251 << 20);
                    e
                },
                ..extended()
            }),
            "the last unit of member 0"
        );
        assert_eq!(
            rejected(&|e| e.copies[0][0][0].offset = layout.meta_bytes + (252 << 20)),
            malformed,
            "past member 0's units"
        );
        assert_eq!(rejected(&|e| e.copies.truncate(2)), malformed, "3 copies");
        assert_eq!(
            rejected(&|e| e.copies[0][0][0] = Extent {
                member: 0,
                offset: u64::MAX - 9,
                chunks: 2
            }),
            malformed,
            "an offset that overflows"
        );
        assert_eq!(
            rejected(&|e| e.chunks = layout.chunks() / 6 + 1),
            malformed,
            "more units than the pool has"
        );
    }

    #[test]
    fn frames_round_trip_and_detect_torn_stale_and_foreign_blocks() {
        let uuid = [7u8; 16];
        let frame = Frame {
            sequence: 42,
            payload: vec![1, 2, 3],
        };
        let bytes = frame.encode(RECORD_MAGIC, &uuid);
        assert_eq!(bytes.len(), META_BLOCK);
        assert_eq!(
            hex(&bytes[..16]),
            "574a5231030000002a00000000000000",
            "magic WJR1, payload length 3, sequence 42"
        );
        assert_eq!(Frame::decode(&bytes, RECORD_MAGIC, &uuid).unwrap(), frame);
        assert_eq!(
            Frame::decode(&bytes, CHECKPOINT_MAGIC, &uuid),
            Err(FormatError::BadMagic)
        );
        assert_eq!(
            Frame::decode(&bytes, RECORD_MAGIC, &[8; 16]),
            Err(FormatError::ForeignPool)
        );
        let mut torn = bytes.clone();
        torn[FRAME_HEADER_BYTES + 1] = 9;
        assert_eq!(
            Frame::decode(&torn, RECORD_MAGIC, &uuid),
            Err(FormatError::BadChecksum)
        );
        let mut huge = bytes;
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            Frame::decode(&huge, RECORD_MAGIC, &uuid),
            Err(FormatError::Truncated)
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
