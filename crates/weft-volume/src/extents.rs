//! Where a compressed volume's units are: an extent per unit written, in
//! *segments* (allocation units filled one after the other and never
//! overwritten in place), and how many sectors of each segment are still
//! referenced.
//!
//! A write places a unit's new extent in the open segment and releases the
//! old one; a segment whose sectors are no longer referenced is free again
//! (once the record that released them is durable, as any chunk), and the
//! cleaner moves what is left of sparse segments so that they can be. A
//! snapshot or clone shares extents: each reference counts. What this
//! module does not do: I/O, or choosing segments (the pool does).

use crate::codec::{Decoder, Encoder};
use crate::compression::{sectors_for, Compression, SECTOR_BYTES, UNIT_BYTES};
use crate::format::FormatError;
use std::collections::BTreeMap;

/// Where one unit of a compressed volume is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The segment: a physical allocation unit.
    pub chunk: u32,
    /// Its first sector within the segment.
    pub sector: u32,
    /// Bytes stored: the compressed length, or a whole unit.
    pub stored_bytes: u32,
    /// How: [`Compression::None`] for a unit stored as it came.
    pub codec: Compression,
}

impl Extent {
    /// Sectors it takes.
    pub fn sectors(&self) -> u32 {
        sectors_for(u64::from(self.stored_bytes))
    }

    /// Whether it is well formed in a segment of `chunk_sectors` sectors: a
    /// unit stored as it came is a whole unit, a compressed one smaller.
    pub fn fits(&self, chunk_sectors: u32) -> bool {
        let length_ok = match self.codec {
            Compression::None => u64::from(self.stored_bytes) == UNIT_BYTES,
            _ => self.stored_bytes > 0 && u64::from(self.stored_bytes) < UNIT_BYTES,
        };
        length_ok
            && self
                .sector
                .checked_add(self.sectors())
                .is_some_and(|end| end <= chunk_sectors)
    }

    /// Byte offset of its first sector within its segment.
    pub fn offset_in_chunk(&self) -> u64 {
        u64::from(self.sector) * SECTOR_BYTES
    }
}

/// A volume's or snapshot's extents, by unit.
pub type ExtentMap = BTreeMap<u32, Extent>;

/// Bytes one extent takes in a record or checkpoint.
pub const ENCODED_EXTENT_BYTES: u64 = 17;

/// Appends one extent (its unit first).
pub fn encode_extent(e: &mut Encoder, unit: u32, extent: &Extent) {
    e.u32(unit);
    e.u32(extent.chunk);
    e.u32(extent.sector);
    e.u32(extent.stored_bytes);
    e.u8(extent.codec.code());
}

/// Decodes one extent and its unit (its fit is the state's to check).
pub fn decode_extent(d: &mut Decoder<'_>) -> Result<(u32, Extent), FormatError> {
    let unit = d.u32()?;
    let extent = Extent {
        chunk: d.u32()?,
        sector: d.u32()?,
        stored_bytes: d.u32()?,
        codec: Compression::from_code(d.u8()?)
            .ok_or(FormatError::Malformed("unknown compression"))?,
    };
    Ok((unit, extent))
}

/// Appends a whole map.
pub fn encode_map(e: &mut Encoder, map: &ExtentMap) {
    e.u32(map.len() as u32);
    for (unit, extent) in map {
        encode_extent(e, *unit, extent);
    }
}

/// Decodes a whole map.
pub fn decode_map(d: &mut Decoder<'_>) -> Result<ExtentMap, FormatError> {
    let mut map = ExtentMap::new();
    for _ in 0..d.u32()? {
        let (unit, extent) = decode_extent(d)?;
        if map.insert(unit, extent).is_some() {
            return Err(FormatError::Malformed("a unit mapped twice"));
        }
    }
    Ok(map)
}

/// Units of a volume of `size_bytes`.
pub fn units_for(size_bytes: u64) -> u32 {
    u32::try_from(size_bytes.div_ceil(UNIT_BYTES)).expect("sizes are validated against the limit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extent_encodes_as_its_fields_in_order() {
        let extent = Extent {
            chunk: 7,
            sector: 0x20,
            stored_bytes: 0x1234,
            codec: Compression::Zstd,
        };
        let mut e = Encoder::new();
        encode_extent(&mut e, 3, &extent);
        let bytes = e.into_bytes();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "0300000007000000200000003412000002");
        assert_eq!(bytes.len() as u64, ENCODED_EXTENT_BYTES);
        assert_eq!(decode_extent(&mut Decoder::new(&bytes)), Ok((3, extent)));
    }

    #[test]
    fn extents_fit_their_segment_and_their_kind() {
        let raw = Extent {
            chunk: 0,
            sector: 0,
            stored_bytes: UNIT_BYTES as u32,
            codec: Compression::None,
        };
        assert!(raw.fits(16));
        assert!(!Extent { sector: 1, ..raw }.fits(16));
        assert!(!Extent {
            stored_bytes: 100,
            ..raw
        }
        .fits(16));
        let packed = Extent {
            sector: 15,
            stored_bytes: 4096,
            codec: Compression::Lz4,
            ..raw
        };
        assert!(packed.fits(16));
        assert!(!Extent {
            stored_bytes: 4097,
            ..packed
        }
        .fits(16));
        assert!(!Extent {
            stored_bytes: 0,
            ..packed
        }
        .fits(16));
        let mut e = Encoder::new();
        e.u32(2);
        encode_extent(&mut e, 1, &raw);
        encode_extent(&mut e, 1, &raw);
        assert!(decode_map(&mut Decoder::new(&e.into_bytes())).is_err());
    }
}
