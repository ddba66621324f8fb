//! QD1 latency of a 4 KiB read from a RAM namespace over loopback TCP, side by
//! side with the physical floor of the same path: a plain blocking TCP
//! request/response of the same sizes (72-byte command out, 4 KiB of data plus
//! headers back). Rounds alternate between the two so that machine noise hits
//! both alike. Prints a table and one JSON line.
//!
//! Run: cargo bench -p weft-target --bench qd1 [-- ROUNDS SAMPLES_PER_ROUND]

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;
use weft_proto::command::io_opcode;
use weft_proto::testing;

/// Bytes a 4 KiB read returns: C2HData header (24) + data + CapsuleResp (24).
const RESPONSE_BYTES: usize = 24 + 4096 + 24;

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let samples: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let mut floor = floor_client();
    let address = support::start("bench-qd1");
    let (_admin, cntlid) = support::admin(address, 0);
    let mut weft = support::io_queue(address, cntlid, 1, false);
    let read = testing::rw(io_opcode::READ, 1, 1, 0, 8, 4096, false);
    let mut weft_ns = Vec::new();
    let mut floor_ns = Vec::new();
    for round in 0..=rounds {
        let warmup = round == 0;
        for _ in 0..samples {
            let start = Instant::now();
            floor();
            if !warmup {
                floor_ns.push(start.elapsed().as_nanos() as u64);
            }
        }
        for _ in 0..samples {
            let start = Instant::now();
            weft.command(&read, &[]);
            if !warmup {
                weft_ns.push(start.elapsed().as_nanos() as u64);
            }
        }
    }
    let floor_stats = Stats::of(&mut floor_ns);
    let weft_stats = Stats::of(&mut weft_ns);
    println!("QD1 4 KiB read, loopback TCP, {rounds} alternating rounds of {samples}");
    println!(
        "{:<28} {:>10} {:>10} {:>10}",
        "", "mean us", "p50 us", "p99 us"
    );
    println!(
        "{:<28} {:>10.1} {:>10.1} {:>10.1}",
        "TCP floor (blocking sockets)", floor_stats.mean_us, floor_stats.p50_us, floor_stats.p99_us
    );
    println!(
        "{:<28} {:>10.1} {:>10.1} {:>10.1}",
        "weft RAM namespace", weft_stats.mean_us, weft_stats.p50_us, weft_stats.p99_us
    );
    println!(
        "{:<28} {:>10.2} {:>10.2} {:>10.2}",
        "weft / floor",
        weft_stats.mean_us / floor_stats.mean_us,
        weft_stats.p50_us / floor_stats.p50_us,
        weft_stats.p99_us / floor_stats.p99_us
    );
    println!(
        "{{\"bench\":\"qd1-4k-read\",\"floor\":{},\"weft\":{},\"ratio_mean\":{:.3},\"ratio_p99\":{:.3}}}",
        floor_stats.json(),
        weft_stats.json(),
        weft_stats.mean_us / floor_stats.mean_us,
        weft_stats.p99_us / floor_stats.p99_us
    );
}

/// A blocking echo server answering 72 bytes with RESPONSE_BYTES, and a closure doing one round trip.
fn floor_client() -> impl FnMut() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        stream.set_nodelay(true).expect("nodelay");
        let mut request = [0u8; 72];
        let response = vec![0u8; RESPONSE_BYTES];
        while stream.read_exact(&mut request).is_ok() {
            stream.write_all(&response).expect("write");
        }
    });
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut response = vec![0u8; RESPONSE_BYTES];
    move || {
        stream.write_all(&[0u8; 72]).expect("write");
        stream.read_exact(&mut response).expect("read");
    }
}

struct Stats {
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
}

impl Stats {
    fn of(samples: &mut [u64]) -> Stats {
        samples.sort_unstable();
        let us = |ns: u64| ns as f64 / 1000.0;
        let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64;
        Stats {
            mean_us: mean / 1000.0,
            p50_us: us(samples[samples.len() / 2]),
            p99_us: us(samples[samples.len() * 99 / 100]),
        }
    }

    fn json(&self) -> String {
        format!(
            "{{\"mean_us\":{:.2},\"p50_us\":{:.2},\"p99_us\":{:.2}}}",
            self.mean_us, self.p50_us, self.p99_us
        )
    }
}
