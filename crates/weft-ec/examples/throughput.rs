//! How fast the code runs on this machine: encoding stripes of 64 KiB
//! chunks for each layout, and rebuilding one and two lost data chunks,
//! in GB/s of data. `cargo run --release -p weft-ec --example throughput`.

use std::time::Instant;
use weft_ec::{encode, reconstruct, Layout};

const CHUNK: usize = 64 * 1024;
const ROUNDS: usize = 2000;

fn main() {
    println!(
        "{:<6} {:>14} {:>16} {:>16}",
        "layout", "encode GB/s", "rebuild 1 GB/s", "rebuild 2 GB/s"
    );
    for (k, m) in [(2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)] {
        let layout = Layout::new(k, m).expect("a layout of the code");
        let mut shards: Vec<Vec<u8>> = (0..k + m)
            .map(|i| (0..CHUNK).map(|b| (b * 7 + i * 13) as u8).collect())
            .collect();
        let data_bytes = (k * CHUNK * ROUNDS) as f64;
        let start = Instant::now();
        for _ in 0..ROUNDS {
            let (data, parity) = shards.split_at_mut(k);
            let data: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            encode(layout, &data, &mut parity).expect("encoded");
        }
        let encode_rate = data_bytes / start.elapsed().as_secs_f64() / 1e9;
        let mut rebuild = |lost: &[usize]| {
            let start = Instant::now();
            for _ in 0..ROUNDS {
                let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
                reconstruct(layout, &mut refs, lost).expect("rebuilt");
            }
            data_bytes / start.elapsed().as_secs_f64() / 1e9
        };
        let one = rebuild(&[0]);
        let two = if m == 2 {
            format!("{:.2}", rebuild(&[0, 1]))
        } else {
            "-".into()
        };
        println!(
            "{:<6} {encode_rate:>14.2} {one:>16.2} {two:>16}",
            layout.to_string()
        );
    }
}
