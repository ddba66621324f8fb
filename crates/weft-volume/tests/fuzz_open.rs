//! Seeded stand-ins for the `volume_open` and `tier_open` fuzz targets
//! (which need nightly): random damage to every metadata region of a pool,
//! or anywhere on a write tier's device, never panics open or the reads
//! after it.

use weft_volume::testing::{fuzz_open, fuzz_tier_open};

fn rng() -> impl FnMut() -> u64 {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[test]
fn damaged_metadata_never_panics() {
    let mut next = rng();
    for _ in 0..400 {
        let len = 3 + (next() % 64) as usize;
        let mut input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Offsets near the start of a region hit headers and the first records.
        if next().is_multiple_of(2) {
            input[2] = 0;
            input[1] %= 64;
        }
        fuzz_open(&input);
    }
}

#[test]
fn a_damaged_write_tier_never_panics() {
    let mut next = rng();
    for _ in 0..400 {
        let len = 2 + (next() % 64) as usize;
        let mut input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Offsets at a block's start hit superblocks and batch headers.
        if next().is_multiple_of(2) {
            let block = (next() % 22) as u16 * 2048 + (next() % 32) as u16;
            input[..2].copy_from_slice(&block.to_le_bytes());
        }
        fuzz_tier_open(&input);
    }
}
