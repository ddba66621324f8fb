//! The data plane as a whole: listeners (one accepting thread per address,
//! handing each connection to a reactor in turn), the reactors, and the
//! target they all serve, whose exports an update replaces while serving.

use crate::exports::Exports;
use crate::guest::Guest;
use crate::peers::{ConnectionCounts, PeerLimits};
use crate::reactor::{Mailbox, Message, QueuePlacement, ReactorHandle, Seat};
use crate::stages::{StageTotals, StagesSnapshot};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use thiserror::Error;
use weft_proto::auth::SecureRandom;
use weft_proto::Target;

/// The running data plane.
#[derive(Debug)]
pub struct DataPlane {
    /// Addresses actually bound (port 0 resolved), in the order given.
    pub listening: Vec<SocketAddr>,
    /// The controller registry and the current configuration, shared by every reactor.
    target: Arc<Target>,
    reactors: Arc<Vec<ReactorHandle>>,
    /// The current exports and their number in the sequence of updates
    /// (0: those it started with). The lock also orders updates: every
    /// reactor receives them in the order the target does.
    exports: Mutex<(Arc<Exports>, u64)>,
    /// Every reactor's stage counts.
    stages: Arc<StageTotals>,
    /// Its clock's origin: every reactor's `Timestamp`s count from it.
    epoch: Instant,
}

/// Why the data plane could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// A listen address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The kernel's random source (for authentication challenges) is not readable.
    #[error("cannot open /dev/urandom: {0}")]
    Random(#[source] io::Error),
    /// The controller ID range is not one a target can serve.
    #[error("{0}")]
    ControllerIds(#[source] weft_proto::target::CntlidRangeError),
    /// A reactor thread or its io_uring could not be created.
    #[error("cannot start reactor: {0}")]
    Reactor(#[source] io::Error),
}

impl DataPlane {
    /// Binds every address, starts `reactors` reactor threads serving
    /// `exports` and the accepting threads, which hold each listener's
    /// connections to `peer_limits`. After any activity a reactor polls for
    /// `poll_window` before it sleeps (zero: purely interrupt driven).
    /// Controllers get IDs from `controller_ids` (a cluster node's own range,
    /// so that nodes exporting one subsystem never give a host the same ID).
    pub fn start(
        exports: Arc<Exports>,
        addresses: &[SocketAddr],
        reactors: usize,
        poll_window: Duration,
        peer_limits: PeerLimits,
        controller_ids: RangeInclusive<u16>,
    ) -> Result<DataPlane, StartError> {
        assert!(reactors > 0, "at least one reactor");
        let listeners = addresses
            .iter()
            .map(|&address| {
                TcpListener::bind(address).map_err(|source| StartError::Bind { address, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let listening = listeners
            .iter()
            .map(|l| l.local_addr().expect("bound sockets have an address"))
            .collect();
        let random = OsRandom::open().map_err(StartError::Random)?;
        let target = Target::with_cntlid_range(
            Arc::clone(&exports.config),
            Arc::new(random),
            controller_ids,
        )
        .map_err(StartError::ControllerIds)?;
        let epoch = Instant::now();
        // Reactor i on the i-th CPU this process may use (so `taskset` and
        // cpusets keep the reactors where they put the process); unpinned
        // if the mask cannot be read.
        let cpus = weft_uring::allowed_cpus()
            .map_err(|error| log::warn!("reactors not pinned: their CPUs are unknown: {error}"))
            .ok();
        let stages = Arc::new(StageTotals::default());
        let siblings = Arc::new(OnceLock::new());
        let handles = (0..reactors)
            .map(|index| {
                ReactorHandle::spawn(
                    Seat {
                        index,
                        cpu: cpus.as_ref().map(|cpus| cpus[index % cpus.len()]),
                        siblings: Arc::clone(&siblings),
                    },
                    Arc::clone(&target),
                    Arc::clone(&exports),
                    epoch,
                    poll_window,
                    Arc::clone(&stages),
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(StartError::Reactor)?;
        let mailboxes: Vec<Arc<Mailbox>> = handles.iter().map(ReactorHandle::mailbox).collect();
        siblings
            .set(mailboxes)
            .expect("set once, after every reactor started");
        let reactors = Arc::new(handles);
        for listener in listeners {
            let reactors = Arc::clone(&reactors);
            let counts = ConnectionCounts::new(peer_limits);
            std::thread::Builder::new()
                .name("weft-accept".into())
                .spawn(move || accept_loop(listener, &reactors, &counts))
                .map_err(StartError::Reactor)?;
        }
        Ok(DataPlane {
            listening,
            target,
            reactors,
            exports: Mutex::new((exports, 0)),
            stages,
            epoch,
        })
    }

    /// The fences of its fenced subsystems, for the node's own writers to
    /// their media (see `weft_proto::fence::LocalFence`).
    pub fn fences(&self) -> Arc<weft_proto::fence::Fences> {
        Arc::clone(&self.target.fences)
    }

    /// The time on the clock its connections run on (what a fence's read
    /// grant is measured with: see `weft_proto::fence::READ_GRANT`).
    pub fn now(&self) -> weft_proto::types::Timestamp {
        weft_proto::types::Timestamp(self.epoch.elapsed())
    }

    /// Serves `exports` from now on: the target's configuration becomes
    /// theirs, and every reactor swaps them in and hands the new configuration
    /// to each of its connections (which report changed namespaces to their
    /// hosts, and end if their subsystem is gone). The caller bumps
    /// `generation` when the set of subsystems changes; the limits must stay
    /// those the data plane started with.
    pub fn update_exports(&self, exports: Arc<Exports>) {
        let mut current = self.lock_exports();
        let number = current.1 + 1;
        self.target
            .replace_config(Arc::clone(&exports.config), self.now());
        for reactor in self.reactors.iter() {
            reactor.send(Message::Exports(Arc::clone(&exports), number));
        }
        *current = (exports, number);
    }

    /// Hosts `guest` on one of the reactors (the one `key` picks: a
    /// volume's name, so that volumes spread over them), which gives it its
    /// turns from now on; `doorbell` is the eventfd its ring signals (see
    /// `crate::guest`). A replicated volume's replicator is hosted by its
    /// volume's name: there the I/O queues of that volume meet it when told
    /// to (see [`DataPlane::place_replicated_queues`]).
    pub fn host(&self, key: &str, guest: Box<dyn Guest>, doorbell: File) {
        let index = home_reactor(key, self.reactors.len());
        self.reactors[index].send(Message::Guest(guest, doorbell));
    }

    /// Where I/O queues of replicated volumes connected from now on are
    /// served (`QueuePlacement::Spread` until told otherwise).
    pub fn place_replicated_queues(&self, placement: QueuePlacement) {
        for reactor in self.reactors.iter() {
            reactor.send(Message::Placement(placement));
        }
    }

    /// Host NQNs connected to subsystem `subnqn`.
    pub fn connected_hosts(&self, subnqn: &str) -> Vec<String> {
        self.target.registry.hosts_of(subnqn)
    }

    /// Where the commands' time went inside the target so far (see `stages`).
    pub fn stages(&self) -> StagesSnapshot {
        self.stages.snapshot()
    }

    /// The exports being served.
    pub fn exports(&self) -> Arc<Exports> {
        Arc::clone(&self.lock_exports().0)
    }

    /// Makes every acknowledged write durable (fdatasync on every device), e.g. before exiting.
    pub fn flush_all(&self) {
        for device in self.exports().all_devices() {
            if let Err(error) = weft_uring::fdatasync(device.fd()) {
                log::error!("flush of {} failed: {error}", device.describe());
            }
        }
    }

    fn lock_exports(&self) -> MutexGuard<'_, (Arc<Exports>, u64)> {
        self.exports
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The reactor, of `reactors`, that `key` picks: the same in every process
/// (`DefaultHasher::new` has fixed keys), so a volume's replicator and its
/// I/O queues meet there whichever of them comes first.
pub(crate) fn home_reactor(key: &str, reactors: usize) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % reactors as u64) as usize
}

fn accept_loop(listener: TcpListener, reactors: &[ReactorHandle], counts: &Arc<ConnectionCounts>) {
    let mut next = 0;
    loop {
        match listener.accept() {
            Ok((stream, address)) => {
                // Over a limit: closed at once (the stream drops), logged by `admit`.
                let Ok(admission) = counts.admit(address) else {
                    continue;
                };
                let message = Message::Connection(stream, address, admission);
                reactors[next % reactors.len()].send(message);
                next += 1;
            }
            Err(error) => {
                // EMFILE and friends: back off instead of spinning.
                log::warn!("accept on {:?} failed: {error}", listener.local_addr());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The kernel's random source, opened once: DH-HMAC-CHAP challenges come
/// from it (a read per challenge, at Connect time only).
#[derive(Debug)]
struct OsRandom(std::fs::File);

impl OsRandom {
    fn open() -> io::Result<OsRandom> {
        std::fs::File::open("/dev/urandom").map(OsRandom)
    }
}

impl SecureRandom for OsRandom {
    fn fill(&self, dest: &mut [u8]) {
        use std::io::Read;
        // Reads of /dev/urandom do not fail once it is open.
        (&self.0)
            .read_exact(dest)
            .expect("/dev/urandom returns what is asked");
    }
}
