//! `weft bench`: fio-style load on an NVMe/TCP namespace (through weft's
//! user-space initiator) or on a local file or block device (io_uring,
//! O_DIRECT), reported as a table or in fio's JSON layout for the fields they
//! share; `compare` runs both sides per iodepth with ratios (and a chart),
//! `floor` measures plain TCP with NVMe/TCP's sizes.
//!
//! The load loop itself is in [`engine`]; it is the same for both sides, so
//! a ratio compares the paths, not two benchmark programs.

mod engine;
mod histogram;
mod report;
mod verify;

use engine::{Direction, LocalDevice, Progress, RemoteDevice, Results};
use histogram::Histogram;
use report::{Point, Summary};
use std::fs::OpenOptions;
use std::io::IsTerminal;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use weft_initiator::{ConnectOptions, Controller, TargetUrl};
use weft_proto::auth::{DhchapSecret, HostKeys};

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
    /// Measured time; None: one pass over the region (`--size` alone).
    runtime: Option<Duration>,
    ramp: Duration,
    /// I/Os each queue issues per second at most (fio's rate_iops): a
    /// load of a fixed rate, whatever the target's speed.
    rate_iops: Option<u32>,
    /// Bytes of the target the load covers; None: all of it.
    size: Option<u64>,
    verify: bool,
    nsid: u32,
    header_digest: bool,
    data_digest: bool,
    /// Busy-poll the remote queues' sockets instead of sleeping.
    poll: bool,
    /// Host NQN to connect as (default: a random one).
    host_nqn: Option<String>,
    /// DH-HMAC-CHAP secrets, when the target asks this host to authenticate.
    dhchap: Option<HostKeys>,
    /// The host's NVMe/TCP TLS PSK: every queue connects in a TLS stream.
    tls_psk: Option<weft_proto::tls::psk::ConfiguredPsk>,
    /// Single: fio JSON on stdout instead of the table.
    json: bool,
    /// Compare: where to keep the whole comparison as JSON.
    json_file: Option<PathBuf>,
    /// Compare: where to draw latency against IOPS.
    plot_file: Option<PathBuf>,
    /// Compare: alternations of local and remote per iodepth (merged).
    rounds: usize,
}

fn parse_secret(text: &str, option: &str) -> Result<DhchapSecret, String> {
    DhchapSecret::parse(text).map_err(|error| format!("{option}: {error}"))
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
        runtime: None,
        ramp: Duration::ZERO,
        rate_iops: None,
        size: None,
        verify: false,
        nsid: 1,
        header_digest: false,
        data_digest: false,
        poll: false,
        host_nqn: None,
        dhchap: None,
        tls_psk: None,
        json: false,
        json_file: None,
        plot_file: None,
        rounds: 1,
    };
    let (mut local, mut remote, mut sweep) = (String::new(), String::new(), Vec::new());
    let (mut dhchap_secret, mut dhchap_ctrl_secret) = (None, None);
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
            "--bs" => {
                args.block_bytes = u32::try_from(parse_size(&value()?, &name)?)
                    .map_err(|_| format!("{name} is larger than 4 GiB"))?
            }
            "--size" => args.size = Some(parse_size(&value()?, &name)?),
            "--verify" => args.verify = true,
            "--rounds" => args.rounds = number(&value()?, &name, 1, 1000)? as usize,
            "--plot" => args.plot_file = Some(PathBuf::from(value()?)),
            "--iodepth" => args.iodepth = number(&value()?, &name, 1, 1024)? as usize,
            "--queues" => args.queues = number(&value()?, &name, 1, 64)? as usize,
            "--runtime" => args.runtime = Some(parse_duration(&value()?, &name)?),
            "--ramp" => args.ramp = parse_duration(&value()?, &name)?,
            "--rate-iops" => args.rate_iops = Some(number(&value()?, &name, 1, 10_000_000)? as u32),
            "--nsid" => args.nsid = number(&value()?, &name, 1, u64::from(u32::MAX - 1))? as u32,
            "--hdr-digest" => args.header_digest = true,
            "--data-digest" => args.data_digest = true,
            "--poll" => args.poll = true,
            "--hostnqn" => args.host_nqn = Some(value()?),
            "--dhchap-secret" => dhchap_secret = Some(parse_secret(&value()?, &name)?),
            "--dhchap-ctrl-secret" => dhchap_ctrl_secret = Some(parse_secret(&value()?, &name)?),
            "--tls-psk" => {
                let text = value()?;
                let psk = weft_proto::tls::psk::ConfiguredPsk::parse(&text)
                    .map_err(|error| format!("{name}: {error}"))?;
                args.tls_psk = Some(psk);
            }
            "--json" if matches!(args.mode, Mode::Compare { .. }) => {
                args.json_file = Some(PathBuf::from(value()?))
            }
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
    if args.runtime.is_none() && (args.size.is_none() || args.mode != Mode::Single) {
        args.runtime = Some(Duration::from_secs(10));
    }
    args.dhchap = match (dhchap_secret, dhchap_ctrl_secret) {
        (Some(host), controller) => Some(HostKeys {
            host,
            controller,
            dh_group: weft_proto::auth::DhGroup::Null,
        }),
        (None, Some(_)) => {
            return Err("--dhchap-ctrl-secret authenticates the controller to a host that authenticates itself: give --dhchap-secret too".into())
        }
        (None, None) => None,
    };
    if args.plot_file.is_some() && !matches!(args.mode, Mode::Compare { .. }) {
        return Err("--plot draws a sweep: use it with weft bench compare".into());
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

/// A size option, e.g. `--bs 4k` (the config's parser).
fn parse_size(text: &str, name: &str) -> Result<u64, String> {
    crate::config::parse_size_text(text).map_err(|e| format!("{name} {e}"))
}

/// A duration option: a whole number with `ms`, `s` (or none), `m`, `h`
/// or `d` (`--runtime 10s`, `--ttl 1h`).
pub fn parse_duration(text: &str, name: &str) -> Result<Duration, String> {
    let wrong = || format!("{name} \"{text}\" is not a duration like 500ms, 10s, 5m or 1h");
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: u64 = digits.parse().map_err(|_| wrong())?;
    let seconds = |per: u64| {
        value
            .checked_mul(per)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{name} \"{text}\" is too long"))
    };
    match unit {
        "ms" => Ok(Duration::from_millis(value)),
        "" | "s" => seconds(1),
        "m" => seconds(60),
        "h" => seconds(3600),
        "d" => seconds(86_400),
        _ => Err(wrong()),
    }
}

/// Runs the benchmark and prints its report.
pub fn run(args: BenchArgs) -> Result<(), String> {
    match args.mode.clone() {
        Mode::Single => single(&args),
        Mode::Compare {
            local,
            remote,
            sweep,
        } => compare(&args, &local, &remote, sweep),
        Mode::Floor => floor(&args),
    }
}

/// One side: the load on `args.target`, with a progress line on a terminal.
fn measure(args: &BenchArgs, label: &str) -> Result<Results, String> {
    let progress = Arc::new(Progress::default());
    let show = !args.json && std::io::stderr().is_terminal();
    let (stop, stopped) = mpsc::channel::<()>();
    let printer = show.then(|| {
        let (progress, label) = (Arc::clone(&progress), label.to_string());
        std::thread::spawn(move || print_progress(&progress, &label, &stopped))
    });
    let results = if args.target.starts_with("nvme-tcp://") {
        remote(args, &progress)
    } else {
        local(args, &progress)
    };
    drop(stop);
    if let Some(printer) = printer {
        let _ = printer.join();
    }
    results
}

/// Rewrites one stderr line each second with the last second's IOPS,
/// bandwidth and mean latency, until `stopped` hangs up; then erases it.
fn print_progress(progress: &Progress, label: &str, stopped: &mpsc::Receiver<()>) {
    let begin = Instant::now();
    let (mut ios, mut bytes, mut latency_ns) = (0u64, 0u64, 0u64);
    let mut last = begin;
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::from_secs(1)) {
        let now = Instant::now();
        let seconds = (now - last).as_secs_f64();
        let (new_ios, new_bytes, new_latency) = (
            progress.ios.load(Ordering::Relaxed),
            progress.bytes.load(Ordering::Relaxed),
            progress.latency_ns.load(Ordering::Relaxed),
        );
        let delta = new_ios - ios;
        eprint!(
            "\r\x1b[2K{label} {:>5.0} s {:>10.0} IOPS {:>9.1} MiB/s  mean {:>8.1} us",
            (now - begin).as_secs_f64(),
            delta as f64 / seconds,
            (new_bytes - bytes) as f64 / seconds / f64::from(1 << 20),
            (new_latency - latency_ns) as f64 / delta.max(1) as f64 / 1000.0
        );
        (ios, bytes, latency_ns, last) = (new_ios, new_bytes, new_latency, now);
    }
    eprint!("\r\x1b[2K");
}

fn single(args: &BenchArgs) -> Result<(), String> {
    let results = measure(args, "weft bench")?;
    let read = Summary::of(&results.read, results.seconds);
    let write = Summary::of(&results.write, results.seconds);
    if args.json {
        outln!(
            "{}",
            fio_json(args, read.as_ref(), write.as_ref(), &results)
        );
        return Ok(());
    }
    outln!(
        "weft bench: {} {} bytes, iodepth {}, {} queue(s), {:.1} s measured, {}",
        args.pattern.name(),
        args.block_bytes,
        args.iodepth,
        args.queues,
        results.seconds,
        args.target
    );
    outln!("{}", report::header("", 6));
    for (name, summary) in [("read", &read), ("write", &write)] {
        if let Some(summary) = summary {
            outln!("{name:<6} {}", report::row(summary));
        }
    }
    if args.verify {
        outln!(
            "verify: {} reads checked against their stamps, all intact",
            results.verified
        );
    }
    Ok(())
}

/// fio's JSON layout for the fields it shares with fio (`jobs[].read|write.iops`,
/// `bw_bytes`, `lat_ns.mean`, `lat_ns.percentile["99.000000"]`, ...).
fn fio_json(
    args: &BenchArgs,
    read: Option<&Summary>,
    write: Option<&Summary>,
    results: &Results,
) -> String {
    format!(
        "{{\"fio version\":\"weft-bench-{}\",\"jobs\":[{{\"jobname\":\"{}\",\"job options\":{{\"rw\":\"{}\",\"bs\":\"{}\",\"iodepth\":\"{}\",\"numjobs\":\"{}\",\"filename\":\"{}\"}},\"job_runtime\":{:.0},\"verified_reads\":{},{}\"read\":{},\"write\":{}}}]}}",
        env!("CARGO_PKG_VERSION"),
        args.pattern.name(),
        args.pattern.name(),
        args.block_bytes,
        args.iodepth,
        args.queues,
        args.target.replace('"', "\\\""),
        results.seconds * 1000.0,
        results.verified,
        host_stages_json(&results.host),
        Summary::fio_json(read),
        Summary::fio_json(write)
    )
}

/// `"host_stages":{...},` for a remote run (its means per I/O), else nothing.
fn host_stages_json(host: &engine::HostStages) -> String {
    if host.ios == 0 {
        return String::new();
    }
    let mean_us = |total_ns: u64| total_ns as f64 / host.ios as f64 / 1000.0;
    format!(
        "\"host_stages\":{{\"ios\":{},\"queued_us_mean\":{:.2},\"round_trip_us_mean\":{:.2}}},",
        host.ios,
        mean_us(host.queued_ns),
        mean_us(host.round_trip_ns)
    )
}

/// The blocks of the target the load covers.
fn region_blocks(args: &BenchArgs, size_bytes: u64) -> Result<u64, String> {
    let block_bytes = u64::from(args.block_bytes);
    let region = match args.size {
        Some(size) if size > size_bytes => {
            return Err(format!(
                "--size {size} is larger than the target ({size_bytes} bytes)"
            ))
        }
        Some(size) if !size.is_multiple_of(block_bytes) || size == 0 => {
            return Err(format!(
                "--size {size} is not a positive multiple of --bs {block_bytes}"
            ))
        }
        Some(size) => size,
        None => size_bytes,
    };
    match region / block_bytes {
        0 => Err(format!(
            "the target ({size_bytes} bytes) is smaller than one {block_bytes} byte block"
        )),
        blocks => Ok(blocks),
    }
}

fn remote(args: &BenchArgs, progress: &Arc<Progress>) -> Result<Results, String> {
    let url = TargetUrl::parse(&args.target).map_err(|e| e.to_string())?;
    let options = ConnectOptions {
        header_digest: args.header_digest,
        data_digest: args.data_digest,
        io_queue_entries: (args.iodepth as u16 + 1).max(2),
        ..ConnectOptions::default()
    };
    let options = match &args.host_nqn {
        Some(host_nqn) => ConnectOptions {
            host_nqn: host_nqn.clone(),
            ..options
        },
        None => options,
    };
    let options = ConnectOptions {
        dhchap: args.dhchap.clone(),
        tls_psk: args.tls_psk.clone(),
        ..options
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
        let size = |bytes: u32| weft_storage::human_bytes(u64::from(bytes)).replace(' ', "");
        return Err(format!(
            "--bs {} is above this target's largest transfer, {} (its MDTS); use --bs {} or less",
            size(args.block_bytes),
            size(controller.info.transfer_bytes_max),
            size(controller.info.transfer_bytes_max)
                .to_lowercase()
                .trim_end_matches("ib"),
        ));
    }
    let namespace = controller.namespace(args.nsid).map_err(|e| e.to_string())?;
    if !args.block_bytes.is_multiple_of(namespace.block_size) {
        return Err(format!(
            "--bs {} is not a multiple of the namespace's {}-byte blocks",
            args.block_bytes, namespace.block_size
        ));
    }
    let blocks = region_blocks(args, namespace.blocks * u64::from(namespace.block_size))?;
    let mut queues = (1..=args.queues as u16)
        .map(|qid| {
            let mut queue = controller.open_io_queue(qid)?;
            queue.set_polling(args.poll)?;
            Ok::<_, weft_initiator::InitiatorError>(Some(queue))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let results = engine::run_workers(args, blocks, progress, |index| {
        let device = RemoteDevice::new(
            queues[index].take().expect("one queue per worker"),
            args.nsid,
            namespace.block_size,
            args.block_bytes,
        );
        Ok(Box::new(move || Ok(device)))
    });
    drop(controller);
    results
}

fn local(args: &BenchArgs, progress: &Arc<Progress>) -> Result<Results, String> {
    let path = PathBuf::from(&args.target);
    let writes = args.verify || !matches!(args.pattern, Pattern::Read | Pattern::RandRead);
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
    let blocks = region_blocks(args, size)?;
    engine::run_workers(args, blocks, progress, |_| {
        let file = file.try_clone().map_err(|e| e.to_string())?;
        let (name, iodepth, len) = (args.target.clone(), args.iodepth, args.block_bytes);
        Ok(Box::new(move || {
            LocalDevice::new(file, &name, iodepth, len as usize)
        }))
    })
}

/// Local and remote side by side, one iodepth at a time, with ratios; the
/// whole comparison optionally kept as JSON and drawn as SVG.
fn compare(
    args: &BenchArgs,
    local_path: &str,
    remote_url: &str,
    sweep: Vec<usize>,
) -> Result<(), String> {
    let depths = if sweep.is_empty() {
        vec![args.iodepth]
    } else {
        sweep
    };
    outln!(
        "weft bench compare: {} {} bytes, {} queue(s), {} x {} s per side, local {local_path} vs remote {remote_url}",
        args.pattern.name(),
        args.block_bytes,
        args.queues,
        args.rounds,
        args.runtime.unwrap_or_default().as_secs_f64()
    );
    outln!("{}", report::header("iodepth side   ", 15));
    let rounds = args.rounds;
    let (mut json_points, mut local_points, mut remote_points) =
        (Vec::new(), Vec::new(), Vec::new());
    for depth in depths {
        // Rounds alternate the sides so that drift on a noisy machine hits both alike.
        let mut measured = [Results::default(), Results::default()];
        for round in 1..=rounds {
            for (side, target) in [local_path, remote_url].into_iter().enumerate() {
                let side_args = BenchArgs {
                    target: target.to_string(),
                    iodepth: depth,
                    mode: Mode::Single,
                    ..args.clone()
                };
                let name = ["local", "remote"][side];
                let results = measure(&side_args, &format!("{name} qd{depth} {round}/{rounds}"))?;
                measured[side].add_round(results);
            }
        }
        let mut sides = Vec::new();
        for (name, results) in ["local", "remote"].into_iter().zip(measured) {
            let read = Summary::of(&results.read, results.seconds);
            let write = Summary::of(&results.write, results.seconds);
            for (direction, summary) in [("", &read), (" w", &write)] {
                if let Some(summary) = summary {
                    let label = format!("{name}{direction}");
                    outln!("{depth:>7} {label:<7} {}", report::row(summary));
                }
            }
            sides.push((read, write));
        }
        // The ratios are of the reads, or of the writes for write-only patterns.
        let pick = |side: &(Option<Summary>, Option<Summary>)| side.0.clone().or(side.1.clone());
        let (Some(local), Some(remote)) = (pick(&sides[0]), pick(&sides[1])) else {
            return Err(format!("iodepth {depth}: a side finished no I/O"));
        };
        let ratio = |r: f64, l: f64| if l > 0.0 { r / l } else { 0.0 };
        let adder_us = (remote.mean_ns - local.mean_ns) / 1000.0;
        let adder_percent = 100.0 * (ratio(remote.mean_ns, local.mean_ns) - 1.0);
        let iops_ratio = ratio(remote.iops, local.iops);
        let bw_ratio = ratio(remote.bytes_per_second, local.bytes_per_second);
        let p99_ratio = ratio(remote.at(99.0) as f64, local.at(99.0) as f64);
        outln!(
            "{depth:>7} {:<7} IOPS {iops_ratio:.3}x, MiB/s {bw_ratio:.3}x, mean latency {adder_us:+.1} us ({adder_percent:+.1}%), p99 {p99_ratio:.3}x",
            "ratio",
        );
        let point = |s: &Summary| Point {
            iodepth: depth,
            iops: s.iops,
            mean_us: s.mean_ns / 1000.0,
            p99_us: s.at(99.0) as f64 / 1000.0,
        };
        local_points.push(point(&local));
        remote_points.push(point(&remote));
        let side_json = |side: &(Option<Summary>, Option<Summary>)| {
            format!(
                "{{\"read\":{},\"write\":{}}}",
                Summary::fio_json(side.0.as_ref()),
                Summary::fio_json(side.1.as_ref())
            )
        };
        json_points.push(format!(
            "{{\"iodepth\":{depth},\"local\":{},\"remote\":{},\"iops_ratio\":{iops_ratio:.4},\"bw_ratio\":{bw_ratio:.4},\"latency_adder_us\":{adder_us:.2},\"latency_adder_percent\":{adder_percent:.2},\"p99_ratio\":{p99_ratio:.4}}}",
            side_json(&sides[0]),
            side_json(&sides[1]),
        ));
    }
    let title = format!(
        "{} {} bytes, {} queue(s): local {local_path} vs remote {remote_url}",
        args.pattern.name(),
        args.block_bytes,
        args.queues
    );
    if let Some(path) = &args.json_file {
        let json = format!(
            "{{\"weft_bench_compare\":{{\"rw\":\"{}\",\"bs\":{},\"queues\":{},\"rounds\":{},\"runtime_s\":{},\"local\":\"{}\",\"remote\":\"{}\",\"points\":[{}]}}}}\n",
            args.pattern.name(),
            args.block_bytes,
            args.queues,
            args.rounds,
            args.runtime.unwrap_or_default().as_secs_f64(),
            local_path.replace('"', "\\\""),
            remote_url.replace('"', "\\\""),
            json_points.join(",")
        );
        write_file(path, &json)?;
    }
    if let Some(path) = &args.plot_file {
        let svg = report::plot_svg(
            &title,
            &[("local", local_points), ("remote", remote_points)],
        );
        write_file(path, &svg)?;
    }
    Ok(())
}

fn write_file(path: &std::path::Path, contents: &str) -> Result<(), String> {
    std::fs::write(path, contents)
        .map_err(|e| format!("{}: cannot write it: {e}", path.display()))?;
    outln!("wrote {}", path.display());
    Ok(())
}

/// Bytes one 4 KiB read puts on the wire back: C2HData header, data, CapsuleResp.
const FLOOR_RESPONSE_BYTES: usize = 24 + 4096 + 24;
/// A CapsuleCmd without data.
const FLOOR_REQUEST_BYTES: usize = 72;

/// The physical floor of the path: a blocking TCP echo on loopback answering
/// a 72-byte request with the bytes of a 4 KiB read, at QD1 and QD32.
///
/// Where the two threads run matters more than anything else on a VM: a
/// wake-up on another CPU can cost tens of microseconds. weft's reactors are
/// pinned and a remote host is another machine, so the floor that weft is
/// held to has its client and server pinned to different CPUs; the one-CPU
/// row shows what the same exchange costs without a cross-CPU wake-up.
fn floor(args: &BenchArgs) -> Result<(), String> {
    let runtime = args.runtime.unwrap_or(Duration::from_secs(10));
    // The first and last CPU this process may use (`taskset` is respected).
    let cpus = weft_uring::allowed_cpus().unwrap_or_else(|_| vec![0]);
    let (first, last) = (cpus[0], cpus[cpus.len() - 1]);
    outln!(
        "weft bench floor: TCP request/response on loopback, {FLOOR_REQUEST_BYTES} bytes out, {FLOOR_RESPONSE_BYTES} back, {} s each",
        runtime.as_secs_f64()
    );
    outln!("{}", report::header("depth placement    ", 19));
    let mut rows = vec![(1usize, (first, last)), (32, (first, last))];
    if first != last {
        rows.push((1, (first, first)));
    }
    let mut json = Vec::new();
    for (depth, (client_cpu, server_cpu)) in rows {
        let placement = if client_cpu == server_cpu {
            "one CPU"
        } else {
            "cross-CPU"
        };
        let direction =
            floor_run(depth, runtime, client_cpu, server_cpu).map_err(|e| format!("floor: {e}"))?;
        if let Some(summary) = Summary::of(&direction, runtime.as_secs_f64()) {
            outln!("{depth:>5} {placement:<13} {}", report::row(&summary));
            json.push(format!(
                "{{\"iodepth\":{depth},\"placement\":\"{placement}\",\"read\":{}}}",
                Summary::fio_json(Some(&summary))
            ));
        }
    }
    if args.json {
        outln!("{{\"weft_bench_floor\":[{}]}}", json.join(","));
    }
    Ok(())
}

fn floor_run(
    depth: usize,
    runtime: Duration,
    client_cpu: usize,
    server_cpu: usize,
) -> std::io::Result<Direction> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        use std::io::{Read, Write};
        // Best effort: without the permission the floor is merely less repeatable.
        let _ = weft_uring::pin_current_thread_to_cpu(server_cpu);
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut request = [0u8; FLOOR_REQUEST_BYTES];
        let response = vec![0u8; FLOOR_RESPONSE_BYTES];
        while stream.read_exact(&mut request).is_ok() {
            stream.write_all(&response)?;
        }
        Ok(())
    });
    let client = std::thread::spawn(move || floor_client(address, depth, runtime, client_cpu));
    let direction = client
        .join()
        .map_err(|_| std::io::Error::other("floor client panicked"))??;
    server
        .join()
        .map_err(|_| std::io::Error::other("floor server panicked"))??;
    Ok(direction)
}

fn floor_client(
    address: std::net::SocketAddr,
    depth: usize,
    runtime: Duration,
    cpu: usize,
) -> std::io::Result<Direction> {
    use std::io::{Read, Write};
    let _ = weft_uring::pin_current_thread_to_cpu(cpu);
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let mut response = vec![0u8; FLOOR_RESPONSE_BYTES];
    let mut started = std::collections::VecDeque::with_capacity(depth);
    let mut direction = Direction {
        latency: Histogram::default(),
        bytes: 0,
    };
    let end = Instant::now() + runtime;
    for _ in 0..depth {
        started.push_back(Instant::now());
        stream.write_all(&[0u8; FLOOR_REQUEST_BYTES])?;
    }
    while let Some(start) = started.pop_front() {
        stream.read_exact(&mut response)?;
        let now = Instant::now();
        direction.latency.record((now - start).as_nanos() as u64);
        direction.bytes += 4096;
        if now < end {
            started.push_back(Instant::now());
            stream.write_all(&[0u8; FLOOR_REQUEST_BYTES])?;
        }
    }
    Ok(direction)
}

#[cfg(test)]
mod tests {

    #[test]
    fn durations_take_the_units_their_options_name() {
        let parse = |text| parse_duration(text, "--ttl");
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse("1w").unwrap_err().contains("not a duration like"));
        assert!(parse("h").unwrap_err().contains("not a duration like"));
        assert!(parse("18446744073709551615d")
            .unwrap_err()
            .contains("too long"));
    }
    use super::*;

    fn parse_line(line: &str) -> Result<BenchArgs, String> {
        let mut parser =
            lexopt::Parser::from_iter(std::iter::once("bench").chain(line.split_whitespace()));
        parse(&mut parser)
    }

    #[test]
    fn options_parse_and_errors_say_what_to_fix() {
        let args = parse_line("--target f --size 64m --verify --bs 8k").unwrap();
        assert_eq!(args.size, Some(64 << 20));
        assert_eq!(args.runtime, None, "--size alone: one pass");
        assert!(args.verify);
        assert_eq!(
            parse_line("--target f").unwrap().runtime,
            Some(Duration::from_secs(10))
        );
        let compare =
            parse_line("compare --local a --remote b --json out.json --plot p.svg").unwrap();
        assert_eq!(compare.json_file, Some(PathBuf::from("out.json")));
        assert!(parse_line("--target f --plot x.svg")
            .unwrap_err()
            .contains("weft bench compare"));
        assert!(parse_line("--target f --bs 1000")
            .unwrap_err()
            .contains("multiple of 512"));
        let args = parse_line("--target f --size 6k").unwrap();
        assert!(region_blocks(&args, 1 << 20)
            .unwrap_err()
            .contains("not a positive multiple"));
        let args = parse_line("--target f --size 2m").unwrap();
        assert!(region_blocks(&args, 1 << 20)
            .unwrap_err()
            .contains("larger than the target"));
        assert_eq!(region_blocks(&args, 4 << 20).unwrap(), 512);
    }
}
