//! The compressed volumes' part of the state machine: their extents by
//! unit, the sectors each segment still has referenced, the three records
//! that change them and their section of a checkpoint.
//!
//! A segment is a chunk held (one reference in the chunk counts) from the
//! moment the pool opens it to fill it (at replay: from the first record
//! naming it) until no reference to its sectors is left and the pool no
//! longer fills it; then it is released as any chunk is (free once the
//! releasing record is durable). What this module does not do:
//! I/O, or deciding where an extent goes (the pool does, and records it).

use super::{inconsistent, CheckpointError, Inconsistent, PoolState};
use crate::codec::{Decoder, Encoder};
use crate::compression::{Compression, SECTOR_BYTES};
use crate::extents::{
    decode_extent, decode_map, encode_extent, encode_map, units_for, Extent, ExtentMap,
    ENCODED_EXTENT_BYTES,
};
use crate::format::FormatError;
use std::collections::BTreeMap;

impl PoolState {
    /// Whether any volume is compressed or any map holds extents (the
    /// checkpoint then has a compression section).
    pub(super) fn has_compression(&self) -> bool {
        self.extent_refs > 0
            || self
                .volumes
                .values()
                .any(|v| v.compression != Compression::None)
    }

    /// Sectors of a segment.
    pub fn segment_sectors(&self) -> u32 {
        u32::try_from((1u64 << self.chunk_shift) / SECTOR_BYTES).expect("units are at most 1 GiB")
    }

    /// Takes a free chunk as the segment to fill from now on (the one
    /// before is closed). None when no chunk is free (the one before is
    /// then kept: the cleaner may still fill what is left of it).
    pub fn open_segment(&mut self) -> Option<u32> {
        let chunk = self.allocate()?;
        self.close_segment();
        self.add_ref(chunk).expect("a free chunk is in the pool");
        self.segments.insert(chunk, 0);
        self.open_segment = Some(chunk);
        Some(chunk)
    }

    /// Stops filling the open segment: released if nothing in it is
    /// referenced.
    pub fn close_segment(&mut self) {
        if let Some(chunk) = self.open_segment.take() {
            if self.segments.get(&chunk) == Some(&0) {
                self.segments.remove(&chunk);
                self.unref(chunk);
            }
        }
    }

    /// The segment being filled, if any.
    pub fn filling(&self) -> Option<u32> {
        self.open_segment
    }

    /// Whether the segment being filled holds nothing referenced.
    pub fn filling_unreferenced(&self) -> bool {
        self.open_segment
            .is_some_and(|chunk| self.segments.get(&chunk) == Some(&0))
    }

    /// Segments other than the one being filled, with their referenced
    /// sectors (the cleaner's choice).
    pub fn closed_segments(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.segments
            .iter()
            .filter(|(chunk, _)| Some(**chunk) != self.open_segment)
            .map(|(&chunk, &sectors)| (chunk, sectors))
    }

    /// Chunks held as segments.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Every distinct extent in segment `chunk`, by first sector, from
    /// every volume's and snapshot's map.
    pub fn extents_in(&self, chunk: u32) -> Vec<Extent> {
        let mut found: Vec<Extent> = self
            .volumes
            .values()
            .flat_map(|v| {
                std::iter::once(&v.extents).chain(v.snapshots.values().map(|s| &s.extents))
            })
            .flat_map(|map| map.values())
            .filter(|e| e.chunk == chunk)
            .copied()
            .collect();
        found.sort_by_key(|e| e.sector);
        found.dedup_by_key(|e| e.sector);
        found
    }

    pub(super) fn set_compression(
        &mut self,
        volume: &str,
        compression: Compression,
    ) -> Result<(), Inconsistent> {
        let v = self.volume_mut(volume)?;
        if v.mapped_chunks != 0 || v.thick {
            return Err(inconsistent(format!(
                "volume {volume} compressed while it maps chunks"
            )));
        }
        if compression == Compression::None && !v.extents.is_empty() {
            return Err(inconsistent(format!(
                "volume {volume} uncompressed while it holds extents"
            )));
        }
        v.compression = compression;
        Ok(())
    }

    pub(super) fn set_extents(
        &mut self,
        volume: &str,
        extents: &[(u32, Option<Extent>)],
    ) -> Result<(), Inconsistent> {
        let v = self.volume(volume)?;
        if v.compression == Compression::None {
            return Err(inconsistent(format!(
                "extents for volume {volume}, which is not compressed"
            )));
        }
        let units = units_for(v.size_bytes);
        for (unit, extent) in extents {
            if *unit >= units {
                return Err(inconsistent(format!("extent beyond volume {volume}")));
            }
            // The new reference first: a unit rewritten into the segment
            // it was in must not release that segment in between.
            if let Some(extent) = extent {
                self.ref_extent(extent)?;
            }
            let map = &mut self.volume_mut(volume)?.extents;
            let old = match extent {
                Some(extent) => map.insert(*unit, *extent),
                None => map.remove(unit),
            };
            if let Some(old) = old {
                self.unref_extent(&old);
            }
        }
        Ok(())
    }

    pub(super) fn move_extents(
        &mut self,
        from: u32,
        moves: &[(u32, u32, u32)],
    ) -> Result<(), Inconsistent> {
        let moves: BTreeMap<u32, (u32, u32)> = moves
            .iter()
            .map(|&(old, chunk, sector)| (old, (chunk, sector)))
            .collect();
        let mut moved = Vec::new();
        for volume in self.volumes.values_mut() {
            let maps = std::iter::once(&mut volume.extents)
                .chain(volume.snapshots.values_mut().map(|s| &mut s.extents));
            for map in maps {
                for extent in map.values_mut().filter(|e| e.chunk == from) {
                    let Some(&(chunk, sector)) = moves.get(&extent.sector) else {
                        continue;
                    };
                    let copy = Extent {
                        chunk,
                        sector,
                        ..*extent
                    };
                    moved.push((*extent, copy));
                    *extent = copy;
                }
            }
        }
        for (_, copy) in &moved {
            self.ref_extent(copy)?;
        }
        for (old, _) in &moved {
            self.unref_extent(old);
        }
        Ok(())
    }

    pub(super) fn ref_extents(&mut self, map: &ExtentMap) -> Result<(), Inconsistent> {
        map.values().try_for_each(|extent| self.ref_extent(extent))
    }

    pub(super) fn unref_extents(&mut self, map: &ExtentMap) {
        for extent in map.values() {
            self.unref_extent(extent);
        }
    }

    fn ref_extent(&mut self, extent: &Extent) -> Result<(), Inconsistent> {
        if extent.chunk >= self.chunks() || !extent.fits(self.segment_sectors()) {
            return Err(inconsistent(format!(
                "extent {extent:?} outside its segment or the pool"
            )));
        }
        if !self.segments.contains_key(&extent.chunk) {
            if self.refcount(extent.chunk) != 0 {
                return Err(inconsistent(format!(
                    "chunk {} holds extents while in use",
                    extent.chunk
                )));
            }
            self.add_ref(extent.chunk)?;
            self.segments.insert(extent.chunk, 0);
        }
        *self.segments.get_mut(&extent.chunk).expect("held") += u64::from(extent.sectors());
        self.extent_refs += 1;
        Ok(())
    }

    fn unref_extent(&mut self, extent: &Extent) {
        let sectors = self
            .segments
            .get_mut(&extent.chunk)
            .expect("an extent's segment is held");
        *sectors = sectors
            .checked_sub(u64::from(extent.sectors()))
            .expect("a segment released more sectors than referenced");
        self.extent_refs -= 1;
        if *sectors == 0 && self.open_segment != Some(extent.chunk) {
            self.segments.remove(&extent.chunk);
            self.unref(extent.chunk);
        }
    }

    /// An upper bound of the compression section's bytes.
    pub(super) fn compression_len_bound(&self) -> u64 {
        if !self.has_compression() {
            return 0;
        }
        let objects = self.volumes.len() as u64
            + self
                .volumes
                .values()
                .map(|v| v.snapshots.len() as u64)
                .sum::<u64>();
        4 + objects * 80 + ENCODED_EXTENT_BYTES * self.extent_refs
    }

    /// The checkpoint's compression section: each compressed volume (or
    /// one holding extents) with its algorithm, its extents and its
    /// snapshots' extents.
    pub(super) fn encode_compression(&self, e: &mut Encoder) {
        let volumes: Vec<_> = self
            .volumes
            .values()
            .filter(|v| {
                v.compression != Compression::None
                    || !v.extents.is_empty()
                    || v.snapshots.values().any(|s| !s.extents.is_empty())
            })
            .collect();
        e.u32(volumes.len() as u32);
        for volume in volumes {
            e.name(&volume.name);
            e.u8(volume.compression.code());
            encode_map(e, &volume.extents);
            let snapshots: Vec<_> = volume
                .snapshots
                .iter()
                .filter(|(_, s)| !s.extents.is_empty())
                .collect();
            e.u32(snapshots.len() as u32);
            for (name, snapshot) in snapshots {
                e.name(name);
                encode_map(e, &snapshot.extents);
            }
        }
    }

    pub(super) fn decode_compression(
        &mut self,
        d: &mut Decoder<'_>,
    ) -> Result<(), CheckpointError> {
        for _ in 0..d.u32()? {
            let name = d.name()?;
            let compression = Compression::from_code(d.u8()?)
                .ok_or(FormatError::Malformed("unknown compression"))?;
            let extents = decode_map(d)?;
            self.check_units(&name, &extents)?;
            self.ref_extents(&extents)?;
            let volume = self.volume_mut(&name)?;
            volume.compression = compression;
            volume.extents = extents;
            for _ in 0..d.u32()? {
                let snapshot = d.name()?;
                let extents = decode_map(d)?;
                self.check_units(&name, &extents)?;
                self.ref_extents(&extents)?;
                self.volume_mut(&name)?
                    .snapshots
                    .get_mut(&snapshot)
                    .ok_or_else(|| inconsistent(format!("no snapshot {name}@{snapshot}")))?
                    .extents = extents;
            }
        }
        Ok(())
    }

    fn check_units(&self, volume: &str, extents: &ExtentMap) -> Result<(), Inconsistent> {
        let units = units_for(self.volume(volume)?.size_bytes);
        match extents.keys().next_back() {
            Some(&last) if last >= units => {
                Err(inconsistent(format!("extent beyond volume {volume}")))
            }
            _ => Ok(()),
        }
    }
}

pub(super) fn encode_set_extents(e: &mut Encoder, extents: &[(u32, Option<Extent>)]) {
    e.u32(extents.len() as u32);
    for (unit, extent) in extents {
        match extent {
            Some(extent) => {
                e.u8(1);
                encode_extent(e, *unit, extent);
            }
            None => {
                e.u8(0);
                e.u32(*unit);
            }
        }
    }
}

pub(super) fn decode_set_extents(
    d: &mut Decoder<'_>,
) -> Result<Vec<(u32, Option<Extent>)>, FormatError> {
    let mut extents = Vec::new();
    for _ in 0..d.u32()? {
        extents.push(match d.flag()? {
            true => {
                let (unit, extent) = decode_extent(d)?;
                (unit, Some(extent))
            }
            false => (d.u32()?, None),
        });
    }
    Ok(extents)
}

pub(super) fn encode_moves(e: &mut Encoder, moves: &[(u32, u32, u32)]) {
    e.u32(moves.len() as u32);
    for &(from_sector, chunk, sector) in moves {
        e.u32(from_sector);
        e.u32(chunk);
        e.u32(sector);
    }
}

pub(super) fn decode_moves(d: &mut Decoder<'_>) -> Result<Vec<(u32, u32, u32)>, FormatError> {
    let mut moves = Vec::new();
    for _ in 0..d.u32()? {
        moves.push((d.u32()?, d.u32()?, d.u32()?));
    }
    Ok(moves)
}

#[cfg(test)]
mod tests {
    use super::super::Record;
    use super::*;

    fn hex(record: &Record) -> String {
        let mut e = Encoder::new();
        record.encode(&mut e);
        let bytes = e.into_bytes();
        assert_eq!(
            Record::decode(&mut Decoder::new(&bytes)).as_ref(),
            Ok(record),
            "decodes back"
        );
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn the_records_of_compressed_volumes_encode_as_documented() {
        let compression = Record::SetCompression {
            volume: "z".into(),
            compression: Compression::Lz4,
        };
        assert_eq!(hex(&compression), "0c017a01");
        let extents = Record::SetExtents {
            volume: "z".into(),
            extents: vec![
                (
                    2,
                    Some(Extent {
                        chunk: 5,
                        sector: 3,
                        stored_bytes: 0x10000,
                        codec: Compression::None,
                    }),
                ),
                (4, None),
            ],
        };
        assert_eq!(
            hex(&extents),
            "0d017a02000000".to_string() + "010200000005000000030000000000010000" + "0004000000"
        );
        let moves = Record::MoveExtents {
            from: 9,
            moves: vec![(1, 7, 2)],
        };
        assert_eq!(hex(&moves), "0e0900000001000000010000000700000002000000");
    }

    #[test]
    fn a_state_with_compressed_volumes_survives_its_checkpoint() {
        let mut state = PoolState::new(16, 16);
        state
            .apply(&Record::CreateVolume {
                id: [1; 16],
                name: "z".into(),
                size_bytes: 1 << 20,
                block_size: 4096,
                thick: false,
                runs: Vec::new(),
                key: None,
            })
            .unwrap();
        state
            .apply(&Record::SetCompression {
                volume: "z".into(),
                compression: Compression::Zstd,
            })
            .unwrap();
        let extent = |sector| Extent {
            chunk: 3,
            sector,
            stored_bytes: 5000,
            codec: Compression::Zstd,
        };
        let set = Record::SetExtents {
            volume: "z".into(),
            extents: vec![(0, Some(extent(0))), (1, Some(extent(2)))],
        };
        state.apply(&set).unwrap();
        state
            .apply(&Record::CreateSnapshot {
                volume: "z".into(),
                name: "s".into(),
                id: [2; 16],
            })
            .unwrap();
        assert_eq!(state.closed_segments().collect::<Vec<_>>(), vec![(3, 8)]);
        let bytes = state.encode();
        let back = PoolState::decode(&bytes, 16, 16).unwrap();
        assert_eq!(back.encode(), bytes);
        assert_eq!(back.closed_segments().collect::<Vec<_>>(), vec![(3, 8)]);
        assert_eq!(back.refcount(3), 1);
        // A chunk mapped by an extent while another volume maps it is corrupt.
        let mut bad = PoolState::new(16, 16);
        bad.apply(&Record::CreateVolume {
            id: [1; 16],
            name: "z".into(),
            size_bytes: 1 << 20,
            block_size: 4096,
            thick: false,
            runs: vec![super::super::Run {
                logical: 0,
                physical: 3,
                len: 1,
            }],
            key: None,
        })
        .unwrap();
        assert!(bad
            .apply(&Record::SetCompression {
                volume: "z".into(),
                compression: Compression::Zstd,
            })
            .is_err());
    }
}
