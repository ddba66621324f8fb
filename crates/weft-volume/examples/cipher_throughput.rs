//! How fast one core encrypts and decrypts a volume's blocks (AES-256-XTS,
//! AES-NI where the CPU has it): `cargo run --release -p weft-volume
//! --example cipher_throughput`. The data plane's cost of encryption at
//! rest is this per byte written or read (docs/PERFORMANCE.md section 14).

use std::time::Instant;
use weft_volume::crypt::{DataKey, VolumeCipher};

fn main() {
    let cipher = VolumeCipher::new(&DataKey::from_bytes([7; 64]), 4096);
    for io_bytes in [4096usize, 131_072] {
        let mut data = vec![0x5au8; io_bytes];
        let total: usize = 1 << 30;
        for (what, decrypt) in [("encrypt", false), ("decrypt", true)] {
            let started = Instant::now();
            let mut offset = 0u64;
            for _ in 0..total / io_bytes {
                if decrypt {
                    cipher.decrypt(offset, &mut data);
                } else {
                    cipher.encrypt(offset, &mut data);
                }
                offset = (offset + io_bytes as u64) % (1 << 30);
            }
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "{what} {:>6} B I/Os: {:>6.0} MiB/s, {:>6.2} us per I/O",
                io_bytes,
                total as f64 / seconds / f64::from(1 << 20),
                seconds * 1e6 / (total / io_bytes) as f64
            );
        }
    }
}
