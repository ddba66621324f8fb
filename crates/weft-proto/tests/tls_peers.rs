//! weft's TLS 1.3 PSK server (`weft_proto::tls`) against real TLS stacks as
//! clients, over loopback TCP: OpenSSL's `s_client` (external PSK, TLS 1.3)
//! and GnuTLS's `gnutls-cli` with the priority string the Linux host's
//! tlshd uses for NVMe/TCP (ktls-utils 1.0, `tlshd_gnutls_priority_init`),
//! each with a PSK and identity derived as nvme-cli 2.13 derives them. Each
//! peer sends a line, which the server reads back, and receives one.
//! The packages come from harness/deps.sh (openssl, gnutls-bin).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;
use weft_proto::auth::SecureRandom;
use weft_proto::tls::psk::{ConfiguredPsk, Identity};
use weft_proto::tls::{
    record_len, Alert, KeyUpdates, PskStore, ServerHandshake, APPLICATION_DATA, KEY_UPDATE_RECORD,
};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000aaaa";
const SUBSYSTEM: &str = "nqn.2026-11.io.weft:vol:db1";
const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

#[derive(Debug)]
struct Urandom;

impl SecureRandom for Urandom {
    fn fill(&self, dest: &mut [u8]) {
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(dest)
            .unwrap();
    }
}

struct Host(ConfiguredPsk);

impl PskStore for Host {
    fn tls_psks(&self, identity: &[u8]) -> Vec<Vec<u8>> {
        Identity::parse(identity).map_or(Vec::new(), |identity| identity.tls_psks(&self.0))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The identity and TLS PSK (hex) a host with `KEY` uses, version 0 as
/// nvme-cli 2.13 inserts it by default.
fn host_credentials() -> (String, String) {
    let psk = ConfiguredPsk::parse(KEY).unwrap();
    let identity = Identity::of(&psk, 0, HOST, SUBSYSTEM);
    let tls_psk = identity.tls_psks(&psk).remove(0);
    (identity.to_string(), hex(&tls_psk))
}

/// The line a server read, and the KeyUpdates it sent and received.
type Served = Result<(String, (u64, u64)), Alert>;

/// Serves one connection: the handshake, then reads the peer's line and
/// answers with one (a target's key updates: it answers, never asks).
fn serve_one(listener: &TcpListener) -> Served {
    let (mut stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let store = Host(ConfiguredPsk::parse(KEY).unwrap());
    let mut handshake = ServerHandshake::new(&Urandom);
    let mut buffer = vec![0u8; 64 * 1024];
    let mut established = loop {
        let read = stream.read(&mut buffer).unwrap();
        assert!(read > 0, "the peer closed during the handshake");
        let result = handshake.handle_input(&buffer[..read], &store);
        stream.write_all(&handshake.take_output()).unwrap();
        result?;
        if let Some(established) = handshake.established() {
            break established;
        }
    };
    let mut received = std::mem::take(&mut established.leftover);
    let mut updates = KeyUpdates::answering();
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        while let Some(len) = record_len(&received)?.filter(|len| *len <= received.len()) {
            let mut record: Vec<u8> = received.drain(..len).collect();
            let (kind, range) = established.receive.open(&mut record)?;
            match kind {
                APPLICATION_DATA => line.extend_from_slice(&record[range]),
                HANDSHAKE => updates.received(&record[range], &mut established.receive)?,
                _ => {}
            }
        }
        if line.ends_with(b"\n") {
            break;
        }
        let read = stream.read(&mut buffer).unwrap();
        assert!(read > 0, "the peer closed before its line");
        received.extend_from_slice(&buffer[..read]);
    }
    let mut answer = vec![0u8; KEY_UPDATE_RECORD];
    let update = updates.send_due(&mut established.send, &established.receive, &mut answer)?;
    answer.truncate(update);
    established
        .send
        .seal_to(APPLICATION_DATA, b"hello from weft\n", &mut answer)?;
    stream.write_all(&answer).unwrap();
    Ok((String::from_utf8(line).unwrap(), updates.counts()))
}

/// A TLS record's content type for handshake messages.
const HANDSHAKE: u8 = 22;

/// Runs `command` as the client of a server on a fresh port (its `{port}`
/// replaced), feeding it `input`, each piece a read of its own (a
/// client's command is a read's first byte); returns what the server read
/// and what the client printed.
fn against(command: &[&str], input: &[&str]) -> (Served, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let args: Vec<String> = command.iter().map(|a| a.replace("{port}", &port)).collect();
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} (harness/deps.sh installs it): {e}", args[0]));
    let mut stdin = child.stdin.take().unwrap();
    let input: Vec<String> = input.iter().map(|piece| piece.to_string()).collect();
    // The line goes once the client is connected; the client waits for more input.
    let writer = std::thread::spawn(move || {
        for piece in input {
            std::thread::sleep(Duration::from_millis(500));
            let _ = stdin.write_all(piece.as_bytes());
        }
        std::thread::sleep(Duration::from_secs(2));
        drop(stdin);
    });
    let served = serve_one(&listener);
    std::thread::sleep(Duration::from_millis(300));
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (served, printed)
}

/// OpenSSL's `s_client` with an external PSK over TLS 1.3 (`quiet`: no
/// session details, and no commands read from its input).
fn s_client<'a>(identity: &'a str, psk: &'a str, quiet: bool) -> Vec<&'a str> {
    let mut args = vec![
        "openssl",
        "s_client",
        "-connect",
        "127.0.0.1:{port}",
        "-tls1_3",
        "-psk_identity",
        identity,
        "-psk",
        psk,
        "-ciphersuites",
        "TLS_AES_128_GCM_SHA256",
    ];
    if quiet {
        args.push("-quiet");
    }
    args
}

#[test]
fn openssl_s_client_connects_with_the_hosts_psk() {
    let (identity, psk) = host_credentials();
    let (served, printed) = against(&s_client(&identity, &psk, true), &["hello from openssl\n"]);
    assert_eq!(
        served,
        Ok(("hello from openssl\n".to_string(), (0, 0))),
        "{printed}"
    );
    assert!(printed.contains("hello from weft"), "{printed}");
}

#[test]
fn openssl_s_client_asks_for_a_key_update_and_weft_answers() {
    // s_client's "K" command (a line of its own, in its interactive mode:
    // no -quiet) sends KeyUpdate with update_requested: weft opens what
    // follows under the client's next key and sends its own KeyUpdate
    // before its line, which the client opens under weft's next key.
    let (identity, psk) = host_credentials();
    let (served, printed) = against(
        &s_client(&identity, &psk, false),
        &["K\n", "hello after a key update\n"],
    );
    assert_eq!(
        served,
        Ok(("hello after a key update\n".to_string(), (1, 1))),
        "{printed}"
    );
    assert!(printed.contains("KEYUPDATE"), "{printed}");
    assert!(printed.contains("hello from weft"), "{printed}");
}

#[test]
fn gnutls_with_the_linux_hosts_tlshd_settings_connects() {
    let (identity, psk) = host_credentials();
    // tlshd's priority string for a 32-byte PSK (ktls-utils 1.0).
    let priority = "SECURE256:+SECURE128:-COMP-ALL:-VERS-ALL:+VERS-TLS1.3:%NO_TICKETS:\
                    -CIPHER-ALL:+AES-128-GCM:+AES-128-CCM:+DHE-PSK:+ECDHE-PSK";
    let (served, printed) = against(
        &[
            "gnutls-cli",
            "--priority",
            priority,
            "--pskusername",
            &identity,
            "--pskkey",
            &psk,
            "--port",
            "{port}",
            "127.0.0.1",
        ],
        &["hello from gnutls\n"],
    );
    assert_eq!(
        served,
        Ok(("hello from gnutls\n".to_string(), (0, 0))),
        "{printed}"
    );
    assert!(printed.contains("hello from weft"), "{printed}");
}

#[test]
fn openssl_with_another_key_is_refused() {
    let (identity, _) = host_credentials();
    let (served, printed) = against(&s_client(&identity, &"11".repeat(32), true), &["hello\n"]);
    assert_eq!(served, Err(Alert::DecryptError), "{printed}");
    assert!(printed.contains("decrypt error"), "{printed}");
}
