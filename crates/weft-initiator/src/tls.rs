//! A queue in a TLS 1.3 stream (NVMe/TCP TLS with a configured PSK, TP
//! 8011, as the Linux host connects with tlshd): the handshake over the
//! queue's blocking socket before ICReq (weft_proto's sans-IO client, with
//! a version 0 identity naming the host and the subsystem), then every PDU
//! sealed into records on the way out and opened on the way in.
//!
//! A queue taken apart (`Queue::into_parts`) hands its stream's record
//! state ([`TlsStream`]) to whoever drives the socket next (a replica link
//! on its replicator's ring).
//!
//! Key updates: when its options say so (links between weft nodes), the
//! stream asks the target to update both directions' keys before either
//! carried too many records under one (RFC 8446 section 5.5); a KeyUpdate
//! the target sends is taken, and answered when it asks.

use crate::OsRandom;
use std::io::{Read, Write};
use std::net::TcpStream;
use weft_proto::tls::psk::{ConfiguredPsk, Identity};
use weft_proto::tls::{
    record_len, Alert, ClientHandshake, Established, KeyUpdates, APPLICATION_DATA, HEADER_LEN,
    KEY_UPDATE_RECORD, MAX_PLAINTEXT, OVERHEAD,
};

/// A TLS record's content type for alerts (RFC 8446 section 5.1).
const ALERT: u8 = 21;
/// A TLS record's content type for handshake messages.
const HANDSHAKE: u8 = 22;

/// What a queue connects over TLS with: the host's configured PSK and the
/// two NQNs its identity names.
#[derive(Debug, Clone)]
pub(crate) struct TlsIdentity<'a> {
    pub(crate) psk: &'a ConfiguredPsk,
    pub(crate) host_nqn: &'a str,
    pub(crate) subsystem_nqn: &'a str,
    /// Ask for key updates after this many records under one key.
    pub(crate) key_update_after_records: Option<u64>,
}

/// Why a TLS stream could not be set up or carried on.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The handshake or a record failed.
    #[error("{0}")]
    Alert(#[from] Alert),
}

/// An established stream's record state.
#[derive(Debug)]
pub struct TlsStream {
    established: Established,
    /// Key updates asked, answered and taken.
    updates: KeyUpdates,
    /// Received and not opened yet (a record's start).
    ciphertext: Vec<u8>,
    /// What the last seal produced.
    sealed: Vec<u8>,
}

impl TlsStream {
    fn new(established: Established, key_update_after_records: Option<u64>) -> TlsStream {
        TlsStream {
            updates: KeyUpdates::asking_after(key_update_after_records),
            ciphertext: established.leftover.clone(),
            established,
            sealed: Vec::new(),
        }
    }

    /// Runs the handshake on `stream` (its timeouts bound each step).
    pub(crate) fn handshake(
        stream: &mut TcpStream,
        identity: &TlsIdentity,
    ) -> Result<TlsStream, TlsError> {
        let offered = Identity::of(identity.psk, 0, identity.host_nqn, identity.subsystem_nqn);
        // The libnvme form of the derivation: what the Linux host and weft's target use.
        let psk = offered.tls_psks(identity.psk).remove(0);
        let mut handshake = ClientHandshake::new(offered.to_string().as_bytes(), &psk, &OsRandom);
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            stream.write_all(&handshake.take_output())?;
            if let Some(established) = handshake.established() {
                return Ok(TlsStream::new(
                    established,
                    identity.key_update_after_records,
                ));
            }
            let read = stream.read(&mut buffer)?;
            if read == 0 {
                return Err(TlsError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            let result = handshake.handle_input(&buffer[..read]);
            if let Err(alert) = result {
                // Tell the target why, as far as it listens.
                let _ = stream.write_all(&handshake.take_output());
                return Err(alert.into());
            }
        }
    }

    /// The most bytes `plaintext_len` bytes of plaintext take once sealed
    /// (a KeyUpdate may go first).
    pub fn sealed_len(plaintext_len: usize) -> usize {
        KEY_UPDATE_RECORD
            + plaintext_len
            + plaintext_len.div_ceil(MAX_PLAINTEXT) * (HEADER_LEN + OVERHEAD)
    }

    /// The KeyUpdates this stream sent and received.
    pub fn key_updates(&self) -> (u64, u64) {
        self.updates.counts()
    }

    /// Seals `plaintext` into records at the front of `out` (which holds
    /// [`TlsStream::sealed_len`] bytes at least), after the KeyUpdate due
    /// if one is; returns their length.
    pub fn seal_into(&mut self, plaintext: &[u8], out: &mut [u8]) -> Result<usize, Alert> {
        let established = &mut self.established;
        let mut at = self
            .updates
            .send_due(&mut established.send, &established.receive, out)?;
        for piece in plaintext.chunks(MAX_PLAINTEXT) {
            at += self
                .established
                .send
                .seal(APPLICATION_DATA, piece, &mut out[at..])?;
        }
        Ok(at)
    }

    /// Seals `plaintext` into records; returns them.
    pub(crate) fn seal(&mut self, plaintext: &[u8]) -> Result<&[u8], Alert> {
        self.sealed.clear();
        self.sealed.resize(KEY_UPDATE_RECORD, 0);
        let established = &mut self.established;
        let update = self.updates.send_due(
            &mut established.send,
            &established.receive,
            &mut self.sealed,
        )?;
        self.sealed.truncate(update);
        established
            .send
            .seal_to(APPLICATION_DATA, plaintext, &mut self.sealed)?;
        Ok(&self.sealed)
    }

    /// Takes `received` bytes and hands the plaintext of every complete
    /// record to `deliver`, in order.
    pub fn open(&mut self, received: &[u8], mut deliver: impl FnMut(&[u8])) -> Result<(), Alert> {
        self.ciphertext.extend_from_slice(received);
        let mut start = 0;
        while let Some(len) = record_len(&self.ciphertext[start..])? {
            if start + len > self.ciphertext.len() {
                break;
            }
            let record = &mut self.ciphertext[start..start + len];
            let (content_type, range) = self.established.receive.open(record)?;
            match content_type {
                APPLICATION_DATA => deliver(&record[range]),
                HANDSHAKE => self
                    .updates
                    .received(&record[range], &mut self.established.receive)?,
                ALERT if range.len() == 2 => return Err(Alert::Received(record[range.start + 1])),
                _ => return Err(Alert::UnexpectedMessage),
            }
            start += len;
        }
        self.ciphertext.drain(..start);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::tls::{PskStore, ServerHandshake};

    struct Psk;

    impl PskStore for Psk {
        fn tls_psks(&self, _identity: &[u8]) -> Vec<Vec<u8>> {
            vec![vec![7; 32]]
        }
    }

    /// A stream asking after `records`, and the target's end of it.
    fn pair(records: u64) -> (TlsStream, Established) {
        let mut client = ClientHandshake::new(b"NVMe0R01 nqn.h nqn.s", &[7; 32], &OsRandom);
        let mut server = ServerHandshake::new(&OsRandom);
        for _ in 0..3 {
            server.handle_input(&client.take_output(), &Psk).unwrap();
            client.handle_input(&server.take_output()).unwrap();
        }
        let client = TlsStream::new(client.established().unwrap(), Some(records));
        (client, server.established().unwrap())
    }

    /// What the ring of a replication link does: each send sealed into a
    /// buffer of `sealed_len` (a KeyUpdate fits before the data), each
    /// receive opened; the target's end answers as weft's target does.
    #[test]
    fn sealed_sends_ask_for_key_updates_within_sealed_len_and_take_the_answers() {
        let (mut client, mut target) = pair(3);
        let mut target_updates = KeyUpdates::answering();
        for round in 0..20u32 {
            let data: Vec<u8> = (0..20_000 + round).map(|i| i as u8).collect();
            let mut out = vec![0u8; TlsStream::sealed_len(data.len())];
            let len = client.seal_into(&data, &mut out).unwrap();
            let mut received = Vec::new();
            let mut at = 0;
            while at < len {
                let record_len = record_len(&out[at..]).unwrap().unwrap();
                let record = &mut out[at..at + record_len];
                let (kind, range) = target.receive.open(record).unwrap();
                match kind {
                    APPLICATION_DATA => received.extend_from_slice(&record[range]),
                    _ => target_updates
                        .received(&record[range], &mut target.receive)
                        .unwrap(),
                }
                at += record_len;
            }
            assert_eq!(received, data, "round {round}");
            let mut answer = vec![0u8; KEY_UPDATE_RECORD];
            let update = target_updates
                .send_due(&mut target.send, &target.receive, &mut answer)
                .unwrap();
            answer.truncate(update);
            target
                .send
                .seal_to(APPLICATION_DATA, &round.to_be_bytes(), &mut answer)
                .unwrap();
            let mut delivered = Vec::new();
            client
                .open(&answer, |plaintext| delivered.extend_from_slice(plaintext))
                .unwrap();
            assert_eq!(delivered, round.to_be_bytes());
        }
        let (asked, taken) = client.key_updates();
        assert!(asked >= 8, "every other round: {asked}");
        assert_eq!((taken, target_updates.counts()), (asked, (asked, asked)));
    }
}
