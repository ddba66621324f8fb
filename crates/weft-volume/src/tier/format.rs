//! The bytes of a write tier: its superblock and a batch's header, each one
//! [`TIER_BLOCK_BYTES`] block, little-endian, sealed with a CRC-32C.
//! Decoding never panics on what a device returns; it says why a block is
//! not what it should be, and the log decides what that means (a superblock
//! copy to pass over, the end of the ring).
//!
//! Superblock (offsets in bytes):
//!
//! ```text
//!  0 magic "WEFTTIER"   8 version u32   12 block bytes u32   16 tier id [16]
//! 32 ring start u64    40 ring end u64  48 generation u64    56 tail u64
//! 64 tail sequence u64                  72 CRC-32C of 0..72 u32
//! ```
//!
//! Batch header:
//!
//! ```text
//!  0 magic "WEFTTLOG"   8 kind u32 (1 batch, 2 wrap)   12 extents u32
//! 16 tier id [16]      32 sequence u64    40 data bytes u64   48 data CRC u32
//! 52 header CRC u32 (of 0..52 and the extents)        56 reserved [8]
//! 64 extents, 28 bytes each: volume u32, blocks u32, first block u64,
//!    pool order u64, reserved u32
//! ```

use super::TIER_BLOCK_BYTES;

const BLOCK: usize = TIER_BLOCK_BYTES as usize;
const SUPER_MAGIC: &[u8; 8] = b"WEFTTIER";
const BATCH_MAGIC: &[u8; 8] = b"WEFTTLOG";
/// The format this code writes and reads.
pub const TIER_VERSION: u32 = 1;
const SUPER_SEALED_BYTES: usize = 72;
const HEADER_FIXED_BYTES: usize = 64;
const EXTENT_BYTES: usize = 28;
/// The most extents one batch holds: as many as fit its header block.
pub const EXTENTS_MAX: usize = (BLOCK - HEADER_FIXED_BYTES) / EXTENT_BYTES;

/// A tier's identity: written in every block it seals, so that another
/// tier's (or an earlier format's) leftovers never pass for its own.
pub type TierId = [u8; 16];

/// The tier superblock: where the ring is and where its oldest live batch
/// starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    /// The tier's identity.
    pub id: TierId,
    /// The ring's first byte.
    pub ring_start: u64,
    /// The byte after the ring's last.
    pub ring_end: u64,
    /// Counts the superblock's writes: the copy with the higher one is current.
    pub generation: u64,
    /// Where the oldest live batch starts.
    pub tail: u64,
    /// Its sequence.
    pub tail_seq: u64,
}

/// What a batch header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    /// The tier's identity.
    pub id: TierId,
    /// The ring's sequence: one more than the batch before.
    pub seq: u64,
    /// A batch of data, or a wrap (the ring goes on at its start).
    pub kind: BatchKind,
}

/// A batch's kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchKind {
    /// Extents of data, the data following the header in their order.
    Data {
        /// The extents.
        extents: Vec<Extent>,
        /// CRC-32C of the data.
        data_crc: u32,
    },
    /// Nothing more before the ring's end: the next batch is at its start.
    Wrap,
}

/// Consecutive blocks of one volume written by one host write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The volume's number in its pool.
    pub volume: u32,
    /// Its first block ([`TIER_BLOCK_BYTES`] each).
    pub first_block: u64,
    /// How many blocks.
    pub blocks: u32,
    /// The write's place in the pool's order of writes (the newer of two
    /// copies of a block is the one with the higher).
    pub pool_order: u64,
}

impl BatchKind {
    /// The bytes of data that follow the header.
    pub fn data_bytes(&self) -> u64 {
        match self {
            BatchKind::Data { extents, .. } => extents
                .iter()
                .map(|e| u64::from(e.blocks) * TIER_BLOCK_BYTES)
                .sum(),
            BatchKind::Wrap => 0,
        }
    }
}

/// Why a block is not a valid superblock or header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// Not this kind of block at all (never written, or something else).
    Magic,
    /// Its CRC does not match (torn or damaged).
    Crc,
    /// Sealed, but by another tier.
    OtherTier,
    /// Sealed, but says something impossible.
    Field(String),
}

impl Superblock {
    /// The block.
    pub fn encode(&self) -> Vec<u8> {
        let mut block = vec![0; BLOCK];
        block[0..8].copy_from_slice(SUPER_MAGIC);
        put_u32(&mut block, 8, TIER_VERSION);
        put_u32(&mut block, 12, TIER_BLOCK_BYTES as u32);
        block[16..32].copy_from_slice(&self.id);
        put_u64(&mut block, 32, self.ring_start);
        put_u64(&mut block, 40, self.ring_end);
        put_u64(&mut block, 48, self.generation);
        put_u64(&mut block, 56, self.tail);
        put_u64(&mut block, 64, self.tail_seq);
        let crc = crc32c::crc32c(&block[..SUPER_SEALED_BYTES]);
        put_u32(&mut block, SUPER_SEALED_BYTES, crc);
        block
    }

    /// Decodes a superblock of the tier `id` on a device of `device_bytes`.
    pub fn decode(block: &[u8], id: &TierId, device_bytes: u64) -> Result<Superblock, Invalid> {
        if block.len() < BLOCK || &block[0..8] != SUPER_MAGIC {
            return Err(Invalid::Magic);
        }
        if crc32c::crc32c(&block[..SUPER_SEALED_BYTES]) != get_u32(block, SUPER_SEALED_BYTES) {
            return Err(Invalid::Crc);
        }
        let version = get_u32(block, 8);
        if version != TIER_VERSION {
            return Err(Invalid::Field(format!(
                "format version {version} (this build reads {TIER_VERSION})"
            )));
        }
        if u64::from(get_u32(block, 12)) != TIER_BLOCK_BYTES {
            return Err(Invalid::Field("block size".into()));
        }
        if block[16..32] != id[..] {
            return Err(Invalid::OtherTier);
        }
        let sb = Superblock {
            id: *id,
            ring_start: get_u64(block, 32),
            ring_end: get_u64(block, 40),
            generation: get_u64(block, 48),
            tail: get_u64(block, 56),
            tail_seq: get_u64(block, 64),
        };
        let aligned = |v: u64| v.is_multiple_of(TIER_BLOCK_BYTES);
        let sane = aligned(sb.ring_start)
            && aligned(sb.ring_end)
            && aligned(sb.tail)
            && sb.ring_start >= 2 * TIER_BLOCK_BYTES
            && sb.ring_start < sb.ring_end
            && sb.ring_end <= device_bytes
            && (sb.ring_start..sb.ring_end).contains(&sb.tail);
        if !sane {
            return Err(Invalid::Field(format!(
                "ring {}..{} with its tail at {} on a device of {device_bytes} bytes",
                sb.ring_start, sb.ring_end, sb.tail
            )));
        }
        Ok(sb)
    }
}

impl BatchHeader {
    /// The header block. Panics on more than [`EXTENTS_MAX`] extents (the
    /// log checks before).
    pub fn encode(&self) -> Vec<u8> {
        let mut block = vec![0; BLOCK];
        block[0..8].copy_from_slice(BATCH_MAGIC);
        let (kind, extents, data_crc): (u32, &[Extent], u32) = match &self.kind {
            BatchKind::Data { extents, data_crc } => (1, extents, *data_crc),
            BatchKind::Wrap => (2, &[], 0),
        };
        assert!(extents.len() <= EXTENTS_MAX, "a header block's extents");
        put_u32(&mut block, 8, kind);
        put_u32(&mut block, 12, extents.len() as u32);
        block[16..32].copy_from_slice(&self.id);
        put_u64(&mut block, 32, self.seq);
        put_u64(&mut block, 40, self.kind.data_bytes());
        put_u32(&mut block, 48, data_crc);
        for (i, e) in extents.iter().enumerate() {
            let at = HEADER_FIXED_BYTES + i * EXTENT_BYTES;
            put_u32(&mut block, at, e.volume);
            put_u32(&mut block, at + 4, e.blocks);
            put_u64(&mut block, at + 8, e.first_block);
            put_u64(&mut block, at + 16, e.pool_order);
        }
        let crc = header_crc(&block, extents.len());
        put_u32(&mut block, 52, crc);
        block
    }

    /// Decodes the header of a batch of tier `id`.
    pub fn decode(block: &[u8], id: &TierId) -> Result<BatchHeader, Invalid> {
        if block.len() < BLOCK || &block[0..8] != BATCH_MAGIC {
            return Err(Invalid::Magic);
        }
        let count = get_u32(block, 12) as usize;
        if count > EXTENTS_MAX {
            return Err(Invalid::Field(format!("{count} extents")));
        }
        if header_crc(block, count) != get_u32(block, 52) {
            return Err(Invalid::Crc);
        }
        if block[16..32] != id[..] {
            return Err(Invalid::OtherTier);
        }
        let seq = get_u64(block, 32);
        let kind = match get_u32(block, 8) {
            1 => {
                let extents: Vec<Extent> = (0..count)
                    .map(|i| {
                        let at = HEADER_FIXED_BYTES + i * EXTENT_BYTES;
                        Extent {
                            volume: get_u32(block, at),
                            blocks: get_u32(block, at + 4),
                            first_block: get_u64(block, at + 8),
                            pool_order: get_u64(block, at + 16),
                        }
                    })
                    .collect();
                if extents.is_empty() || extents.iter().any(|e| e.blocks == 0) {
                    return Err(Invalid::Field("an empty extent".into()));
                }
                BatchKind::Data {
                    extents,
                    data_crc: get_u32(block, 48),
                }
            }
            2 if count == 0 => BatchKind::Wrap,
            kind => return Err(Invalid::Field(format!("batch kind {kind}"))),
        };
        let header = BatchHeader { id: *id, seq, kind };
        if header.kind.data_bytes() != get_u64(block, 40) {
            return Err(Invalid::Field("data length".into()));
        }
        Ok(header)
    }
}

fn header_crc(block: &[u8], extents: usize) -> u32 {
    let crc = crc32c::crc32c(&block[..52]);
    let end = HEADER_FIXED_BYTES + extents * EXTENT_BYTES;
    crc32c::crc32c_append(crc, &block[HEADER_FIXED_BYTES..end])
}

fn put_u32(block: &mut [u8], at: usize, value: u32) {
    block[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(block: &mut [u8], at: usize, value: u64) {
    block[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(block[at..at + 4].try_into().expect("four bytes"))
}

fn get_u64(block: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(block[at..at + 8].try_into().expect("eight bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: TierId = [0xA5; 16];

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn superblock() -> Superblock {
        Superblock {
            id: ID,
            ring_start: 8192,
            ring_end: 1 << 20,
            generation: 3,
            tail: 12288,
            tail_seq: 7,
        }
    }

    #[test]
    fn a_superblock_is_laid_out_as_documented_and_decodes_back() {
        let block = superblock().encode();
        assert_eq!(
            hex(&block[..76]),
            concat!(
                "5745465454494552",
                "01000000",
                "00100000",
                "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5",
                "0020000000000000",
                "0000100000000000",
                "0300000000000000",
                "0030000000000000",
                "0700000000000000",
            )
            .to_string()
                + &hex(&crc32c::crc32c(&block[..72]).to_le_bytes())
        );
        assert!(block[76..].iter().all(|&b| b == 0));
        assert_eq!(Superblock::decode(&block, &ID, 1 << 20), Ok(superblock()));
    }

    #[test]
    fn a_superblock_torn_of_another_tier_or_beyond_its_device_is_refused() {
        let block = superblock().encode();
        let mut torn = block.clone();
        torn[60] ^= 1;
        assert_eq!(Superblock::decode(&torn, &ID, 1 << 20), Err(Invalid::Crc));
        assert_eq!(
            Superblock::decode(&block, &[0; 16], 1 << 20),
            Err(Invalid::OtherTier)
        );
        assert!(matches!(
            Superblock::decode(&block, &ID, 1 << 19),
            Err(Invalid::Field(_))
        ));
        assert_eq!(
            Superblock::decode(&[0; BLOCK], &ID, 1 << 20),
            Err(Invalid::Magic)
        );
    }

    #[test]
    fn a_batch_header_seals_its_extents_and_decodes_back() {
        let header = BatchHeader {
            id: ID,
            seq: 9,
            kind: BatchKind::Data {
                extents: vec![
                    Extent {
                        volume: 2,
                        first_block: 0x10,
                        blocks: 3,
                        pool_order: 41,
                    },
                    Extent {
                        volume: 5,
                        first_block: 0,
                        blocks: 1,
                        pool_order: 42,
                    },
                ],
                data_crc: 0xDEAD_BEEF,
            },
        };
        let block = header.encode();
        assert_eq!(
            hex(&block[..52]),
            concat!(
                "57454654544c4f47",
                "01000000",
                "02000000",
                "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5",
                "0900000000000000",
                "0040000000000000",
                "efbeadde",
            )
        );
        assert_eq!(
            hex(&block[64..64 + 2 * EXTENT_BYTES]),
            concat!(
                "02000000",
                "03000000",
                "1000000000000000",
                "2900000000000000",
                "00000000",
                "05000000",
                "01000000",
                "0000000000000000",
                "2a00000000000000",
                "00000000",
            )
        );
        assert_eq!(BatchHeader::decode(&block, &ID), Ok(header));
        let mut torn = block.clone();
        torn[64 + EXTENT_BYTES] ^= 1;
        assert_eq!(BatchHeader::decode(&torn, &ID), Err(Invalid::Crc));
    }

    #[test]
    fn a_wrap_has_no_extents_and_a_header_past_its_room_is_refused() {
        let wrap = BatchHeader {
            id: ID,
            seq: 1,
            kind: BatchKind::Wrap,
        };
        assert_eq!(BatchHeader::decode(&wrap.encode(), &ID), Ok(wrap));
        let mut block = vec![0; BLOCK];
        block[0..8].copy_from_slice(BATCH_MAGIC);
        put_u32(&mut block, 12, u32::MAX);
        assert!(matches!(
            BatchHeader::decode(&block, &ID),
            Err(Invalid::Field(_))
        ));
        assert_eq!(EXTENTS_MAX, 144);
    }
}
