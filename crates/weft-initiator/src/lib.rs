//! weft's user-space NVMe/TCP initiator: connects to any NVMe/TCP target
//! (weft, Linux nvmet, SPDK), brings up the admin queue, identifies the
//! controller and its namespaces, and opens I/O queues, each a blocking TCP
//! connection driven by the protocol core's [`HostQueue`]. No kernel module
//! needed. A background thread sends Keep Alive on the admin queue every half
//! KATO; [`Controller::reconnect`] re-establishes a lost controller with
//! exponential backoff (its I/O queues are then opened again and whatever was
//! in flight on the old ones is resubmitted by the caller: the target may or
//! may not have executed it, as with any NVMe-oF transport loss).

mod identify;
mod job;
mod queue;
mod tls;
mod url;

pub use identify::{IdentifyError, TRANSFER_BYTES_CAP};
pub use job::{probe_capacity_bytes, Job, JobError, JobIo, Outcome, Submitted, IO_TIMEOUT};
pub use queue::{HeapBuffers, Queue};
pub use tls::{TlsError, TlsStream};
pub use url::{TargetUrl, UrlError};

use std::io;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;
use weft_proto::auth::{
    HostAuthError, HostExchange, HostKeys, SecureRandom, CONNECT_AUTHREQ_ATR, SECP_DHCHAP,
    SPSP_DHCHAP,
};
use weft_proto::command::{admin_opcode, fctype, FABRICS_OPCODE, NQN_BYTES_MAX};
use weft_proto::fence::{FenceToken, FENCE_FEATURE};
use weft_proto::host::{DataTransfer, HostCompletion, HostConfig, HostError};
use weft_proto::intent::{IntentLogHeader, INTENT_LOG, INTENT_LOG_HEADER_LEN};
use weft_proto::status::Status;
use weft_proto::types::Nsid;

/// Why the initiator failed; every message says what to check.
#[derive(Debug, Error)]
pub enum InitiatorError {
    /// No TCP connection.
    #[error("cannot reach {address}: {source} (is a target listening there?)")]
    Unreachable {
        /// The address.
        address: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The connection broke.
    #[error("connection to {address} failed: {source}")]
    Io {
        /// The address.
        address: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The TLS stream could not be set up, or a record failed.
    #[error("TLS with {address} failed: {source} (does the target know this host's PSK for this subsystem? weft: weft host add/set NAME --tls-psk KEY)")]
    Tls {
        /// The address.
        address: SocketAddr,
        /// What went wrong.
        #[source]
        source: TlsError,
    },
    /// The target broke the protocol or terminated the connection.
    #[error("{address}: {source}")]
    Protocol {
        /// The address.
        address: SocketAddr,
        /// What happened.
        #[source]
        source: HostError,
    },
    /// The target does not export the subsystem.
    #[error("{address} does not export {nqn} (list what it exports with: nvme discover -t tcp -a {ip} -s {port})", ip = address.ip(), port = address.port())]
    UnknownNqn {
        /// The address.
        address: SocketAddr,
        /// The NQN asked for.
        nqn: String,
    },
    /// The target refused this host.
    #[error("{address} refused host {host_nqn} for {nqn}: allow this host NQN on the target (on weft: weft host add NAME --nqn {host_nqn}, then weft volume attach VOLUME --host NAME), or, if the host was given a TLS PSK (weft host list says TLS yes), connect over TLS")]
    HostRejected {
        /// The address.
        address: SocketAddr,
        /// The subsystem.
        nqn: String,
        /// This host's NQN.
        host_nqn: String,
    },
    /// The target requires DH-HMAC-CHAP and no secret was given.
    #[error("{address} requires this host to authenticate for {nqn} (give the host's DH-HMAC-CHAP secret, e.g. --dhchap-secret)")]
    AuthenticationRequired {
        /// The address.
        address: SocketAddr,
        /// The subsystem.
        nqn: String,
    },
    /// A controller secret was given and the target did not ask to
    /// authenticate: it never proved it knows the secret.
    #[error("{address} did not authenticate for {nqn}, though a controller secret was given: refusing to use it (whoever answers there may not be that subsystem; if it is, make the subsystem require DH-HMAC-CHAP from this host, e.g. weft host add ... --dhchap-secret ... --dhchap-ctrl-secret ...)")]
    ControllerNotAuthenticated {
        /// The address.
        address: SocketAddr,
        /// The subsystem.
        nqn: String,
    },
    /// DH-HMAC-CHAP failed.
    #[error("authentication with {nqn} at {address} failed: {source}")]
    Authentication {
        /// The address.
        address: SocketAddr,
        /// The subsystem.
        nqn: String,
        /// What went wrong.
        #[source]
        source: HostAuthError,
    },
    /// A command failed.
    #[error("{what} failed with status {status:?}")]
    Command {
        /// The command.
        what: &'static str,
        /// Its status.
        status: Status,
    },
    /// The controller did not become ready.
    #[error("the controller did not become ready (CSTS {csts:#x}) within {timeout:?}")]
    NotReady {
        /// Last CSTS.
        csts: u32,
        /// How long it was given.
        timeout: Duration,
    },
    /// The subsystem has no such namespace.
    #[error("namespace {nsid} does not exist on {nqn} (it has {available:?})")]
    NoNamespace {
        /// Asked for.
        nsid: u32,
        /// Subsystem.
        nqn: String,
        /// What exists.
        available: Vec<u32>,
    },
    /// The controller reported something the initiator cannot use.
    #[error("{address}: {source}")]
    Identify {
        /// The address.
        address: SocketAddr,
        /// What it reported.
        #[source]
        source: IdentifyError,
    },
    /// An NQN the initiator was given cannot be sent.
    #[error("the {role} NQN is {bytes} bytes long; an NQN is 1 to {NQN_BYTES_MAX} bytes (NVMe Base 2.0, section 4.5)")]
    NqnLength {
        /// "host" or "subsystem".
        role: &'static str,
        /// Its length.
        bytes: usize,
    },
    /// I/O queues of a size the controller does not allow.
    #[error("I/O queues of {entries} entries were asked for; this controller allows 2 to {entries_max} (CAP.MQES + 1)")]
    QueueEntries {
        /// Asked for.
        entries: u16,
        /// CAP.MQES + 1.
        entries_max: u32,
    },
    /// A read or write a queue cannot carry in one command.
    #[error("a {len}-byte transfer is not 1 to 65536 whole {block_size}-byte blocks within the {buffer_bytes}-byte command buffer")]
    Transfer {
        /// Bytes asked for.
        len: usize,
        /// The block size given.
        block_size: u32,
        /// The command buffer's size.
        buffer_bytes: usize,
    },
}

impl InitiatorError {
    /// Whether trying again later may succeed (the path or the target was
    /// down), as opposed to a refusal that will repeat.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            InitiatorError::Unreachable { .. }
                | InitiatorError::Io { .. }
                | InitiatorError::Protocol { .. }
                | InitiatorError::NotReady { .. }
        )
    }
}

/// How [`Controller::reconnect`] retries: the first delay doubles up to
/// `delay_max`, until `give_up_after` has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Wait before the second attempt.
    pub delay_first: Duration,
    /// Longest wait between attempts.
    pub delay_max: Duration,
    /// Stop trying after this long (the kernel's ctrl-loss-tmo).
    pub give_up_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            delay_first: Duration::from_millis(100),
            delay_max: Duration::from_secs(5),
            give_up_after: Duration::from_secs(60),
        }
    }
}

/// Connection options.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Header digests.
    pub header_digest: bool,
    /// Data digests.
    pub data_digest: bool,
    /// Entries of each I/O queue (the host may have that many commands outstanding).
    pub io_queue_entries: u16,
    /// This host's NQN.
    pub host_nqn: String,
    /// This host's identifier.
    pub host_id: [u8; 16],
    /// Keep Alive Timeout asked for at Connect (None: no keep-alive); the
    /// initiator sends Keep Alive every half of it.
    pub keep_alive: Option<Duration>,
    /// How [`Controller::reconnect`] retries.
    pub reconnect: Backoff,
    /// DH-HMAC-CHAP secrets, used when the target asks for authentication.
    pub dhchap: Option<HostKeys>,
    /// The host's NVMe/TCP TLS PSK (`NVMeTLSkey-1`): every queue then
    /// connects in a TLS 1.3 stream with it (none: in the clear).
    pub tls_psk: Option<weft_proto::tls::psk::ConfiguredPsk>,
    /// In TLS, ask the target to update the keys of both directions once
    /// either carried this many records under one key (RFC 8446 sections
    /// 4.6.3 and 5.5; `weft_proto::tls::ASK_AFTER_RECORDS` between weft
    /// nodes). Weft's target answers; Linux's nvmet may end a queue that
    /// gets a KeyUpdate, so none is asked by default.
    pub tls_key_update_after_records: Option<u64>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        let host_id = random_bytes();
        let uuid = weft_proto::types::uuid_text(&host_id);
        ConnectOptions {
            header_digest: false,
            data_digest: false,
            io_queue_entries: 128,
            host_nqn: format!("nqn.2014-08.org.nvmexpress:uuid:{uuid}"),
            host_id,
            // The Linux host's default (NVME_DEFAULT_KATO).
            keep_alive: Some(Duration::from_secs(5)),
            reconnect: Backoff::default(),
            dhchap: None,
            tls_psk: None,
            tls_key_update_after_records: None,
        }
    }
}

/// What the controller told us about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    /// Controller ID.
    pub cntlid: u16,
    /// Serial number.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// Largest transfer per command, bytes.
    pub transfer_bytes_max: u32,
    /// In-capsule data accepted on I/O queues, bytes.
    pub io_in_capsule_bytes: u32,
    /// I/O queues granted.
    pub io_queues: u16,
    /// Optional NVM commands supported (ONCS: bit 2 Dataset Management, bit 3 Write Zeroes).
    pub optional_commands: u16,
}

/// A namespace as Identify Namespace reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Namespace {
    /// NSID.
    pub nsid: Nsid,
    /// Capacity in blocks.
    pub blocks: u64,
    /// Block size.
    pub block_size: u32,
}

/// A replica's write intent, as its target reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaIntent {
    /// Marked regions, ascending.
    pub regions: Vec<u32>,
    /// Power was lost since a primary last wrote there.
    pub unclean: bool,
    /// Bytes per region.
    pub region_bytes: u64,
}

/// A connected controller: its admin queue, its keep-alive and what it reported.
#[derive(Debug)]
pub struct Controller {
    url: TargetUrl,
    options: ConnectOptions,
    requested_io_queues: u16,
    admin: Arc<Mutex<Queue>>,
    keep_alive: Option<KeepAlive>,
    /// Identify Controller's answers.
    pub info: ControllerInfo,
}

/// The thread sending Keep Alive; stopped when dropped.
#[derive(Debug)]
struct KeepAlive {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    failure: Arc<Mutex<Option<String>>>,
}

impl KeepAlive {
    fn start(admin: &Arc<Mutex<Queue>>, kato: Duration) -> KeepAlive {
        let (stop, stopped) = mpsc::channel::<()>();
        let failure = Arc::new(Mutex::new(None));
        let (admin, failed) = (Arc::clone(admin), Arc::clone(&failure));
        let thread = std::thread::spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(kato / 2) {
                let sent = lock(&admin).execute(
                    "Keep Alive",
                    sqe(admin_opcode::KEEP_ALIVE, 0),
                    DataTransfer::None,
                );
                if let Err(error) = sent {
                    *lock(&failed) = Some(error.to_string());
                    return;
                }
            }
        });
        KeepAlive {
            stop: Some(stop),
            thread: Some(thread),
            failure,
        }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Transfer size used before Identify tells the real one.
const ADMIN_BUFFER_BYTES: u32 = 8192;
const READY_TIMEOUT: Duration = Duration::from_secs(10);

impl Controller {
    /// Connects the admin queue, enables the controller, identifies it and
    /// asks for `io_queues` I/O queues; one attempt (see [`Controller::reconnect`]).
    pub fn connect(
        url: &TargetUrl,
        options: ConnectOptions,
        io_queues: u16,
    ) -> Result<Controller, InitiatorError> {
        let (admin, info) = establish(url, &options, io_queues)?;
        let admin = Arc::new(Mutex::new(admin));
        Ok(Controller {
            url: url.clone(),
            keep_alive: options
                .keep_alive
                .map(|kato| KeepAlive::start(&admin, kato)),
            options,
            requested_io_queues: io_queues,
            admin,
            info,
        })
    }

    /// Why keep-alive stopped, if it did (the controller is then lost: reconnect).
    pub fn keep_alive_failure(&self) -> Option<String> {
        self.keep_alive
            .as_ref()
            .and_then(|keep_alive| lock(&keep_alive.failure).clone())
    }

    /// Establishes a new controller in place of this one, retrying transient
    /// failures with the options' backoff; a refusal (unknown NQN, host
    /// rejected, a failed command) ends the attempts at once. Open the I/O
    /// queues again afterwards.
    pub fn reconnect(&mut self) -> Result<(), InitiatorError> {
        self.keep_alive = None;
        let backoff = self.options.reconnect;
        let start = Instant::now();
        let mut delay = backoff.delay_first;
        loop {
            match establish(&self.url, &self.options, self.requested_io_queues) {
                Ok((admin, info)) => {
                    self.admin = Arc::new(Mutex::new(admin));
                    self.info = info;
                    self.keep_alive = self
                        .options
                        .keep_alive
                        .map(|kato| KeepAlive::start(&self.admin, kato));
                    return Ok(());
                }
                Err(error)
                    if error.is_transient() && start.elapsed() + delay < backoff.give_up_after =>
                {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(backoff.delay_max);
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn admin(&self) -> MutexGuard<'_, Queue> {
        lock(&self.admin)
    }

    /// Takes the fence of a weft replica subsystem with `token` (see
    /// `weft_proto::fence`). `Ok(Err(epoch))`: refused, the fence is held
    /// under `epoch` (a newer primary's, or this one's own older token).
    pub fn fence(&self, token: FenceToken) -> Result<Result<(), u64>, InitiatorError> {
        let mut command = sqe(admin_opcode::SET_FEATURES, 0);
        set_cdw(&mut command, 10, u32::from(FENCE_FEATURE));
        for (n, value) in (11..).zip(token.cdws()) {
            set_cdw(&mut command, n, value);
        }
        let done = self.admin().run(command, DataTransfer::None)?;
        match done.status {
            Status::SUCCESS => Ok(Ok(())),
            Status::RESERVATION_CONFLICT => Ok(Err(done.result)),
            status => Err(InitiatorError::Command {
                what: "Set Features (replica fence)",
                status,
            }),
        }
    }

    /// The write intent of a weft replica subsystem (see
    /// `weft_proto::intent`): its marked regions and whether it is unclean.
    pub fn write_intent(&self) -> Result<ReplicaIntent, InitiatorError> {
        let mut admin = self.admin();
        let mut read = |offset: u64, len: u32| {
            let dwords = len / 4 - 1;
            let mut command = sqe(admin_opcode::GET_LOG_PAGE, 0xFFFF_FFFF);
            set_cdw(
                &mut command,
                10,
                u32::from(INTENT_LOG) | ((dwords & 0xFFFF) << 16),
            );
            set_cdw(&mut command, 11, dwords >> 16);
            set_cdw(&mut command, 12, offset as u32);
            set_cdw(&mut command, 13, (offset >> 32) as u32);
            let transfer = DataTransfer::FromController(len);
            let done = admin.execute("Get Log Page (write intent)", command, transfer)?;
            Ok::<_, InitiatorError>(admin.buffer(done.cid.0)[..len as usize].to_vec())
        };
        let header = read(0, INTENT_LOG_HEADER_LEN as u32)?;
        let header = IntentLogHeader::decode(header[..].try_into().expect("16 bytes"));
        let mut regions = Vec::with_capacity(header.marked as usize);
        // In pieces within the admin queue's transfer size.
        let piece_regions = ADMIN_BUFFER_BYTES / 4;
        while regions.len() < header.marked as usize {
            let left = header.marked - regions.len() as u32;
            let count = left.min(piece_regions);
            let offset = INTENT_LOG_HEADER_LEN as u64 + regions.len() as u64 * 4;
            let data = read(offset, count * 4)?;
            regions.extend(weft_proto::intent::clean_regions(&data, count));
        }
        Ok(ReplicaIntent {
            regions,
            unclean: header.unclean,
            region_bytes: header.region_bytes,
        })
    }

    /// The active namespaces.
    pub fn namespaces(&mut self) -> Result<Vec<Namespace>, InitiatorError> {
        let mut admin = self.admin();
        let list = admin.execute(
            "Identify Active Namespace List",
            identify(2, 0),
            DataTransfer::FromController(4096),
        )?;
        let nsids: Vec<u32> = admin.buffer(list.cid.0)[..4096]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .take_while(|&nsid| nsid != 0)
            .collect();
        let mut namespaces = Vec::new();
        for nsid in nsids {
            let done = admin.execute(
                "Identify Namespace",
                identify(0, nsid),
                DataTransfer::FromController(4096),
            )?;
            let data = admin.buffer(done.cid.0);
            let namespace = identify::namespace(nsid, data, self.info.transfer_bytes_max).map_err(
                |source| InitiatorError::Identify {
                    address: self.url.address,
                    source,
                },
            )?;
            namespaces.push(namespace);
        }
        Ok(namespaces)
    }

    /// One namespace, or an error that lists the ones that exist.
    pub fn namespace(&mut self, nsid: u32) -> Result<Namespace, InitiatorError> {
        let all = self.namespaces()?;
        all.iter()
            .find(|ns| ns.nsid.0 == nsid)
            .copied()
            .ok_or_else(|| InitiatorError::NoNamespace {
                nsid,
                nqn: self.url.nqn.clone(),
                available: all.iter().map(|ns| ns.nsid.0).collect(),
            })
    }

    /// Opens I/O queue `qid` (1-based, up to `info.io_queues`).
    pub fn open_io_queue(&self, qid: u16) -> Result<Queue, InitiatorError> {
        assert!(
            (1..=self.info.io_queues).contains(&qid),
            "I/O queue {qid} was not granted"
        );
        let config = HostConfig {
            header_digest: self.options.header_digest,
            data_digest: self.options.data_digest,
            queue_entries: self.options.io_queue_entries,
            in_capsule_bytes_max: self.info.io_in_capsule_bytes,
            buffer_bytes: self.info.transfer_bytes_max,
        };
        let mut queue = Queue::open(self.url.address, config, tls_of(&self.url, &self.options))?;
        connect_queue(
            &mut queue,
            &self.url,
            &self.options,
            QueueParameters {
                qid,
                cntlid: self.info.cntlid,
                sqsize: self.options.io_queue_entries - 1,
                kato_ms: 0,
            },
        )?;
        queue.set_io_timeout(None)?;
        Ok(queue)
    }
}

/// How a queue to `url` connects over TLS, if `options` give a PSK.
fn tls_of<'a>(url: &'a TargetUrl, options: &'a ConnectOptions) -> Option<tls::TlsIdentity<'a>> {
    options.tls_psk.as_ref().map(|psk| tls::TlsIdentity {
        psk,
        host_nqn: &options.host_nqn,
        subsystem_nqn: &url.nqn,
        key_update_after_records: options.tls_key_update_after_records,
    })
}

/// Checks that `nqn` fits the Connect data's NQN field.
fn check_nqn(role: &'static str, nqn: &str) -> Result<(), InitiatorError> {
    if (1..=NQN_BYTES_MAX).contains(&nqn.len()) {
        Ok(())
    } else {
        Err(InitiatorError::NqnLength {
            role,
            bytes: nqn.len(),
        })
    }
}

/// Connects an admin queue, enables the controller, identifies it and asks
/// for `io_queues` I/O queues.
fn establish(
    url: &TargetUrl,
    options: &ConnectOptions,
    io_queues: u16,
) -> Result<(Queue, ControllerInfo), InitiatorError> {
    check_nqn("host", &options.host_nqn)?;
    check_nqn("subsystem", &url.nqn)?;
    let config = HostConfig {
        header_digest: options.header_digest,
        data_digest: options.data_digest,
        queue_entries: 32,
        in_capsule_bytes_max: 8192,
        buffer_bytes: ADMIN_BUFFER_BYTES,
    };
    let mut admin = Queue::open(url.address, config, tls_of(url, options))?;
    let kato_ms = options.keep_alive.map_or(0, |kato| kato.as_millis() as u32);
    let cntlid = connect_queue(
        &mut admin,
        url,
        options,
        QueueParameters {
            qid: 0,
            cntlid: 0xFFFF,
            sqsize: 31,
            kato_ms,
        },
    )?;
    let cap = admin
        .execute("Property Get CAP", property_get_cap(), DataTransfer::None)?
        .result;
    // CAP.MQES is 0's based.
    let entries_max = (cap & 0xFFFF) as u32 + 1;
    let entries = options.io_queue_entries;
    if entries < 2 || u32::from(entries) > entries_max {
        return Err(InitiatorError::QueueEntries {
            entries,
            entries_max,
        });
    }
    admin.execute(
        "Property Set CC.EN",
        property_set(0x14, (6 << 16) | (4 << 20) | 1),
        DataTransfer::None,
    )?;
    wait_ready(&mut admin)?;
    let identify = admin.execute(
        "Identify Controller",
        identify(1, 0),
        DataTransfer::FromController(4096),
    )?;
    let data = admin.buffer(identify.cid.0).to_vec();
    let mut queues = sqe(admin_opcode::SET_FEATURES, 0);
    let requested = u32::from(io_queues.max(1) - 1);
    set_cdw(&mut queues, 10, 0x07);
    set_cdw(&mut queues, 11, requested | (requested << 16));
    let granted = admin.execute("Set Features Number of Queues", queues, DataTransfer::None)?;
    let info =
        identify::controller_info(&data, cntlid, granted.result, io_queues).map_err(|source| {
            InitiatorError::Identify {
                address: url.address,
                source,
            }
        })?;
    admin.set_io_timeout(None)?;
    Ok((admin, info))
}

/// What Fabrics Connect asks for.
#[derive(Debug, Clone, Copy)]
struct QueueParameters {
    qid: u16,
    cntlid: u16,
    sqsize: u16,
    kato_ms: u32,
}

/// Fabrics Connect on `queue`; returns the controller ID.
fn connect_queue(
    queue: &mut Queue,
    url: &TargetUrl,
    options: &ConnectOptions,
    parameters: QueueParameters,
) -> Result<u16, InitiatorError> {
    let mut command = sqe(FABRICS_OPCODE, 0);
    command[4] = fctype::CONNECT;
    command[42..44].copy_from_slice(&parameters.qid.to_le_bytes());
    command[44..46].copy_from_slice(&parameters.sqsize.to_le_bytes());
    // CDW12: KATO in milliseconds (NVMe-oF 1.1, Figure 20).
    command[48..52].copy_from_slice(&parameters.kato_ms.to_le_bytes());
    let cid = queue.next_cid();
    let data = &mut queue.buffer(cid)[..1024];
    data.fill(0);
    data[..16].copy_from_slice(&options.host_id);
    data[16..18].copy_from_slice(&parameters.cntlid.to_le_bytes());
    data[256..256 + url.nqn.len()].copy_from_slice(url.nqn.as_bytes());
    data[512..512 + options.host_nqn.len()].copy_from_slice(options.host_nqn.as_bytes());
    let done = queue.run(command, DataTransfer::ToController(1024))?;
    match done.status {
        status if status.is_success() && done.result as u32 & CONNECT_AUTHREQ_ATR != 0 => {
            authenticate(queue, url, options, parameters.qid)?;
            Ok(done.result as u16)
        }
        // Bidirectional authentication is the host's to insist on: a target
        // that skips it has not proven who it is.
        status
            if status.is_success()
                && options
                    .dhchap
                    .as_ref()
                    .is_some_and(|keys| keys.controller.is_some()) =>
        {
            Err(InitiatorError::ControllerNotAuthenticated {
                address: url.address,
                nqn: url.nqn.clone(),
            })
        }
        status if status.is_success() => Ok(done.result as u16),
        // Invalid parameter in the Connect data at SUBNQN (NVMe-oF 1.1, Figure 21).
        status
            if status == Status::CONNECT_INVALID_PARAMETERS && done.result == (1 << 16) | 256 =>
        {
            Err(InitiatorError::UnknownNqn {
                address: url.address,
                nqn: url.nqn.clone(),
            })
        }
        status if status == Status::CONNECT_INVALID_HOST => Err(InitiatorError::HostRejected {
            address: url.address,
            nqn: url.nqn.clone(),
            host_nqn: options.host_nqn.clone(),
        }),
        status => Err(InitiatorError::Command {
            what: "Fabrics Connect",
            status,
        }),
    }
}

/// DH-HMAC-CHAP on a queue whose Connect response asked for it (NVMe Base
/// 2.0, section 8.13), as the Linux host runs it.
fn authenticate(
    queue: &mut Queue,
    url: &TargetUrl,
    options: &ConnectOptions,
    qid: u16,
) -> Result<(), InitiatorError> {
    let Some(keys) = options.dhchap.clone() else {
        return Err(InitiatorError::AuthenticationRequired {
            address: url.address,
            nqn: url.nqn.clone(),
        });
    };
    let failed = |source| InitiatorError::Authentication {
        address: url.address,
        nqn: url.nqn.clone(),
        source,
    };
    let mut exchange = HostExchange::new(keys, &options.host_nqn, &url.nqn, qid);
    auth_send(queue, &exchange.negotiate())?;
    let challenge = auth_receive(queue)?;
    let reply = match exchange.reply(&challenge, &OsRandom) {
        Ok(reply) => reply,
        Err(error) => {
            if let Some(abort) = exchange.abort(&error) {
                // The error is what matters, not whether Failure2 went out.
                let _ = auth_send(queue, &abort);
            }
            return Err(failed(error));
        }
    };
    auth_send(queue, &reply)?;
    let success1 = auth_receive(queue)?;
    let (last, outcome) = exchange.conclude(&success1);
    if let Some(last) = last {
        // After a failure the failure is what matters, not whether Failure2 went out.
        let sent = auth_send(queue, &last);
        if outcome.is_ok() {
            sent?;
        }
    }
    outcome.map_err(failed)
}

/// The largest DH-HMAC-CHAP message read (the Linux host's buffer size).
const AUTH_RECEIVE_BYTES: usize = 4096;

fn auth_command(fctype: u8, len: usize) -> [u8; 64] {
    let mut command = sqe(FABRICS_OPCODE, 0);
    command[4] = fctype;
    command[41] = SPSP_DHCHAP;
    command[42] = SPSP_DHCHAP;
    command[43] = SECP_DHCHAP;
    command[44..48].copy_from_slice(&(len as u32).to_le_bytes());
    command
}

fn auth_send(queue: &mut Queue, message: &[u8]) -> Result<(), InitiatorError> {
    let cid = queue.next_cid();
    queue.buffer(cid)[..message.len()].copy_from_slice(message);
    let command = auth_command(fctype::AUTH_SEND, message.len());
    let transfer = DataTransfer::ToController(message.len() as u32);
    queue.execute("Authentication Send", command, transfer)?;
    Ok(())
}

fn auth_receive(queue: &mut Queue) -> Result<Vec<u8>, InitiatorError> {
    let cid = queue.next_cid();
    queue.buffer(cid)[..AUTH_RECEIVE_BYTES].fill(0);
    let command = auth_command(fctype::AUTH_RECEIVE, AUTH_RECEIVE_BYTES);
    let transfer = DataTransfer::FromController(AUTH_RECEIVE_BYTES as u32);
    let done = queue.execute("Authentication Receive", command, transfer)?;
    Ok(queue.buffer(done.cid.0)[..AUTH_RECEIVE_BYTES].to_vec())
}

/// The kernel's random source: our challenge to the controller, and keys
/// the CLI makes.
#[derive(Debug)]
pub struct OsRandom;

impl SecureRandom for OsRandom {
    fn fill(&self, dest: &mut [u8]) {
        use std::io::Read;
        std::fs::File::open("/dev/urandom")
            .and_then(|mut file| file.read_exact(dest))
            .expect("/dev/urandom is readable");
    }
}

fn wait_ready(admin: &mut Queue) -> Result<(), InitiatorError> {
    let start = std::time::Instant::now();
    loop {
        let mut get = sqe(FABRICS_OPCODE, 0);
        get[4] = fctype::PROPERTY_GET;
        get[44..48].copy_from_slice(&0x1Cu32.to_le_bytes());
        let csts = admin
            .execute("Property Get CSTS", get, DataTransfer::None)?
            .result as u32;
        if csts & 1 == 1 {
            return Ok(());
        }
        if csts & 2 != 0 || start.elapsed() > READY_TIMEOUT {
            return Err(InitiatorError::NotReady {
                csts,
                timeout: READY_TIMEOUT,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An SQE with `opcode` and `nsid`.
pub fn sqe(opcode: u8, nsid: u32) -> [u8; 64] {
    let mut sqe = [0u8; 64];
    sqe[0] = opcode;
    sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
    sqe
}

/// Sets command dword `n` (10..=15).
pub fn set_cdw(sqe: &mut [u8; 64], n: usize, value: u32) {
    let at = 40 + (n - 10) * 4;
    sqe[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// A Read or Write of `blocks` blocks (1 to 65536: NLB is 16 bits, 0's
/// based) at `slba`.
pub fn read_write(opcode: u8, nsid: u32, slba: u64, blocks: u32) -> [u8; 64] {
    assert!(
        (1..=65536).contains(&blocks),
        "a command moves 1 to 65536 blocks, not {blocks}"
    );
    let mut command = sqe(opcode, nsid);
    set_cdw(&mut command, 10, slba as u32);
    set_cdw(&mut command, 11, (slba >> 32) as u32);
    set_cdw(&mut command, 12, blocks - 1);
    command
}

fn identify(cns: u8, nsid: u32) -> [u8; 64] {
    let mut command = sqe(admin_opcode::IDENTIFY, nsid);
    set_cdw(&mut command, 10, u32::from(cns));
    command
}

/// Property Get of CAP, an 8-byte property (ATTRIB bits 2:0 = 1).
fn property_get_cap() -> [u8; 64] {
    let mut command = sqe(FABRICS_OPCODE, 0);
    command[4] = fctype::PROPERTY_GET;
    command[40] = 1;
    command
}

fn property_set(offset: u32, value: u32) -> [u8; 64] {
    let mut command = sqe(FABRICS_OPCODE, 0);
    command[4] = fctype::PROPERTY_SET;
    command[44..48].copy_from_slice(&offset.to_le_bytes());
    command[48..52].copy_from_slice(&value.to_le_bytes());
    command
}

fn random_bytes() -> [u8; 16] {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_err()
    {
        // Not secret, only unique per run: the clock will do.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = nanos.to_le_bytes();
    }
    bytes
}

/// A finished command's outcome, or the command's failure as an error.
fn check(what: &'static str, completion: HostCompletion) -> Result<HostCompletion, InitiatorError> {
    if completion.status.is_success() {
        Ok(completion)
    } else {
        Err(InitiatorError::Command {
            what,
            status: completion.status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An NQN longer than the Connect data's 256-byte field used to be
    /// copied over the next field, or past the buffer's end; it is now
    /// refused before anything is sent (the address has no listener).
    #[test]
    fn nqns_are_refused_before_connecting_unless_1_to_223_bytes() {
        let url = TargetUrl {
            address: "127.0.0.1:9".parse().expect("an address"),
            nqn: "nqn.2026-11.io.weft:default".to_string(),
        };
        let options = ConnectOptions {
            host_nqn: format!("nqn.2014-08.org.example:{}", "h".repeat(300)),
            keep_alive: None,
            ..ConnectOptions::default()
        };
        let error = Controller::connect(&url, options.clone(), 1).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the host NQN is 324 bytes long; an NQN is 1 to 223 bytes (NVMe Base 2.0, section 4.5)"
        );
        let long_subsystem = TargetUrl {
            nqn: format!("nqn.2026-11.io.weft:{}", "s".repeat(204)),
            ..url.clone()
        };
        let options = ConnectOptions {
            host_nqn: "nqn.2014-08.org.example:host".to_string(),
            ..options
        };
        assert!(matches!(
            Controller::connect(&long_subsystem, options.clone(), 1),
            Err(InitiatorError::NqnLength {
                role: "subsystem",
                bytes: 224
            })
        ));
        assert!(check_nqn("host", &"n".repeat(223)).is_ok());
        assert!(check_nqn("host", "").is_err());
    }
}
