//! Compression of a volume's data: what a compressed volume's 64 KiB
//! units become on the devices (an extent of whole 4 KiB sectors, see
//! `extents`), and back.
//!
//! A unit is stored compressed only when that saves at least one sector;
//! otherwise as it came (data that does not compress costs one failed
//! attempt, not a larger extent). What this module does not do: choose
//! where extents go or encrypt them (the pool does, compression first:
//! ciphertext does not compress).

use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Bytes of a compression unit: the granule a compressed volume's writes
/// are read, modified, compressed and placed in.
pub const UNIT_BYTES: u64 = 64 * 1024;
/// Bytes of an extent's sector: extents are whole sectors.
pub const SECTOR_BYTES: u64 = 4096;

/// zstd's level: its default, the usual trade of ratio for speed.
const ZSTD_LEVEL: i32 = 3;

/// A volume's compression algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Stored as written.
    #[default]
    None,
    /// LZ4 (block format): fast, a modest ratio.
    Lz4,
    /// Zstandard at level 3: slower, a better ratio.
    Zstd,
}

impl Compression {
    /// Its code in records and extents (0 none, 1 lz4, 2 zstd).
    pub fn code(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => 1,
            Compression::Zstd => 2,
        }
    }

    /// The algorithm of a code, if it names one.
    pub fn from_code(code: u8) -> Option<Compression> {
        match code {
            0 => Some(Compression::None),
            1 => Some(Compression::Lz4),
            2 => Some(Compression::Zstd),
            _ => None,
        }
    }

    /// Its name as the CLI and API spell it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    /// Compresses a unit's bytes; None when that would not save a sector
    /// (the unit is then stored as it is).
    pub fn compress(self, unit: &[u8]) -> Option<Vec<u8>> {
        let packed = match self {
            Compression::None => return None,
            Compression::Lz4 => lz4_flex::block::compress(unit),
            Compression::Zstd => zstd::bulk::compress(unit, ZSTD_LEVEL).ok()?,
        };
        let saves_a_sector = sectors_for(packed.len() as u64) < sectors_for(unit.len() as u64);
        saves_a_sector.then_some(packed)
    }

    /// Expands `packed` into `unit`, which it must fill exactly.
    pub fn decompress(self, packed: &[u8], unit: &mut [u8]) -> Result<(), CorruptExtent> {
        let written = match self {
            Compression::None => return Err(CorruptExtent("no algorithm".into())),
            Compression::Lz4 => lz4_flex::block::decompress_into(packed, unit)
                .map_err(|e| CorruptExtent(e.to_string()))?,
            Compression::Zstd => zstd::bulk::decompress_to_buffer(packed, unit)
                .map_err(|e| CorruptExtent(e.to_string()))?,
        };
        if written != unit.len() {
            return Err(CorruptExtent(format!(
                "{written} bytes where the unit has {}",
                unit.len()
            )));
        }
        Ok(())
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compression {
    type Err = String;

    fn from_str(text: &str) -> Result<Compression, String> {
        match text {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(format!(
                "compression '{other}' is not one weft knows: use lz4, zstd or none"
            )),
        }
    }
}

/// Sectors `bytes` take.
pub fn sectors_for(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(SECTOR_BYTES)).expect("an extent is at most a unit")
}

/// A compressed extent that does not expand to its unit: the devices
/// returned other bytes than were written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("a compressed extent does not expand: {0}")]
pub struct CorruptExtent(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(fill: impl FnMut(usize) -> u8) -> Vec<u8> {
        (0..UNIT_BYTES as usize).map(fill).collect()
    }

    #[test]
    fn compressible_units_shrink_and_expand_back() {
        let text = unit(|i| b"weft stores blocks "[i % 19]);
        for algorithm in [Compression::Lz4, Compression::Zstd] {
            let packed = algorithm.compress(&text).expect("text compresses");
            assert!(sectors_for(packed.len() as u64) <= 2, "{algorithm}");
            let mut back = vec![0; text.len()];
            algorithm.decompress(&packed, &mut back).unwrap();
            assert_eq!(back, text);
        }
    }

    #[test]
    fn random_units_are_stored_as_they_are() {
        let mut rng = crate::testing::Rng(0x2545_f491_4f6c_dd1d);
        let noise = unit(|_| rng.next_u64() as u8);
        assert_eq!(Compression::Lz4.compress(&noise), None);
        assert_eq!(Compression::Zstd.compress(&noise), None);
        assert_eq!(Compression::None.compress(&unit(|_| 0)), None);
    }

    #[test]
    fn damaged_extents_are_errors_not_panics() {
        let text = unit(|i| (i / 100) as u8);
        for algorithm in [Compression::Lz4, Compression::Zstd] {
            let mut packed = algorithm.compress(&text).unwrap();
            let mut back = vec![0; text.len()];
            packed.truncate(packed.len() / 2);
            assert!(algorithm.decompress(&packed, &mut back).is_err());
            let mut short = vec![0; text.len() / 2];
            assert!(algorithm
                .decompress(&algorithm.compress(&text).unwrap(), &mut short)
                .is_err());
        }
    }

    #[test]
    fn names_parse_back_and_strangers_are_refused_with_the_choices() {
        for algorithm in [Compression::None, Compression::Lz4, Compression::Zstd] {
            assert_eq!(algorithm.name().parse::<Compression>(), Ok(algorithm));
            assert_eq!(Compression::from_code(algorithm.code()), Some(algorithm));
        }
        let error = "gzip".parse::<Compression>().unwrap_err();
        assert!(error.contains("lz4, zstd or none"), "{error}");
        assert_eq!(Compression::from_code(3), None);
    }
}
