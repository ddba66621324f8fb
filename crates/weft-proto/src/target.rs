//! What the protocol core knows about the target it speaks for: the exported
//! subsystems, namespaces and listeners, the negotiated limits, and the
//! registry of live controllers that admin and I/O queue connections share.
//!
//! The configuration changes while serving (volumes are created, deleted and
//! resized), so the target holds the current one as an immutable snapshot,
//! `Arc<TargetConfig>`, that an update replaces whole. Each connection keeps
//! its own snapshot and is told about a new one by its driver (see
//! `Connection::update_config`), so that the lock here is taken only when a
//! connection is created and when the configuration changes, never per I/O.
//!
//! The registry is the only other state shared between connections. It is
//! touched at Connect, at controller teardown and by Set Features, never per I/O.
//!
//! Controller IDs are unique within the registry, and each registry hands
//! them out from its own range ([`ControllerRegistry::with_range`]): a host
//! refuses a second controller with the CNTLID of one it has in the same
//! subsystem (Linux: "Duplicate cntlid"), so nodes that export the same
//! subsystem allocate from disjoint ranges ([`cntlid_range_for_ordinal`]).

use crate::ana::AnaConfig;
use crate::auth::{HostKeys, SecureRandom};
use crate::identify::IDENTIFY_LEN;
use crate::types::{Cntlid, Nsid};
use std::cmp;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// The well-known discovery subsystem NQN (NVMe Base 2.0, section 4.5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Limits the target advertises and enforces. Every one is a promise on the wire.
///
/// The framing and the command slots rely on the invariants that
/// [`Limits::validate`] checks (a slot buffer holds any in-capsule data, an
/// Identify structure and the Connect data; the advertised fields encode the
/// values exactly). Limits built from configuration must be validated before
/// they reach a [`Target`], which asserts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest queue (entries) a host may create: CAP.MQES + 1.
    pub queue_entries_max: u16,
    /// Largest data transfer of one command, bytes (MDTS, with 4 KiB pages).
    pub transfer_bytes_max: u32,
    /// In-capsule data accepted on I/O queues, bytes (IOCCSZ = (64 + this) / 16).
    pub io_in_capsule_bytes_max: u32,
    /// In-capsule data accepted on the admin queue (8 KiB per NVMe/TCP 1.0, section 3.3.1).
    pub admin_in_capsule_bytes_max: u32,
    /// Largest H2CData payload (MAXH2CDATA).
    pub h2c_data_bytes_max: u32,
    /// Number of I/O queues a controller may create.
    pub io_queues_max: u16,
    /// Outstanding Asynchronous Event Requests per controller (AERL + 1).
    pub async_events_max: u8,
    /// A new connection must send ICReq within this many milliseconds (a
    /// socket that says nothing holds buffers for nothing).
    pub icreq_timeout_ms: u32,
    /// After ICResp, the queue's Fabrics Connect must complete within this many milliseconds.
    pub connect_timeout_ms: u32,
    /// Controllers one subsystem (the discovery subsystem included) may have at once.
    pub controllers_per_subsystem_max: u16,
    /// Of those, controllers whose host has not authenticated yet (where
    /// the host must), from anyone: a stranger naming an allowed host NQN
    /// holds a controller until the Connect deadline.
    pub pending_authentications_per_subsystem: u16,
    /// Of those, from one peer address (on each subsystem).
    pub pending_authentications_per_address: u16,
    /// Discovery controllers from one peer address: anyone may connect to
    /// discovery, and a host needs a few (one per discovery address it
    /// keeps, and one-shot ones).
    pub discovery_controllers_per_address: u16,
    /// In a cluster, of each subsystem's controllers and of those waiting
    /// to authenticate, this many (at most a quarter of either limit) are
    /// left to Connects from the other nodes' addresses
    /// ([`TargetConfig::node_addresses`]): strangers naming a node's host
    /// NQN cannot take every place a replica link or a planned move needs.
    pub controllers_reserved_for_nodes: u16,
}

impl Limits {
    /// The defaults weft serves with.
    pub const DEFAULT: Limits = Limits {
        queue_entries_max: 128,
        transfer_bytes_max: 1024 * 1024,
        io_in_capsule_bytes_max: 16 * 1024,
        admin_in_capsule_bytes_max: 8 * 1024,
        h2c_data_bytes_max: 128 * 1024,
        io_queues_max: 64,
        async_events_max: 4,
        icreq_timeout_ms: 10_000,
        connect_timeout_ms: 10_000,
        controllers_per_subsystem_max: 256,
        pending_authentications_per_subsystem: 32,
        pending_authentications_per_address: 4,
        discovery_controllers_per_address: 16,
        controllers_reserved_for_nodes: 8,
    };

    /// The largest transfer: 2 GiB, so that the PLEN of a PDU carrying a whole
    /// transfer (plus header, padding and digest) still fits in 32 bits.
    pub const TRANSFER_BYTES_LIMIT: u32 = 1 << 31;

    /// The most queue entries: twice as many slots (see
    /// [`Limits::slots_per_queue`]) are numbered by a u16.
    pub const QUEUE_ENTRIES_LIMIT: u16 = 1 << 15;

    /// In-capsule data a host may send on the admin queue: NVMe/TCP hosts send
    /// up to 8 KiB there without looking at the controller (Linux's
    /// NVME_TCP_ADMIN_CCSZ), so the admin queue must accept at least that.
    pub const ADMIN_IN_CAPSULE_BYTES_MIN: u32 = 8 * 1024;

    /// Command slots per queue: twice its largest number of entries. A
    /// read's slot holds its data until the send that carries it completes,
    /// and the host may send the next command as soon as it has the
    /// completion, which comes at the end of that send: with one slot per
    /// entry, a host at its queue depth would find none free. (Linux's
    /// nvmet-tcp allocates twice the queue size for the same reason.)
    pub const fn slots_per_queue(&self) -> usize {
        2 * self.queue_entries_max as usize
    }

    /// Size of every command slot's data buffer: the largest transfer, since a
    /// Compare needs the host's data and the media's side by side in one
    /// buffer of twice its length, Compare transfers are limited to half of it.
    pub fn slot_buffer_bytes(&self) -> usize {
        self.transfer_bytes_max as usize
    }

    /// Checks the invariants the protocol core relies on; a `Target` serves
    /// only limits that pass.
    pub const fn validate(&self) -> Result<(), LimitsError> {
        // Connect's SQSIZE is 0's based and at least 1 (NVMe-oF 1.1, section 3.3).
        // Twice the entries must fit a slot number (u16).
        if self.queue_entries_max < 2 || self.queue_entries_max > Limits::QUEUE_ENTRIES_LIMIT {
            return Err(LimitsError::QueueEntries(self.queue_entries_max));
        }
        // MDTS is a power of two of 4 KiB pages, and every slot buffer must
        // hold an Identify structure (4 KiB) and the Connect data (1 KiB).
        let transfer = self.transfer_bytes_max;
        if !transfer.is_power_of_two()
            || transfer < IDENTIFY_LEN as u32
            || transfer > Limits::TRANSFER_BYTES_LIMIT
        {
            return Err(LimitsError::TransferBytes(transfer));
        }
        // In-capsule data is received into the command's slot buffer, and
        // IOCCSZ counts 16-byte units.
        let io = self.io_in_capsule_bytes_max;
        if io > transfer || !io.is_multiple_of(16) {
            return Err(LimitsError::IoInCapsuleBytes {
                value: io,
                transfer_bytes_max: transfer,
            });
        }
        let admin = self.admin_in_capsule_bytes_max;
        if admin < Limits::ADMIN_IN_CAPSULE_BYTES_MIN || admin > transfer {
            return Err(LimitsError::AdminInCapsuleBytes {
                value: admin,
                transfer_bytes_max: transfer,
            });
        }
        // MAXH2CDATA "is a multiple of dwords and should be no less than
        // 4,096" (NVMe/TCP 1.0, Figure 21); Linux hosts refuse less.
        let h2c = self.h2c_data_bytes_max;
        if h2c < 4096 || !h2c.is_multiple_of(4) {
            return Err(LimitsError::H2cDataBytes(h2c));
        }
        // Connected I/O queues are a 64-bit map; Set Features answers NSQA/NCQA 0's based.
        if self.io_queues_max == 0 || self.io_queues_max > 64 {
            return Err(LimitsError::IoQueues(self.io_queues_max));
        }
        // AERL is 0's based.
        if self.async_events_max == 0 {
            return Err(LimitsError::AsyncEvents);
        }
        // A zero deadline or controller count would refuse every host.
        if self.icreq_timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return Err(LimitsError::SetupTimeout);
        }
        if self.controllers_per_subsystem_max == 0 {
            return Err(LimitsError::ControllersPerSubsystem);
        }
        if self.pending_authentications_per_subsystem == 0
            || self.pending_authentications_per_address == 0
        {
            return Err(LimitsError::PendingAuthentications);
        }
        if self.discovery_controllers_per_address == 0 {
            return Err(LimitsError::DiscoveryControllersPerAddress);
        }
        Ok(())
    }
}

const _: () = assert!(
    Limits::DEFAULT.validate().is_ok(),
    "the default limits are valid"
);

/// Why a set of [`Limits`] cannot be served, and what the limit must be instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum LimitsError {
    /// Fewer than two queue entries, or more than 32768.
    #[error("queue_entries_max is {0}; a queue has 2 to 32768 entries (Connect SQSIZE is 0's based and at least 1)")]
    QueueEntries(u16),
    /// Not a power of two from 4 KiB to 2 GiB.
    #[error("transfer_bytes_max is {0}; it must be a power of two from 4096 (an Identify structure) to 2 GiB (MDTS counts powers of two of 4 KiB pages; a PDU carrying a whole transfer must have a 32-bit PLEN)")]
    TransferBytes(u32),
    /// Larger than a slot buffer, or not a multiple of 16.
    #[error("io_in_capsule_bytes_max is {value}; it must be a multiple of 16 (IOCCSZ counts 16-byte units) and at most transfer_bytes_max ({transfer_bytes_max}), the slot buffer the data lands in")]
    IoInCapsuleBytes {
        /// The limit given.
        value: u32,
        /// The slot buffer size.
        transfer_bytes_max: u32,
    },
    /// Below what hosts send, or larger than a slot buffer.
    #[error("admin_in_capsule_bytes_max is {value}; it must be at least 8192 (NVMe/TCP hosts send up to 8 KiB in admin capsules) and at most transfer_bytes_max ({transfer_bytes_max}), the slot buffer the data lands in")]
    AdminInCapsuleBytes {
        /// The limit given.
        value: u32,
        /// The slot buffer size.
        transfer_bytes_max: u32,
    },
    /// Not a MAXH2CDATA a host accepts.
    #[error("h2c_data_bytes_max is {0}; MAXH2CDATA must be a multiple of 4 and at least 4096 (NVMe/TCP 1.0, Figure 21)")]
    H2cDataBytes(u32),
    /// Not 1 to 64 I/O queues.
    #[error("io_queues_max is {0}; it must be 1 to 64 (connected I/O queues are tracked in a 64-bit map)")]
    IoQueues(u16),
    /// No Asynchronous Event Request accepted.
    #[error("async_events_max is 0; at least one Asynchronous Event Request must be accepted (AERL is 0's based)")]
    AsyncEvents,
    /// A zero ICReq or Connect deadline.
    #[error("icreq_timeout_ms and connect_timeout_ms must be positive (0 would close every connection at once)")]
    SetupTimeout,
    /// No controller allowed per subsystem.
    #[error(
        "controllers_per_subsystem_max is 0; at least one controller per subsystem must be allowed"
    )]
    ControllersPerSubsystem,
    /// No host that must authenticate could connect.
    #[error(
        "pending_authentications_per_subsystem and _per_address must be at least 1, or no host that must authenticate could connect"
    )]
    PendingAuthentications,
    /// No host could discover.
    #[error("discovery_controllers_per_address must be at least 1, or no host could discover")]
    DiscoveryControllersPerAddress,
}

/// One exported namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Namespace ID within its subsystem.
    pub nsid: Nsid,
    /// Capacity in logical blocks.
    pub blocks: u64,
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Namespace globally unique identifier, stable across restarts.
    pub nguid: [u8; 16],
    /// Namespace UUID, stable across restarts.
    pub uuid: [u8; 16],
    /// IEEE EUI-64, stable across restarts.
    pub eui64: [u8; 8],
    /// Thin provisioned: deallocate frees space and unwritten blocks read as zeroes.
    pub thin: bool,
    /// Whether the backend is open and serving.
    pub ready: bool,
    /// Its reservations, when it supports them (see [`crate::reservation`]).
    pub reservations: Option<Arc<crate::reservation::ReservationCell>>,
}

impl NamespaceConfig {
    /// log2 of the block size (LBADS).
    pub fn block_shift(&self) -> u32 {
        self.block_size.trailing_zeros()
    }

    /// Capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks << self.block_shift()
    }
}

/// One exported NVM subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// Subsystem NQN.
    pub nqn: String,
    /// Serial number (20 ASCII characters at most), stable across restarts.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// Firmware revision (8 ASCII characters at most).
    pub firmware: String,
    /// Namespaces, sorted by NSID.
    pub namespaces: Vec<NamespaceConfig>,
    /// Hosts allowed to connect and to see it in the discovery log.
    pub access: HostAccess,
    /// A replica subsystem: only the controller holding its fence may run
    /// I/O (see [`crate::fence`]); it is never listed in discovery logs.
    pub fenced: bool,
    /// Who may take a fenced subsystem's fence (see [`crate::fence`]);
    /// none: any allowed host whose token is larger than the current one.
    pub fence_authority: Option<crate::fence::FenceAuthority>,
    /// A replica subsystem's write intent (see [`crate::intent`]): served
    /// as its log page, cleaned by the Clean I/O command.
    pub intent: Option<Arc<crate::intent::WriteIntent>>,
    /// The ANA group of every namespace of the subsystem on this target, and
    /// its state: whether I/O through this target's controllers is served.
    pub ana: AnaConfig,
}

/// Which hosts may associate with a subsystem. A host that may not is refused
/// at Connect with Connect Invalid Host (NVMe-oF 1.1, section 3.3, Figure 21)
/// and does not find the subsystem in its discovery log page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostAccess {
    /// Every host, none of them authenticated.
    Any,
    /// Only these hosts (none at all when empty).
    Only(Vec<AllowedHost>),
}

/// A host allowed to use a subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    /// Its NQN.
    pub nqn: String,
    /// Its DH-HMAC-CHAP secrets: when set, each of its queues must
    /// authenticate before it carries anything but Fabrics commands.
    pub keys: Option<Arc<HostKeys>>,
    /// Its configured TLS PSK: when set, each of its queues must come over
    /// TLS with it (see [`crate::tls`]); a plain one is refused at Connect.
    pub tls_psk: Option<Arc<crate::tls::psk::ConfiguredPsk>>,
}

impl HostAccess {
    /// Whether host `hostnqn` may connect.
    pub fn allows(&self, hostnqn: &str) -> bool {
        match self {
            HostAccess::Any => true,
            HostAccess::Only(hosts) => hosts.iter().any(|h| h.nqn == hostnqn),
        }
    }

    /// The TLS PSK host `hostnqn` must connect with, if any.
    pub fn tls_psk_of(&self, hostnqn: &str) -> Option<&Arc<crate::tls::psk::ConfiguredPsk>> {
        match self {
            HostAccess::Any => None,
            HostAccess::Only(hosts) => hosts
                .iter()
                .find(|h| h.nqn == hostnqn)
                .and_then(|h| h.tls_psk.as_ref()),
        }
    }

    /// The secrets host `hostnqn` must authenticate with, if any.
    pub fn keys_of(&self, hostnqn: &str) -> Option<&Arc<HostKeys>> {
        match self {
            HostAccess::Any => None,
            HostAccess::Only(hosts) => hosts
                .iter()
                .find(|h| h.nqn == hostnqn)
                .and_then(|h| h.keys.as_ref()),
        }
    }
}

/// The TLS PSKs of the hosts a target allows, by the identity a host offers
/// (NVMe/TCP 1.1 section 3.6.1.3): the identity names the host and the
/// subsystem, whose access list holds the host's configured key; a host
/// discovering over TLS may use the key any subsystem gives it.
impl crate::tls::PskStore for TargetConfig {
    fn tls_psks(&self, identity: &[u8]) -> Vec<Vec<u8>> {
        let Some(identity) = crate::tls::psk::Identity::parse(identity) else {
            return Vec::new();
        };
        let psk = if identity.subsystem_nqn == DISCOVERY_NQN {
            self.subsystems
                .iter()
                .find_map(|s| s.access.tls_psk_of(&identity.host_nqn))
        } else {
            self.subsystem(&identity.subsystem_nqn)
                .and_then(|s| s.access.tls_psk_of(&identity.host_nqn))
        };
        psk.map_or(Vec::new(), |psk| identity.tls_psks(psk))
    }
}

impl SubsystemConfig {
    /// The namespace with `nsid`, if exported.
    pub fn namespace(&self, nsid: Nsid) -> Option<&NamespaceConfig> {
        self.namespaces.iter().find(|ns| ns.nsid == nsid)
    }

    /// NSIDs whose namespace was added, removed or changed in any attribute
    /// between `self` and `newer`, in increasing order.
    pub fn changed_namespaces(&self, newer: &SubsystemConfig) -> Vec<Nsid> {
        let sorted = |namespaces: &[NamespaceConfig]| {
            namespaces
                .windows(2)
                .all(|pair| pair[0].nsid < pair[1].nsid)
        };
        debug_assert!(sorted(&self.namespaces) && sorted(&newer.namespaces));
        let (mut old, mut new) = (self.namespaces.as_slice(), newer.namespaces.as_slice());
        let mut changed = Vec::new();
        // A merge of the two sorted lists.
        while let (Some(before), Some(after)) = (old.first(), new.first()) {
            match before.nsid.cmp(&after.nsid) {
                cmp::Ordering::Less => {
                    changed.push(before.nsid);
                    old = &old[1..];
                }
                cmp::Ordering::Greater => {
                    changed.push(after.nsid);
                    new = &new[1..];
                }
                cmp::Ordering::Equal => {
                    if before != after {
                        changed.push(before.nsid);
                    }
                    old = &old[1..];
                    new = &new[1..];
                }
            }
        }
        // At most one of the two has namespaces left.
        changed.extend(old.iter().chain(new).map(|ns| ns.nsid));
        changed
    }

    /// Highest NSID (Identify Controller NN).
    pub fn max_nsid(&self) -> u32 {
        self.namespaces
            .iter()
            .map(|ns| ns.nsid.0)
            .max()
            .unwrap_or(0)
    }
}

/// Address family of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFamily {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// A TCP listener, as reported in the discovery log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Port ID (PORTID in the discovery log).
    pub port_id: u16,
    /// Address family.
    pub family: AddressFamily,
    /// Transport address, e.g. "127.0.0.1".
    pub address: String,
    /// Transport service ID, e.g. "4420".
    pub service: String,
}

/// A snapshot of everything the target exports. A snapshot never changes: an
/// update replaces it with a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// Exported NVM subsystems.
    pub subsystems: Vec<SubsystemConfig>,
    /// Listeners (discovery and I/O on the same ports).
    pub listeners: Vec<ListenerConfig>,
    /// Discovery controllers elsewhere (other nodes of a cluster), listed in
    /// the discovery log as referrals so that a host that discovers through
    /// this node finds them too. The caller leaves this node's own out.
    pub referrals: Vec<ListenerConfig>,
    /// Limits.
    pub limits: Limits,
    /// The other nodes' addresses, sorted (a cluster node's; empty for a
    /// node alone): Connects from them may use the places
    /// [`Limits::controllers_reserved_for_nodes`] keeps.
    pub node_addresses: Vec<IpAddr>,
    /// Serial number of the discovery controller.
    pub discovery_serial: String,
    /// Bumped whenever the set of exported subsystems changes (discovery GENCTR).
    pub generation: u64,
}

impl TargetConfig {
    /// The subsystem with `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<&SubsystemConfig> {
        self.subsystems.iter().find(|s| s.nqn == nqn)
    }

    /// Position of the subsystem with `nqn` in `subsystems`.
    pub fn subsystem_index(&self, nqn: &str) -> Option<usize> {
        self.subsystems.iter().position(|s| s.nqn == nqn)
    }
}

/// Per-controller counters for the SMART / health log.
#[derive(Debug, Default)]
pub struct ControllerCounters {
    /// Host read commands completed.
    pub read_commands: AtomicU64,
    /// Host write commands completed.
    pub write_commands: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Bytes written.
    pub written_bytes: AtomicU64,
}

/// State of one controller that its admin and I/O queue connections share.
#[derive(Debug)]
pub struct ControllerShared {
    /// Controller ID.
    pub cntlid: Cntlid,
    /// Subsystem NQN the controller belongs to.
    pub subnqn: String,
    /// Host NQN recorded at admin Connect.
    pub hostnqn: String,
    /// Host identifier recorded at admin Connect.
    pub host_id: [u8; 16],
    /// Set while its host must still authenticate its admin queue.
    authenticating: AtomicBool,
    /// The address of the peer that connected it (when the driver gave it).
    peer: Option<IpAddr>,
    /// Cleared when the controller is torn down (keep-alive expiry, admin queue gone).
    alive: AtomicBool,
    /// CSTS.RDY: I/O queues may connect only while set.
    ready: AtomicBool,
    /// Bumped on controller reset or shutdown: I/O queues of an older epoch must close.
    epoch: AtomicU32,
    /// I/O queues granted by Set Features Number of Queues (count, not 0's based).
    io_queues_granted: AtomicU32,
    /// Bitmap of connected I/O queue IDs (1..=64).
    io_queues_connected: AtomicU64,
    /// Volatile write cache enabled (Set Features 06h); when off, every write is FUA.
    pub write_cache_enabled: AtomicBool,
    /// Health counters.
    pub counters: ControllerCounters,
    /// It holds its (fenced) subsystem's fence: its I/O may run (see [`crate::fence`]).
    fence_holder: AtomicBool,
    /// I/O commands on a fenced subsystem admitted and not yet done: a new
    /// fence is answered once the previous holder's count is zero.
    fenced_io_in_flight: AtomicU32,
    /// When its last command on a fenced subsystem reached the target
    /// (nanoseconds of the target's clock; 0: never): what a read grant
    /// runs from (see [`crate::fence::READ_GRANT`]).
    heard_at_ns: AtomicU64,
}

impl ControllerShared {
    /// Whether it holds its subsystem's fence.
    pub fn holds_fence(&self) -> bool {
        self.fence_holder.load(Ordering::Acquire)
    }

    /// The target's own writer to subsystem `subnqn`'s media, outside any
    /// connection (see [`crate::fence::LocalFence`]): never in the registry.
    pub(crate) fn local_writer(subnqn: &str) -> ControllerShared {
        let local = ControllerShared::new(
            Cntlid(0),
            &NewController {
                subnqn,
                hostnqn: "",
                host_id: [0; 16],
                authenticating: false,
                peer: None,
                stranger: false,
            },
        );
        local.ready.store(true, Ordering::Release);
        local
    }

    /// A controller that is alive, not ready yet, and holds no fence.
    fn new(cntlid: Cntlid, new: &NewController<'_>) -> ControllerShared {
        ControllerShared {
            cntlid,
            subnqn: new.subnqn.to_string(),
            hostnqn: new.hostnqn.to_string(),
            host_id: new.host_id,
            authenticating: AtomicBool::new(new.authenticating),
            peer: new.peer,
            alive: AtomicBool::new(true),
            ready: AtomicBool::new(false),
            epoch: AtomicU32::new(0),
            io_queues_granted: AtomicU32::new(0),
            io_queues_connected: AtomicU64::new(0),
            write_cache_enabled: AtomicBool::new(true),
            counters: ControllerCounters::default(),
            fence_holder: AtomicBool::new(false),
            fenced_io_in_flight: AtomicU32::new(0),
            heard_at_ns: AtomicU64::new(0),
        }
    }

    /// Its host authenticated its admin queue: it no longer counts as pending.
    pub fn set_authenticated(&self) {
        self.authenticating.store(false, Ordering::Release);
    }

    /// It is gone (a local writer dropped): a fence no longer waits for it
    /// once its I/O on its way is done.
    pub(crate) fn set_gone(&self) {
        self.alive.store(false, Ordering::Release);
    }

    /// Gives or takes the fence. Sequentially consistent with
    /// [`ControllerShared::fenced_io_enter`]: a fencer that clears the old
    /// holder's flag and then reads its count either sees an I/O that
    /// entered, or that I/O sees the flag cleared.
    pub(crate) fn set_fence_holder(&self, holds: bool) {
        self.fence_holder.store(holds, Ordering::SeqCst);
    }

    /// An I/O command on a fenced subsystem is about to reach the media:
    /// counted if the controller holds the fence (true), refused otherwise.
    pub fn fenced_io_enter(&self) -> bool {
        self.fenced_io_in_flight.fetch_add(1, Ordering::SeqCst);
        if self.fence_holder.load(Ordering::SeqCst) {
            return true;
        }
        self.fenced_io_done();
        false
    }

    /// A counted I/O command on a fenced subsystem is done.
    pub fn fenced_io_done(&self) {
        let before = self.fenced_io_in_flight.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "more fenced I/O done than entered");
    }

    /// A command of its reached the target at `now` (on a fenced
    /// subsystem: a fence, or I/O about to enter it). Recorded before the
    /// I/O enters (sequentially consistent with the fence's holder flag):
    /// a fencer that cleared the flag and then waited for the count to
    /// drain sees the time of every command it let through.
    pub fn heard(&self, now: crate::types::Timestamp) {
        let ns = (now.0.as_nanos() as u64).max(1);
        self.heard_at_ns.fetch_max(ns, Ordering::SeqCst);
    }

    /// When its last command on a fenced subsystem reached the target, if any did.
    pub fn heard_at(&self) -> Option<crate::types::Timestamp> {
        match self.heard_at_ns.load(Ordering::SeqCst) {
            0 => None,
            ns => Some(crate::types::Timestamp(std::time::Duration::from_nanos(ns))),
        }
    }

    /// Whether it is a host's controller (not the target's own writer).
    pub fn is_remote(&self) -> bool {
        !self.hostnqn.is_empty()
    }

    /// Its I/O commands on a fenced subsystem on their way to the media.
    pub fn fenced_io_in_flight(&self) -> u32 {
        self.fenced_io_in_flight.load(Ordering::SeqCst)
    }

    /// Whether the controller still exists.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Current reset epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Marks the controller ready (CSTS.RDY) or not; leaving ready starts a new epoch.
    pub fn set_ready(&self, ready: bool) {
        let was = self.ready.swap(ready, Ordering::AcqRel);
        if was && !ready {
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.io_queues_connected.store(0, Ordering::Release);
        }
    }

    /// CSTS.RDY.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// I/O queues granted so far.
    pub fn io_queues_granted(&self) -> u32 {
        self.io_queues_granted.load(Ordering::Acquire)
    }

    /// Records the granted number of I/O queues.
    pub fn grant_io_queues(&self, count: u32) {
        self.io_queues_granted.store(count, Ordering::Release);
    }

    /// Claims I/O queue `qid`; false if it is already connected.
    pub fn claim_io_queue(&self, qid: u16) -> bool {
        debug_assert!((1..=64).contains(&qid));
        let bit = 1u64 << (qid - 1);
        self.io_queues_connected.fetch_or(bit, Ordering::AcqRel) & bit == 0
    }

    /// Releases I/O queue `qid` when its connection ends.
    pub fn release_io_queue(&self, qid: u16, epoch: u32) {
        if self.epoch() == epoch {
            self.io_queues_connected
                .fetch_and(!(1u64 << (qid - 1)), Ordering::AcqRel);
        }
    }
}

/// Why a controller could not be created or found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryError {
    /// Every controller ID is in use.
    Exhausted,
    /// The subsystem has as many controllers as it may have.
    SubsystemFull,
    /// No live controller with that ID for that subsystem and host.
    UnknownController,
    /// A live controller has that host identifier under another host NQN.
    HostIdTaken,
    /// As many controllers wait for their host to authenticate as may.
    PendingFull,
    /// The peer address holds as many discovery controllers as it may.
    AddressFull,
}

/// A controller an admin Connect asks for.
#[derive(Debug, Clone, Copy)]
pub struct NewController<'a> {
    /// Its subsystem.
    pub subnqn: &'a str,
    /// Its host's NQN.
    pub hostnqn: &'a str,
    /// Its host's identifier.
    pub host_id: [u8; 16],
    /// Its host must authenticate before it is of use.
    pub authenticating: bool,
    /// The peer address that asks (when the driver knows it).
    pub peer: Option<IpAddr>,
    /// Places are kept for others: the peer is not one of the cluster's
    /// nodes, and the target is a cluster node.
    pub stranger: bool,
}

/// Why a range of controller IDs cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CntlidRangeError {
    /// Empty, or reaching outside 1 to FFEFh.
    #[error("controller IDs {start:#06x}..={end:#06x} are not a range of dynamic controller IDs (a non-empty range within 0x0001..=0xffef)")]
    Range {
        /// First ID of the range.
        start: u16,
        /// Last ID of the range.
        end: u16,
    },
    /// A node ordinal whose range would pass FFEFh.
    #[error("node ordinal {0} has no controller ID range: ordinals 0 to {max} have one (0x400 IDs each, within 0x0001..=0xffef)", max = CNTLID_ORDINALS - 1)]
    Ordinal(u16),
}

/// Controller IDs of node ordinal `k` in a cluster whose nodes export the
/// same subsystems: `k * 0x400 + 1 ..= k * 0x400 + 0x3FF`, so that no two
/// nodes hand a host the same CNTLID in one subsystem. Ordinals 0 to 62
/// have a range within the dynamic controller IDs (1 to FFEFh).
pub fn cntlid_range_for_ordinal(k: u16) -> Result<RangeInclusive<u16>, CntlidRangeError> {
    if k >= CNTLID_ORDINALS {
        return Err(CntlidRangeError::Ordinal(k));
    }
    let base = k * CNTLID_ORDINAL_STRIDE;
    Ok(base + 1..=base + CNTLID_ORDINAL_STRIDE - 1)
}

/// Every dynamic controller ID: what a target on its own hands out.
pub const DYNAMIC_CNTLIDS: RangeInclusive<u16> = 1..=Cntlid::MAX_DYNAMIC;

/// Controller IDs set aside per node ordinal (ID 0 of each block is unused).
const CNTLID_ORDINAL_STRIDE: u16 = 0x400;

/// Node ordinals with a controller ID range: the last one, 62, ends at FBFFh.
pub const CNTLID_ORDINALS: u16 = 63;

const _: () = assert!(
    (CNTLID_ORDINALS as u32) * (CNTLID_ORDINAL_STRIDE as u32) - 1 <= Cntlid::MAX_DYNAMIC as u32
        && (CNTLID_ORDINALS as u32 + 1) * (CNTLID_ORDINAL_STRIDE as u32) - 1
            > Cntlid::MAX_DYNAMIC as u32,
    "every ordinal's range lies within the dynamic controller IDs, and the next would not"
);

/// Live controllers of the target, keyed by controller ID (unique across
/// subsystems), allocated from the registry's range.
#[derive(Debug)]
pub struct ControllerRegistry {
    inner: Mutex<RegistryInner>,
    /// Controller IDs this registry hands out.
    range: RangeInclusive<u16>,
}

impl Default for ControllerRegistry {
    /// Every dynamic controller ID, 1 to FFEFh.
    fn default() -> ControllerRegistry {
        ControllerRegistry {
            inner: Mutex::default(),
            range: 1..=Cntlid::MAX_DYNAMIC,
        }
    }
}

#[derive(Debug, Default)]
struct RegistryInner {
    controllers: BTreeMap<u16, Arc<ControllerShared>>,
    next_cntlid: u16,
}

impl ControllerRegistry {
    /// A registry that hands out controller IDs from `range` only, which must
    /// be a non-empty range of dynamic controller IDs (within 1 to FFEFh).
    pub fn with_range(range: RangeInclusive<u16>) -> Result<ControllerRegistry, CntlidRangeError> {
        let (start, end) = (*range.start(), *range.end());
        if start == 0 || start > end || end > Cntlid::MAX_DYNAMIC {
            return Err(CntlidRangeError::Range { start, end });
        }
        Ok(ControllerRegistry {
            inner: Mutex::default(),
            range,
        })
    }

    /// The controller IDs this registry hands out.
    pub fn range(&self) -> RangeInclusive<u16> {
        self.range.clone()
    }

    /// Allocates a controller for an admin Connect (dynamic controller model)
    /// of a host that need not authenticate. `subnqn` may have
    /// `per_subsystem_max` controllers at once.
    pub fn create(
        &self,
        subnqn: &str,
        hostnqn: &str,
        host_id: [u8; 16],
        per_subsystem_max: u16,
    ) -> Result<Arc<ControllerShared>, RegistryError> {
        let new = NewController {
            subnqn,
            hostnqn,
            host_id,
            authenticating: false,
            peer: None,
            stranger: false,
        };
        self.create_within(
            &new,
            &Limits {
                controllers_per_subsystem_max: per_subsystem_max,
                ..Limits::DEFAULT
            },
        )
    }

    /// Allocates a controller for an admin Connect within `limits`: its
    /// subsystem's controllers, and, for a host that must authenticate,
    /// the subsystem's and the peer address's pending ones.
    pub fn create_within(
        &self,
        new: &NewController<'_>,
        limits: &Limits,
    ) -> Result<Arc<ControllerShared>, RegistryError> {
        let (subnqn, hostnqn, host_id) = (new.subnqn, new.hostnqn, new.host_id);
        let per_subsystem_max = limits.controllers_per_subsystem_max;
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // A host identifier names one host (reservations are held by it):
        // another NQN presenting it is not that host.
        if inner
            .controllers
            .values()
            .any(|c| c.host_id == host_id && c.hostnqn != hostnqn)
        {
            return Err(RegistryError::HostIdTaken);
        }
        // Counted at Connect only (a scan of the live controllers, not per I/O).
        let of_subsystem = inner
            .controllers
            .values()
            .filter(|c| c.subnqn == subnqn)
            .count();
        // Strangers leave the places kept for the cluster's nodes: at most a
        // quarter of a limit, so that lowering one leaves hosts room.
        let kept = |limit: u16| {
            let kept = limits.controllers_reserved_for_nodes.min(limit / 4);
            usize::from(if new.stranger { kept } else { 0 })
        };
        if of_subsystem + kept(per_subsystem_max) >= usize::from(per_subsystem_max) {
            return Err(RegistryError::SubsystemFull);
        }
        if subnqn == DISCOVERY_NQN && new.peer.is_some() {
            let of_peer = inner
                .controllers
                .values()
                .filter(|c| c.subnqn == subnqn && c.peer == new.peer)
                .count();
            if of_peer >= usize::from(limits.discovery_controllers_per_address) {
                return Err(RegistryError::AddressFull);
            }
        }
        if new.authenticating {
            let pending = inner
                .controllers
                .values()
                .filter(|c| c.subnqn == subnqn && c.authenticating.load(Ordering::Acquire));
            let (mut of_subsystem, mut of_peer) = (0, 0);
            for controller in pending {
                of_subsystem += 1;
                of_peer += usize::from(new.peer.is_some() && controller.peer == new.peer);
            }
            let limit = limits.pending_authentications_per_subsystem;
            if of_subsystem + kept(limit) >= usize::from(limit)
                || of_peer >= usize::from(limits.pending_authentications_per_address)
            {
                return Err(RegistryError::PendingFull);
            }
        }
        let cntlid = inner
            .free_cntlid(&self.range)
            .ok_or(RegistryError::Exhausted)?;
        let controller = Arc::new(ControllerShared::new(Cntlid(cntlid), new));
        inner.controllers.insert(cntlid, Arc::clone(&controller));
        Ok(controller)
    }

    /// Finds the controller an I/O queue Connect names. The host must be the one
    /// that created it (NVMe-oF 1.1, section 3.3: same Host NQN and Host ID).
    pub fn find(
        &self,
        subnqn: &str,
        cntlid: u16,
        hostnqn: &str,
        host_id: [u8; 16],
    ) -> Result<Arc<ControllerShared>, RegistryError> {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        inner
            .controllers
            .get(&cntlid)
            .filter(|c| {
                c.is_alive() && c.subnqn == subnqn && c.hostnqn == hostnqn && c.host_id == host_id
            })
            .cloned()
            .ok_or(RegistryError::UnknownController)
    }

    /// Tears a controller down: its I/O queues notice and close.
    pub fn remove(&self, cntlid: Cntlid) {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(controller) = inner.controllers.remove(&cntlid.0) {
            controller.alive.store(false, Ordering::Release);
            controller.set_ready(false);
        }
    }

    /// Host NQNs of the live controllers of subsystem `subnqn`.
    pub fn hosts_of(&self, subnqn: &str) -> Vec<String> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .controllers
            .values()
            .filter(|c| c.subnqn == subnqn)
            .map(|c| c.hostnqn.clone())
            .collect()
    }

    /// Number of live controllers.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .controllers
            .len()
    }

    /// Whether no controller is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RegistryInner {
    /// The next free ID of `range` after the last one handed out, wrapping
    /// from the range's end to its start (so that a just released ID is not
    /// reused at once).
    fn free_cntlid(&mut self, range: &RangeInclusive<u16>) -> Option<u16> {
        let (start, end) = (*range.start(), *range.end());
        for _ in range.clone() {
            self.next_cntlid = if self.next_cntlid < start || self.next_cntlid >= end {
                start
            } else {
                self.next_cntlid + 1
            };
            if !self.controllers.contains_key(&self.next_cntlid) {
                return Some(self.next_cntlid);
            }
        }
        None
    }
}

/// The target as a connection sees it: the current configuration, the
/// controller registry and the random source of authentication challenges.
#[derive(Debug)]
pub struct Target {
    /// What is exported now. Read at connection creation, written by updates.
    config: Mutex<Arc<TargetConfig>>,
    /// Live controllers.
    pub registry: ControllerRegistry,
    /// Fences of the fenced subsystems (shared with the target's own local writers).
    pub fences: Arc<crate::fence::Fences>,
    /// Random bytes for DH-HMAC-CHAP challenges.
    pub random: Arc<dyn SecureRandom>,
}

impl Target {
    /// A target exporting `config` (a `TargetConfig` or an already shared
    /// one), with no controllers yet, drawing challenges from `random`.
    ///
    /// # Panics
    /// If `config.limits` do not pass [`Limits::validate`]: the framing
    /// relies on them, and limits from configuration are validated where the
    /// configuration is read.
    pub fn new(config: impl Into<Arc<TargetConfig>>, random: Arc<dyn SecureRandom>) -> Arc<Target> {
        Target::with_registry(config.into(), random, ControllerRegistry::default())
    }

    /// [`Target::new`], handing out controller IDs from `range` only (see
    /// [`cntlid_range_for_ordinal`] for a cluster node's).
    ///
    /// # Panics
    /// As [`Target::new`].
    pub fn with_cntlid_range(
        config: impl Into<Arc<TargetConfig>>,
        random: Arc<dyn SecureRandom>,
        range: RangeInclusive<u16>,
    ) -> Result<Arc<Target>, CntlidRangeError> {
        let registry = ControllerRegistry::with_range(range)?;
        Ok(Target::with_registry(config.into(), random, registry))
    }

    fn with_registry(
        config: Arc<TargetConfig>,
        random: Arc<dyn SecureRandom>,
        registry: ControllerRegistry,
    ) -> Arc<Target> {
        if let Err(error) = config.limits.validate() {
            panic!("a target cannot serve these limits: {error}");
        }
        Arc::new(Target {
            config: Mutex::new(config),
            registry,
            fences: Arc::default(),
            random,
        })
    }

    /// The current configuration snapshot.
    pub fn config(&self) -> Arc<TargetConfig> {
        Arc::clone(&self.lock_config())
    }

    /// Makes `config` the current snapshot for connections created from now
    /// on (at `now`); the driver hands it to live connections itself. The
    /// limits size every connection's slots and buffers, so they are fixed
    /// for the target's life.
    pub fn replace_config(&self, config: Arc<TargetConfig>, now: crate::types::Timestamp) {
        let mut current = self.lock_config();
        assert_eq!(
            current.limits, config.limits,
            "the limits of a target never change"
        );
        self.fences
            .retain(|nqn| config.subsystem(nqn).is_some_and(|s| s.fenced), now);
        *current = config;
    }

    fn lock_config(&self) -> std::sync::MutexGuard<'_, Arc<TargetConfig>> {
        self.config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_ids_are_unique_and_reused_after_removal() {
        let registry = ControllerRegistry::default();
        let a = registry.create("nqn.s", "nqn.h", [1; 16], 8).unwrap();
        let b = registry.create("nqn.s", "nqn.h", [1; 16], 8).unwrap();
        assert_ne!(a.cntlid, b.cntlid);
        assert!(registry.find("nqn.s", a.cntlid.0, "nqn.h", [1; 16]).is_ok());
        assert_eq!(
            registry
                .find("nqn.s", a.cntlid.0, "nqn.other", [1; 16])
                .unwrap_err(),
            RegistryError::UnknownController
        );
        registry.remove(a.cntlid);
        assert!(!a.is_alive());
        assert!(registry
            .find("nqn.s", a.cntlid.0, "nqn.h", [1; 16])
            .is_err());
        assert_eq!(registry.len(), 1);
    }

    fn create(registry: &ControllerRegistry) -> Result<Arc<ControllerShared>, RegistryError> {
        registry.create("nqn.s", "nqn.h", [1; 16], u16::MAX)
    }

    #[test]
    fn controller_ids_stay_in_the_registry_range_and_wrap_within_it() {
        let registry = ControllerRegistry::with_range(0x401..=0x403).unwrap();
        let ids: Vec<u16> = (0..3)
            .map(|_| create(&registry).unwrap().cntlid.0)
            .collect();
        assert_eq!(ids, [0x401, 0x402, 0x403]);
        assert_eq!(
            create(&registry).unwrap_err(),
            RegistryError::Exhausted,
            "three IDs, three controllers"
        );
        registry.remove(Cntlid(0x402));
        assert_eq!(create(&registry).unwrap().cntlid, Cntlid(0x402));
        registry.remove(Cntlid(0x401));
        registry.remove(Cntlid(0x403));
        // The next ID after the last one handed out (402h), wrapping at the range's end.
        assert_eq!(create(&registry).unwrap().cntlid, Cntlid(0x403));
        assert_eq!(create(&registry).unwrap().cntlid, Cntlid(0x401));
        assert_eq!(create(&registry).unwrap_err(), RegistryError::Exhausted);
        assert_eq!(registry.len(), 3);
    }

    #[test]
    fn a_one_id_range_and_the_default_range() {
        let registry = ControllerRegistry::with_range(0xFFEF..=0xFFEF).unwrap();
        assert_eq!(create(&registry).unwrap().cntlid, Cntlid(0xFFEF));
        assert_eq!(create(&registry).unwrap_err(), RegistryError::Exhausted);
        assert_eq!(ControllerRegistry::default().range(), 1..=0xFFEF);
        assert_eq!(
            create(&ControllerRegistry::default()).unwrap().cntlid,
            Cntlid(1)
        );
    }

    #[test]
    fn registry_ranges_are_dynamic_controller_ids() {
        for (start, end) in [(0, 5), (1, 0xFFF0), (9, 8), (0xFFF0, 0xFFFF)] {
            assert_eq!(
                ControllerRegistry::with_range(start..=end).unwrap_err(),
                CntlidRangeError::Range { start, end }
            );
        }
        assert!(ControllerRegistry::with_range(1..=0xFFEF).is_ok());
    }

    #[test]
    fn each_node_ordinal_has_its_own_controller_ids() {
        assert_eq!(cntlid_range_for_ordinal(0), Ok(0x0001..=0x03FF));
        assert_eq!(cntlid_range_for_ordinal(1), Ok(0x0401..=0x07FF));
        assert_eq!(cntlid_range_for_ordinal(62), Ok(0xF801..=0xFBFF));
        assert_eq!(
            cntlid_range_for_ordinal(63),
            Err(CntlidRangeError::Ordinal(63))
        );
        assert_eq!(
            cntlid_range_for_ordinal(u16::MAX),
            Err(CntlidRangeError::Ordinal(u16::MAX))
        );
        let ranges: Vec<_> = (0..CNTLID_ORDINALS)
            .map(|k| cntlid_range_for_ordinal(k).unwrap())
            .collect();
        for pair in ranges.windows(2) {
            assert!(pair[0].end() < pair[1].start(), "disjoint and increasing");
        }
        for range in ranges {
            assert!(ControllerRegistry::with_range(range).is_ok());
        }
        let message = CntlidRangeError::Ordinal(63).to_string();
        assert!(message.contains("ordinals 0 to 62"), "{message}");
    }

    #[test]
    fn a_target_with_a_range_hands_out_its_ids() {
        let config = (*crate::testing::test_target().config()).clone();
        let random = Arc::new(crate::testing::CountingRandom::default());
        let target =
            Target::with_cntlid_range(config.clone(), random.clone(), 0x801..=0xBFF).unwrap();
        assert_eq!(target.registry.range(), 0x801..=0xBFF);
        assert_eq!(
            Target::with_cntlid_range(config, random, 0..=3).unwrap_err(),
            CntlidRangeError::Range { start: 0, end: 3 }
        );
    }

    fn subsystem(namespaces: &[(u32, u64)]) -> SubsystemConfig {
        let namespace = |&(nsid, blocks): &(u32, u64)| NamespaceConfig {
            nsid: Nsid(nsid),
            blocks,
            block_size: 512,
            nguid: [0; 16],
            uuid: [0; 16],
            eui64: [0; 8],
            thin: true,
            ready: true,
            reservations: None,
        };
        SubsystemConfig {
            nqn: "nqn.s".into(),
            serial: "s".into(),
            model: "m".into(),
            firmware: "f".into(),
            namespaces: namespaces.iter().map(namespace).collect(),
            access: HostAccess::Any,
            ana: AnaConfig::DEFAULT,
            fenced: false,
            fence_authority: None,
            intent: None,
        }
    }

    #[test]
    fn changed_namespaces_are_added_removed_or_different() {
        let old = subsystem(&[(1, 8), (2, 8), (4, 8), (9, 8)]);
        let new = subsystem(&[(2, 8), (3, 8), (4, 16), (9, 8), (10, 8), (11, 8)]);
        let changed: Vec<u32> = old.changed_namespaces(&new).iter().map(|n| n.0).collect();
        assert_eq!(changed, [1, 3, 4, 10, 11]);
        let back: Vec<u32> = new.changed_namespaces(&old).iter().map(|n| n.0).collect();
        assert_eq!(back, changed, "symmetric");
        assert!(old.changed_namespaces(&old).is_empty());
        assert_eq!(subsystem(&[]).changed_namespaces(&old).len(), 4);
    }

    #[test]
    fn limits_are_refused_when_the_framing_could_not_honour_them() {
        fn with(change: impl FnOnce(&mut Limits)) -> Result<(), LimitsError> {
            let mut limits = Limits::DEFAULT;
            change(&mut limits);
            limits.validate()
        }
        assert_eq!(Limits::DEFAULT.validate(), Ok(()));
        assert_eq!(
            with(|l| l.queue_entries_max = 1),
            Err(LimitsError::QueueEntries(1))
        );
        assert_eq!(
            with(|l| l.queue_entries_max = 32769),
            Err(LimitsError::QueueEntries(32769))
        );
        assert_eq!(with(|l| l.queue_entries_max = 32768), Ok(()));
        for transfer in [0, 2048, 96 * 1024, 1 << 31 | 1 << 30] {
            assert_eq!(
                with(|l| l.transfer_bytes_max = transfer),
                Err(LimitsError::TransferBytes(transfer)),
                "{transfer}"
            );
        }
        assert_eq!(
            with(|l| l.io_in_capsule_bytes_max = 2048 * 1024),
            Err(LimitsError::IoInCapsuleBytes {
                value: 2048 * 1024,
                transfer_bytes_max: 1024 * 1024
            })
        );
        assert!(with(|l| l.io_in_capsule_bytes_max = 100).is_err());
        assert!(with(|l| l.io_in_capsule_bytes_max = 0).is_ok());
        assert!(with(|l| l.admin_in_capsule_bytes_max = 4096).is_err());
        assert!(with(|l| l.admin_in_capsule_bytes_max = 2048 * 1024).is_err());
        assert_eq!(
            with(|l| l.h2c_data_bytes_max = 4094),
            Err(LimitsError::H2cDataBytes(4094))
        );
        assert!(with(|l| l.h2c_data_bytes_max = 4098).is_err());
        assert_eq!(with(|l| l.io_queues_max = 0), Err(LimitsError::IoQueues(0)));
        assert_eq!(
            with(|l| l.io_queues_max = 65),
            Err(LimitsError::IoQueues(65))
        );
        assert_eq!(
            with(|l| l.async_events_max = 0),
            Err(LimitsError::AsyncEvents)
        );
        let message = with(|l| l.io_queues_max = 65).unwrap_err().to_string();
        assert!(message.contains("1 to 64"), "{message}");
    }

    /// In-capsule data larger than a slot buffer used to reach the framing,
    /// which would have written it past the buffer's end.
    #[test]
    #[should_panic(expected = "io_in_capsule_bytes_max is 2097152")]
    fn a_target_refuses_limits_that_fail_validation() {
        let mut config = (*crate::testing::test_target().config()).clone();
        config.limits.io_in_capsule_bytes_max = 2048 * 1024;
        Target::new(config, Arc::new(crate::testing::CountingRandom::default()));
    }

    #[test]
    fn io_queue_claims_are_exclusive_and_reset_clears_them() {
        let registry = ControllerRegistry::default();
        let c = registry.create("nqn.s", "nqn.h", [0; 16], 8).unwrap();
        c.set_ready(true);
        assert!(c.claim_io_queue(1));
        assert!(!c.claim_io_queue(1));
        let epoch = c.epoch();
        c.set_ready(false);
        assert_ne!(c.epoch(), epoch);
        assert!(c.claim_io_queue(1));
    }
}
