//! `weft bench`: fio-style load on an NVMe/TCP namespace (through weft's
//! user-space initiator) or on a local file or block device (io_uring,
//! O_DIRECT), with one latency sample per I/O, reported as a table or in
//! fio's JSON layout for the fields they share.
//!
//! Not yet here (they come with the rest of the benchmark issue): `compare`,
//! `floor`, sweeps and plots, `--verify`, a live progress line.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weft_initiator::{read_write, ConnectOptions, Controller, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::host::DataTransfer;
use weft_uring::{IoBuf, Op, Ring};

/// The I/O pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mix, `read_percent` reads.
    RandRw,
}

impl Pattern {
    fn parse(text: &str) -> Result<Pattern, String> {
        Ok(match text {
            "read" => Pattern::Read,
            "write" => Pattern::Write,
            "randread" => Pattern::RandRead,
            "randwrite" => Pattern::RandWrite,
            "randrw" => Pattern::RandRw,
            _ => {
                return Err(format!(
                    "--rw \"{text}\" is not one of read, write, randread, randwrite, randrw"
                ))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Pattern::Read => "read",
            Pattern::Write => "write",
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::RandRw => "randrw",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    target: String,
    pattern: Pattern,
    read_percent: u32,
    block_bytes: u32,
    iodepth: usize,
    queues: usize,
    runtime: Duration,
    ramp: Duration,
    nsid: u32,
    header_digest: bool,
    data_digest: bool,
    json: bool,
}

/// Parses `weft bench` options.
pub fn parse(parser: &mut lexopt::Parser) -> Result<BenchArgs, String> {
    use lexopt::prelude::*;
    let mut args = BenchArgs {
        target: String::new(),
        pattern: Pattern::RandRead,
        read_percent: 50,
        block_bytes: 4096,
        iodepth: 1,
        queues: 1,
        runtime: Duration::from_secs(10),
        ramp: Duration::ZERO,
        nsid: 1,
        header_digest: false,
        data_digest: false,
        json: false,
    };
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        let name = match arg {
            Long(name) => format!("--{name}"),
            other => return Err(format!("{}; see weft --help", other.unexpected())),
        };
        let mut value = || -> Result<String, String> {
            parser
                .value()
                .map_err(|e| e.to_string())?
                .string()
                .map_err(|_| format!("{name} is not UTF-8"))
        };
        match name.as_str() {
            "--target" => args.target = value()?,
            "--rw" => args.pattern = Pattern::parse(&value()?)?,
            "--rwmixread" => args.read_percent = number(&value()?, &name, 0, 100)? as u32,
            "--bs" => args.block_bytes = parse_bytes(&value()?, &name)?,
            "--iodepth" => args.iodepth = number(&value()?, &name, 1, 1024)? as usize,
            "--queues" => args.queues = number(&value()?, &name, 1, 64)? as usize,
            "--runtime" => args.runtime = parse_duration(&value()?, &name)?,
            "--ramp" => args.ramp = parse_duration(&value()?, &name)?,
            "--nsid" => args.nsid = number(&value()?, &name, 1, u64::from(u32::MAX - 1))? as u32,
            "--hdr-digest" => args.header_digest = true,
            "--data-digest" => args.data_digest = true,
            "--json" => args.json = true,
            _ => {
                return Err(format!(
                    "unknown option {name} for weft bench; see weft --help"
                ))
            }
        }
    }
    if args.target.is_empty() {
        return Err("weft bench needs --target nvme-tcp://HOST:PORT/NQN or --target PATH".into());
    }
    if args.block_bytes == 0 || !args.block_bytes.is_multiple_of(512) {
        return Err(format!(
            "--bs {} is not a positive multiple of 512",
            args.block_bytes
        ));
    }
    Ok(args)
}

fn number(text: &str, name: &str, min: u64, max: u64) -> Result<u64, String> {
    text.parse()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| format!("{name} \"{text}\" is not a number from {min} to {max}"))
}

fn parse_bytes(text: &str, name: &str) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    let (digits, multiplier) = match lower.trim_end_matches(['b', 'i']) {
        t if t.ends_with('k') => (&t[..t.len() - 1], 1024),
        t if t.ends_with('m') => (&t[..t.len() - 1], 1 << 20),
        t => (t, 1),
    };
    digits
        .parse::<u32>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("{name} \"{text}\" is not a size like 4k, 128k or 1m"))
}

fn parse_duration(text: &str, name: &str) -> Result<Duration, String> {
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{name} \"{text}\" is not a duration like 10s or 500ms"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(value)),
        "ms" => Ok(Duration::from_millis(value)),
        "m" => Ok(Duration::from_secs(value * 60)),
        _ => Err(format!(
            "{name} \"{text}\" is not a duration like 10s or 500ms"
        )),
    }
}

/// Latency samples and counts of one direction.
#[derive(Debug, Default)]
struct Direction {
    latencies_ns: Vec<u64>,
    bytes: u64,
}

#[derive(Debug, Default)]
struct Results {
    read: Direction,
    write: Direction,
    seconds: f64,
}

impl Results {
    fn merge(&mut self, other: Results) {
        self.read.latencies_ns.extend(other.read.latencies_ns);
        self.read.bytes += other.read.bytes;
        self.write.latencies_ns.extend(other.write.latencies_ns);
        self.write.bytes += other.write.bytes;
        self.seconds = self.seconds.max(other.seconds);
    }
}

/// Offsets and directions of the workload, deterministic per queue.
struct Workload {
    pattern: Pattern,
    read_percent: u32,
    block_bytes: u64,
    blocks: u64,
    next: u64,
    state: u64,
}

impl Workload {
    fn new(args: &BenchArgs, size_bytes: u64, queue: usize) -> Result<Workload, String> {
        let blocks = size_bytes / u64::from(args.block_bytes);
        if blocks == 0 {
            return Err(format!(
                "the target ({size_bytes} bytes) is smaller than one {} byte block",
                args.block_bytes
            ));
        }
        Ok(Workload {
            pattern: args.pattern,
            read_percent: args.read_percent,
            block_bytes: u64::from(args.block_bytes),
            blocks,
            next: queue as u64 * blocks / 8,
            state: 0x9E37_79B9_7F4A_7C15 ^ queue as u64,
        })
    }

    fn random(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// Byte offset and whether it is a read.
    fn next(&mut self) -> (u64, bool) {
        let block = match self.pattern {
            Pattern::Read | Pattern::Write => {
                let block = self.next % self.blocks;
                self.next += 1;
                block
            }
            _ => self.random() % self.blocks,
        };
        let read = match self.pattern {
            Pattern::Read | Pattern::RandRead => true,
            Pattern::Write | Pattern::RandWrite => false,
            Pattern::RandRw => self.random() % 100 < u64::from(self.read_percent),
        };
        (block * self.block_bytes, read)
    }
}

/// Runs the benchmark and prints its report.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let mut results = if args.target.starts_with("nvme-tcp://") {
        remote(&args)?
    } else {
        local(&args)?
    };
    let read = summarize(&mut results.read, results.seconds);
    let write = summarize(&mut results.write, results.seconds);
    if args.json {
        println!("{}", fio_json(&args, &read, &write));
    } else {
        print_table(&args, &read, &write);
    }
    Ok(())
}

fn remote(args: &BenchArgs) -> Result<Results, String> {
    let url = TargetUrl::parse(&args.target).map_err(|e| e.to_string())?;
    let options = ConnectOptions {
        header_digest: args.header_digest,
        data_digest: args.data_digest,
        io_queue_entries: (args.iodepth as u16 + 1).max(2),
        ..ConnectOptions::default()
    };
    let mut controller =
        Controller::connect(&url, options, args.queues as u16).map_err(|e| e.to_string())?;
    if usize::from(controller.info.io_queues) < args.queues {
        return Err(format!(
            "the target granted {} I/O queues, fewer than --queues {}",
            controller.info.io_queues, args.queues
        ));
    }
    if args.block_bytes > controller.info.transfer_bytes_max {
        return Err(format!(
            "--bs {} exceeds the target's largest transfer ({} bytes)",
            args.block_bytes, controller.info.transfer_bytes_max
        ));
    }
    let namespace = controller.namespace(args.nsid).map_err(|e| e.to_string())?;
    if !args.block_bytes.is_multiple_of(namespace.block_size) {
        return Err(format!(
            "--bs {} is not a multiple of the namespace's {}-byte blocks",
            args.block_bytes, namespace.block_size
        ));
    }
    let size = namespace.blocks * u64::from(namespace.block_size);
    let queues = (1..=args.queues as u16)
        .map(|qid| controller.open_io_queue(qid).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let threads: Vec<_> = queues
        .into_iter()
        .enumerate()
        .map(|(index, mut queue)| {
            let args = args.clone();
            let block_size = namespace.block_size;
            std::thread::spawn(move || -> Result<Results, String> {
                let mut workload = Workload::new(&args, size, index)?;
                let mut started =
                    vec![(Instant::now(), true); usize::from(args.iodepth as u16 + 1)];
                let mut results = Results::default();
                let begin = Instant::now();
                let measure_from = begin + args.ramp;
                let end = measure_from + args.runtime;
                let blocks = args.block_bytes / block_size;
                let mut submit =
                    |queue: &mut weft_initiator::Queue, started: &mut Vec<(Instant, bool)>| {
                        let (offset, read) = workload.next();
                        let slba = offset / u64::from(block_size);
                        let (opcode, transfer) = if read {
                            (
                                io_opcode::READ,
                                DataTransfer::FromController(args.block_bytes),
                            )
                        } else {
                            (
                                io_opcode::WRITE,
                                DataTransfer::ToController(args.block_bytes),
                            )
                        };
                        let cid = queue
                            .submit(read_write(opcode, args.nsid, slba, blocks), transfer)
                            .expect("a free slot: one completion per submission");
                        started[usize::from(cid.0)] = (Instant::now(), read);
                    };
                for _ in 0..args.iodepth {
                    submit(&mut queue, &mut started);
                }
                loop {
                    let done = queue.wait().map_err(|e| e.to_string())?;
                    let now = Instant::now();
                    if !done.status.is_success() {
                        return Err(format!("an I/O failed with status {:?}", done.status));
                    }
                    let (start, read) = started[usize::from(done.cid.0)];
                    if start >= measure_from {
                        let direction = if read {
                            &mut results.read
                        } else {
                            &mut results.write
                        };
                        direction.latencies_ns.push((now - start).as_nanos() as u64);
                        direction.bytes += u64::from(args.block_bytes);
                    }
                    if now >= end {
                        break;
                    }
                    submit(&mut queue, &mut started);
                }
                results.seconds = (Instant::now() - measure_from).as_secs_f64();
                Ok(results)
            })
        })
        .collect();
    collect(threads)
}

fn collect(
    threads: Vec<std::thread::JoinHandle<Result<Results, String>>>,
) -> Result<Results, String> {
    let mut total = Results::default();
    for thread in threads {
        total.merge(
            thread
                .join()
                .map_err(|_| "a benchmark thread panicked".to_string())??,
        );
    }
    Ok(total)
}

fn local(args: &BenchArgs) -> Result<Results, String> {
    let path = PathBuf::from(&args.target);
    let writes = !matches!(args.pattern, Pattern::Read | Pattern::RandRead);
    let file = OpenOptions::new()
        .read(true)
        .write(writes)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .map_err(|e| {
            format!(
                "{}: {e} (a local target is a file or block device opened with O_DIRECT)",
                path.display()
            )
        })?;
    let size = match weft_uring::block_device_size_bytes(&file) {
        Ok(size) => size,
        Err(_) => file
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len(),
    };
    let threads: Vec<_> = (0..args.queues)
        .map(|index| {
            let args = args.clone();
            let file = file.try_clone().map_err(|e| e.to_string());
            std::thread::spawn(move || -> Result<Results, String> {
                let file = file?;
                let mut workload = Workload::new(&args, size, index)?;
                let mut ring = Ring::new((args.iodepth as u32).next_power_of_two().max(8))
                    .map_err(|e| e.to_string())?;
                let mut buffers: Vec<Option<IoBuf>> = (0..args.iodepth)
                    .map(|_| IoBuf::new(args.block_bytes as usize).map(Some))
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.to_string())?;
                let mut started = vec![(Instant::now(), true); args.iodepth];
                let mut results = Results::default();
                let begin = Instant::now();
                let measure_from = begin + args.ramp;
                let end = measure_from + args.runtime;
                let fd = file.as_raw_fd();
                let len = args.block_bytes as usize;
                let mut submit = |ring: &mut Ring,
                                  slot: usize,
                                  buffers: &mut Vec<Option<IoBuf>>,
                                  started: &mut Vec<(Instant, bool)>|
                 -> Result<(), String> {
                    let (offset, read) = workload.next();
                    let buf = buffers[slot].take().expect("the slot's buffer is home");
                    let op = if read {
                        Op::Read {
                            fd,
                            buf,
                            buf_offset: 0,
                            len,
                            file_offset: offset,
                        }
                    } else {
                        Op::Write {
                            fd,
                            buf,
                            buf_offset: 0,
                            len,
                            file_offset: offset,
                            dsync: false,
                        }
                    };
                    started[slot] = (Instant::now(), read);
                    ring.push(op, slot as u64).map_err(|e| e.to_string())
                };
                for slot in 0..args.iodepth {
                    submit(&mut ring, slot, &mut buffers, &mut started)?;
                }
                loop {
                    ring.submit_and_wait(1).map_err(|e| e.to_string())?;
                    let mut finished = false;
                    while let Some(completion) = ring.pop() {
                        let now = Instant::now();
                        let slot = completion.user_data as usize;
                        if let weft_uring::Returned::Buf(buf) = completion.returned {
                            buffers[slot] = Some(buf);
                        }
                        match completion.result {
                            Ok(done) if done == len => {}
                            Ok(done) => {
                                return Err(format!("short transfer: {done} of {len} bytes"))
                            }
                            Err(error) => return Err(format!("{}: {error}", args.target)),
                        }
                        let (start, read) = started[slot];
                        if start >= measure_from {
                            let direction = if read {
                                &mut results.read
                            } else {
                                &mut results.write
                            };
                            direction.latencies_ns.push((now - start).as_nanos() as u64);
                            direction.bytes += len as u64;
                        }
                        if now >= end {
                            finished = true;
                        } else {
                            submit(&mut ring, slot, &mut buffers, &mut started)?;
                        }
                    }
                    if finished {
                        while ring.in_flight() > 0 {
                            ring.submit_and_wait(1).map_err(|e| e.to_string())?;
                            while ring.pop().is_some() {}
                        }
                        break;
                    }
                }
                results.seconds = (Instant::now() - measure_from).as_secs_f64();
                Ok(results)
            })
        })
        .collect();
    collect(threads)
}

struct Summary {
    ios: usize,
    iops: f64,
    bytes_per_second: f64,
    mean_ns: f64,
    min_ns: u64,
    max_ns: u64,
    percentiles: Vec<(f64, u64)>,
}

const PERCENTILES: [f64; 7] = [1.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0];

fn summarize(direction: &mut Direction, seconds: f64) -> Option<Summary> {
    let samples = &mut direction.latencies_ns;
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let at = |p: f64| {
        samples[((p / 100.0 * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1]
    };
    Some(Summary {
        ios: samples.len(),
        iops: samples.len() as f64 / seconds,
        bytes_per_second: direction.bytes as f64 / seconds,
        mean_ns: samples.iter().sum::<u64>() as f64 / samples.len() as f64,
        min_ns: samples[0],
        max_ns: samples[samples.len() - 1],
        percentiles: PERCENTILES.iter().map(|&p| (p, at(p))).collect(),
    })
}

fn print_table(args: &BenchArgs, read: &Option<Summary>, write: &Option<Summary>) {
    println!(
        "weft bench: {} {} bytes, iodepth {}, {} queue(s), {:.1} s measured, {}",
        args.pattern.name(),
        args.block_bytes,
        args.iodepth,
        args.queues,
        read.as_ref()
            .or(write.as_ref())
            .map_or(0.0, |s| s.ios as f64 / s.iops),
        args.target
    );
    println!(
        "{:<6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "", "IOPS", "MiB/s", "mean us", "p50 us", "p99 us", "p99.9 us"
    );
    for (name, summary) in [("read", read), ("write", write)] {
        if let Some(s) = summary {
            let us = |p: f64| {
                s.percentiles
                    .iter()
                    .find(|(q, _)| *q == p)
                    .map_or(0.0, |(_, ns)| *ns as f64 / 1000.0)
            };
            println!(
                "{name:<6} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                s.iops,
                s.bytes_per_second / (1 << 20) as f64,
                s.mean_ns / 1000.0,
                us(50.0),
                us(99.0),
                us(99.9)
            );
        }
    }
}

/// fio's JSON layout for the fields it shares with fio (`jobs[].read|write.iops`,
/// `bw_bytes`, `lat_ns.mean`, `lat_ns.percentile["99.000000"]`, ...).
fn fio_json(args: &BenchArgs, read: &Option<Summary>, write: &Option<Summary>) -> String {
    let direction = |summary: &Option<Summary>| {
        match summary {
        None => "{\"total_ios\":0,\"io_bytes\":0,\"iops\":0,\"bw_bytes\":0,\"lat_ns\":{\"min\":0,\"max\":0,\"mean\":0,\"percentile\":{}}}".to_string(),
        Some(s) => {
            let percentiles: Vec<String> = s.percentiles.iter().map(|(p, ns)| format!("\"{p:.6}\":{ns}")).collect();
            format!(
                "{{\"total_ios\":{},\"io_bytes\":{},\"iops\":{:.3},\"bw_bytes\":{:.0},\"lat_ns\":{{\"min\":{},\"max\":{},\"mean\":{:.1},\"percentile\":{{{}}}}}}}",
                s.ios,
                (s.bytes_per_second * s.ios as f64 / s.iops) as u64,
                s.iops,
                s.bytes_per_second,
                s.min_ns,
                s.max_ns,
                s.mean_ns,
                percentiles.join(",")
            )
        }
    }
    };
    format!(
        "{{\"fio version\":\"weft-bench-{}\",\"jobs\":[{{\"jobname\":\"{}\",\"job options\":{{\"rw\":\"{}\",\"bs\":\"{}\",\"iodepth\":\"{}\",\"numjobs\":\"{}\",\"filename\":\"{}\"}},\"read\":{},\"write\":{}}}]}}",
        env!("CARGO_PKG_VERSION"),
        args.pattern.name(),
        args.pattern.name(),
        args.block_bytes,
        args.iodepth,
        args.queues,
        args.target.replace('"', "\\\""),
        direction(read),
        direction(write)
    )
}
