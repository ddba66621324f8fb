//! Identify data structures and log pages (NVMe Base 2.0 sections 5.17 and
//! 5.16, NVMe-oF 1.1 section 5 for the discovery log). Each encoder fills a
//! zeroed output buffer and returns the structure's length; what to put in the
//! fields comes from the target configuration and the controller's state.

use crate::ana::{AnaConfig, AnaState, ANA_GROUPS_MAX};
use crate::target::{
    AddressFamily, ListenerConfig, NamespaceConfig, SubsystemConfig, DISCOVERY_NQN,
};
use crate::types::{Cntlid, Nsid};
use crate::wire::Writer;
use std::time::Duration;

/// Size of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// Identify CNS values weft answers.
pub mod cns {
    /// Identify Namespace.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTORS: u8 = 0x03;
    /// I/O Command Set specific Identify Namespace.
    pub const CS_NAMESPACE: u8 = 0x05;
    /// I/O Command Set specific Identify Controller.
    pub const CS_CONTROLLER: u8 = 0x06;
    /// Active Namespace ID list of an I/O command set.
    pub const CS_ACTIVE_NAMESPACES: u8 = 0x07;
    /// I/O Command Set Independent Identify Namespace.
    pub const CS_INDEPENDENT_NAMESPACE: u8 = 0x08;
    /// I/O Command Set data structure (supported combinations).
    pub const COMMAND_SETS: u8 = 0x1C;
}

/// Log page identifiers weft answers.
pub mod log_id {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NAMESPACES: u8 = 0x04;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = 0x0C;
    /// Discovery.
    pub const DISCOVERY: u8 = 0x70;
}

/// Kind of controller (CNTRLTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerKind {
    /// An I/O controller of an NVM subsystem.
    Io,
    /// A discovery controller.
    Discovery,
}

/// What Identify Controller reports.
#[derive(Debug, Clone, Copy)]
pub struct ControllerIdentity<'a> {
    /// Kind.
    pub kind: ControllerKind,
    /// Controller ID.
    pub cntlid: Cntlid,
    /// Subsystem NQN.
    pub subnqn: &'a str,
    /// Serial number.
    pub serial: &'a str,
    /// Model number.
    pub model: &'a str,
    /// Firmware revision.
    pub firmware: &'a str,
    /// Highest NSID (NN).
    pub max_nsid: u32,
    /// Maximum Number of Allowed Namespaces (MNAN), 1 to NN on an I/O
    /// controller (see [`namespace_limits`]).
    pub max_namespaces: u32,
    /// MDTS as a power of two of 4 KiB pages.
    pub mdts: u8,
    /// Maximum outstanding commands per queue.
    pub max_commands: u16,
    /// In-capsule data on I/O queues, bytes.
    pub io_in_capsule_bytes: u32,
    /// AERL + 1.
    pub async_events_max: u8,
}

/// NVMe version reported in VS and Identify Controller VER: 1.3.0, as Linux nvmet.
pub const NVME_VERSION: u32 = 0x0001_0300;
/// Keep Alive granularity in 100 ms units (KAS).
pub const KEEP_ALIVE_GRANULARITY_100MS: u16 = 10;
/// The same granularity as a duration.
pub const KEEP_ALIVE_GRANULE: Duration =
    Duration::from_millis(100 * KEEP_ALIVE_GRANULARITY_100MS as u64);

/// ANA Transition Time (ANATT), seconds: the longest a group stays in the
/// Change state. A Linux host resets the controller when a group is still
/// in Change after twice this long. nvmet reports 10 s as well.
pub const ANA_TRANSITION_SECONDS: u8 = 10;

/// ANACAP (NVMe Base 2.0, Figure 275): bits 0 to 4, the controller reports
/// the Optimized, Non-optimized, Inaccessible, Persistent Loss and Change
/// states (as nvmet); bit 6, a namespace's ANAGRPID does not change while
/// it is attached (a subsystem's group on a node is fixed, see
/// [`AnaConfig`]). Bit 7 (a non-zero ANAGRPID in Namespace Management) stays
/// clear: weft has no Namespace Management command.
pub const ANA_CAPABILITIES: u8 = 0x1F | (1 << 6);

/// NN and MNAN for a subsystem whose highest NSID is `max_nsid`, on a
/// controller whose largest transfer is `transfer_bytes_max` bytes.
///
/// A Linux host that sees CMIC bit 3 (ANA reporting) refuses the controller
/// unless 1 <= MNAN <= NN ("Invalid MNAN value"), and disables ANA if the
/// ANA log page it sizes, ANA header + NANAGRPID descriptors + MNAN NSIDs,
/// exceeds MDTS ("ANA log page size larger than MDTS"). So NN is at least 1,
/// and MNAN is NN capped at what fits the transfer; with the 4 KiB
/// transfer every valid [`crate::Limits`] allows at least, that is 508.
pub const fn namespace_limits(max_nsid: u32, transfer_bytes_max: u32) -> (u32, u32) {
    let nn = if max_nsid == 0 { 1 } else { max_nsid };
    let room = transfer_bytes_max.saturating_sub(ANA_LOG_FIXED_LEN as u32) / 4;
    let mnan = if nn < room { nn } else { room };
    (nn, mnan)
}

/// The ANA log page without NSIDs, at its largest: the header and one
/// descriptor per group a controller may report (NANAGRPID).
const ANA_LOG_FIXED_LEN: usize = ANA_HEADER_LEN + ANA_GROUPS_MAX as usize * ANA_DESCRIPTOR_LEN;

// The smallest transfer a valid Limits allows holds the largest ANA log a
// host sizes for one namespace, so MNAN is never 0.
const _: () = assert!(ANA_LOG_FIXED_LEN + 4 <= IDENTIFY_LEN);

/// Identify Controller (NVMe Base 2.0, Figure 275; Fabrics fields NVMe-oF 1.1, Figure 36).
pub fn controller(id: &ControllerIdentity<'_>, out: &mut [u8]) -> usize {
    let mut w = Writer::new(out);
    w.ascii(4, 20, id.serial, b' ')
        .ascii(24, 40, id.model, b' ')
        .ascii(64, 8, id.firmware, b' ')
        .u8(72, 6) // RAB: recommended arbitration burst, as nvmet
        // CMIC bit 1: the subsystem may have two or more controllers (one per
        // connected host, as with nvmet). A Linux host then puts the namespace
        // behind a multipath head, which holds I/O while a controller
        // reconnects instead of failing it. Bit 3 (ANA reporting) is an I/O
        // controller's, below: a discovery controller has no namespaces,
        // and NN 0 would fail Linux's MNAN check.
        .u8(76, 1 << 1)
        .u8(77, id.mdts)
        .u16(78, id.cntlid.0)
        .u32(80, NVME_VERSION)
        .u8(
            111,
            if id.kind == ControllerKind::Discovery {
                2
            } else {
                1
            },
        )
        .u8(258, 3) // ACL: 4 concurrent Aborts (0's based)
        .u8(259, id.async_events_max - 1) // AERL (0's based; Limits::validate keeps it >= 1)
        .u8(260, 0x3) // FRMW: slot 1 read-only, one slot
        .u8(261, 0x4) // LPA: extended data for Get Log Page (offsets, NUMDU)
        .u8(262, 0) // ELPE: one error log entry (0's based)
        .u16(320, KEEP_ALIVE_GRANULARITY_100MS) // KAS
        .u16(514, id.max_commands)
        .ascii(768, 256, id.subnqn, 0);
    if id.kind == ControllerKind::Io {
        // CMIC bit 3: the controller reports ANA states (its subsystem's
        // group, in the ANA log page). A Linux host then picks the paths
        // of a multipath namespace by their ANA state.
        w.u8(76, (1 << 1) | (1 << 3))
            // OAES bit 8: Namespace Attribute Notices; bit 11: ANA Change Notices.
            .u32(92, (1 << 8) | (1 << 11))
            // CTRATT bit 0: 128-bit Host Identifiers (as NVMe over Fabrics
            // requires; reservation reports use the extended structure).
            .u32(96, 1)
            .u8(342, ANA_TRANSITION_SECONDS) // ANATT
            .u8(343, ANA_CAPABILITIES) // ANACAP
            .u32(344, ANA_GROUPS_MAX) // ANAGRPMAX
            .u32(348, ANA_GROUPS_MAX) // NANAGRPID
            .u8(512, 0x66) // SQES: 64-byte entries
            .u8(513, 0x44) // CQES: 16-byte entries
            .u32(516, id.max_nsid) // NN
            // ONCS: Compare, Dataset Management, Write Zeroes, Reservations
            // (on the namespaces whose RESCAP says so).
            .u16(520, (1 << 0) | (1 << 2) | (1 << 3) | (1 << 5))
            // VWC: present; bits 2:1 = 11b, Flush with NSID FFFFFFFFh is supported.
            .u8(525, 0x7)
            .u32(540, id.max_namespaces); // MNAN
    } else {
        // OAES bit 31: Discovery Log Page Change Notices.
        w.u32(92, 1 << 31);
    }
    // SGLS: SGLs supported (dword aligned granularity not required), bit 20:
    // the address field of an in-capsule data block is an offset.
    w.u32(536, (1 << 0) | (1 << 20));
    // Fabrics: IOCCSZ and IORCSZ in 16-byte units (the in-capsule limit is a
    // multiple of 16 no larger than 2 GiB, see Limits::validate); ICDOFF 0;
    // FCATT 0 = dynamic model; MSDBD 1.
    w.u32(1792, (64 + id.io_in_capsule_bytes) / 16)
        .u32(1796, 1)
        .u16(1800, 0)
        .u8(1802, 0)
        .u8(1803, 1);
    // OFCS bit 0: Disconnect command supported.
    w.u16(1804, 1);
    // Power state 0: 25 W max power (MP in 0.01 W), as a placeholder the host only displays.
    w.u16(2048, 2500);
    IDENTIFY_LEN
}

/// NMIC bit 0: the namespace may be attached to two or more controllers
/// (every host attached to a volume gets its own controller).
const NMIC_SHARED: u8 = 1;

/// Identify Namespace, NVM command set (NVMe NVM Command Set 1.0, Figure
/// 97), of a namespace in ANA group `ana`.
pub fn namespace(ns: &NamespaceConfig, ana: &AnaConfig, out: &mut [u8]) -> usize {
    // NUSE: thin accounting comes with the volume manager. It is 0 while
    // the path cannot reach the namespace's data, as nvmet reports it.
    let used = match ana.state {
        AnaState::Inaccessible | AnaState::PersistentLoss => 0,
        _ => ns.blocks,
    };
    let mut w = Writer::new(out);
    w.u64(0, ns.blocks) // NSZE
        .u64(8, ns.blocks) // NCAP
        .u64(16, used) // NUSE
        // NSFEAT: bit 0 thin provisioning, bit 3 NGUID/EUI64 never reused.
        .u8(24, (ns.thin as u8) | (1 << 3))
        .u8(25, 0) // NLBAF: one format (0's based)
        .u8(26, 0) // FLBAS: format 0
        .u8(30, NMIC_SHARED)
        .u8(31, rescap(ns))
        // DLFEAT: deallocated blocks read as zeroes (001b), Write Zeroes may deallocate (bit 3).
        .u8(33, 0x1 | (1 << 3))
        .u32(92, ana.group.get()) // ANAGRPID
        .bytes(104, &ns.nguid)
        .bytes(120, &ns.eui64)
        .u32(128, ns.block_shift() << 16); // LBAF0: MS 0, LBADS, RP 0
    IDENTIFY_LEN
}

/// RESCAP: the reservations a namespace supports (none without a cell).
fn rescap(ns: &NamespaceConfig) -> u8 {
    if ns.reservations.is_some() {
        crate::reservation::RESCAP
    } else {
        0
    }
}

/// Active namespace ID list: NSIDs greater than `after`, ascending (CNS 02h / 07h).
pub fn active_namespaces(subsystem: &SubsystemConfig, after: Nsid, out: &mut [u8]) -> usize {
    let mut w = Writer::new(out);
    let listed = subsystem
        .namespaces
        .iter()
        .filter(|ns| ns.nsid > after)
        .take(IDENTIFY_LEN / 4);
    for (index, ns) in listed.enumerate() {
        w.u32(index * 4, ns.nsid.0);
    }
    IDENTIFY_LEN
}

/// Namespace Identification Descriptor list (NVMe Base 2.0, Figure 280): EUI64, NGUID, UUID, CSI.
pub fn namespace_descriptors(ns: &NamespaceConfig, out: &mut [u8]) -> usize {
    let mut w = Writer::new(out);
    let mut offset = 0;
    let descriptors: [(u8, &[u8]); 4] = [
        (0x1, &ns.eui64),
        (0x2, &ns.nguid),
        (0x3, &ns.uuid),
        (0x4, &[0]),
    ];
    for (kind, id) in descriptors {
        w.u8(offset, kind)
            .u8(offset + 1, id.len() as u8)
            .bytes(offset + 4, id);
        offset += 4 + id.len();
    }
    IDENTIFY_LEN
}

/// I/O Command Set Independent Identify Namespace (NVMe Base 2.0, Figure
/// 281), of a namespace in ANA group `ana`.
pub fn cs_independent_namespace(ns: &NamespaceConfig, ana: &AnaConfig, out: &mut [u8]) -> usize {
    // NSFEAT and NMIC mirror the NVM structure; NSTAT bit 0: ready.
    Writer::new(out)
        .u8(0, ns.thin as u8 | (1 << 3))
        .u8(1, NMIC_SHARED)
        .u8(2, rescap(ns))
        .u32(4, ana.group.get()) // ANAGRPID
        .u8(14, ns.ready as u8);
    IDENTIFY_LEN
}

/// I/O Command Set data structure (CNS 1Ch): one combination, the NVM command set.
pub fn command_sets(out: &mut [u8]) -> usize {
    Writer::new(out).u64(0, 1);
    IDENTIFY_LEN
}

/// Length of a SMART / Health log page.
pub const SMART_LEN: usize = 512;

/// What the health log reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct Health {
    /// Bytes read by the host.
    pub read_bytes: u64,
    /// Bytes written by the host.
    pub written_bytes: u64,
    /// Read commands.
    pub read_commands: u64,
    /// Write commands.
    pub write_commands: u64,
}

/// SMART / Health Information (NVMe Base 2.0, Figure 207).
pub fn smart(health: &Health, out: &mut [u8]) -> usize {
    // Data units are thousands of 512-byte units, rounded up.
    let units = |bytes: u64| (bytes / 512).div_ceil(1000) as u128;
    let mut w = Writer::new(out);
    w.u16(1, 0) // composite temperature unknown (0 K); a virtual device has none
        .u8(3, 100) // available spare
        .u8(4, 10) // available spare threshold
        .bytes(32, &units(health.read_bytes).to_le_bytes())
        .bytes(48, &units(health.written_bytes).to_le_bytes())
        .bytes(64, &(health.read_commands as u128).to_le_bytes())
        .bytes(80, &(health.write_commands as u128).to_le_bytes());
    SMART_LEN
}

/// Firmware Slot Information (NVMe Base 2.0, Figure 209): slot 1 active.
pub fn firmware_slot(firmware: &str, out: &mut [u8]) -> usize {
    Writer::new(out).u8(0, 1).ascii(8, 8, firmware, b' ');
    512
}

/// Length of one Error Information log entry.
pub const ERROR_ENTRY_LEN: usize = 64;

/// Entries of the Changed Namespace List.
pub const CHANGED_NAMESPACES_MAX: usize = 1024;

/// Changed Namespace List (NVMe Base 2.0, Figure 211): up to 1024 NSIDs, the
/// rest zero. A longer list is the caller's to replace by its overflow marker.
pub fn changed_namespaces(nsids: &[Nsid], out: &mut [u8]) -> usize {
    assert!(nsids.len() <= CHANGED_NAMESPACES_MAX);
    let mut w = Writer::new(out);
    for (index, nsid) in nsids.iter().enumerate() {
        w.u32(index * 4, nsid.0);
    }
    CHANGED_NAMESPACES_MAX * 4
}

/// Length of the ANA log page header (NVMe Base 2.0, Figure 223).
pub const ANA_HEADER_LEN: usize = 16;
/// Length of an ANA Group Descriptor without its NSIDs (Figure 224).
pub const ANA_DESCRIPTOR_LEN: usize = 32;

/// The ANA log page header: CHGCNT, the change count of the page, and
/// NGRPS, the number of group descriptors that follow.
pub fn ana_header(change_count: u64, groups: u16, out: &mut [u8]) {
    Writer::new(out).u64(0, change_count).u16(8, groups);
}

/// An ANA Group Descriptor: ANAGRPID, NNSIDS (the NSIDs that follow it,
/// 0 when the host asked for groups only), CHGCNT and ANAS. The NSIDs
/// themselves, ascending, are the caller's to append.
pub fn ana_group_descriptor(ana: &AnaConfig, nsids: u32, change_count: u64, out: &mut [u8]) {
    Writer::new(out)
        .u32(0, ana.group.get())
        .u32(4, nsids)
        .u64(8, change_count)
        .u8(16, ana.state.code());
}

/// Discovery log header length and entry length (NVMe-oF 1.1, Figures 38 and 39).
pub const DISCOVERY_HEADER_LEN: usize = 1024;
/// Length of one discovery log entry.
pub const DISCOVERY_ENTRY_LEN: usize = 1024;

/// What a discovery log record names (its SUBTYPE, NVMe-oF 1.1 Figure 39).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// An NVM subsystem (SUBTYPE 2).
    Nvm,
    /// This discovery subsystem (SUBTYPE 3, "current discovery subsystem").
    CurrentDiscovery,
    /// Another discovery subsystem to ask as well (SUBTYPE 1, "referral").
    Referral,
}

/// One discovery log record: a subsystem reachable through a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryRecord<'a> {
    /// Subsystem NQN.
    pub subnqn: &'a str,
    /// What it names.
    pub kind: RecordKind,
    /// Where it is reached.
    pub listener: &'a ListenerConfig,
    /// The host asking must connect over TLS 1.3 (it was given a PSK).
    pub tls: bool,
}

/// All records of the discovery log: every NVM subsystem on every listener,
/// then the discovery subsystem itself on every listener (as nvmet reports it,
/// so that `nvme discover` shows the current discovery controller too), then
/// the referrals to other discovery controllers (as nvmet lists its
/// configured referrals).
pub fn discovery_records<'a>(
    subsystems: &'a [SubsystemConfig],
    listeners: &'a [ListenerConfig],
    referrals: &'a [ListenerConfig],
) -> impl Iterator<Item = DiscoveryRecord<'a>> + Clone {
    let nvm = subsystems.iter().flat_map(move |s| {
        listeners.iter().map(move |l| DiscoveryRecord {
            subnqn: &s.nqn,
            kind: RecordKind::Nvm,
            listener: l,
            tls: false,
        })
    });
    let discovery = listeners.iter().map(|l| DiscoveryRecord {
        subnqn: DISCOVERY_NQN,
        kind: RecordKind::CurrentDiscovery,
        listener: l,
        tls: false,
    });
    let referred = referrals.iter().map(|r| DiscoveryRecord {
        subnqn: DISCOVERY_NQN,
        kind: RecordKind::Referral,
        listener: r,
        tls: false,
    });
    nvm.chain(discovery).chain(referred)
}

/// Writes the discovery log page header.
pub fn discovery_header(generation: u64, records: u64, out: &mut [u8]) {
    Writer::new(out)
        .u64(0, generation)
        .u64(8, records)
        .u16(16, 0);
}

/// Writes one discovery log entry.
pub fn discovery_entry(record: &DiscoveryRecord<'_>, out: &mut [u8]) {
    let adrfam = match record.listener.family {
        AddressFamily::Ipv4 => 1,
        AddressFamily::Ipv6 => 2,
    };
    let subtype = match record.kind {
        RecordKind::Referral => 1,
        RecordKind::Nvm => 2,
        RecordKind::CurrentDiscovery => 3,
    };
    Writer::new(out)
        .u8(0, 3) // TRTYPE: TCP
        .u8(1, adrfam)
        .u8(2, subtype)
        // TREQ 04h, as nvmet reports a TCP port: secure channel "not
        // specified" and SQ flow control may be disabled (weft supports
        // it). Not "not required" (02h), which says TLS is offered:
        // libnvme 1.3 (Debian bookworm) then asks the kernel for it and
        // `nvme connect-all` fails on 6.1 ("unknown parameter 'tls'"). For
        // a host given a TLS PSK: "required" (01h), and SECTYPE TLS 1.3
        // below, which libnvme's connect-all turns into `--tls`.
        .u8(3, if record.tls { 0x05 } else { 0x04 })
        .u16(4, record.listener.port_id)
        .u16(6, 0xFFFF) // CNTLID: dynamic controller model
        .u16(8, 32) // ASQSZ: admin queue entries the host should use
        .ascii(32, 32, &record.listener.service, 0)
        .ascii(256, 256, record.subnqn, 0)
        .ascii(512, 256, &record.listener.address, 0)
        .u8(768, if record.tls { 2 } else { 0 }); // TSAS: SECTYPE (TCP)
}

// Sizes fixed by the specifications (NVMe Base 2.0 Figures 207, 223-224, 275; NVMe-oF 1.1 Figure 38-39).
const _: () = assert!(IDENTIFY_LEN == 4096 && SMART_LEN == 512 && ERROR_ENTRY_LEN == 64);
const _: () = assert!(ANA_HEADER_LEN == 16 && ANA_DESCRIPTOR_LEN == 32);
const _: () = assert!(DISCOVERY_HEADER_LEN == 1024 && DISCOVERY_ENTRY_LEN == 1024);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ana::AnaGroupId;
    use crate::wire::{ascii_field, hex};

    fn ana(group: u32, state: AnaState) -> AnaConfig {
        AnaConfig {
            group: AnaGroupId::new(group).unwrap(),
            state,
        }
    }

    fn ns() -> NamespaceConfig {
        NamespaceConfig {
            nsid: Nsid(1),
            blocks: 1 << 20,
            block_size: 4096,
            nguid: [0x11; 16],
            uuid: [0x22; 16],
            eui64: [0x33; 8],
            thin: true,
            ready: true,
            reservations: None,
        }
    }

    #[test]
    fn identify_namespace_fields() {
        let mut out = vec![0u8; IDENTIFY_LEN];
        namespace(&ns(), &AnaConfig::DEFAULT, &mut out);
        assert_eq!(u64::from_le_bytes(out[0..8].try_into().unwrap()), 1 << 20);
        assert_eq!(u64::from_le_bytes(out[16..24].try_into().unwrap()), 1 << 20);
        assert_eq!(out[24], 0x9);
        assert_eq!(out[30], 1, "NMIC: shared");
        assert_eq!(out[92..96], hex("01000000"), "ANAGRPID");
        assert_eq!(&out[104..120], &[0x11; 16]);
        assert_eq!(out[130], 12, "LBADS of a 4 KiB block");
    }

    /// ANAGRPID at bytes 95:92 (Linux's struct nvme_id_ns anagrpid); NUSE 0
    /// while the group is Inaccessible, as nvmet reports it.
    #[test]
    fn identify_namespace_reports_its_ana_group() {
        let mut out = vec![0u8; IDENTIFY_LEN];
        namespace(&ns(), &ana(3, AnaState::Inaccessible), &mut out);
        assert_eq!(out[92..96], hex("03000000"));
        assert_eq!(out[16..24], [0; 8], "NUSE");
        assert_eq!(
            u64::from_le_bytes(out[0..8].try_into().unwrap()),
            1 << 20,
            "NSZE"
        );
        out.fill(0);
        namespace(&ns(), &ana(64, AnaState::NonOptimized), &mut out);
        assert_eq!(out[92..96], hex("40000000"));
        assert_eq!(u64::from_le_bytes(out[16..24].try_into().unwrap()), 1 << 20);
    }

    #[test]
    fn command_set_independent_namespace_fields() {
        let mut out = vec![0u8; IDENTIFY_LEN];
        cs_independent_namespace(&ns(), &ana(3, AnaState::Optimized), &mut out);
        // NSFEAT, NMIC, ANAGRPID, NSTAT at the offsets of Linux's struct nvme_id_ns_cs_indep.
        assert_eq!(
            out[0..16],
            hex("09 01 00 00 03000000 00 00 0000 0000 01 00")
        );
    }

    #[test]
    fn ana_log_header_and_descriptor_bytes() {
        let mut header = [0u8; ANA_HEADER_LEN];
        ana_header(0x0102_0304_0506_0708, 1, &mut header);
        assert_eq!(header[..], hex("0807060504030201 0100 000000000000"));
        let mut descriptor = [0u8; ANA_DESCRIPTOR_LEN];
        ana_group_descriptor(&ana(3, AnaState::Change), 2, 5, &mut descriptor);
        assert_eq!(
            descriptor[..],
            hex("03000000 02000000 0500000000000000 0f 000000000000000000000000000000")
        );
    }

    /// NN and MNAN as a Linux host checks them with ANA reported: MNAN at
    /// least 1 and at most NN, and the ANA log page it sizes from NANAGRPID
    /// and MNAN within MDTS.
    #[test]
    fn mnan_is_positive_at_most_nn_and_the_ana_log_fits_the_transfer() {
        assert_eq!(namespace_limits(0, 4096), (1, 1));
        assert_eq!(namespace_limits(2, 128 * 1024), (2, 2));
        assert_eq!(namespace_limits(u32::MAX - 1, 4096), (u32::MAX - 1, 508));
        for transfer in [4096, 8192, 128 * 1024, 1 << 31] {
            for max_nsid in [0, 1, 2, 507, 508, 4096, 1 << 20, u32::MAX - 1] {
                let (nn, mnan) = namespace_limits(max_nsid, transfer);
                assert!(1 <= mnan && mnan <= nn, "{max_nsid} {transfer}");
                let host_log_len = 16 + u64::from(ANA_GROUPS_MAX) * 32 + u64::from(mnan) * 4;
                assert!(host_log_len <= u64::from(transfer), "{max_nsid} {transfer}");
            }
        }
    }

    #[test]
    fn descriptors_are_packed() {
        let mut out = vec![0u8; IDENTIFY_LEN];
        namespace_descriptors(&ns(), &mut out);
        assert_eq!(&out[0..4], &[1, 8, 0, 0]);
        assert_eq!(&out[12..16], &[2, 16, 0, 0]);
        assert_eq!(&out[32..36], &[3, 16, 0, 0]);
        assert_eq!(&out[52..57], &[4, 1, 0, 0, 0]);
        assert_eq!(out[57], 0, "list ends with a zero descriptor");
    }

    #[test]
    fn identify_controller_fields() {
        let mut out = vec![0u8; IDENTIFY_LEN];
        let id = ControllerIdentity {
            kind: ControllerKind::Io,
            cntlid: Cntlid(7),
            subnqn: "nqn.2026-11.io.weft:default",
            serial: "0123456789abcdef0123",
            model: "weft",
            firmware: "0.1.0",
            max_nsid: 2,
            max_namespaces: 2,
            mdts: 5,
            max_commands: 128,
            io_in_capsule_bytes: 16384,
            async_events_max: 4,
        };
        controller(&id, &mut out);
        assert_eq!(ascii_field(&out[4..24]), "0123456789abcdef0123");
        assert_eq!(ascii_field(&out[24..64]), "weft");
        assert_eq!(out[76], 0xA, "CMIC: two or more controllers, ANA reporting");
        assert_eq!(out[77], 5);
        assert_eq!(u16::from_le_bytes([out[78], out[79]]), 7);
        assert_eq!(out[92..96], hex("00090000"), "OAES: bits 8 and 11");
        assert_eq!(out[261], 0x4, "LPA: extended data only, as before ANA");
        // ANATT, ANACAP, ANAGRPMAX, NANAGRPID at the offsets of Linux's
        // struct nvme_id_ctrl (after ENDGIDMAX at 340).
        assert_eq!(out[340..352], hex("0000 0a 5f 40000000 40000000"));
        assert_eq!(out[352..356], [0; 4], "PELS");
        assert_eq!(out[516..520], hex("02000000"), "NN");
        assert_eq!(out[540..544], hex("02000000"), "MNAN");
        assert_eq!(ascii_field(&out[768..1024]), "nqn.2026-11.io.weft:default");
        assert_eq!(
            u32::from_le_bytes(out[1792..1796].try_into().unwrap()),
            1028
        );
        // A discovery controller reports no ANA.
        let discovery = ControllerIdentity {
            kind: ControllerKind::Discovery,
            max_nsid: 0,
            max_namespaces: 0,
            ..id
        };
        out.fill(0);
        controller(&discovery, &mut out);
        assert_eq!(out[76], 0x2, "CMIC: no ANA reporting");
        assert_eq!(out[92..96], hex("00000080"), "OAES: bit 31 only");
        assert_eq!(out[340..356], [0; 16]);
        assert_eq!(out[540..544], [0; 4]);
    }

    #[test]
    fn discovery_entry_layout() {
        let listener = ListenerConfig {
            port_id: 1,
            family: AddressFamily::Ipv4,
            address: "10.0.2.2".into(),
            service: "4420".into(),
        };
        let mut out = vec![0u8; DISCOVERY_ENTRY_LEN];
        let mut record = DiscoveryRecord {
            subnqn: "nqn.x:y",
            kind: RecordKind::Nvm,
            listener: &listener,
            tls: false,
        };
        discovery_entry(&record, &mut out);
        assert_eq!(&out[0..4], &[3, 1, 2, 4]);
        assert_eq!(ascii_field(&out[32..64]), "4420");
        assert_eq!(ascii_field(&out[256..512]), "nqn.x:y");
        assert_eq!(ascii_field(&out[512..768]), "10.0.2.2");
        assert_eq!(out[768], 0, "SECTYPE none");
        // For a host given a TLS PSK: TREQ "required" (and SQ flow control
        // may be disabled), SECTYPE TLS 1.3 (NVMe/TCP 1.1 Figure 9).
        record.tls = true;
        discovery_entry(&record, &mut out);
        assert_eq!((out[3], out[768]), (0x05, 2));
    }

    /// A referral (NVMe-oF 1.1 Figure 39: SUBTYPE 01h, the well-known
    /// discovery NQN) as Linux nvmet formats one: TRTYPE TCP, ADRFAM IPv4,
    /// TREQ 04h, the referred port's PORTID, CNTLID FFFFh, ASQSZ 32.
    #[test]
    fn referral_entry_bytes() {
        let referred = ListenerConfig {
            port_id: 2,
            family: AddressFamily::Ipv4,
            address: "10.0.0.6".into(),
            service: "4421".into(),
        };
        let mut out = vec![0u8; DISCOVERY_ENTRY_LEN];
        let record = discovery_records(&[], &[], std::slice::from_ref(&referred))
            .next()
            .unwrap();
        discovery_entry(&record, &mut out);
        assert_eq!(out[0..10], hex("030101040200ffff2000")[..]);
        assert_eq!(ascii_field(&out[32..64]), "4421");
        assert_eq!(ascii_field(&out[256..512]), DISCOVERY_NQN);
        assert_eq!(ascii_field(&out[512..768]), "10.0.0.6");
        assert_eq!(out[768], 0, "TSAS: no security");
    }
}
