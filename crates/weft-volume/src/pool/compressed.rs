//! A compressed volume's I/O and the cleaner: each 64 KiB unit written is
//! compressed (when that saves a sector), encrypted if the volume is, and
//! placed in the open segment; the record naming its new extent is
//! written to the journal after the data is synced (a group of writes
//! together), so a crash leaves the unit's old extent or its new one,
//! never a mix. The journal is synced at the next flush: a write is
//! durable against a power cut once flushed (or written with FUA), as an
//! uncompressed volume's, and a killed process loses nothing
//! acknowledged. A write of part of a unit reads the rest
//! first. A unit of zeroes is stored as nothing (it reads as zeroes).
//!
//! On a pool with a write tier, a compressed volume's writes go to the
//! tier as any volume's (acknowledged from there) and are compressed when
//! destaged: the destage round places the units their blocks touch and
//! commits their records once its data is synced, before the tier lets
//! the blocks go. The room those units may take (a whole unit each, as
//! if none compressed) is kept when the write is accepted, so that a
//! destage never finds the pool full: a write that finds too little
//! settles the tier and runs the cleaner first, then is refused.
//!
//! The cleaner copies the extents still referenced in sparse segments
//! (ciphertext as it is: the tweak is the unit's place on the volume, not
//! on the device) and commits their new places; the emptied segment is
//! free once that is durable. What this module does not do: the data
//! plane's path (every I/O of a compressed volume reaches the pool through
//! the manager), or choosing an algorithm (the volume has one).

use super::{check_aligned, check_range, Pool};
use crate::compression::{sectors_for, Compression, SECTOR_BYTES, UNIT_BYTES};
use crate::crypt::VolumeCipher;
use crate::extents::{Extent, ExtentMap};
use crate::media::Media;
use crate::state::Record;
use crate::VolumeError;
use std::ops::Range;
use std::sync::Arc;

/// Units per `SetExtents` record, so that a record stays small.
const EXTENTS_PER_RECORD: usize = 4096;

/// How much a compressed volume stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressionUsage {
    /// Its algorithm.
    pub algorithm: Compression,
    /// Bytes of the units written (what they would take uncompressed).
    pub logical_bytes: u64,
    /// Bytes of the extents they take.
    pub stored_bytes: u64,
}

/// Free allocation units a writer leaves to the cleaner: with none left,
/// the cleaner could not move anything and a full pool would stay full.
pub(super) const CLEANER_RESERVE: u32 = 1;

/// Blocks of compressed volumes a destage round took from the write tier,
/// by volume and unit: (offset in the unit, plain bytes), in the order
/// taken.
pub(super) type Destaging = std::collections::BTreeMap<(String, u32), Vec<(u64, Vec<u8>)>>;

/// What a write or the cleaner placed on the devices and has not staged.
enum Placed {
    /// A volume's units in their new extents (None: nothing stored).
    Extents {
        volume: String,
        extents: Vec<(u32, Option<Extent>)>,
    },
    /// The cleaner's copies out of segment `from`: (sector there, chunk
    /// and sector of the copy).
    Moves {
        from: u32,
        moves: Vec<(u32, u32, u32)>,
    },
}

impl<M: Media> Pool<M> {
    /// Whether `name`'s data lives in extents.
    pub(super) fn is_compressed(&self, name: &str) -> bool {
        self.state
            .volumes
            .get(name)
            .is_some_and(|v| v.compression != Compression::None)
    }

    /// What a compressed volume stores; None for any other.
    pub fn compression_usage(&self, name: &str) -> Option<CompressionUsage> {
        let volume = self.state.volumes.get(name)?;
        (volume.compression != Compression::None).then(|| CompressionUsage {
            algorithm: volume.compression,
            logical_bytes: volume.extents.len() as u64 * UNIT_BYTES,
            stored_bytes: volume
                .extents
                .values()
                .map(|e| u64::from(e.sectors()) * SECTOR_BYTES)
                .sum(),
        })
    }

    /// Bytes of the allocation units holding compressed extents.
    pub fn segment_bytes(&self) -> u64 {
        self.state.segment_count() as u64 * u64::from(self.layout().chunk_bytes)
    }

    /// Takes blocks of compressed volume `name` at `start` from a destage
    /// round, as the write tier holds them (encrypted, if the volume is):
    /// kept by unit until the round syncs ([`Pool::place_destaged`]).
    pub(super) fn destage_compressed(
        &mut self,
        name: &str,
        start: u64,
        stored: &[u8],
    ) -> Result<(), VolumeError> {
        let mut plain = stored.to_vec();
        if let Some(cipher) = self.cipher(name)? {
            cipher.decrypt(start, &mut plain);
        }
        let end = start + plain.len() as u64;
        for unit in units_touched(start, plain.len() as u64) {
            let unit_start = u64::from(unit) * UNIT_BYTES;
            let (from, to) = (unit_start.max(start), (unit_start + UNIT_BYTES).min(end));
            let piece = plain[(from - start) as usize..(to - start) as usize].to_vec();
            self.destaging
                .entry((name.to_string(), unit))
                .or_default()
                .push((from - unit_start, piece));
        }
        Ok(())
    }

    /// Places the units a destage round took blocks of, each read (unless
    /// its blocks cover it) and placed once however many of its blocks the
    /// round holds, and stages their records.
    pub(super) fn place_destaged(&mut self) -> Result<(), VolumeError> {
        let units = std::mem::take(&mut self.destaging);
        // Room was kept for them when they were written (`tier_room`).
        self.check_checkpoint_room(2 * units.len() as u64)?;
        let mut placed: Option<Placed> = None;
        for ((name, unit), pieces) in units {
            if let Some(Placed::Extents { volume, .. }) = &placed {
                if *volume != name {
                    self.stage_placed(placed.as_mut().expect("a volume's"));
                    placed = None;
                }
            }
            let placed = placed.get_or_insert_with(|| Placed::Extents {
                volume: name.clone(),
                extents: Vec::new(),
            });
            let (compression, cipher) = (self.existing(&name)?.compression, self.cipher(&name)?);
            let start = u64::from(unit) * UNIT_BYTES;
            let covered = pieces
                .iter()
                .any(|(at, piece)| *at == 0 && piece.len() as u64 == UNIT_BYTES);
            let mut plain = match covered {
                true => vec![0; UNIT_BYTES as usize],
                false => {
                    let extent = self.existing(&name)?.extents.get(&unit).copied();
                    self.read_unit(&name, extent, cipher.as_deref(), start)?
                }
            };
            for (at, piece) in &pieces {
                plain[*at as usize..*at as usize + piece.len()].copy_from_slice(piece);
            }
            let result = self.place_unit(&name, unit, &plain, compression, &cipher, placed);
            if let Err(error) = result {
                self.stage_placed(placed);
                return Err(error);
            }
        }
        if let Some(placed) = placed.as_mut() {
            self.stage_placed(placed);
        }
        Ok(())
    }

    /// Writes `data` at `offset` of compressed volume `name`: its data
    /// synced and its records written when it returns, so that a killed
    /// process loses nothing; durable against a power cut at the next
    /// flush (as an uncompressed volume's write: the volatile write cache
    /// weft reports).
    pub(super) fn write_compressed(
        &mut self,
        name: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), VolumeError> {
        let result = self.write_compressed_staged(name, offset, data);
        self.commit_unsynced()?;
        result
    }

    /// Writes a group's writes of compressed volumes (each staged as it is
    /// placed, so that a later write's read of a unit finds an earlier
    /// one's): their results, in order, where `results` has None (the
    /// others are left alone).
    pub(super) fn write_compressed_group(
        &mut self,
        writes: &[super::GroupWrite<'_>],
        results: &mut [Option<Result<(), VolumeError>>],
    ) {
        let mut staged = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            if results[i].is_none() && self.is_compressed(w.volume) {
                results[i] = Some(self.write_compressed_staged(w.volume, w.offset, w.data));
                staged.push(i);
            }
        }
        // A commit made on the way (a segment closed on a full pool) may
        // have failed the pool: what was staged is then not to be trusted.
        if self.failed.is_some() || self.commit_unsynced().is_err() {
            for i in staged {
                results[i] = Some(Err(self.failed_error()));
            }
        }
    }

    /// Places `data`'s units and stages their records (committed by the
    /// caller): on error, what was placed before it is staged all the same
    /// (its range of the write is then undefined, as any failed write's).
    fn write_compressed_staged(
        &mut self,
        name: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), VolumeError> {
        self.check_usable()?;
        let volume = self.existing(name)?;
        check_range(volume, offset, data.len() as u64)?;
        let compression = volume.compression;
        let cipher = self.cipher(name)?;
        check_aligned(cipher.as_deref(), name, offset, data.len())?;
        let units = units_touched(offset, data.len() as u64);
        self.check_references(2 * u64::from(units.end - units.start))?;
        let mut placed = Placed::Extents {
            volume: name.to_string(),
            extents: Vec::new(),
        };
        let mut result = Ok(());
        for unit in units {
            let start = u64::from(unit) * UNIT_BYTES;
            let plain = match self.unit_with(name, cipher.as_deref(), start, offset, data) {
                Ok(plain) => plain,
                Err(error) => {
                    result = Err(error);
                    break;
                }
            };
            if let Err(error) =
                self.place_unit(name, unit, &plain, compression, &cipher, &mut placed)
            {
                result = Err(error);
                break;
            }
        }
        self.stage_placed(&mut placed);
        result
    }

    /// The whole unit at `start` as it is to be after writing `data` at
    /// `offset` over it (read first when the write covers part of it).
    fn unit_with(
        &mut self,
        name: &str,
        cipher: Option<&VolumeCipher>,
        start: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<Vec<u8>, VolumeError> {
        let end = offset + data.len() as u64;
        let (from, to) = (start.max(offset), (start + UNIT_BYTES).min(end));
        let source = &data[(from - offset) as usize..(to - offset) as usize];
        if from == start && to == start + UNIT_BYTES {
            return Ok(source.to_vec());
        }
        let extent = self.existing(name)?.extents.get(&unit_of(start)).copied();
        let mut plain = self.read_unit(name, extent, cipher, start)?;
        plain[(from - start) as usize..(to - start) as usize].copy_from_slice(source);
        Ok(plain)
    }

    /// Compresses, encrypts and writes one unit's bytes to the open
    /// segment (nothing for a unit of zeroes), adding its extent to
    /// `placed` (a volume's).
    fn place_unit(
        &mut self,
        name: &str,
        unit: u32,
        plain: &[u8],
        compression: Compression,
        cipher: &Option<Arc<VolumeCipher>>,
        placed: &mut Placed,
    ) -> Result<(), VolumeError> {
        if plain.iter().all(|&b| b == 0) {
            if self.existing(name)?.extents.contains_key(&unit) {
                push_extent(placed, unit, None);
            }
            return Ok(());
        }
        let (mut stored, codec) = match compression.compress(plain) {
            Some(packed) => (packed, compression),
            None => (plain.to_vec(), Compression::None),
        };
        let stored_bytes = stored.len() as u32;
        stored.resize(
            sectors_for(stored.len() as u64) as usize * SECTOR_BYTES as usize,
            0,
        );
        if let Some(cipher) = cipher {
            cipher.encrypt(u64::from(unit) * UNIT_BYTES, &mut stored);
        }
        let (chunk, sector) = self.segment_room(stored.len() as u64, placed)?;
        self.write_sectors(chunk, sector, &stored, name)?;
        let extent = Extent {
            chunk,
            sector,
            stored_bytes,
            codec,
        };
        push_extent(placed, unit, Some(extent));
        Ok(())
    }

    /// Where `bytes` go: the open segment's next sectors, or a new
    /// segment's first. What was placed is staged first, so that the
    /// segment closed keeps what references it. A writer leaves the last
    /// `CLEANER_RESERVE` free units to the cleaner, which it runs once
    /// when it finds no more.
    fn segment_room(&mut self, bytes: u64, placed: &mut Placed) -> Result<(u32, u32), VolumeError> {
        let sectors = sectors_for(bytes);
        let writer = matches!(placed, Placed::Extents { .. });
        let mut cleaned = false;
        loop {
            if let Some(chunk) = self.state.filling() {
                if self.segment_fill + sectors <= self.state.segment_sectors() {
                    let sector = self.segment_fill;
                    self.segment_fill += sectors;
                    return Ok((chunk, sector));
                }
            }
            self.stage_placed(placed);
            let reserve = if writer { CLEANER_RESERVE } else { 0 };
            if self.state.free_now() > reserve {
                let chunk = self.state.open_segment().expect("a chunk is free");
                self.segment_fill = sectors;
                return Ok((chunk, 0));
            }
            if !writer || cleaned {
                return Err(VolumeError::PoolFull {
                    pool: self.name().to_string(),
                    needed: 1,
                    free: u64::from(self.state.free_now().saturating_sub(reserve)),
                });
            }
            self.commit()?;
            self.clean_segments(1)?;
            cleaned = true;
        }
    }

    fn stage_placed(&mut self, placed: &mut Placed) {
        match placed {
            Placed::Extents { volume, extents } => {
                let volume = volume.clone();
                for part in std::mem::take(extents).chunks(EXTENTS_PER_RECORD) {
                    self.stage(Record::SetExtents {
                        volume: volume.clone(),
                        extents: part.to_vec(),
                    });
                }
            }
            Placed::Moves { from, moves } if !moves.is_empty() => {
                let from = *from;
                let moves = std::mem::take(moves);
                self.stage(Record::MoveExtents { from, moves });
            }
            Placed::Moves { .. } => {}
        }
    }

    fn write_sectors(
        &mut self,
        chunk: u32,
        sector: u32,
        bytes: &[u8],
        name: &str,
    ) -> Result<(), VolumeError> {
        let (member, base) = self.layout().locate(chunk);
        self.data_dirty = true;
        self.media
            .write_at(member, base + u64::from(sector) * SECTOR_BYTES, bytes)
            .map_err(|source| VolumeError::Io {
                context: format!("writing compressed volume {name}"),
                source,
            })
    }

    fn read_sectors(&mut self, extent: &Extent, name: &str) -> Result<Vec<u8>, VolumeError> {
        let mut stored = vec![0; extent.sectors() as usize * SECTOR_BYTES as usize];
        let (member, base) = self.layout().locate(extent.chunk);
        self.media
            .read_at(member, base + extent.offset_in_chunk(), &mut stored)
            .map_err(|source| VolumeError::Io {
                context: format!("reading compressed volume {name}"),
                source,
            })?;
        Ok(stored)
    }

    /// One unit's plain bytes: zeroes where nothing is stored.
    fn read_unit(
        &mut self,
        name: &str,
        extent: Option<Extent>,
        cipher: Option<&VolumeCipher>,
        start: u64,
    ) -> Result<Vec<u8>, VolumeError> {
        let mut plain = vec![0; UNIT_BYTES as usize];
        let Some(extent) = extent else {
            return Ok(plain);
        };
        let mut stored = self.read_sectors(&extent, name)?;
        if let Some(cipher) = cipher {
            cipher.decrypt(start, &mut stored);
        }
        let stored = &stored[..extent.stored_bytes as usize];
        match extent.codec {
            Compression::None => plain.copy_from_slice(stored),
            codec => codec.decompress(stored, &mut plain).map_err(|error| {
                VolumeError::Corrupt(format!(
                    "volume {name}, unit at byte {start}: {error}; the device returned other data than was written"
                ))
            })?,
        }
        Ok(plain)
    }

    /// Reads `buf.len()` bytes at `offset` of a compressed volume.
    pub(super) fn read_compressed(
        &mut self,
        name: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), VolumeError> {
        let volume = self.existing(name)?;
        check_range(volume, offset, buf.len() as u64)?;
        let extents = extents_under(&volume.extents, offset, buf.len() as u64);
        let cipher = self.cipher(name)?;
        check_aligned(cipher.as_deref(), name, offset, buf.len())?;
        self.read_extents(name, &extents, cipher.as_deref(), offset, buf)
    }

    /// Reads `buf.len()` bytes at `offset` of what `extents` hold.
    pub(super) fn read_extents(
        &mut self,
        name: &str,
        extents: &ExtentMap,
        cipher: Option<&VolumeCipher>,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), VolumeError> {
        let end = offset + buf.len() as u64;
        for unit in units_touched(offset, buf.len() as u64) {
            let start = u64::from(unit) * UNIT_BYTES;
            let (from, to) = (start.max(offset), (start + UNIT_BYTES).min(end));
            let target = &mut buf[(from - offset) as usize..(to - offset) as usize];
            match extents.get(&unit) {
                None => target.fill(0),
                Some(extent) => {
                    let plain = self.read_unit(name, Some(*extent), cipher, start)?;
                    target.copy_from_slice(&plain[(from - start) as usize..(to - start) as usize]);
                }
            }
        }
        Ok(())
    }

    /// Deallocates `[offset, offset + len)` of a compressed volume: whole
    /// units are released, the parts of others written with zeroes.
    pub(super) fn deallocate_compressed(
        &mut self,
        name: &str,
        offset: u64,
        len: u64,
    ) -> Result<(), VolumeError> {
        let end = offset + len;
        let whole = offset.next_multiple_of(UNIT_BYTES)..end - end % UNIT_BYTES;
        if whole.start >= whole.end {
            return self.write_compressed(name, offset, &vec![0; len as usize]);
        }
        if offset < whole.start {
            self.write_compressed(name, offset, &vec![0; (whole.start - offset) as usize])?;
        }
        let mut placed = Placed::Extents {
            volume: name.to_string(),
            extents: self
                .existing(name)?
                .extents
                .range(unit_of(whole.start)..unit_of(whole.end))
                .map(|(&unit, _)| (unit, None))
                .collect(),
        };
        self.stage_placed(&mut placed);
        self.commit()?;
        if whole.end < end {
            self.write_compressed(name, whole.end, &vec![0; (end - whole.end) as usize])?;
        }
        Ok(())
    }

    /// Moves the extents still referenced in up to `max` segments that are
    /// at most half referenced into the open segment, and commits what it
    /// moved (even when a later copy failed); returns how many segments it
    /// emptied. An open segment nothing references any more (its volumes
    /// deleted) is let go first.
    pub fn clean_segments(&mut self, max: usize) -> Result<usize, VolumeError> {
        self.check_usable()?;
        if self.state.filling_unreferenced() {
            self.state.close_segment();
        }
        let half = u64::from(self.state.segment_sectors()) / 2;
        let mut sparse: Vec<(u32, u64)> = self
            .state
            .closed_segments()
            .filter(|&(_, referenced)| referenced <= half)
            .collect();
        sparse.sort_by_key(|&(_, referenced)| referenced);
        let mut emptied = 0;
        let mut result = Ok(());
        for (chunk, _) in sparse.into_iter().take(max) {
            match self.empty_segment(chunk) {
                Ok(()) => emptied += 1,
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        self.commit()?;
        result.map(|()| emptied)
    }

    /// Copies every extent still referenced in segment `chunk` elsewhere
    /// and stages the moves (those made, on error).
    fn empty_segment(&mut self, chunk: u32) -> Result<(), VolumeError> {
        // The segment it may open for the copies is one more reference.
        self.check_references(1)?;
        let mut placed = Placed::Moves {
            from: chunk,
            moves: Vec::new(),
        };
        let mut result = Ok(());
        for extent in self.state.extents_in(chunk) {
            let copied = self
                .read_sectors(&extent, "(the cleaner)")
                .and_then(|stored| {
                    let (to, sector) = self.segment_room(stored.len() as u64, &mut placed)?;
                    self.write_sectors(to, sector, &stored, "(the cleaner)")?;
                    Ok((to, sector))
                });
            match (copied, &mut placed) {
                (Ok((to, sector)), Placed::Moves { moves, .. }) => {
                    moves.push((extent.sector, to, sector))
                }
                (Ok(_), Placed::Extents { .. }) => unreachable!("the cleaner places moves"),
                (Err(error), _) => {
                    result = Err(error);
                    break;
                }
            }
        }
        self.stage_placed(&mut placed);
        result
    }
}

/// Adds a unit's new extent to what a write placed.
fn push_extent(placed: &mut Placed, unit: u32, extent: Option<Extent>) {
    match placed {
        Placed::Extents { extents, .. } => extents.push((unit, extent)),
        Placed::Moves { .. } => unreachable!("the cleaner places no units"),
    }
}

/// The unit holding byte `offset`.
fn unit_of(offset: u64) -> u32 {
    u32::try_from(offset / UNIT_BYTES).expect("sizes are validated against the limit")
}

/// Units `[offset, offset + len)` touches.
pub(super) fn units_touched(offset: u64, len: u64) -> Range<u32> {
    match len {
        0 => 0..0,
        _ => unit_of(offset)..unit_of(offset + len - 1) + 1,
    }
}

/// The extents of `map` under `[offset, offset + len)`.
pub(super) fn extents_under(map: &ExtentMap, offset: u64, len: u64) -> ExtentMap {
    let units = units_touched(offset, len);
    map.range(units).map(|(&u, &e)| (u, e)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FaultyMedia;
    use crate::{PoolOptions, VolumeSpec};

    const CHUNK: u64 = 64 * 1024;

    fn pool(compression: Compression) -> Pool<FaultyMedia> {
        let options = PoolOptions {
            name: "small".into(),
            chunk_bytes: CHUNK as u32,
            uuid: [4; 16],
        };
        let mut pool = Pool::create(FaultyMedia::new(1, 8 << 20, 1), options).unwrap();
        pool.create_volume(&VolumeSpec {
            name: "v".into(),
            size_bytes: 2 << 20,
            block_size: 512,
            thick: false,
            encrypted: false,
            compression,
        })
        .unwrap();
        pool
    }

    fn text(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| b"weft compresses "[i % 16] ^ seed)
            .collect()
    }

    /// `len` bytes that do not compress.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut rng = crate::testing::Rng(seed | 1);
        (0..len).map(|_| rng.next_u64() as u8).collect()
    }

    fn read(pool: &mut Pool<FaultyMedia>, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        pool.read("v", offset, &mut buf).unwrap();
        buf
    }

    #[test]
    fn compressible_writes_take_a_fraction_of_their_units_and_read_back_after_a_crash() {
        let mut pool = pool(Compression::Lz4);
        pool.write("v", 0, &text(1 << 20, 1)).unwrap();
        pool.write("v", 3 * 512, &[9; 512]).unwrap();
        let usage = pool.compression_usage("v").unwrap();
        assert_eq!(usage.logical_bytes, 1 << 20);
        assert!(usage.stored_bytes * 8 <= usage.logical_bytes, "{usage:?}");
        assert_eq!(pool.info().compressed_stored_bytes, usage.stored_bytes);
        assert!(
            pool.segment_bytes() <= 2 * CHUNK,
            "{}",
            pool.segment_bytes()
        );
        // Read back before and after a flush and a power cut; a write after
        // the flush is not durable yet.
        assert_eq!(read(&mut pool, 3 * 512, 512), vec![9; 512]);
        pool.flush().unwrap();
        pool.write("v", 0, &[1; 4096]).unwrap();
        let media = pool.into_media().crash();
        let mut pool = Pool::open(media).unwrap();
        let mut expected = text(1 << 20, 1);
        expected[3 * 512..4 * 512].fill(9);
        assert_eq!(read(&mut pool, 0, 1 << 20), expected);
        assert_eq!(read(&mut pool, 1 << 20, 4096), vec![0; 4096]);
    }

    #[test]
    fn units_of_zeroes_and_deallocated_units_store_nothing() {
        let mut pool = pool(Compression::Zstd);
        pool.write("v", 0, &text(4 * CHUNK as usize, 2)).unwrap();
        pool.write("v", 0, &vec![0; CHUNK as usize]).unwrap();
        pool.deallocate("v", CHUNK + 512, 2 * CHUNK).unwrap();
        assert_eq!(
            pool.compression_usage("v").unwrap().logical_bytes,
            2 * CHUNK
        );
        let mut expected = text(4 * CHUNK as usize, 2);
        expected[..CHUNK as usize].fill(0);
        expected[CHUNK as usize + 512..3 * CHUNK as usize + 512].fill(0);
        assert_eq!(read(&mut pool, 0, 4 * CHUNK as usize), expected);
    }

    #[test]
    fn the_cleaner_frees_segments_that_overwrites_left_sparse_and_snapshots_keep_theirs() {
        let mut pool = pool(Compression::Lz4);
        let unit = CHUNK as usize;
        // Text takes a sector a unit: 16 units fill a segment.
        pool.write("v", 0, &text(16 * unit, 3)).unwrap();
        // Noise is stored as it came: a whole unit's sectors.
        let noise = noise(0x2545_f491_4f6c_dd1d, 2 * unit);
        pool.write("v", 16 * CHUNK, &noise).unwrap();
        // The first segment keeps 4 units, shared with the snapshot: the
        // cleaner moves them into the open segment's last 4 sectors.
        pool.write("v", 0, &text(12 * unit, 4)).unwrap();
        pool.create_snapshot("v", "s").unwrap();
        assert_eq!(pool.segment_bytes(), 4 * CHUNK);
        assert_eq!(pool.clean_segments(16).unwrap(), 1);
        assert_eq!(pool.segment_bytes(), 3 * CHUNK);
        let mut expected = text(16 * unit, 3);
        expected[..12 * unit].copy_from_slice(&text(12 * unit, 4));
        let snapshot = expected.clone();
        expected.extend_from_slice(&noise);
        let media = pool.into_media().crash();
        let mut pool = Pool::open(media).unwrap();
        assert_eq!(read(&mut pool, 0, 18 * unit), expected);
        let mut seen = vec![0; 16 * unit];
        pool.read_snapshot("v", "s", 0, &mut seen).unwrap();
        assert_eq!(seen, snapshot);
        pool.clone_volume("v", "s", "c").unwrap();
        pool.delete_snapshot("v", "s").unwrap();
        pool.read("c", 0, &mut seen).unwrap();
        assert_eq!(seen, snapshot);
        pool.delete_volume("c").unwrap();
        pool.delete_volume("v").unwrap();
        assert_eq!(pool.segment_bytes(), 0);
        assert_eq!(pool.info().allocated_bytes, 0);
    }

    #[test]
    fn a_full_pool_makes_room_by_cleaning_and_keeps_taking_overwrites() {
        let mut pool = pool(Compression::Lz4);
        pool.create_volume(&VolumeSpec {
            name: "w".into(),
            size_bytes: 16 << 20,
            block_size: 512,
            thick: false,
            encrypted: false,
            compression: Compression::Lz4,
        })
        .unwrap();
        let units = 256;
        let chunks = pool.layout().chunks() as usize;
        assert!(
            units - 4 > chunks,
            "more cold units than the pool has segments"
        );
        let mut expected = vec![0; units * CHUNK as usize];
        // Each round fills about a segment (text: a sector a unit) with 15
        // writes of 4 hot units and one of a cold unit, rewritten only
        // every 252 rounds: every segment keeps one live extent, and
        // without the cleaner the pool runs out of segments.
        for round in 0..3 * units {
            let cold = 4 + round % (units - 4);
            for unit in (0..15).map(|k| k % 4).chain([cold]) {
                let data = text(CHUNK as usize, (round % 250) as u8 + 1);
                pool.write("w", unit as u64 * CHUNK, &data)
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
                expected[unit * CHUNK as usize..(unit + 1) * CHUNK as usize].copy_from_slice(&data);
            }
        }
        pool.flush().unwrap();
        let media = pool.into_media().crash();
        let mut pool = Pool::open(media).unwrap();
        let mut seen = vec![0; units * CHUNK as usize];
        pool.read("w", 0, &mut seen).unwrap();
        assert!(seen == expected, "the volume reads back as written");
        // After a restart (no open segment) it still finds room.
        pool.write("w", 0, &text(CHUNK as usize, 77)).unwrap();
    }

    /// A unit overwritten without a flush empties its segment; another
    /// volume's next allocation takes that chunk and its write fails half
    /// done; a power cut follows. The unit must read as before or as
    /// written: never the other volume's bytes over its old extent.
    #[test]
    fn a_chunk_freed_by_a_write_not_flushed_is_reused_only_once_its_record_is_durable() {
        for seed in 1..=48 {
            let options = PoolOptions {
                name: "small".into(),
                chunk_bytes: CHUNK as u32,
                uuid: [4; 16],
            };
            let mut pool = Pool::create(FaultyMedia::new(1, 8 << 20, seed), options).unwrap();
            for (name, compression) in [("v", Compression::Lz4), ("p", Compression::None)] {
                let spec = VolumeSpec {
                    name: name.into(),
                    size_bytes: 1 << 20,
                    block_size: 512,
                    thick: false,
                    encrypted: false,
                    compression,
                };
                pool.create_volume(&spec).unwrap();
            }
            // Noise takes a whole segment: the unit is alone in it.
            let (old, new) = (
                noise(seed, CHUNK as usize),
                noise(seed + 1000, CHUNK as usize),
            );
            pool.write("v", 0, &old).unwrap();
            pool.flush().unwrap();
            pool.write("v", 0, &new).unwrap();
            pool.media_mut().fail_after_writes(0);
            assert!(pool.write("p", 0, &[7; 4096]).is_err());
            let mut pool = Pool::open(pool.into_media().crash()).unwrap();
            let seen = read(&mut pool, 0, CHUNK as usize);
            assert!(
                seen == old || seen == new,
                "seed {seed}: the unit reads as neither its old data nor its new"
            );
        }
    }

    #[test]
    fn a_compressed_volume_is_thin_and_never_maps_chunks() {
        let mut pool = pool(Compression::None);
        let error = pool
            .create_volume(&VolumeSpec {
                name: "t".into(),
                size_bytes: 1 << 20,
                block_size: 512,
                thick: true,
                encrypted: false,
                compression: Compression::Zstd,
            })
            .unwrap_err();
        assert!(error.to_string().contains("drop --thick"), "{error}");
        let mut pool = self::pool(Compression::Zstd);
        let error = pool.prepare_write("v", 0, 4096).unwrap_err();
        assert!(error.to_string().contains("extents"), "{error}");
    }

    /// A write tier of `blocks` 4 KiB blocks in each of two rings.
    fn tier(blocks: usize) -> FaultyMedia {
        FaultyMedia::new(1, 8192 + 2 * blocks * 4096, 5)
    }

    fn power_cut(pool: Pool<FaultyMedia>) -> Pool<FaultyMedia> {
        let (media, tier) = pool.into_media_and_tier();
        Pool::open_with_tier(media.crash(), tier.map(FaultyMedia::crash)).unwrap()
    }

    #[test]
    fn on_a_tiered_pool_writes_wait_in_the_tier_and_are_compressed_when_destaged() {
        let mut pool = pool(Compression::Lz4);
        pool.attach_tier(tier(256), [5; 16], 2).unwrap();
        let mut expected = text(256 << 10, 1);
        pool.write("v", 0, &expected).unwrap();
        // Part of a unit, and part of a block.
        pool.write("v", 8192, &text(4096, 2)).unwrap();
        pool.write("v", 70_000 / 512 * 512, &[3; 1024]).unwrap();
        expected[8192..12288].copy_from_slice(&text(4096, 2));
        expected[70_000 / 512 * 512..][..1024].fill(3);
        assert_eq!(pool.compression_usage("v").unwrap().logical_bytes, 0);
        assert_eq!(read(&mut pool, 0, 256 << 10), expected);
        // Acknowledged from the tier: a power cut before any destage
        // keeps them.
        let mut pool = power_cut(pool);
        assert_eq!(read(&mut pool, 0, 256 << 10), expected);
        pool.settle_tier().unwrap();
        assert_eq!(pool.tier_info().unwrap().blocks, 0);
        let usage = pool.compression_usage("v").unwrap();
        assert_eq!(usage.logical_bytes, 256 << 10);
        assert!(usage.stored_bytes * 4 <= usage.logical_bytes, "{usage:?}");
        let mut pool = power_cut(pool);
        assert_eq!(read(&mut pool, 0, 256 << 10), expected);
    }

    #[test]
    fn a_tiered_pool_keeps_room_for_the_units_it_destages_and_refuses_writes_beyond() {
        let mut pool = pool(Compression::Zstd);
        pool.attach_tier(tier(256), [5; 16], 2).unwrap();
        // Everything but three allocation units taken by a thick volume.
        let free = pool.state.free_now();
        pool.create_volume(&VolumeSpec {
            name: "thick".into(),
            size_bytes: u64::from(free - 3) * CHUNK,
            block_size: 512,
            thick: true,
            encrypted: false,
            compression: Compression::None,
        })
        .unwrap();
        // Units that do not compress, each a whole allocation unit.
        let mut acked = Vec::new();
        let refused = (0..8u64).find_map(|unit| {
            let data = noise(unit, CHUNK as usize);
            match pool.write("v", unit * CHUNK, &data) {
                Ok(()) => {
                    acked.push(data);
                    None
                }
                Err(error) => Some(error),
            }
        });
        let error = refused.expect("the pool fills");
        assert!(matches!(error, VolumeError::PoolFull { .. }), "{error}");
        assert!(!acked.is_empty());
        // The destage of what was acknowledged had its room: the pool did
        // not fail, and everything reads back after a power cut.
        pool.settle_tier().unwrap();
        assert_eq!(pool.failure(), None);
        let mut pool = power_cut(pool);
        for (unit, data) in acked.iter().enumerate() {
            assert_eq!(&read(&mut pool, unit as u64 * CHUNK, CHUNK as usize), data);
        }
    }
}
