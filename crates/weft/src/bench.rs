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

/// Which benchmark.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// One target.
    Single,
    /// A local file and a remote namespace, interleaved, per iodepth of the sweep.
    Compare {
        local: String,
        remote: String,
        sweep: Vec<usize>,
    },
    /// The TCP floor: plain request/response with NVMe/TCP's sizes.
    Floor,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    mode: Mode,
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
        mode: Mode::Single,
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
    let (mut local, mut remote, mut sweep) = (String::new(), String::new(), Vec::new());
    let mut first = true;
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        let name = match arg {
            Long(name) => format!("--{name}"),
            Value(value) if first => {
                first = false;
                args.mode = match value.to_str() {
                    Some("compare") => Mode::Compare { local: String::new(), remote: String::new(), sweep: Vec::new() },
                    Some("floor") => Mode::Floor,
                    _ => return Err(format!("{value:?} is not a bench mode: use `weft bench`, `weft bench compare` or `weft bench floor`")),
                };
                continue;
            }
            other => return Err(format!("{}; see weft --help", other.unexpected())),
        };
        first = false;
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
            "--local" => local = value()?,
            "--remote" => remote = value()?,
            "--sweep" => sweep = parse_sweep(&value()?)?,
            _ => {
                return Err(format!(
                    "unknown option {name} for weft bench; see weft --help"
                ))
            }
        }
    }
    match &mut args.mode {
        Mode::Single if args.target.is_empty() => {
            return Err(
                "weft bench needs --target nvme-tcp://HOST:PORT/NQN or --target PATH".into(),
            )
        }
        Mode::Compare { .. } if local.is_empty() || remote.is_empty() => {
            return Err(
                "weft bench compare needs --local PATH and --remote nvme-tcp://HOST:PORT/NQN"
                    .into(),
            )
        }
        Mode::Compare {
            local: l,
            remote: r,
            sweep: s,
        } => {
            (*l, *r, *s) = (local, remote, sweep);
        }
        _ => {}
    }
    if args.block_bytes == 0 || !args.block_bytes.is_multiple_of(512) {
        return Err(format!(
            "--bs {} is not a positive multiple of 512",
            args.block_bytes
        ));
    }
    Ok(args)
}

/// `iodepth=1,2,4` (the only swept parameter so far).
fn parse_sweep(text: &str) -> Result<Vec<usize>, String> {
    let values = text
        .strip_prefix("iodepth=")
        .ok_or_else(|| format!("--sweep \"{text}\" is not iodepth=N,N,..."))?;
    values
        .split(',')
        .map(|v| number(v, "--sweep iodepth", 1, 1024).map(|n| n as usize))
        .collect()
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
    match args.mode.clone() {
        Mode::Single => single(args),
        Mode::Compare {
            local,
            remote,
            sweep,
        } => compare(args, &local, &remote, sweep),
        Mode::Floor => floor(args),
    }
}

fn engine(args: &BenchArgs) -> Result<Results, String> {
    if args.target.starts_with("nvme-tcp://") {
        remote(args)
    } else {
        local(args)
    }
}

/// Local and remote side by side, one iodepth at a time, with ratios.
fn compare(
    args: BenchArgs,
    local_path: &str,
    remote_url: &str,
    sweep: Vec<usize>,
) -> Result<(), String> {
    let depths = if sweep.is_empty() {
        vec![args.iodepth]
    } else {
        sweep
    };
    println!(
        "weft bench compare: {} {} bytes, {} s per side, local {local_path} vs remote {remote_url}",
        args.pattern.name(),
        args.block_bytes,
        args.runtime.as_secs_f64()
    );
    println!(
        "{:>7} {:<7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "iodepth", "side", "IOPS", "MiB/s", "mean us", "p50 us", "p99 us", "p99.9 us"
    );
    let mut json_rows = Vec::new();
    for depth in depths {
        let mut sides = Vec::new();
        for target in [local_path, remote_url] {
            let side = BenchArgs {
                target: target.to_string(),
                iodepth: depth,
                mode: Mode::Single,
                ..args.clone()
            };
            let mut results = engine(&side)?;
            let read = summarize(&mut results.read, results.seconds);
            let write = summarize(&mut results.write, results.seconds);
            sides.push((read, write));
        }
        for (name, (read, write)) in ["local", "remote"].iter().zip(&sides) {
            for summary in [read, write].into_iter().flatten() {
                println!("{depth:>7} {name:<7} {}", row(summary));
            }
        }
        let pick = |side: &(Option<Summary>, Option<Summary>)| {
            side.0
                .as_ref()
                .or(side.1.as_ref())
                .map(|s| (s.iops, s.mean_ns, at(s, 99.0)))
        };
        if let (
            Some((local_iops, local_mean, local_p99)),
            Some((remote_iops, remote_mean, remote_p99)),
        ) = (pick(&sides[0]), pick(&sides[1]))
        {
            let adder_us = (remote_mean - local_mean) / 1000.0;
            println!(
                "{depth:>7} {:<7} IOPS {:.3}x, mean latency {:+.1} us ({:+.1}%), p99 {:.3}x",
                "ratio",
                remote_iops / local_iops,
                adder_us,
                100.0 * (remote_mean / local_mean - 1.0),
                remote_p99 as f64 / local_p99 as f64
            );
            json_rows.push(format!(
                "{{\"iodepth\":{depth},\"local_iops\":{local_iops:.1},\"remote_iops\":{remote_iops:.1},\"iops_ratio\":{:.4},\"local_mean_ns\":{local_mean:.0},\"remote_mean_ns\":{remote_mean:.0},\"latency_adder_us\":{adder_us:.2},\"local_p99_ns\":{local_p99},\"remote_p99_ns\":{remote_p99}}}",
                remote_iops / local_iops
            ));
        }
    }
    if args.json {
        println!("{{\"compare\":[{}]}}", json_rows.join(","));
    }
    Ok(())
}

fn at(summary: &Summary, percentile: f64) -> u64 {
    summary
        .percentiles
        .iter()
        .find(|(p, _)| *p == percentile)
        .map_or(0, |(_, ns)| *ns)
}

fn row(s: &Summary) -> String {
    format!(
        "{:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        s.iops,
        s.bytes_per_second / (1 << 20) as f64,
        s.mean_ns / 1000.0,
        at(s, 50.0) as f64 / 1000.0,
        at(s, 99.0) as f64 / 1000.0,
        at(s, 99.9) as f64 / 1000.0
    )
}

/// Bytes one 4 KiB read puts on the wire back: C2HData header, data, CapsuleResp.
const FLOOR_RESPONSE_BYTES: usize = 24 + 4096 + 24;
/// A CapsuleCmd without data.
const FLOOR_REQUEST_BYTES: usize = 72;

/// The physical floor of the path: a blocking TCP echo on loopback answering
/// a 72-byte request with the bytes of a 4 KiB read, at QD1 and QD32.
fn floor(args: BenchArgs) -> Result<(), String> {
    println!("weft bench floor: TCP request/response on loopback, {FLOOR_REQUEST_BYTES} bytes out, {FLOOR_RESPONSE_BYTES} back, {} s each", args.runtime.as_secs_f64());
    println!(
        "{:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "depth", "IOPS", "MiB/s", "mean us", "p50 us", "p99 us", "p99.9 us"
    );
    for depth in [1usize, 32] {
        let mut direction = floor_run(depth, args.runtime).map_err(|e| format!("floor: {e}"))?;
        let seconds = args.runtime.as_secs_f64();
        if let Some(summary) = summarize(&mut direction, seconds) {
            println!("{depth:>7} {}", row(&summary));
        }
    }
    Ok(())
}

fn floor_run(depth: usize, runtime: Duration) -> std::io::Result<Direction> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut request = [0u8; FLOOR_REQUEST_BYTES];
        let response = vec![0u8; FLOOR_RESPONSE_BYTES];
        while stream.read_exact(&mut request).is_ok() {
            stream.write_all(&response)?;
        }
        Ok(())
    });
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let mut response = vec![0u8; FLOOR_RESPONSE_BYTES];
    let mut started = std::collections::VecDeque::with_capacity(depth);
    let mut direction = Direction::default();
    let end = Instant::now() + runtime;
    for _ in 0..depth {
        started.push_back(Instant::now());
        stream.write_all(&[0u8; FLOOR_REQUEST_BYTES])?;
    }
    while let Some(start) = started.pop_front() {
        stream.read_exact(&mut response)?;
        let now = Instant::now();
        direction.latencies_ns.push((now - start).as_nanos() as u64);
        direction.bytes += 4096;
        if now < end {
            started.push_back(Instant::now());
            stream.write_all(&[0u8; FLOOR_REQUEST_BYTES])?;
        }
    }
    drop(stream);
    server
        .join()
        .map_err(|_| std::io::Error::other("floor server panicked"))??;
    Ok(direction)
}

fn single(args: BenchArgs) -> Result<(), String> {
    let mut results = engine(&args)?;
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
