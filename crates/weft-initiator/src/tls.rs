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
//! What it does not do: key updates (the Linux host and weft's target send
//! none).

use crate::OsRandom;
use std::io::{Read, Write};
use std::net::TcpStream;
use weft_proto::tls::psk::{ConfiguredPsk, Identity};
use weft_proto::tls::{
    record_len, Alert, ClientHandshake, Established, APPLICATION_DATA, HEADER_LEN, MAX_PLAINTEXT,
    OVERHEAD,
};

/// What a queue connects over TLS with: the host's configured PSK and the
/// two NQNs its identity names.
#[derive(Debug, Clone)]
pub(crate) struct TlsIdentity<'a> {
    pub(crate) psk: &'a ConfiguredPsk,
    pub(crate) host_nqn: &'a str,
    pub(crate) subsystem_nqn: &'a str,
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
    /// Received and not opened yet (a record's start).
    ciphertext: Vec<u8>,
    /// What the last seal produced.
    sealed: Vec<u8>,
}

impl TlsStream {
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
                return Ok(TlsStream {
                    ciphertext: established.leftover.clone(),
                    established,
                    sealed: Vec::new(),
                });
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

    /// The bytes `plaintext_len` bytes of plaintext take once sealed.
    pub fn sealed_len(plaintext_len: usize) -> usize {
        plaintext_len + plaintext_len.div_ceil(MAX_PLAINTEXT) * (HEADER_LEN + OVERHEAD)
    }

    /// Seals `plaintext` into records at the front of `out` (which holds
    /// [`TlsStream::sealed_len`] bytes at least); returns their length.
    pub fn seal_into(&mut self, plaintext: &[u8], out: &mut [u8]) -> Result<usize, Alert> {
        let mut at = 0;
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
        self.established
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
            if content_type != APPLICATION_DATA {
                // An alert (the target ending the stream) or a handshake
                // message (a key update): neither is carried on.
                return Err(Alert::UnexpectedMessage);
            }
            deliver(&record[range]);
            start += len;
        }
        self.ciphertext.drain(..start);
        Ok(())
    }
}
