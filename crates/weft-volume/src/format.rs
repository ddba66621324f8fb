//! The pool's on-disk format, version 1 (docs/VOLUME-FORMAT.md describes it
//! for humans; this module is the normative encoder and decoder).
//!
//! Every member device starts with a metadata region of `meta_bytes`
//! (a multiple of the allocation unit); data chunks follow. The region holds
//! two copies of the superblock on every member and, on member 0 only, two
//! checkpoint slots and the journal:
//!
//! ```text
//! 0        4 KiB     8 KiB   64 KiB          +checkpoint_bytes   +checkpoint_bytes   +journal_bytes
//! | super A | super B | ...  | checkpoint 0   | checkpoint 1      | journal (records) | (pad) | chunks...
//! ```
//!
//! Superblocks, checkpoints and journal records each carry a CRC-32C, and
//! checkpoints and records carry the pool UUID and a sequence number, so a
//! torn or stale block is recognised and never applied. What this module
//! does not do: decide what the records mean (see `state`) or any I/O.

use crate::codec::{Decoder, Encoder};
use thiserror::Error;

/// Format version written by this code and the only one it opens.
pub const FORMAT_VERSION: u32 = 1;
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
    #[error("format version {0} is not supported (this weft reads version 1)")]
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

/// Sizes of the pool's regions, fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Allocation unit in bytes (a power of two).
    pub chunk_bytes: u32,
    /// Data chunks on each member.
    pub chunks_per_member: u32,
    /// Members (devices) the chunks are striped over.
    pub members: u16,
    /// Metadata region at the start of every member; data starts here.
    pub meta_bytes: u64,
    /// Bytes of each of the two checkpoint slots.
    pub checkpoint_bytes: u64,
    /// Bytes of the journal.
    pub journal_bytes: u64,
}

impl Layout {
    /// The layout for `members` devices of at least `member_bytes` each.
    /// Checkpoints are sized to hold about eight chunk references per
    /// physical chunk at the worst-case encoding (12 bytes per reference).
    pub fn plan(members: u16, member_bytes: u64, chunk_bytes: u32) -> Result<Layout, String> {
        assert!(chunk_bytes.is_power_of_two(), "validated by the caller");
        let chunk = u64::from(chunk_bytes);
        let rough_chunks = member_bytes / chunk * u64::from(members);
        let checkpoint_bytes = round_up(64 * 1024 + rough_chunks * 96, 1 << 20);
        let journal_bytes = round_up((rough_chunks * 16).clamp(1 << 20, 64 << 20), 1 << 20);
        let meta_bytes = round_up(
            CHECKPOINTS_OFFSET + 2 * checkpoint_bytes + journal_bytes,
            chunk,
        );
        let data_bytes = member_bytes.saturating_sub(meta_bytes);
        let chunks_per_member = u32::try_from(data_bytes / chunk).unwrap_or(u32::MAX);
        let total = u64::from(chunks_per_member) * u64::from(members);
        if chunks_per_member == 0 {
            return Err(format!(
                "a device of {member_bytes} bytes leaves no room for data after {meta_bytes} bytes of metadata; use devices of at least {} bytes",
                meta_bytes + chunk
            ));
        }
        if total >= u64::from(u32::MAX) {
            return Err(format!(
                "{total} allocation units are more than a pool can address; choose a larger allocation unit"
            ));
        }
        Ok(Layout {
            chunk_bytes,
            chunks_per_member,
            members,
            meta_bytes,
            checkpoint_bytes,
            journal_bytes,
        })
    }

    /// Chunks in the pool.
    pub fn chunks(&self) -> u32 {
        self.chunks_per_member * u32::from(self.members)
    }

    /// log2 of the allocation unit.
    pub fn chunk_shift(&self) -> u32 {
        self.chunk_bytes.trailing_zeros()
    }

    /// Member and byte offset of physical chunk `chunk`: chunks are striped
    /// round-robin over the members.
    pub fn locate(&self, chunk: u32) -> (usize, u64) {
        debug_assert!(chunk < self.chunks(), "chunk {chunk} beyond the pool");
        let members = u32::from(self.members);
        let member = (chunk % members) as usize;
        let offset = self.meta_bytes + (u64::from(chunk / members) << self.chunk_shift());
        (member, offset)
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
    /// first three, or every member of a smaller pool. Losing the metadata of
    /// one member then loses no volume.
    pub fn metadata_copies(&self) -> usize {
        usize::from(self.members).min(METADATA_COPIES_MAX)
    }

    /// Smallest member size this layout needs.
    pub fn member_bytes_needed(&self) -> u64 {
        self.meta_bytes + (u64::from(self.chunks_per_member) << self.chunk_shift())
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
    /// This device's position in the stripe.
    pub member: u16,
    /// Region sizes.
    pub layout: Layout,
}

impl Superblock {
    /// One superblock copy, padded to [`SUPERBLOCK_BYTES`], CRC last.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.bytes(&SUPERBLOCK_MAGIC);
        e.u32(FORMAT_VERSION);
        e.u32(0); // flags, none defined
        e.bytes(&self.pool_uuid);
        e.name(&self.pool_name);
        e.u16(self.member);
        e.u16(self.layout.members);
        e.u32(self.layout.chunk_bytes);
        e.u32(self.layout.chunks_per_member);
        e.u64(self.layout.meta_bytes);
        e.u64(self.layout.checkpoint_bytes);
        e.u64(self.layout.journal_bytes);
        let mut bytes = e.into_bytes();
        bytes.resize(SUPERBLOCK_BYTES - 4, 0);
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes and checks one superblock copy.
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
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let _flags = d.u32()?;
        let pool_uuid = d.array()?;
        let pool_name = d.name()?;
        let member = d.u16()?;
        let layout = Layout {
            members: d.u16()?,
            chunk_bytes: d.u32()?,
            chunks_per_member: d.u32()?,
            meta_bytes: d.u64()?,
            checkpoint_bytes: d.u64()?,
            journal_bytes: d.u64()?,
        };
        check_layout(&layout, member)?;
        Ok(Superblock {
            pool_uuid,
            pool_name,
            member,
            layout,
        })
    }
}

fn check_layout(layout: &Layout, member: u16) -> Result<(), FormatError> {
    let chunk = u64::from(layout.chunk_bytes);
    let sane = layout.chunk_bytes.is_power_of_two()
        && layout.chunk_bytes >= 4096
        && layout.members > 0
        && member < layout.members
        && layout.chunks_per_member > 0
        && (layout.chunks_per_member as u64 * layout.members as u64) < u64::from(u32::MAX)
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
            layout: Layout::plan(2, 256 << 20, 1 << 20).unwrap(),
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
        assert_eq!(layout.chunks_per_member, 252);
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
        newer[8] = 2;
        let crc = crc32c::crc32c(&newer[..SUPERBLOCK_BYTES - 4]);
        newer[SUPERBLOCK_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Superblock::decode(&newer),
            Err(FormatError::UnsupportedVersion(2))
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
