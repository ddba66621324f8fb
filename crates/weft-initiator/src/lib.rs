//! weft's user-space NVMe/TCP initiator: connects to any NVMe/TCP target
//! (weft, Linux nvmet, SPDK), brings up the admin queue, identifies the
//! controller and its namespaces, and opens I/O queues, each a blocking TCP
//! connection driven by the protocol core's [`HostQueue`]. No kernel module
//! needed. It does not yet reconnect or send keep-alives (it connects with
//! keep-alive disabled); those come with replication, its other user.

mod queue;
mod url;

pub use queue::{HeapBuffers, Queue};
pub use url::{TargetUrl, UrlError};

use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use thiserror::Error;
use weft_proto::command::{admin_opcode, fctype, FABRICS_OPCODE};
use weft_proto::host::{DataTransfer, HostCompletion, HostConfig, HostError};
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
    #[error("{address} refused host {host_nqn} for {nqn} (allow this host NQN on the target)")]
    HostRejected {
        /// The address.
        address: SocketAddr,
        /// The subsystem.
        nqn: String,
        /// This host's NQN.
        host_nqn: String,
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
}

impl Default for ConnectOptions {
    fn default() -> Self {
        let host_id = random_bytes();
        let uuid = format_uuid(&host_id);
        ConnectOptions {
            header_digest: false,
            data_digest: false,
            io_queue_entries: 128,
            host_nqn: format!("nqn.2014-08.org.nvmexpress:uuid:{uuid}"),
            host_id,
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

/// A connected controller: its admin queue and what it reported.
#[derive(Debug)]
pub struct Controller {
    url: TargetUrl,
    options: ConnectOptions,
    admin: Queue,
    /// Identify Controller's answers.
    pub info: ControllerInfo,
}

/// Transfer size used before Identify tells the real one.
const ADMIN_BUFFER_BYTES: u32 = 8192;
const READY_TIMEOUT: Duration = Duration::from_secs(10);

impl Controller {
    /// Connects the admin queue, enables the controller, identifies it and asks for `io_queues` I/O queues.
    pub fn connect(
        url: &TargetUrl,
        options: ConnectOptions,
        io_queues: u16,
    ) -> Result<Controller, InitiatorError> {
        let config = HostConfig {
            header_digest: options.header_digest,
            data_digest: options.data_digest,
            queue_entries: 32,
            in_capsule_bytes_max: 8192,
            buffer_bytes: ADMIN_BUFFER_BYTES,
        };
        let mut admin = Queue::open(url.address, config)?;
        let cntlid = connect_queue(&mut admin, url, &options, 0, 0xFFFF, 31)?;
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
        let data = admin.buffer(identify.cid.0)[..4096].to_vec();
        let mut queues = sqe(admin_opcode::SET_FEATURES, 0);
        let requested = u32::from(io_queues.max(1) - 1);
        set_cdw(&mut queues, 10, 0x07);
        set_cdw(&mut queues, 11, requested | (requested << 16));
        let granted = admin.execute("Set Features Number of Queues", queues, DataTransfer::None)?;
        let info = ControllerInfo {
            cntlid,
            serial: ascii(&data[4..24]),
            model: ascii(&data[24..64]),
            // MDTS in units of the minimum page size (4 KiB); 0 = no limit, capped at 1 MiB here.
            transfer_bytes_max: match data[77] {
                0 => 1 << 20,
                mdts => (4096u32 << mdts.min(8)).min(1 << 20),
            },
            io_in_capsule_bytes: (u32::from_le_bytes([
                data[1792], data[1793], data[1794], data[1795],
            ]) * 16)
                .saturating_sub(64),
            // The controller may allocate more than asked (NSQA/NCQA); the host uses what it asked for.
            io_queues: (((granted.result & 0xFFFF) as u16).min((granted.result >> 16) as u16) + 1)
                .min(io_queues.max(1)),
        };
        Ok(Controller {
            url: url.clone(),
            options,
            admin,
            info,
        })
    }

    /// The active namespaces.
    pub fn namespaces(&mut self) -> Result<Vec<Namespace>, InitiatorError> {
        let list = self.admin.execute(
            "Identify Active Namespace List",
            identify(2, 0),
            DataTransfer::FromController(4096),
        )?;
        let nsids: Vec<u32> = self.admin.buffer(list.cid.0)[..4096]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .take_while(|&nsid| nsid != 0)
            .collect();
        let mut namespaces = Vec::new();
        for nsid in nsids {
            let done = self.admin.execute(
                "Identify Namespace",
                identify(0, nsid),
                DataTransfer::FromController(4096),
            )?;
            let data = &self.admin.buffer(done.cid.0)[..4096];
            let blocks = u64::from_le_bytes(data[0..8].try_into().expect("8 bytes"));
            let format = usize::from(data[26] & 0xF);
            let lbads = data[128 + format * 4 + 2];
            namespaces.push(Namespace {
                nsid: Nsid(nsid),
                blocks,
                block_size: 1 << lbads,
            });
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
        let mut queue = Queue::open(self.url.address, config)?;
        connect_queue(
            &mut queue,
            &self.url,
            &self.options,
            qid,
            self.info.cntlid,
            self.options.io_queue_entries - 1,
        )?;
        Ok(queue)
    }
}

/// Fabrics Connect on `queue`; returns the controller ID.
fn connect_queue(
    queue: &mut Queue,
    url: &TargetUrl,
    options: &ConnectOptions,
    qid: u16,
    cntlid: u16,
    sqsize: u16,
) -> Result<u16, InitiatorError> {
    let mut command = sqe(FABRICS_OPCODE, 0);
    command[4] = fctype::CONNECT;
    command[42..44].copy_from_slice(&qid.to_le_bytes());
    command[44..46].copy_from_slice(&sqsize.to_le_bytes());
    let cid = queue.next_cid();
    let data = &mut queue.buffer(cid)[..1024];
    data.fill(0);
    data[..16].copy_from_slice(&options.host_id);
    data[16..18].copy_from_slice(&cntlid.to_le_bytes());
    data[256..256 + url.nqn.len()].copy_from_slice(url.nqn.as_bytes());
    data[512..512 + options.host_nqn.len()].copy_from_slice(options.host_nqn.as_bytes());
    let done = queue.run(command, DataTransfer::ToController(1024))?;
    match done.status {
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

/// A Read or Write of `blocks` blocks at `slba`.
pub fn read_write(opcode: u8, nsid: u32, slba: u64, blocks: u32) -> [u8; 64] {
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

fn property_set(offset: u32, value: u32) -> [u8; 64] {
    let mut command = sqe(FABRICS_OPCODE, 0);
    command[4] = fctype::PROPERTY_SET;
    command[44..48].copy_from_slice(&offset.to_le_bytes());
    command[48..52].copy_from_slice(&value.to_le_bytes());
    command
}

fn ascii(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .trim_end_matches([' ', '\0'])
        .to_string()
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

fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
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
