//! NVMe/TCP over TLS against the data plane, over loopback TCP: a host
//! given a TLS PSK connects its admin and I/O queues in TLS streams (weft's
//! TLS client, with the identity and PSK nvme-cli derives) and writes and
//! reads back 128 KiB, larger than the buffer the target seals into at a
//! time; the same host in the clear is refused at Connect, and a host with
//! another key never gets past the handshake; discovery over TLS says TLS is
//! required for the volume. (OpenSSL and GnuTLS against
//! the same handshake: crates/weft-proto/tests/tls_peers.rs; the Linux
//! host with tlshd: harness/auth-interop.sh.)

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;
use weft_proto::command::{admin_opcode, io_opcode};
use weft_proto::pdu::{DataHeader, PduType};
use weft_proto::status::Status;
use weft_proto::target::{AllowedHost, HostAccess};
use weft_proto::testing::{self, CountingRandom, ReceivedPdu, HOST_NQN, TEST_NQN};
use weft_proto::tls::psk::{ConfiguredPsk, Identity};
use weft_proto::tls::{record_len, Alert, ClientHandshake, Established, APPLICATION_DATA};
use weft_target::{DataPlane, Exports};

const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

/// The test plane with its subsystem open to the model host only, over TLS with `KEY`.
fn plane_with_tls_host(name: &str) -> DataPlane {
    let plane = support::start_plane(name);
    let current = plane.exports();
    let mut config = (*current.config).clone();
    config.subsystems[0].access = HostAccess::Only(vec![AllowedHost {
        nqn: HOST_NQN.to_string(),
        keys: None,
        tls_psk: Some(Arc::new(ConfiguredPsk::parse(KEY).unwrap())),
    }]);
    config.generation += 1;
    plane.update_exports(Arc::new(Exports::new(
        Arc::new(config),
        current.devices.clone(),
    )));
    plane
}

/// A host queue in a TLS stream, speaking PDUs through the host model's builders.
struct TlsClient {
    stream: TcpStream,
    tls: Established,
    ciphertext: Vec<u8>,
    plaintext: Vec<u8>,
}

impl TlsClient {
    /// Connects with `key` (as nvme-cli derives a version 0 identity), then ICReq.
    fn connect(address: SocketAddr, key: &str) -> Result<TlsClient, Alert> {
        TlsClient::connect_to(address, key, TEST_NQN)
    }

    /// [`TlsClient::connect`] with an identity naming `subnqn`.
    fn connect_to(address: SocketAddr, key: &str, subnqn: &str) -> Result<TlsClient, Alert> {
        let psk = ConfiguredPsk::parse(key).unwrap();
        let identity = Identity::of(&psk, 0, HOST_NQN, subnqn);
        let tls_psk = identity.tls_psks(&psk).remove(0);
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let random = CountingRandom::default();
        let mut handshake =
            ClientHandshake::new(identity.to_string().as_bytes(), &tls_psk, &random);
        let mut buffer = vec![0u8; 64 * 1024];
        let tls = loop {
            stream.write_all(&handshake.take_output()).unwrap();
            if let Some(established) = handshake.established() {
                break established;
            }
            let read = stream.read(&mut buffer).unwrap();
            if read == 0 {
                return Err(Alert::Received(0));
            }
            handshake.handle_input(&buffer[..read])?;
        };
        let mut client = TlsClient {
            stream,
            ciphertext: tls.leftover.clone(),
            tls,
            plaintext: Vec::new(),
        };
        client.send(&testing::icreq(false, false));
        assert_eq!(client.next_pdu().pdu_type, PduType::IcResp as u8);
        Ok(client)
    }

    fn send(&mut self, bytes: &[u8]) {
        let mut wire = Vec::new();
        self.tls
            .send
            .seal_to(APPLICATION_DATA, bytes, &mut wire)
            .unwrap();
        self.stream.write_all(&wire).unwrap();
    }

    fn next_pdu(&mut self) -> ReceivedPdu {
        loop {
            if let Some(pdu) = testing::parse_pdu(&mut self.plaintext) {
                return pdu;
            }
            while let Some(len) = record_len(&self.ciphertext)
                .unwrap()
                .filter(|len| *len <= self.ciphertext.len())
            {
                let mut record: Vec<u8> = self.ciphertext.drain(..len).collect();
                let (kind, range) = self.tls.receive.open(&mut record).unwrap();
                assert_eq!(
                    kind, APPLICATION_DATA,
                    "only application data after the handshake"
                );
                self.plaintext.extend_from_slice(&record[range]);
            }
            if testing::parse_pdu(&mut self.plaintext.clone()).is_some() {
                continue;
            }
            let mut chunk = [0u8; 65536];
            let read = self.stream.read(&mut chunk).unwrap();
            assert!(read > 0, "the target closed the stream");
            self.ciphertext.extend_from_slice(&chunk[..read]);
        }
    }

    /// Sends `sqe` with `data` in the capsule and returns what the target
    /// read back and its response.
    fn command(&mut self, sqe: &[u8; 64], data: &[u8]) -> (Vec<u8>, ReceivedPdu) {
        self.send(&testing::capsule(false, false, sqe, data));
        self.answer(&[])
    }

    /// Sends `sqe` alone and `data` when the target asks for it (R2T).
    fn write_r2t(&mut self, sqe: &[u8; 64], data: &[u8]) -> ReceivedPdu {
        self.send(&testing::capsule(false, false, sqe, &[]));
        self.answer(data).1
    }

    fn answer(&mut self, data: &[u8]) -> (Vec<u8>, ReceivedPdu) {
        let mut read = Vec::new();
        loop {
            let pdu = self.next_pdu();
            match pdu.pdu_type {
                t if t == PduType::C2hData as u8 => read.extend_from_slice(&pdu.data),
                t if t == PduType::CapsuleResp as u8 => return (read, pdu),
                t if t == PduType::R2t as u8 => {
                    // In pieces of at most the target's MAXH2CDATA (32 KiB).
                    let header = DataHeader::decode(&pdu.header).unwrap();
                    let start = header.offset as usize;
                    let wanted = &data[start..start + header.length as usize];
                    for (index, piece) in wanted.chunks(32 * 1024).enumerate() {
                        let offset = start + index * 32 * 1024;
                        let last = offset + piece.len() == start + wanted.len();
                        let h2c = testing::h2c_data(
                            false,
                            false,
                            header.cccid,
                            header.ttag,
                            offset as u32,
                            piece,
                            last,
                        );
                        self.send(&h2c);
                    }
                }
                other => panic!("unexpected PDU type {other:#x}: {:02x?}", pdu.header),
            }
        }
    }
}

#[test]
fn a_host_with_its_psk_connects_writes_and_reads_over_tls() {
    let plane = plane_with_tls_host("tls-io");
    let address = plane.listening[0];
    let mut admin = TlsClient::connect(address, KEY).unwrap();
    let (sqe, data) = testing::connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
    let (_, response) = admin.command(&sqe, &data);
    assert_eq!(response.status(), Status::SUCCESS);
    let cntlid = response.result() as u16;
    let enable = testing::property_set(2, 0x14, (6 << 16) | (4 << 20) | 1);
    assert_eq!(admin.command(&enable, &[]).1.status(), Status::SUCCESS);
    let mut queues = testing::sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
    testing::set_cdw(&mut queues, 10, 0x07);
    testing::set_cdw(&mut queues, 11, 0x0001_0001);
    assert_eq!(admin.command(&queues, &[]).1.status(), Status::SUCCESS);

    let mut io = TlsClient::connect(address, KEY).unwrap();
    let (sqe, data) = testing::connect_command(1, 1, 127, 0, cntlid, TEST_NQN);
    assert_eq!(io.command(&sqe, &data).1.status(), Status::SUCCESS);
    // 128 KiB to namespace 2 (4 KiB blocks), through an R2T, and back.
    let pattern: Vec<u8> = (0..128 * 1024u32).map(|i| (i * 7 % 253) as u8).collect();
    let write = testing::rw(io_opcode::WRITE, 5, 2, 8, 32, pattern.len() as u32, false);
    assert_eq!(io.write_r2t(&write, &pattern).status(), Status::SUCCESS);
    let read = testing::rw(io_opcode::READ, 6, 2, 8, 32, pattern.len() as u32, false);
    let (data, response) = io.command(&read, &[]);
    assert_eq!(response.status(), Status::SUCCESS);
    assert!(
        data == pattern,
        "read back what was written, through TLS both ways"
    );
}

#[test]
fn the_host_in_the_clear_is_refused_at_connect() {
    let plane = plane_with_tls_host("tls-clear");
    let mut plain = support::Client::connect(plane.listening[0], false, false);
    let (sqe, data) = testing::connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
    let (_, response) = plain.command(&sqe, &data);
    assert_eq!(response.status(), Status::CONNECT_INVALID_HOST);
}

#[test]
fn a_host_with_another_key_never_gets_past_the_handshake() {
    let plane = plane_with_tls_host("tls-other-key");
    let other = ConfiguredPsk::generate(&CountingRandom::default()).to_string();
    let result = TlsClient::connect(plane.listening[0], &other).map(|_| ());
    assert_eq!(
        result,
        Err(Alert::Received(51)),
        "decrypt_error: the binder failed"
    );
}

/// weft's own initiator connects in TLS streams with the host's PSK: the
/// admin queue and an I/O queue, 256 KiB written (R2T and H2CData in
/// records) and read back; with another key the handshake fails, naming
/// TLS; in the clear the host is refused.
#[test]
fn weft_s_initiator_connects_over_tls_with_the_host_s_psk() {
    use weft_initiator::{ConnectOptions, Controller, InitiatorError, TargetUrl};
    let plane = plane_with_tls_host("tls-initiator");
    let url = TargetUrl::parse(&format!("nvme-tcp://{}/{TEST_NQN}", plane.listening[0])).unwrap();
    let options = |key: Option<&str>| ConnectOptions {
        host_nqn: HOST_NQN.into(),
        tls_psk: key.map(|k| ConfiguredPsk::parse(k).unwrap()),
        ..ConnectOptions::default()
    };
    let controller = Controller::connect(&url, options(Some(KEY)), 1).unwrap();
    let mut queue = controller.open_io_queue(1).unwrap();
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    queue.write(1, 64, 512, &data).unwrap();
    assert_eq!(
        queue.read(1, 64, 512, data.len() as u32).unwrap(),
        &data[..]
    );
    let other = ConfiguredPsk::generate(&CountingRandom::default()).to_string();
    let refused = Controller::connect(&url, options(Some(&other)), 1).unwrap_err();
    assert!(matches!(refused, InitiatorError::Tls { .. }), "{refused}");
    let clear = Controller::connect(&url, options(None), 1).unwrap_err();
    assert!(
        matches!(clear, InitiatorError::HostRejected { .. }),
        "{clear}"
    );
}

/// A queue that asks for key updates (as replication links do), here after
/// every 4 records: each answered by the target, the keys of both
/// directions renewed many times, every block read back as written.
#[test]
fn weft_s_initiator_renews_both_directions_keys_and_the_target_answers() {
    use weft_initiator::{ConnectOptions, Controller, TargetUrl};
    let plane = plane_with_tls_host("tls-key-update");
    let url = TargetUrl::parse(&format!("nvme-tcp://{}/{TEST_NQN}", plane.listening[0])).unwrap();
    let options = ConnectOptions {
        host_nqn: HOST_NQN.into(),
        tls_psk: Some(ConfiguredPsk::parse(KEY).unwrap()),
        tls_key_update_after_records: Some(4),
        ..ConnectOptions::default()
    };
    let controller = Controller::connect(&url, options, 1).unwrap();
    let mut queue = controller.open_io_queue(1).unwrap();
    for round in 0..40u64 {
        let data: Vec<u8> = (0..8192).map(|i| (i as u64 * 7 + round) as u8).collect();
        queue.write(1, round * 16, 512, &data).unwrap();
        assert_eq!(
            queue.read(1, round * 16, 512, data.len() as u32).unwrap(),
            &data[..],
            "round {round}"
        );
    }
    let (_, _, _, tls) = queue.into_parts();
    let (asked, taken) = tls.expect("a TLS queue").key_updates();
    assert!(asked >= 10, "{asked} key updates asked");
    assert_eq!(taken, asked, "each answered");
}

/// `nvme discover --tls`: the discovery subsystem over TLS, with the key any
/// subsystem gave the host; its log says TLS is required for the volume.
#[test]
fn the_host_discovers_over_tls_and_is_told_tls_is_required() {
    let plane = plane_with_tls_host("tls-discovery");
    let discovery_nqn = weft_proto::target::DISCOVERY_NQN;
    let mut discovery = TlsClient::connect_to(plane.listening[0], KEY, discovery_nqn).unwrap();
    let (sqe, data) = testing::connect_command(1, 0, 31, 0, 0xFFFF, discovery_nqn);
    assert_eq!(discovery.command(&sqe, &data).1.status(), Status::SUCCESS);
    let enable = testing::property_set(2, 0x14, (6 << 16) | (4 << 20) | 1);
    assert_eq!(discovery.command(&enable, &[]).1.status(), Status::SUCCESS);
    let (page, response) = discovery.command(&testing::get_log_page(3, 0x70, 4096, 0), &[]);
    assert_eq!(response.status(), Status::SUCCESS);
    let entry = &page[1024..2048];
    assert_eq!(&entry[256..256 + TEST_NQN.len()], TEST_NQN.as_bytes());
    assert_eq!(
        (entry[3], entry[768]),
        (0x05, 2),
        "TREQ required, SECTYPE TLS 1.3"
    );
}
