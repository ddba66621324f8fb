//! `--verify`: every written block carries a stamp (a header naming its byte
//! offset and write generation, then a pattern derived from both) and every
//! read of a block this run wrote is checked against the stamp of the last
//! write, so a lost, torn, stale or misplaced write is reported with where
//! it landed.

const MAGIC: &[u8; 8] = b"weftbnch";
const HEADER_BYTES: usize = 24;

/// Per-block write generations and in-flight marks of one worker's share.
#[derive(Debug)]
pub struct Stamps {
    generations: Vec<u32>,
    busy: Vec<bool>,
}

impl Stamps {
    /// `blocks` never-written blocks.
    pub fn new(blocks: u64) -> Stamps {
        Stamps {
            generations: vec![0; blocks as usize],
            busy: vec![false; blocks as usize],
        }
    }

    /// The generation of the last write started on `block` (0: none).
    pub fn generation(&self, block: u64) -> u32 {
        self.generations[block as usize]
    }

    /// Whether an I/O on `block` is in flight.
    pub fn busy(&self, block: u64) -> bool {
        self.busy[block as usize]
    }

    /// Marks an I/O on `block` started; returns the generation a read must
    /// find (0: unknown, not checked) or a write stamps.
    pub fn start(&mut self, block: u64, read: bool) -> u32 {
        let block = block as usize;
        debug_assert!(!self.busy[block], "two I/Os on block {block} at once");
        self.busy[block] = true;
        if !read {
            self.generations[block] = self.generations[block].wrapping_add(1).max(1);
        }
        self.generations[block]
    }

    /// Marks the I/O on `block` finished.
    pub fn finish(&mut self, block: u64) {
        self.busy[block as usize] = false;
    }
}

fn pattern_seed(offset: u64, generation: u32) -> u64 {
    (offset ^ (u64::from(generation) << 40) ^ 0xD6E8_FEB8_6659_FD93) | 1
}

fn pattern(seed: u64, out: &mut [u8]) {
    let mut state = seed;
    for chunk in out.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

/// Writes the stamp of a block at byte `offset`, write `generation`.
pub fn stamp(buf: &mut [u8], offset: u64, generation: u32) {
    assert!(buf.len() >= HEADER_BYTES, "blocks are at least 512 bytes");
    buf[..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&offset.to_le_bytes());
    buf[16..20].copy_from_slice(&generation.to_le_bytes());
    let len = buf.len() as u32;
    buf[20..24].copy_from_slice(&len.to_le_bytes());
    pattern(pattern_seed(offset, generation), &mut buf[HEADER_BYTES..]);
}

/// Checks a block read at `offset` against write `generation`'s stamp.
pub fn check(buf: &[u8], offset: u64, generation: u32) -> Result<(), String> {
    let mut expected = vec![0u8; buf.len()];
    stamp(&mut expected, offset, generation);
    let Some(first) = buf.iter().zip(&expected).position(|(a, b)| a != b) else {
        return Ok(());
    };
    let found = if &buf[..8] == MAGIC {
        format!(
            "a block stamped for offset {} generation {}",
            u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")),
            u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"))
        )
    } else {
        "data weft did not write".to_string()
    };
    Err(format!(
        "verify failed at byte offset {offset}: expected write generation {generation}, found {found} (first difference at byte {first} of the block)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_checks_only_at_its_offset_and_generation() {
        let mut block = vec![0u8; 4096];
        stamp(&mut block, 8192, 3);
        assert!(check(&block, 8192, 3).is_ok());
        let stale = check(&block, 8192, 4).unwrap_err();
        assert!(
            stale.contains("found a block stamped for offset 8192 generation 3"),
            "{stale}"
        );
        let misplaced = check(&block, 4096, 3).unwrap_err();
        assert!(misplaced.contains("offset 8192"), "{misplaced}");
        block[4000] ^= 1;
        let torn = check(&block, 8192, 3).unwrap_err();
        assert!(torn.contains("byte 4000"), "{torn}");
        assert!(check(&[0u8; 512], 0, 1)
            .unwrap_err()
            .contains("data weft did not write"));
    }

    #[test]
    fn generations_advance_on_writes_and_mark_blocks_busy() {
        let mut stamps = Stamps::new(4);
        assert_eq!(stamps.start(1, true), 0);
        assert!(stamps.busy(1));
        stamps.finish(1);
        assert_eq!(stamps.start(1, false), 1);
        stamps.finish(1);
        assert_eq!(stamps.start(1, true), 1);
        assert_eq!(stamps.generation(1), 1);
        assert_eq!(stamps.generation(2), 0);
    }
}
