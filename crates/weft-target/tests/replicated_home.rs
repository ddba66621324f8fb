//! A replicated volume's I/O queues meet its replicator when told to
//! (`QueuePlacement::FollowReplicator`): the listener deals connections to
//! reactors in turn, and an I/O queue of a replicated volume moves, right
//! after its Connect, to the reactor that hosts (or would host) the
//! volume's replicator, so that its writes reach the replicator and come
//! back within one thread. Every queue moved this way serves reads and
//! writes. By default (`QueuePlacement::Spread`) they stay where they
//! were dealt.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use weft_proto::ana::AnaConfig;
use weft_proto::command::io_opcode;
use weft_proto::status::Status;
use weft_proto::target::{
    AddressFamily, HostAccess, ListenerConfig, NamespaceConfig, SubsystemConfig,
};
use weft_proto::testing::{self, TEST_NQN};
use weft_proto::types::Nsid;
use weft_proto::{Limits, TargetConfig};
use weft_target::guest::Guest;
use weft_target::replicated::{Replicated, ReplicatedIo, ReplicatedSink, Serving};
use weft_target::{
    Backend, DataPlane, Exports, NamespaceDevice, PeerLimits, QueuePlacement, VolumeBackend,
    VolumeManager, VolumeOutcome, VolumeRequest,
};
use weft_volume::format::Layout;
use weft_volume::ChunkMap;

const VOLUME: &str = "db1";
const CHUNK_BYTES: u32 = 1 << 20;
const VOLUME_BYTES: u64 = 16 << 20;
const BLOCK: u32 = 4096;

/// The threads its writes were handed over on; it acknowledges each.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

struct RecordingSink(Arc<Recorder>);

impl ReplicatedSink for RecordingSink {
    fn submit(&self, io: ReplicatedIo) {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed").to_string();
        self.0 .0.lock().unwrap().push(name);
        io.reply.send(VolumeOutcome::Done(Ok(())));
    }
}

/// A manager nothing should reach: every chunk read here is unwritten.
struct NoManager;

impl VolumeManager for NoManager {
    fn submit(&self, request: VolumeRequest) {
        panic!("unexpected slow-path work: {:?}", request.work);
    }
}

/// A guest hosted by the volume's name: tells the thread it runs on (the
/// replicator's home) and finishes.
struct Probe(Arc<Mutex<Option<String>>>);

impl Guest for Probe {
    fn has_work(&mut self) -> bool {
        false
    }

    fn turn(&mut self) -> bool {
        let thread = std::thread::current();
        *self.0.lock().unwrap() = thread.name().map(str::to_string);
        false
    }
}

fn serve_replicated_volume(reactors: usize, sink: Arc<Recorder>) -> DataPlane {
    serve_with_sink(reactors, Box::new(RecordingSink(sink)))
}

fn serve_with_sink(reactors: usize, sink: Box<dyn ReplicatedSink>) -> DataPlane {
    let path = Replicated::new(sink);
    path.set_serving(Serving::Yes);
    path.reads_until(u64::MAX);
    let backend = VolumeBackend {
        pool: "p".into(),
        volume: VOLUME.into(),
        map: Arc::new(ChunkMap::new(
            (VOLUME_BYTES / u64::from(CHUNK_BYTES)) as usize,
        )),
        gate: Arc::default(),
        layout: Arc::new(Layout::plan(1, 64 << 20, CHUNK_BYTES).unwrap()),
        member_fds: vec![-1],
        manager: Arc::new(NoManager),
        health: Arc::default(),
        intent: None,
        replicated: Some(Arc::new(path)),
        cipher: None,
    };
    let config = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: TEST_NQN.into(),
            serial: "replicated-home".into(),
            model: "weft".into(),
            firmware: "test".into(),
            namespaces: vec![NamespaceConfig {
                nsid: Nsid(1),
                blocks: VOLUME_BYTES / u64::from(BLOCK),
                block_size: BLOCK,
                nguid: [1; 16],
                uuid: [1; 16],
                eui64: [1; 8],
                thin: true,
                ready: true,
                reservations: None,
            }],
            access: HostAccess::Any,
            ana: AnaConfig::DEFAULT,
            fenced: false,
            fence_authority: None,
            intent: None,
        }],
        listeners: vec![ListenerConfig {
            port_id: 1,
            family: AddressFamily::Ipv4,
            address: "127.0.0.1".into(),
            service: "0".into(),
        }],
        limits: Limits::DEFAULT,
        referrals: Vec::new(),
        node_addresses: Vec::new(),
        discovery_serial: "discovery".into(),
        generation: 1,
    };
    let devices = vec![vec![NamespaceDevice {
        nsid: Nsid(1),
        backend: Backend::Volume(Arc::new(backend)),
        meter: Default::default(),
        health: Arc::default(),
    }]];
    DataPlane::start(
        Arc::new(Exports::new(Arc::new(config), devices)),
        &["127.0.0.1:0".parse().unwrap()],
        reactors,
        Duration::ZERO,
        PeerLimits::DEFAULT,
        weft_proto::target::DYNAMIC_CNTLIDS,
    )
    .unwrap()
}

/// The thread of the reactor that hosts `VOLUME`'s replicator.
fn home_thread(plane: &DataPlane) -> String {
    let seen = Arc::new(Mutex::new(None));
    let doorbell = weft_uring::eventfd().unwrap();
    plane.host(VOLUME, Box::new(Probe(Arc::clone(&seen))), doorbell);
    support::eventually("the probe's turn", || seen.lock().unwrap().is_some());
    let home = seen.lock().unwrap().clone().unwrap();
    home
}

#[test]
fn every_io_queue_of_a_replicated_volume_is_served_where_its_replicator_is() {
    let recorder = Arc::new(Recorder::default());
    let plane = serve_replicated_volume(2, Arc::clone(&recorder));
    plane.place_replicated_queues(QueuePlacement::FollowReplicator);
    let address = plane.listening[0];
    let home = home_thread(&plane);

    // Dealt in turn: without the move, one of two queues sits elsewhere.
    let (_admin, cntlid) = support::admin(address, 0);
    let mut queues: Vec<_> = (1..=3)
        .map(|qid| support::io_queue(address, cntlid, qid, false))
        .collect();
    let data = vec![0xA5u8; BLOCK as usize];
    for (index, queue) in queues.iter_mut().enumerate() {
        let cid = index as u16 + 1;
        let write = testing::rw(io_opcode::WRITE, cid, 1, index as u64, 1, BLOCK, true);
        assert_eq!(queue.command(&write, &data).1.status(), Status::SUCCESS);
        let read = testing::rw(io_opcode::READ, cid, 1, 0, 1, BLOCK, false);
        let (read, response) = queue.command(&read, &[]);
        assert_eq!(response.status(), Status::SUCCESS);
        assert_eq!(read, vec![0; BLOCK as usize], "an unwritten chunk");
    }
    let threads = recorder.0.lock().unwrap().clone();
    assert_eq!(threads, vec![home; 3], "every write handed over at home");
}

#[test]
fn queues_that_move_while_the_exports_change_serve_the_newest() {
    let recorder = Arc::new(Recorder::default());
    let plane = Arc::new(serve_replicated_volume(2, Arc::clone(&recorder)));
    plane.place_replicated_queues(QueuePlacement::FollowReplicator);
    let address = plane.listening[0];
    let home = home_thread(&plane);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The same volume, exported anew over and over: a queue may move to a
    // reactor that has seen fewer updates than the one it leaves, or more.
    let updater = {
        let (plane, done) = (Arc::clone(&plane), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut updates = 0u32;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let current = plane.exports();
                let config = Arc::clone(&current.config);
                plane.update_exports(Arc::new(Exports::new(config, current.devices.clone())));
                updates += 1;
            }
            updates
        })
    };
    let data = vec![0x5Au8; BLOCK as usize];
    let mut writes = 0;
    for round in 0..20u16 {
        let (_admin, cntlid) = support::admin(address, 0);
        for qid in 1..=3 {
            let mut queue = support::io_queue(address, cntlid, qid, false);
            let write = testing::rw(io_opcode::WRITE, round, 1, 0, 1, BLOCK, true);
            assert_eq!(queue.command(&write, &data).1.status(), Status::SUCCESS);
            writes += 1;
        }
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    assert!(updater.join().unwrap() > 0);
    let threads = recorder.0.lock().unwrap().clone();
    assert_eq!(threads, vec![home; writes]);
}

#[test]
fn by_default_queues_stay_where_the_listener_dealt_them() {
    let recorder = Arc::new(Recorder::default());
    let plane = serve_replicated_volume(2, Arc::clone(&recorder));
    let address = plane.listening[0];
    let (_admin, cntlid) = support::admin(address, 0);
    let data = vec![0x3Cu8; BLOCK as usize];
    for qid in 1..=2 {
        let mut queue = support::io_queue(address, cntlid, qid, false);
        let write = testing::rw(io_opcode::WRITE, qid, 1, 0, 1, BLOCK, true);
        assert_eq!(queue.command(&write, &data).1.status(), Status::SUCCESS);
    }
    let mut threads = recorder.0.lock().unwrap().clone();
    threads.sort();
    assert_eq!(threads, ["weft-reactor-0", "weft-reactor-1"]);
}

/// Work posted to a guest without its doorbell, as a replicator's own
/// reactor hands it host I/O: the guest answers it on its turn.
#[derive(Default)]
struct Postbox {
    posted: Mutex<Vec<ReplicatedIo>>,
}

struct PostboxSink(Arc<Postbox>);

impl ReplicatedSink for PostboxSink {
    fn submit(&self, io: ReplicatedIo) {
        self.0.posted.lock().unwrap().push(io);
    }
}

struct PostboxGuest(Arc<Postbox>);

impl Guest for PostboxGuest {
    fn has_work(&mut self) -> bool {
        !self.0.posted.lock().unwrap().is_empty()
    }

    fn turn(&mut self) -> bool {
        for io in self.0.posted.lock().unwrap().drain(..) {
            io.reply.send(VolumeOutcome::Done(Ok(())));
        }
        true
    }
}

/// Never has work; counts its turns.
struct Idle(Arc<std::sync::atomic::AtomicU32>);

impl Guest for Idle {
    fn has_work(&mut self) -> bool {
        false
    }

    fn turn(&mut self) -> bool {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        true
    }
}

/// A reactor that hands a replicated volume's I/O over cannot tell which
/// of its guests took it: it asks each whether it has work and turns only
/// those (turning every guest cost a reactor of G guests G turns per I/O).
#[test]
fn a_hand_over_turns_the_guest_that_took_it_and_no_other() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let postbox = Arc::new(Postbox::default());
    let plane = serve_with_sink(1, Box::new(PostboxSink(Arc::clone(&postbox))));
    let doorbell = weft_uring::eventfd().unwrap();
    plane.host(VOLUME, Box::new(PostboxGuest(postbox)), doorbell);
    let idle: Vec<Arc<AtomicU32>> = (0..4).map(|_| Arc::default()).collect();
    for (n, turns) in idle.iter().enumerate() {
        let doorbell = weft_uring::eventfd().unwrap();
        plane.host(
            &format!("idle-{n}"),
            Box::new(Idle(Arc::clone(turns))),
            doorbell,
        );
    }
    support::eventually("every idle guest's first turn", || {
        idle.iter().all(|t| t.load(Ordering::Acquire) >= 1)
    });
    let (_admin, cntlid) = support::admin(plane.listening[0], 0);
    let mut queue = support::io_queue(plane.listening[0], cntlid, 1, false);
    let data = vec![0x7Eu8; BLOCK as usize];
    for cid in 1..=20u16 {
        let write = testing::rw(io_opcode::WRITE, cid, 1, u64::from(cid), 1, BLOCK, true);
        assert_eq!(queue.command(&write, &data).1.status(), Status::SUCCESS);
    }
    for turns in &idle {
        assert_eq!(turns.load(Ordering::Acquire), 1, "turned by others' I/O");
    }
}
