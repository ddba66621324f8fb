//! Seeded stand-in for the `volume_open` fuzz target (which needs nightly):
//! random damage to every metadata region of a pool never panics open or
//! the reads after it.

use weft_volume::testing::fuzz_open;

#[test]
fn damaged_metadata_never_panics() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..400 {
        let len = 3 + (next() % 64) as usize;
        let mut input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Offsets near the start of a region hit headers and the first records.
        if next() % 2 == 0 {
            input[2] = 0;
            input[1] %= 64;
        }
        fuzz_open(&input);
    }
}
