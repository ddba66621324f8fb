//! The load loop shared by both sides of a comparison: one worker thread per
//! queue keeps `iodepth` I/Os in flight on a [`Device`] (an NVMe/TCP queue
//! of weft's initiator, or an io_uring ring on a local file with O_DIRECT),
//! times every I/O into histograms and, with `--verify`, stamps what it
//! writes and checks what it reads.
//!
//! Each worker owns a contiguous share of the region, so two workers never
//! touch the same block and verification needs no coordination. With
//! `--verify` a worker never has two I/Os on one block in flight.

use super::histogram::Histogram;
use super::verify::Stamps;
use super::{BenchArgs, Pattern};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_initiator::{read_write, Queue};
use weft_proto::command::io_opcode;
use weft_proto::host::DataTransfer;
use weft_uring::{IoBuf, Op, Ring};

/// One queue's way of doing I/O of the benchmark's block size.
pub trait Device {
    /// Starts an I/O at byte `offset`; for a write, `fill` writes its data
    /// into the buffer first. Returns the I/O's tag.
    fn submit(
        &mut self,
        offset: u64,
        read: bool,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, String>;
    /// Sends what was submitted and blocks until at least one I/O finishes;
    /// appends the tags of the finished ones.
    fn complete(&mut self, done: &mut Vec<usize>) -> Result<(), String>;
    /// The data a finished read brought (valid until the tag is reused).
    fn data(&mut self, tag: usize) -> &[u8];
    /// Where the host's time went so far (a remote queue only).
    fn host_stages(&self) -> HostStages {
        HostStages::default()
    }
}

/// The host side of remote I/O, added up over every pass of a run (the
/// `--verify` passes and the ramp included): from the benchmark's submit to
/// the send that carried the command, and from that send to the completion
/// received (for a write sent after an R2T, the R2T's exchange included).
/// The rest of an I/O's latency is the benchmark's own bookkeeping.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HostStages {
    /// I/Os completed.
    pub ios: u64,
    /// Submitted to sent, added up.
    pub queued_ns: u64,
    /// Sent to completed, added up.
    pub round_trip_ns: u64,
}

impl HostStages {
    fn add(&mut self, other: HostStages) {
        self.ios += other.ios;
        self.queued_ns += other.queued_ns;
        self.round_trip_ns += other.round_trip_ns;
    }
}

/// A queue of weft's initiator.
pub struct RemoteDevice {
    pub queue: Queue,
    pub nsid: u32,
    pub block_size: u32,
    pub len: u32,
    /// Per command ID: when it was submitted, then when its send finished.
    times: Vec<Instant>,
    /// Submitted, not sent yet.
    unsent: Vec<u16>,
    stages: HostStages,
}

impl RemoteDevice {
    pub fn new(queue: Queue, nsid: u32, block_size: u32, len: u32) -> RemoteDevice {
        RemoteDevice {
            times: Vec::new(),
            unsent: Vec::new(),
            stages: HostStages::default(),
            queue,
            nsid,
            block_size,
            len,
        }
    }
}

impl Device for RemoteDevice {
    fn submit(
        &mut self,
        offset: u64,
        read: bool,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, String> {
        let (opcode, transfer) = if read {
            (io_opcode::READ, DataTransfer::FromController(self.len))
        } else {
            let cid = self.queue.next_cid();
            fill(&mut self.queue.buffer(cid)[..self.len as usize]);
            (io_opcode::WRITE, DataTransfer::ToController(self.len))
        };
        let slba = offset / u64::from(self.block_size);
        let command = read_write(opcode, self.nsid, slba, self.len / self.block_size);
        let cid = self
            .queue
            .submit(command, transfer)
            .map_err(|e| format!("submitting an I/O: {e}"))?;
        let now = Instant::now();
        if self.times.len() <= usize::from(cid.0) {
            self.times.resize(usize::from(cid.0) + 1, now);
        }
        self.times[usize::from(cid.0)] = now;
        self.unsent.push(cid.0);
        Ok(usize::from(cid.0))
    }

    fn complete(&mut self, done: &mut Vec<usize>) -> Result<(), String> {
        self.queue.transmit().map_err(|e| e.to_string())?;
        let sent = Instant::now();
        for cid in self.unsent.drain(..) {
            let submitted = std::mem::replace(&mut self.times[usize::from(cid)], sent);
            self.stages.queued_ns += (sent - submitted).as_nanos() as u64;
        }
        let mut completion = Some(self.queue.wait().map_err(|e| e.to_string())?);
        let received = Instant::now();
        while let Some(finished) = completion {
            if !finished.status.is_success() {
                return Err(format!("an I/O failed with status {}", finished.status));
            }
            let sent = self.times[usize::from(finished.cid.0)];
            self.stages.round_trip_ns += (received - sent).as_nanos() as u64;
            self.stages.ios += 1;
            done.push(usize::from(finished.cid.0));
            completion = self.queue.poll_completion();
        }
        Ok(())
    }

    fn host_stages(&self) -> HostStages {
        self.stages
    }

    fn data(&mut self, tag: usize) -> &[u8] {
        &self.queue.buffer(tag as u16)[..self.len as usize]
    }
}

/// An io_uring ring on a local file or block device opened with O_DIRECT.
pub struct LocalDevice {
    ring: Ring,
    file: File,
    name: String,
    buffers: Vec<Option<IoBuf>>,
    free: Vec<usize>,
    len: usize,
}

impl LocalDevice {
    /// A ring and `iodepth` aligned buffers of `len` bytes.
    pub fn new(file: File, name: &str, iodepth: usize, len: usize) -> Result<LocalDevice, String> {
        let ring = Ring::new((iodepth as u32).next_power_of_two().max(8))
            .map_err(|e| format!("io_uring: {e}"))?;
        let buffers = (0..iodepth)
            .map(|_| IoBuf::new(len).map(Some))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        Ok(LocalDevice {
            ring,
            file,
            name: name.to_string(),
            buffers,
            free: (0..iodepth).rev().collect(),
            len,
        })
    }
}

impl Device for LocalDevice {
    fn submit(
        &mut self,
        offset: u64,
        read: bool,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, String> {
        let slot = self
            .free
            .pop()
            .expect("no more I/Os in flight than buffers");
        let mut buf = self.buffers[slot]
            .take()
            .expect("a free slot's buffer is home");
        let (fd, len) = (self.file.as_raw_fd(), self.len);
        let op = if read {
            Op::Read {
                fd,
                buf,
                buf_offset: 0,
                len,
                file_offset: offset,
            }
        } else {
            fill(&mut buf.as_mut_slice()[..len]);
            Op::Write {
                fd,
                buf,
                buf_offset: 0,
                len,
                file_offset: offset,
                dsync: false,
            }
        };
        self.ring
            .push(op, slot as u64)
            .map_err(|e| format!("io_uring: {e}"))?;
        Ok(slot)
    }

    fn complete(&mut self, done: &mut Vec<usize>) -> Result<(), String> {
        self.ring
            .submit_and_wait(1)
            .map_err(|e| format!("io_uring: {e}"))?;
        while let Some(completion) = self.ring.pop() {
            let slot = completion.user_data as usize;
            if let weft_uring::Returned::Buf(buf) = completion.returned {
                self.buffers[slot] = Some(buf);
            }
            self.free.push(slot);
            match completion.result {
                Ok(bytes) if bytes == self.len => done.push(slot),
                Ok(bytes) => {
                    return Err(format!(
                        "{}: short transfer, {bytes} of {} bytes",
                        self.name, self.len
                    ))
                }
                Err(error) => return Err(format!("{}: {error}", self.name)),
            }
        }
        Ok(())
    }

    fn data(&mut self, tag: usize) -> &[u8] {
        &self.buffers[tag]
            .as_ref()
            .expect("a finished I/O's buffer is home")
            .as_slice()[..self.len]
    }
}

/// Counters the progress line reads while workers run.
#[derive(Debug, Default)]
pub struct Progress {
    pub ios: AtomicU64,
    pub bytes: AtomicU64,
    pub latency_ns: AtomicU64,
}

/// What one direction measured.
#[derive(Debug, Default)]
pub struct Direction {
    pub latency: Histogram,
    pub bytes: u64,
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct Results {
    pub read: Direction,
    pub write: Direction,
    pub seconds: f64,
    /// Reads whose data was checked against its stamp.
    pub verified: u64,
    /// The host side of remote I/O (zero for a local device).
    pub host: HostStages,
}

impl Results {
    /// Adds a run made after this one (times add up; `merge` is for runs side by side).
    pub fn add_round(&mut self, later: Results) {
        let seconds = self.seconds + later.seconds;
        self.merge(later);
        self.seconds = seconds;
    }

    /// Adds a run made at the same time (queues of one run).
    pub fn merge(&mut self, other: Results) {
        self.read.latency.merge(&other.read.latency);
        self.read.bytes += other.read.bytes;
        self.write.latency.merge(&other.write.latency);
        self.write.bytes += other.write.bytes;
        self.seconds = self.seconds.max(other.seconds);
        self.verified += other.verified;
        self.host.add(other.host);
    }
}

/// The blocks one worker owns: `[first, first + count)` in units of the
/// block size.
#[derive(Debug, Clone, Copy)]
pub struct Share {
    pub first: u64,
    pub count: u64,
}

impl Share {
    /// Worker `index` of `workers` over a region of `blocks`.
    pub fn of(blocks: u64, index: usize, workers: usize) -> Share {
        let first = blocks * index as u64 / workers as u64;
        let end = blocks * (index as u64 + 1) / workers as u64;
        Share {
            first,
            count: end - first,
        }
    }
}

/// Which blocks a phase visits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Sequential,
    Random,
    /// Every block this worker wrote, once (the final check of `--verify`).
    Written,
}

/// One pass of the loop: what to issue, when to stop, what to record.
struct Phase {
    order: Order,
    pattern: Pattern,
    /// Stop issuing after this many I/Os.
    ios_max: u64,
    /// Stop issuing at this instant.
    until: Option<Instant>,
    /// Record I/Os started from this instant on (None: record nothing).
    measure_from: Option<Instant>,
}

/// When each I/O of a fixed-rate load is due (`--rate-iops`): evenly
/// spaced from the phase's start, so a late I/O does not push the rest back.
struct Pacing {
    start: Instant,
    interval: Option<Duration>,
}

impl Pacing {
    fn new(rate_iops: Option<u32>, start: Instant) -> Pacing {
        let interval = rate_iops.map(|rate| Duration::from_secs(1) / rate);
        Pacing { start, interval }
    }

    /// When I/O number `issued` is due (None: at once, no rate).
    fn due(&self, issued: u64) -> Option<Instant> {
        let interval = self.interval?;
        let ahead = interval.saturating_mul(u32::try_from(issued).unwrap_or(u32::MAX));
        Some(self.start + ahead)
    }
}

/// One worker: a device, its share of the region and its stamps.
pub struct Worker<'a> {
    pub args: &'a BenchArgs,
    pub share: Share,
    pub progress: &'a Progress,
    pub stamps: Option<Stamps>,
    state: u64,
    next: u64,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    block: u64,
    read: bool,
    generation: u32,
    start: Instant,
}

impl<'a> Worker<'a> {
    pub fn new(args: &'a BenchArgs, share: Share, progress: &'a Progress, index: usize) -> Self {
        Worker {
            args,
            share,
            progress,
            stamps: args.verify.then(|| Stamps::new(share.count)),
            state: 0x9E37_79B9_7F4A_7C15 ^ (index as u64 + 1),
            next: 0,
        }
    }

    /// Runs the job: with `--verify`, a fill pass first for read-only
    /// patterns and a check of every written block last.
    pub fn run(&mut self, device: &mut dyn Device) -> Result<Results, String> {
        let args = self.args;
        let mut results = Results::default();
        let read_only = matches!(args.pattern, Pattern::Read | Pattern::RandRead);
        if args.verify && read_only {
            self.pass(device, &mut results, Order::Sequential, Pattern::Write)?;
        }
        let begin = Instant::now();
        let measure_from = begin + args.ramp;
        let random = !matches!(args.pattern, Pattern::Read | Pattern::Write);
        let phase = Phase {
            order: if random {
                Order::Random
            } else {
                Order::Sequential
            },
            pattern: args.pattern,
            ios_max: match args.runtime {
                Some(_) => u64::MAX,
                None => self.share.count,
            },
            until: args.runtime.map(|runtime| measure_from + runtime),
            measure_from: Some(measure_from),
        };
        self.next = 0;
        let last = self.phase(device, &mut results, phase)?;
        results.seconds = last.saturating_duration_since(measure_from).as_secs_f64();
        if args.verify && !read_only {
            self.pass(device, &mut results, Order::Written, Pattern::Read)?;
        }
        results.host = device.host_stages();
        Ok(results)
    }

    /// An unmeasured pass over the share.
    fn pass(
        &mut self,
        device: &mut dyn Device,
        results: &mut Results,
        order: Order,
        pattern: Pattern,
    ) -> Result<(), String> {
        self.next = 0;
        let phase = Phase {
            order,
            pattern,
            ios_max: self.share.count,
            until: None,
            measure_from: None,
        };
        self.phase(device, results, phase).map(|_| ())
    }

    fn random(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// The next block (relative to the share) and direction, or None when
    /// the phase has nothing more to issue.
    fn choose(&mut self, phase: &Phase) -> Option<(u64, bool)> {
        let count = self.share.count;
        let block = match phase.order {
            Order::Sequential => {
                let block = self.next % count;
                self.next += 1;
                block
            }
            Order::Random => loop {
                let block = self.random() % count;
                if !self.stamps.as_ref().is_some_and(|s| s.busy(block)) {
                    break block;
                }
            },
            Order::Written => {
                let stamps = self.stamps.as_ref().expect("a check pass needs stamps");
                while self.next < count && stamps.generation(self.next) == 0 {
                    self.next += 1;
                }
                if self.next == count {
                    return None;
                }
                self.next += 1;
                self.next - 1
            }
        };
        let read = match phase.pattern {
            Pattern::Read | Pattern::RandRead => true,
            Pattern::Write | Pattern::RandWrite => false,
            Pattern::RandRw => self.random() % 100 < u64::from(self.args.read_percent),
        };
        Some((block, read))
    }

    /// Keeps `iodepth` I/Os in flight until the phase ends and every I/O
    /// finished; returns when the last one finished.
    fn phase(
        &mut self,
        device: &mut dyn Device,
        results: &mut Results,
        phase: Phase,
    ) -> Result<Instant, String> {
        let block_bytes = u64::from(self.args.block_bytes);
        let mut in_flight: Vec<Option<InFlight>> = Vec::new();
        let mut outstanding = 0usize;
        let mut issued = 0u64;
        let mut done = Vec::with_capacity(self.args.iodepth);
        let mut now = Instant::now();
        let mut stopped = false;
        let pacing = Pacing::new(self.args.rate_iops, now);
        loop {
            while !stopped && outstanding < self.args.iodepth {
                if issued == phase.ios_max || phase.until.is_some_and(|until| now >= until) {
                    stopped = true;
                    break;
                }
                if let Some(due) = pacing.due(issued).filter(|&due| due > now) {
                    if outstanding > 0 {
                        // Completions first; the next turn looks again.
                        break;
                    }
                    std::thread::sleep(due - now);
                    now = Instant::now();
                    continue;
                }
                let Some((block, read)) = self.choose(&phase) else {
                    stopped = true;
                    break;
                };
                let absolute = self.share.first + block;
                let generation = match &mut self.stamps {
                    Some(stamps) => stamps.start(block, read),
                    None => 0,
                };
                let mut fill = |buf: &mut [u8]| {
                    if generation != 0 {
                        super::verify::stamp(buf, absolute * block_bytes, generation);
                    }
                };
                let start = Instant::now();
                let tag = device.submit(absolute * block_bytes, read, &mut fill)?;
                if in_flight.len() <= tag {
                    in_flight.resize(tag + 1, None);
                }
                in_flight[tag] = Some(InFlight {
                    block,
                    read,
                    generation,
                    start,
                });
                outstanding += 1;
                issued += 1;
            }
            if outstanding == 0 {
                return Ok(now);
            }
            device.complete(&mut done)?;
            now = Instant::now();
            // The progress line's counters, added once per batch rather than per I/O.
            let (mut batch_ios, mut batch_bytes, mut batch_latency_ns) = (0u64, 0u64, 0u64);
            for tag in done.drain(..) {
                let io = in_flight[tag]
                    .take()
                    .expect("a completion for an I/O in flight");
                outstanding -= 1;
                if let Some(stamps) = &mut self.stamps {
                    stamps.finish(io.block);
                    if io.read && io.generation != 0 {
                        let offset = (self.share.first + io.block) * block_bytes;
                        super::verify::check(device.data(tag), offset, io.generation)?;
                        results.verified += 1;
                    }
                }
                if phase.measure_from.is_some_and(|from| io.start >= from) {
                    let latency_ns = (now - io.start).as_nanos() as u64;
                    let direction = if io.read {
                        &mut results.read
                    } else {
                        &mut results.write
                    };
                    direction.latency.record(latency_ns);
                    direction.bytes += block_bytes;
                    batch_ios += 1;
                    batch_bytes += block_bytes;
                    batch_latency_ns += latency_ns;
                }
            }
            if batch_ios > 0 {
                self.progress.ios.fetch_add(batch_ios, Ordering::Relaxed);
                self.progress
                    .bytes
                    .fetch_add(batch_bytes, Ordering::Relaxed);
                self.progress
                    .latency_ns
                    .fetch_add(batch_latency_ns, Ordering::Relaxed);
            }
        }
    }
}

/// Runs `make_device` + [`Worker::run`] on one thread per queue and merges
/// what they measured.
pub fn run_workers<D, F>(
    args: &BenchArgs,
    blocks: u64,
    progress: &Arc<Progress>,
    mut make_device: F,
) -> Result<Results, String>
where
    D: Device + 'static,
    F: FnMut(usize) -> Result<Box<dyn FnOnce() -> Result<D, String> + Send>, String>,
{
    let mut threads = Vec::new();
    for index in 0..args.queues {
        let share = Share::of(blocks, index, args.queues);
        if share.count == 0 || (args.verify && share.count <= args.iodepth as u64) {
            return Err(format!(
                "the region ({blocks} blocks of {} bytes) is too small for {} queue(s) at iodepth {}{}",
                args.block_bytes,
                args.queues,
                args.iodepth,
                if args.verify { " with --verify (each queue needs more blocks than its iodepth)" } else { "" }
            ));
        }
        let device = make_device(index)?;
        let (args, progress) = (args.clone(), Arc::clone(progress));
        threads.push(std::thread::spawn(move || -> Result<Results, String> {
            let mut device = device()?;
            Worker::new(&args, share, &progress, index).run(&mut device)
        }));
    }
    let mut total = Results::default();
    let mut first_error = None;
    for thread in threads {
        match thread.join() {
            Ok(Ok(results)) => total.merge(results),
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(_) => {
                first_error.get_or_insert("a benchmark thread panicked".to_string());
            }
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_rate_spaces_its_ios_evenly_from_the_start() {
        let start = Instant::now();
        let pacing = Pacing::new(Some(1000), start);
        assert_eq!(pacing.due(0), Some(start));
        assert_eq!(pacing.due(250), Some(start + Duration::from_millis(250)));
        assert_eq!(Pacing::new(None, start).due(7), None);
    }

    #[test]
    fn shares_split_the_region_without_overlap() {
        let shares: Vec<Share> = (0..3).map(|i| Share::of(10, i, 3)).collect();
        assert_eq!(shares.iter().map(|s| s.count).sum::<u64>(), 10);
        assert_eq!(shares[0].first, 0);
        assert_eq!(shares[1].first, shares[0].count);
        assert_eq!(shares[2].first + shares[2].count, 10);
    }
}
