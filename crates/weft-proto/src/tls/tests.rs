//! The handshake in memory: weft's client against weft's server, each
//! given what the other sends (byte by byte too), and what a wrong key, an
//! unknown identity or a changed byte does. The same server against real
//! TLS stacks (OpenSSL, GnuTLS with the Linux host's settings) is in
//! crates/weft-proto/tests/tls_peers.rs.

use super::psk::{ConfiguredPsk, Identity};
use super::*;
use crate::testing::CountingRandom;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const SUBSYSTEM: &str = "nqn.2026-11.io.weft:vol:db1";
const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

/// Knows one host's configured key.
struct OneHost(ConfiguredPsk);

impl PskStore for OneHost {
    fn tls_psks(&self, identity: &[u8]) -> Vec<Vec<u8>> {
        match Identity::parse(identity) {
            Some(identity) if identity.host_nqn == HOST => identity.tls_psks(&self.0),
            _ => Vec::new(),
        }
    }
}

fn client_with(key: &str, version: u8) -> ClientHandshake {
    let psk = ConfiguredPsk::parse(key).unwrap();
    let identity = Identity::of(&psk, version, HOST, SUBSYSTEM);
    let tls_psk = identity.tls_psks(&psk).remove(0);
    ClientHandshake::new(
        identity.to_string().as_bytes(),
        &tls_psk,
        &CountingRandom::default(),
    )
}

fn server() -> (ServerHandshake, OneHost) {
    let store = OneHost(ConfiguredPsk::parse(KEY).unwrap());
    (ServerHandshake::new(&CountingRandom::default()), store)
}

/// Runs both sides to the end, `chunk` bytes at a time.
fn run(
    client: &mut ClientHandshake,
    server: &mut ServerHandshake,
    store: &OneHost,
    chunk: usize,
) -> (Result<(), Alert>, Result<(), Alert>) {
    let (mut client_result, mut server_result) = (Ok(()), Ok(()));
    for _ in 0..10 {
        let to_server = client.take_output();
        for piece in to_server.chunks(chunk) {
            server_result = server_result.and_then(|()| server.handle_input(piece, store));
        }
        let to_client = server.take_output();
        for piece in to_client.chunks(chunk) {
            client_result = client_result.and_then(|()| client.handle_input(piece));
        }
        if to_server.is_empty() && to_client.is_empty() {
            break;
        }
    }
    (client_result, server_result)
}

#[test]
fn a_client_and_a_server_with_one_key_agree_and_carry_data_both_ways() {
    for (version, chunk) in [(0, usize::MAX), (1, usize::MAX), (0, 1), (1, 7)] {
        let mut client = client_with(KEY, version);
        let (mut server, store) = server();
        let (c, s) = run(&mut client, &mut server, &store, chunk);
        assert_eq!((c, s), (Ok(()), Ok(())), "version {version}, chunk {chunk}");
        let mut client = client.established().expect("client established");
        let mut server = server.established().expect("server established");
        assert_eq!(client.suite, CipherSuite::Aes128GcmSha256);
        assert_eq!(server.identity, client.identity);
        assert!(client.leftover.is_empty() && server.leftover.is_empty());
        for (from, to) in [
            (&mut client.send, &mut server.receive),
            (&mut server.send, &mut client.receive),
        ] {
            let mut wire = Vec::new();
            from.seal_to(APPLICATION_DATA, b"ICReq", &mut wire).unwrap();
            let (kind, range) = to.open(&mut wire).unwrap();
            assert_eq!((kind, &wire[range]), (APPLICATION_DATA, &b"ICReq"[..]));
        }
    }
}

#[test]
fn another_key_fails_the_binder_and_the_host_hears_decrypt_error() {
    let other = ConfiguredPsk::generate(&CountingRandom::default()).to_string();
    assert_ne!(other, KEY);
    let mut client = client_with(&other, 0);
    let (mut server, store) = server();
    let (c, s) = run(&mut client, &mut server, &store, usize::MAX);
    assert_eq!(s, Err(Alert::DecryptError));
    assert_eq!(c, Err(Alert::Received(51)));
    assert!(server.established().is_none() && client.established().is_none());
}

#[test]
fn an_unknown_host_is_refused_before_any_key_is_tried() {
    let psk = ConfiguredPsk::parse(KEY).unwrap();
    let identity = Identity::of(
        &psk,
        0,
        "nqn.2014-08.org.nvmexpress:uuid:stranger",
        SUBSYSTEM,
    );
    let tls_psk = identity.tls_psks(&psk).remove(0);
    let mut client = ClientHandshake::new(
        identity.to_string().as_bytes(),
        &tls_psk,
        &CountingRandom::default(),
    );
    let (mut server, store) = server();
    let (c, s) = run(&mut client, &mut server, &store, usize::MAX);
    assert_eq!(s, Err(Alert::UnknownPskIdentity));
    assert_eq!(c, Err(Alert::Received(115)));
}

#[test]
fn a_changed_byte_anywhere_in_the_clients_flight_fails_the_handshake() {
    let mut reference = client_with(KEY, 0);
    let hello = reference.take_output();
    for at in 0..hello.len() {
        let mut client = client_with(KEY, 0);
        let mut changed = client.take_output();
        assert_eq!(changed, hello, "deterministic");
        changed[at] ^= 0x01;
        let (mut server, store) = server();
        let result = server.handle_input(&changed, &store);
        assert!(server.established().is_none(), "byte {at}");
        // Past the record's and the message's lengths (a longer one only
        // waits for more; the record's version is ignored, RFC 8446
        // section 5.1), every change fails: the binder covers the fields
        // that still parse.
        if at >= 9 {
            assert!(result.is_err(), "byte {at} went unnoticed");
        }
    }
}

#[test]
fn a_changed_byte_in_the_servers_flight_fails_the_client() {
    let mut client = client_with(KEY, 0);
    let (mut server, store) = server();
    server.handle_input(&client.take_output(), &store).unwrap();
    let flight = server.take_output();
    for at in [10, 60, flight.len() - 20, flight.len() - 1] {
        let mut client = client_with(KEY, 0);
        let (mut server, store) = crate::tls::tests::server();
        server.handle_input(&client.take_output(), &store).unwrap();
        let mut changed = server.take_output();
        assert_eq!(changed, flight, "deterministic");
        changed[at] ^= 0x01;
        assert!(client.handle_input(&changed).is_err(), "byte {at}");
        assert!(client.established().is_none());
    }
}

#[test]
fn a_flood_before_the_hello_is_answered_is_refused() {
    let (mut server, store) = server();
    // A record header announcing the largest record, then more than two records' worth.
    let flood = vec![0x16u8; 3 * MAX_RECORD];
    assert!(server.handle_input(&flood, &store).is_err());
}

#[test]
fn a_change_cipher_spec_is_dropped_only_in_the_clear_after_the_hello() {
    // Before the ClientHello: unexpected.
    let (mut early, store) = server();
    let ccs = [20, 3, 3, 0, 1, 1];
    assert_eq!(
        early.handle_input(&ccs, &store),
        Err(Alert::UnexpectedMessage)
    );
    // After it, in the clear (what a client in compatibility mode sends): dropped.
    let mut client = client_with(KEY, 0);
    let (mut later, store) = server();
    let (c, s) = run(&mut client, &mut later, &store, usize::MAX);
    assert_eq!(
        (c, s),
        (Ok(()), Ok(())),
        "the client sent one before its Finished"
    );
}

#[test]
fn a_host_that_fails_after_the_servers_finished_hears_the_alert_under_its_application_keys() {
    let mut client = client_with(KEY, 0);
    let (mut server, store) = server();
    server.handle_input(&client.take_output(), &store).unwrap();
    client.handle_input(&server.take_output()).unwrap();
    let mut client = client.established().unwrap();
    // A record the server cannot open in place of the client's Finished.
    let garbage = [
        23, 3, 3, 0, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
    ];
    assert_eq!(
        server.handle_input(&garbage, &store),
        Err(Alert::BadRecordMac)
    );
    let mut alert = server.take_output();
    let (kind, range) = client
        .receive
        .open(&mut alert)
        .expect("sealed with the server's application keys");
    assert_eq!(
        (kind, &alert[range]),
        (21, &[2, 20][..]),
        "fatal bad_record_mac"
    );
}
