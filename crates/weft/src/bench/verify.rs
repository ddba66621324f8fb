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

/// The pattern's bytes, 8 at a time.
fn pattern_words(seed: u64) -> impl Iterator<Item = [u8; 8]> {
    std::iter::successors(Some(seed), |&state| {
        let mut state = state;
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        Some(state)
    })
    .skip(1)
    .map(u64::to_le_bytes)
}

fn header(offset: u64, generation: u32, len: usize) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&offset.to_le_bytes());
    header[16..20].copy_from_slice(&generation.to_le_bytes());
    header[20..24].copy_from_slice(&(len as u32).to_le_bytes());
    header
}

/// Writes the stamp of a block at byte `offset`, write `generation`.
pub fn stamp(buf: &mut [u8], offset: u64, generation: u32) {
    assert!(buf.len() >= HEADER_BYTES, "blocks are at least 512 bytes");
    let header = header(offset, generation, buf.len());
    buf[..HEADER_BYTES].copy_from_slice(&header);
    let words = pattern_words(pattern_seed(offset, generation));
    for (chunk, word) in buf[HEADER_BYTES..].chunks_mut(8).zip(words) {
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Checks a block read at `offset` against write `generation`'s stamp
/// (without building the expected block: this runs once per verified read).
pub fn check(buf: &[u8], offset: u64, generation: u32) -> Result<(), String> {
    let expected_header = header(offset, generation, buf.len());
    let words = pattern_words(pattern_seed(offset, generation));
    let first = match buf[..HEADER_BYTES]
        .iter()
        .zip(&expected_header)
        .position(|(a, b)| a != b)
    {
        Some(at) => at,
        None => {
            let mismatch = buf[HEADER_BYTES..]
                .chunks(8)
                .zip(words)
                .enumerate()
                .find_map(|(index, (chunk, word))| {
                    chunk
                        .iter()
                        .zip(&word)
                        .position(|(a, b)| a != b)
                        .map(|at| HEADER_BYTES + index * 8 + at)
                });
            match mismatch {
                None => return Ok(()),
                Some(at) => at,
            }
        }
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
