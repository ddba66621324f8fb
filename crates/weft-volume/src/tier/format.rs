//! The bytes of a write tier: its superblock and a batch's header, each one
//! [`TIER_BLOCK_BYTES`] block, little-endian, sealed with a CRC-32C.
//! Decoding never panics on what a device returns; it says why a block is
//! not what it should be, and the log decides what that means (a superblock
//! copy to pass over, the end of the ring).
//!
//! Superblock (offsets in bytes), one for the device's rings:
//!
//! ```text
//!  0 magic "WEFTTIER"   8 version u32   12 block bytes u32   16 tier id [16]
//! 32 first ring's start u64 (8192)   40 bytes per ring u64   48 generation u64
//! 56 destaged order u64       64 opens u64   72 rings u32
//! 76 CRC-32C u32 (of 0..76 and the tails)
//! 80 each ring's tail, 16 bytes: offset u64, sequence u64
//! ```

//! Batch header:
//!
//! ```text
//!  0 magic "WEFTTLOG"   8 kind u32 (1 batch, 2 wrap)   12 extents u32
//! 16 tier id [16]      32 sequence u64    40 data bytes u64   48 data CRC u32
//! 52 header CRC u32 (of 0..52, 56..64 and the extents)   56 opens u64
//! 64 extents, 40 bytes each: volume id [16], blocks u32, first block u64,
//!    pool order u64, reserved u32
//! ```

use super::TIER_BLOCK_BYTES;

const BLOCK: usize = TIER_BLOCK_BYTES as usize;
const SUPER_MAGIC: &[u8; 8] = b"WEFTTIER";
const BATCH_MAGIC: &[u8; 8] = b"WEFTTLOG";
/// The format this code writes and reads.
pub const TIER_VERSION: u32 = 1;
const SUPER_FIXED_BYTES: usize = 80;
const SUPER_CRC_AT: usize = 76;
/// Where the first ring starts: after the two superblock copies.
pub const RINGS_START: u64 = 2 * TIER_BLOCK_BYTES;
const TAIL_BYTES: usize = 16;
/// The most rings a tier holds: as many tails as fit its superblock.
pub const RINGS_MAX: usize = (BLOCK - SUPER_FIXED_BYTES) / TAIL_BYTES;
/// The smallest ring, in blocks: a batch of one block, a wrap and the
/// block of room kept free.
pub const RING_BLOCKS_MIN: u64 = 4;
const HEADER_FIXED_BYTES: usize = 64;
const EXTENT_BYTES: usize = 40;
/// The most extents one batch holds: as many as fit its header block.
pub const EXTENTS_MAX: usize = (BLOCK - HEADER_FIXED_BYTES) / EXTENT_BYTES;

/// A tier's identity: written in every block it seals, so that another
/// tier's (or an earlier format's) leftovers never pass for its own.
pub type TierId = [u8; 16];

/// A volume's identity, as its pool's state has it: stable for the
/// volume's life, so that a batch written before a crash finds its volume
/// whatever was created or deleted since.
pub type VolumeId = [u8; 16];

/// The tier superblock: where the rings are, where each one's oldest live
/// batch starts, and up to which pool-wide order every write is destaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// The tier's identity.
    pub id: TierId,
    /// The first ring's first byte (the others follow it).
    pub ring_start: u64,
    /// Each ring's length.
    pub ring_bytes: u64,
    /// Counts the superblock's writes: the copy with the higher one is current.
    pub generation: u64,
    /// Every write of this pool order or lower is on the capacity devices:
    /// replay passes over them.
    pub destaged: u64,
    /// How many times the tier was opened (formatting counts as one): each
    /// batch carries the count it was written under, and a ring's chain
    /// never goes back to a lower one (a batch written before a crash and
    /// left beyond where replay stopped is never taken in later).
    pub opens: u64,
    /// Each ring's tail.
    pub tails: Vec<RingTail>,
}

/// Where a ring's oldest live batch starts, and its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingTail {
    /// Its offset on the device.
    pub offset: u64,
    /// Its sequence.
    pub seq: u64,
}

impl Superblock {
    /// Ring `ring`'s bytes on the device.
    pub fn ring(&self, ring: usize) -> std::ops::Range<u64> {
        let start = self.ring_start + ring as u64 * self.ring_bytes;
        start..start + self.ring_bytes
    }
}

/// What a batch header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    /// The tier's identity.
    pub id: TierId,
    /// The ring's sequence: one more than the batch before.
    pub seq: u64,
    /// The tier's opens when it was written ([`Superblock::opens`]).
    pub opens: u64,
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
    /// The volume.
    pub volume: VolumeId,
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

/// Whether `block` is a sealed tier superblock (of any tier).
pub fn is_superblock(block: &[u8]) -> bool {
    if block.len() < BLOCK || &block[0..8] != SUPER_MAGIC {
        return false;
    }
    let rings = get_u32(block, 72) as usize;
    (1..=RINGS_MAX).contains(&rings) && super_crc(block, rings) == get_u32(block, SUPER_CRC_AT)
}

impl Superblock {
    /// The block. Panics on more than [`RINGS_MAX`] rings (checked at format).
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.tails.len() <= RINGS_MAX, "a superblock's tails");
        let mut block = vec![0; BLOCK];
        block[0..8].copy_from_slice(SUPER_MAGIC);
        put_u32(&mut block, 8, TIER_VERSION);
        put_u32(&mut block, 12, TIER_BLOCK_BYTES as u32);
        block[16..32].copy_from_slice(&self.id);
        put_u64(&mut block, 32, self.ring_start);
        put_u64(&mut block, 40, self.ring_bytes);
        put_u64(&mut block, 48, self.generation);
        put_u64(&mut block, 56, self.destaged);
        put_u64(&mut block, 64, self.opens);
        put_u32(&mut block, 72, self.tails.len() as u32);
        for (i, tail) in self.tails.iter().enumerate() {
            let at = SUPER_FIXED_BYTES + i * TAIL_BYTES;
            put_u64(&mut block, at, tail.offset);
            put_u64(&mut block, at + 8, tail.seq);
        }
        let crc = super_crc(&block, self.tails.len());
        put_u32(&mut block, SUPER_CRC_AT, crc);
        block
    }

    /// Decodes a superblock of the tier `id` on a device of `device_bytes`.
    pub fn decode(block: &[u8], id: &TierId, device_bytes: u64) -> Result<Superblock, Invalid> {
        if block.len() < BLOCK || &block[0..8] != SUPER_MAGIC {
            return Err(Invalid::Magic);
        }
        let rings = get_u32(block, 72) as usize;
        if rings == 0 || rings > RINGS_MAX {
            return Err(Invalid::Field(format!("{rings} rings")));
        }
        if super_crc(block, rings) != get_u32(block, SUPER_CRC_AT) {
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
        let tails = (0..rings)
            .map(|i| {
                let at = SUPER_FIXED_BYTES + i * TAIL_BYTES;
                RingTail {
                    offset: get_u64(block, at),
                    seq: get_u64(block, at + 8),
                }
            })
            .collect();
        let sb = Superblock {
            id: *id,
            ring_start: get_u64(block, 32),
            ring_bytes: get_u64(block, 40),
            generation: get_u64(block, 48),
            destaged: get_u64(block, 56),
            opens: get_u64(block, 64),
            tails,
        };
        let aligned = |v: u64| v.is_multiple_of(TIER_BLOCK_BYTES);
        let end = sb
            .ring_bytes
            .checked_mul(rings as u64)
            .and_then(|all| all.checked_add(sb.ring_start));
        let sane = sb.ring_start == RINGS_START
            && aligned(sb.ring_bytes)
            && sb.ring_bytes >= RING_BLOCKS_MIN * TIER_BLOCK_BYTES
            && end.is_some_and(|end| end <= device_bytes)
            && sb
                .tails
                .iter()
                .enumerate()
                .all(|(i, t)| aligned(t.offset) && sb.ring(i).contains(&t.offset));
        if !sane {
            return Err(Invalid::Field(format!(
                "{rings} rings of {} bytes from {}, or a tail outside its ring, on a device of {device_bytes} bytes",
                sb.ring_bytes, sb.ring_start
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
        put_u64(&mut block, 56, self.opens);
        put_u64(&mut block, 40, self.kind.data_bytes());
        put_u32(&mut block, 48, data_crc);
        for (i, e) in extents.iter().enumerate() {
            let at = HEADER_FIXED_BYTES + i * EXTENT_BYTES;
            block[at..at + 16].copy_from_slice(&e.volume);
            put_u32(&mut block, at + 16, e.blocks);
            put_u64(&mut block, at + 20, e.first_block);
            put_u64(&mut block, at + 28, e.pool_order);
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
                            volume: block[at..at + 16].try_into().expect("sixteen bytes"),
                            blocks: get_u32(block, at + 16),
                            first_block: get_u64(block, at + 20),
                            pool_order: get_u64(block, at + 28),
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
        let header = BatchHeader {
            id: *id,
            seq,
            opens: get_u64(block, 56),
            kind,
        };
        if header.kind.data_bytes() != get_u64(block, 40) {
            return Err(Invalid::Field("data length".into()));
        }
        Ok(header)
    }
}

fn super_crc(block: &[u8], rings: usize) -> u32 {
    let crc = crc32c::crc32c(&block[..SUPER_CRC_AT]);
    let end = SUPER_FIXED_BYTES + rings * TAIL_BYTES;
    crc32c::crc32c_append(crc, &block[SUPER_FIXED_BYTES..end])
}

fn header_crc(block: &[u8], extents: usize) -> u32 {
    let crc = crc32c::crc32c(&block[..52]);
    let end = HEADER_FIXED_BYTES + extents * EXTENT_BYTES;
    crc32c::crc32c_append(crc, &block[56..end])
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
            ring_bytes: 1 << 16,
            generation: 3,
            destaged: 40,
            opens: 5,
            tails: vec![
                RingTail {
                    offset: 12288,
                    seq: 7,
                },
                RingTail {
                    offset: 8192 + (1 << 16),
                    seq: 1,
                },
            ],
        }
    }

    #[test]
    fn a_superblock_is_laid_out_as_documented_and_decodes_back() {
        let block = superblock().encode();
        assert_eq!(
            hex(&block[..112]),
            concat!(
                "5745465454494552",
                "01000000",
                "00100000",
                "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5",
                "0020000000000000",
                "0000010000000000",
                "0300000000000000",
                "2800000000000000",
                "0500000000000000",
                "02000000",
            )
            .to_string()
                + &hex(&block[76..80])
                + concat!(
                    "0030000000000000",
                    "0700000000000000",
                    "0020010000000000",
                    "0100000000000000",
                )
        );
        let crc = crc32c::crc32c_append(crc32c::crc32c(&block[..76]), &block[80..112]);
        assert_eq!(block[76..80], crc.to_le_bytes());
        assert!(block[112..].iter().all(|&b| b == 0));
        assert_eq!(Superblock::decode(&block, &ID, 1 << 18), Ok(superblock()));
        assert!(is_superblock(&block), "whatever the tier");
        let mut torn = block.clone();
        torn[100] ^= 1;
        assert!(!is_superblock(&torn) && !is_superblock(&[0; BLOCK]));
    }

    #[test]
    fn a_superblock_torn_of_another_tier_or_beyond_its_device_is_refused() {
        let block = superblock().encode();
        let mut torn = block.clone();
        torn[90] ^= 1;
        assert_eq!(Superblock::decode(&torn, &ID, 1 << 18), Err(Invalid::Crc));
        assert_eq!(
            Superblock::decode(&block, &[0; 16], 1 << 18),
            Err(Invalid::OtherTier)
        );
        assert!(matches!(
            Superblock::decode(&block, &ID, 1 << 17),
            Err(Invalid::Field(_))
        ));
        assert_eq!(
            Superblock::decode(&[0; BLOCK], &ID, 1 << 18),
            Err(Invalid::Magic)
        );
        let mut outside = superblock();
        outside.tails[0].offset = 8192 + (1 << 16);
        assert!(matches!(
            Superblock::decode(&outside.encode(), &ID, 1 << 18),
            Err(Invalid::Field(_))
        ));
        assert_eq!(RINGS_MAX, 251);
    }

    #[test]
    fn a_batch_header_seals_its_extents_and_decodes_back() {
        let header = BatchHeader {
            id: ID,
            seq: 9,
            opens: 2,
            kind: BatchKind::Data {
                extents: vec![
                    Extent {
                        volume: [2; 16],
                        first_block: 0x10,
                        blocks: 3,
                        pool_order: 41,
                    },
                    Extent {
                        volume: [5; 16],
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
            hex(&block[56..64 + 2 * EXTENT_BYTES]),
            concat!(
                "0200000000000000",
                "02020202020202020202020202020202",
                "03000000",
                "1000000000000000",
                "2900000000000000",
                "00000000",
                "05050505050505050505050505050505",
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
            opens: 1,
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
        assert_eq!(EXTENTS_MAX, 100);
    }
}
