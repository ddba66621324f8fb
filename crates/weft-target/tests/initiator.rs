//! weft's user-space initiator against weft's target over real TCP.

mod support;

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_initiator::{read_write, Backoff, ConnectOptions, Controller, InitiatorError, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::host::DataTransfer;
use weft_proto::testing::TEST_NQN;

#[test]
fn connects_identifies_and_moves_data() {
    let address = support::start("initiator");
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{TEST_NQN}")).unwrap();
    for digests in [false, true] {
        let options = ConnectOptions {
            header_digest: digests,
            data_digest: digests,
            ..ConnectOptions::default()
        };
        let mut controller = Controller::connect(&url, options, 2).unwrap();
        assert_eq!(controller.info.model, "weft");
        assert_eq!(controller.info.transfer_bytes_max, 1024 * 1024);
        assert_eq!(controller.info.io_in_capsule_bytes, 16 * 1024);
        assert_eq!(controller.info.io_queues, 2);
        let namespace = controller.namespace(2).unwrap();
        assert_eq!(namespace.block_size, 4096);
        assert_eq!(namespace.blocks * 4096, support::FILE_BYTES);
        let mut queue = controller.open_io_queue(2).unwrap();
        // Queue depth 16: submit all, then reap; sizes from in-capsule to
        // R2T, the largest in several H2CData PDUs (MAXH2CDATA 128 KiB).
        for (round, len) in [4096u32, 16384, 65536, 131072, 1 << 20]
            .into_iter()
            .enumerate()
        {
            let mut patterns = Vec::new();
            for index in 0..16u64 {
                let slba = index * 256;
                let pattern: Vec<u8> = (0..len)
                    .map(|i| (i as u64 ^ index ^ round as u64) as u8)
                    .collect();
                let cid = queue.next_cid();
                queue.buffer(cid)[..len as usize].copy_from_slice(&pattern);
                queue
                    .submit(
                        read_write(io_opcode::WRITE, 2, slba, len / 4096),
                        DataTransfer::ToController(len),
                    )
                    .unwrap();
                patterns.push((slba, pattern));
            }
            for _ in 0..16 {
                assert!(queue.wait().unwrap().status.is_success());
            }
            for (slba, pattern) in patterns {
                let done = queue
                    .run(
                        read_write(io_opcode::READ, 2, slba, len / 4096),
                        DataTransfer::FromController(len),
                    )
                    .unwrap();
                assert!(done.status.is_success());
                assert!(
                    queue.buffer(done.cid.0)[..len as usize] == pattern[..],
                    "read back differs at {slba}, {len} bytes"
                );
            }
        }
    }
}

#[test]
fn errors_say_what_failed() {
    let address = support::start("initiator-errors");
    let unknown =
        TargetUrl::parse(&format!("nvme-tcp://{address}/nqn.2026-11.io.weft:nothing")).unwrap();
    let error = Controller::connect(&unknown, ConnectOptions::default(), 1).unwrap_err();
    assert!(
        matches!(error, InitiatorError::UnknownNqn { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("nvme discover"), "{error}");
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{TEST_NQN}")).unwrap();
    let mut controller = Controller::connect(&url, ConnectOptions::default(), 1).unwrap();
    let error = controller.namespace(9).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("namespace 9 does not exist on {TEST_NQN} (it has [1, 2])")
    );
    // A port released on 127.0.0.2, where no test listens: surely closed.
    let closed = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let nowhere = TargetUrl::parse(&format!("nvme-tcp://{closed}/{TEST_NQN}")).unwrap();
    let error = Controller::connect(&nowhere, ConnectOptions::default(), 1).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with(&format!("cannot reach {closed}")),
        "{error}"
    );
}

/// A host that holds a controller secret asked for bidirectional
/// authentication: a target that lets it in without authenticating (one
/// that is not the subsystem it claims to be, say) is refused, before any
/// command reaches it. With only its own secret, the host goes on.
#[test]
fn a_controller_secret_insists_that_the_target_authenticates() {
    use weft_proto::auth::{DhchapSecret, HostKeys};
    let address = support::start("initiator-insists");
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{TEST_NQN}")).unwrap();
    let host = DhchapSecret::derived(b"seed", "host");
    let bidirectional = ConnectOptions {
        dhchap: Some(HostKeys {
            host: host.clone(),
            controller: Some(DhchapSecret::derived(b"seed", "controller")),
            dh_group: weft_proto::auth::DhGroup::Null,
        }),
        ..ConnectOptions::default()
    };
    let error = Controller::connect(&url, bidirectional, 1).unwrap_err();
    assert!(
        matches!(error, InitiatorError::ControllerNotAuthenticated { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("did not authenticate"),
        "{error}"
    );
    let host_only = ConnectOptions {
        dhchap: Some(HostKeys {
            host,
            controller: None,
            dh_group: weft_proto::auth::DhGroup::Null,
        }),
        ..ConnectOptions::default()
    };
    Controller::connect(&url, host_only, 1).unwrap();
}

#[test]
fn io_helpers_flush_zero_and_deallocate() {
    let address = support::start("initiator-io");
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{TEST_NQN}")).unwrap();
    let mut controller = Controller::connect(&url, ConnectOptions::default(), 1).unwrap();
    let mut queue = controller.open_io_queue(1).unwrap();
    for nsid in [1u32, 2] {
        let block = controller.namespace(nsid).unwrap().block_size;
        let data: Vec<u8> = (0..8 * block).map(|i| (i % 251) as u8 + 1).collect();
        queue.write(nsid, 16, block, &data).unwrap();
        queue.flush(nsid).unwrap();
        assert_eq!(queue.read(nsid, 16, block, 8 * block).unwrap(), &data[..]);
        queue.write_zeroes(nsid, 17, 2).unwrap();
        queue.deallocate(nsid, &[(20, 2), (23, 1)]).unwrap();
        let back = queue.read(nsid, 16, block, 8 * block).unwrap().to_vec();
        let b = block as usize;
        for (index, chunk) in back.chunks(b).enumerate() {
            let zeroed = [1, 2, 4, 5, 7].contains(&index);
            if zeroed {
                assert!(
                    chunk.iter().all(|&x| x == 0),
                    "ns {nsid} block {index} not zero"
                );
            } else {
                assert_eq!(
                    chunk,
                    &data[index * b..(index + 1) * b],
                    "ns {nsid} block {index}"
                );
            }
        }
    }
}

#[test]
fn keep_alive_holds_an_idle_controller() {
    let address = support::start("initiator-keep-alive");
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{TEST_NQN}")).unwrap();
    let options = ConnectOptions {
        keep_alive: Some(Duration::from_secs(1)),
        ..ConnectOptions::default()
    };
    let mut controller = Controller::connect(&url, options, 1).unwrap();
    let mut queue = controller.open_io_queue(1).unwrap();
    // Three KATOs idle: the target would have dropped a silent controller.
    std::thread::sleep(Duration::from_millis(3200));
    assert_eq!(controller.keep_alive_failure(), None);
    assert_eq!(controller.namespaces().unwrap().len(), 2);
    queue.flush(1).unwrap();
}

#[test]
fn reconnects_with_backoff_after_the_path_comes_back() {
    let target = support::start("initiator-reconnect");
    let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), target);
    let url = TargetUrl::parse(&format!("nvme-tcp://{}/{TEST_NQN}", proxy.address)).unwrap();
    let options = ConnectOptions {
        reconnect: Backoff {
            delay_first: Duration::from_millis(50),
            delay_max: Duration::from_millis(400),
            give_up_after: Duration::from_secs(3),
        },
        ..ConnectOptions::default()
    };
    let mut controller = Controller::connect(&url, options, 1).unwrap();
    let mut queue = controller.open_io_queue(1).unwrap();
    let data = vec![0x5Au8; 4096];
    queue.write(2, 3, 4096, &data).unwrap();

    // The path goes down; it comes back on the same address 700 ms later.
    let address = proxy.address;
    proxy.cut();
    assert!(queue.flush(2).unwrap_err().is_transient());
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        Proxy::start(address, target)
    });
    let started = Instant::now();
    controller.reconnect().unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "it waited for the path"
    );
    let mut queue = controller.open_io_queue(1).unwrap();
    assert_eq!(queue.read(2, 3, 4096, 4096).unwrap(), &data[..]);

    // Down for good: reconnect gives up after its budget with the cause.
    back.join().unwrap().cut();
    let started = Instant::now();
    let error = controller.reconnect().unwrap_err();
    assert!(error.to_string().starts_with("cannot reach"), "{error}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2500) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
}

/// A TCP forwarder standing in for the network path: `cut` drops every
/// connection and stops listening.
struct Proxy {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    accept: std::thread::JoinHandle<()>,
}

impl Proxy {
    fn start(listen: SocketAddr, target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(listen).unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let (stopping, tracked) = (Arc::clone(&stop), Arc::clone(&streams));
        let accept = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let server = TcpStream::connect(target).unwrap();
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
                tracked.lock().unwrap().extend([client, server]);
            }
        });
        Proxy {
            address,
            stop,
            streams,
            accept,
        }
    }

    fn cut(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.accept.join().unwrap();
        for stream in self.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// A host given an FFDHE group on the target authenticates over the
/// network with weft's initiator, both ways, with each group (the largest's
/// Reply carries a 1,024-byte DH value), and then does I/O.
#[test]
fn a_host_authenticates_with_each_ffdhe_group() {
    use std::sync::Arc;
    use weft_proto::auth::{DhGroup, DhchapSecret, HostKeys};
    use weft_proto::target::{AllowedHost, HostAccess};
    let plane = support::start_plane("initiator-ffdhe");
    let host_nqn = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000ffd0";
    let keys = |group| HostKeys {
        host: DhchapSecret::derived(b"seed", "host"),
        controller: Some(DhchapSecret::derived(b"seed", "controller")),
        dh_group: group,
    };
    let url = TargetUrl::parse(&format!("nvme-tcp://{}/{TEST_NQN}", plane.listening[0])).unwrap();
    for group in DhGroup::ALL {
        let current = plane.exports();
        let mut config = (*current.config).clone();
        config.subsystems[0].access = HostAccess::Only(vec![AllowedHost {
            nqn: host_nqn.to_string(),
            keys: Some(Arc::new(keys(group))),
            tls_psk: None,
        }]);
        config.generation += 1;
        plane.update_exports(Arc::new(weft_target::Exports::new(
            Arc::new(config),
            current.devices.clone(),
        )));
        let options = ConnectOptions {
            host_nqn: host_nqn.to_string(),
            dhchap: Some(keys(DhGroup::Null)),
            ..ConnectOptions::default()
        };
        let controller =
            Controller::connect(&url, options, 1).unwrap_or_else(|e| panic!("{group:?}: {e}"));
        let mut queue = controller.open_io_queue(1).unwrap();
        queue.write(1, 0, 512, &[7; 512]).unwrap();
        assert_eq!(queue.read(1, 0, 512, 512).unwrap(), &[7; 512][..]);
    }
}
