//! Key updates of an established stream (RFC 8446 sections 4.6.3 and
//! 7.2): a side sends a KeyUpdate under its current keys and seals what
//! follows under the next ones; the peer opens what follows under the
//! next ones too, and answers with a KeyUpdate of its own before its next
//! record when asked to ("update_requested").
//!
//! Why: RFC 8446 section 5.5 advises at most 2^24.5 full-size records
//! under one AES-GCM key. A stream that lives long and carries much (a
//! replication link between two weft nodes) asks for an update of both
//! directions before that; a target never asks on its own (the Linux host
//! ends a queue that receives a KeyUpdate) and answers when asked.
//!
//! What this does not do: post-handshake messages other than KeyUpdate
//! (a NewSessionTicket is never sent by these peers and ends the stream),
//! or sockets and buffers (the caller writes the record it is given).

use super::keys::{RecordKeys, HEADER_LEN, OVERHEAD};
use super::Alert;

/// The handshake message type of a KeyUpdate (RFC 8446 section 4).
const KEY_UPDATE: u8 = 24;
/// Its handshake header and its one byte of body.
const MESSAGE_LEN: usize = 4 + 1;
/// request_update's values (RFC 8446 section 4.6.3).
const NOT_REQUESTED: u8 = 0;
const REQUESTED: u8 = 1;
/// The record content type of handshake messages.
const HANDSHAKE: u8 = super::codec::content::HANDSHAKE;

/// The bytes the record of one KeyUpdate takes.
pub const KEY_UPDATE_RECORD: usize = HEADER_LEN + MESSAGE_LEN + OVERHEAD;

/// When a stream that asks for updates asks: after this many records under
/// one key in either direction, below RFC 8446 section 5.5's 2^24.5 for
/// AES-GCM by the records still in flight when the peer reads the request.
pub const ASK_AFTER_RECORDS: u64 = 1 << 24;

/// One stream's key update state.
#[derive(Debug, Clone)]
pub struct KeyUpdates {
    /// Ask the peer to update once either direction carried this many
    /// records under one key; `None`: never ask, only answer.
    ask_after_records: Option<u64>,
    /// The peer asked: a KeyUpdate goes before this side's next record.
    owed: bool,
    /// This side asked and the peer's KeyUpdate has not arrived yet.
    asked: bool,
    /// KeyUpdates sent and received.
    sent: u64,
    received: u64,
}

impl KeyUpdates {
    /// A side that only answers (a target: its hosts may not take one it
    /// was not asked for).
    pub fn answering() -> KeyUpdates {
        KeyUpdates::asking_after(None)
    }

    /// A side that asks for an update of both directions once either
    /// carried `records` under one key (`None`: only answers).
    pub fn asking_after(records: Option<u64>) -> KeyUpdates {
        KeyUpdates {
            ask_after_records: records,
            owed: false,
            asked: false,
            sent: 0,
            received: 0,
        }
    }

    /// The KeyUpdates this side sent and received.
    pub fn counts(&self) -> (u64, u64) {
        (self.sent, self.received)
    }

    /// Takes `message`, the plaintext of a handshake record the peer sent:
    /// one KeyUpdate (anything else ends the stream), after which `receive`
    /// opens under the peer's next keys.
    pub fn received(&mut self, message: &[u8], receive: &mut RecordKeys) -> Result<(), Alert> {
        let [KEY_UPDATE, 0, 0, 1, request] = *message else {
            return Err(Alert::UnexpectedMessage);
        };
        // RFC 8446 section 4.6.3: any other value MUST end the connection
        // with illegal_parameter.
        match request {
            NOT_REQUESTED => {}
            REQUESTED => self.owed = true,
            _ => return Err(Alert::IllegalParameter),
        }
        receive.update();
        self.asked = false;
        self.received += 1;
        Ok(())
    }

    /// Writes the KeyUpdate this side sends before its next record, if
    /// one is due, to the front of `out` (which holds [`KEY_UPDATE_RECORD`]
    /// bytes), under `send`'s current keys; `send` then seals under the
    /// next ones. Returns the bytes written (0: none due).
    pub fn send_due(
        &mut self,
        send: &mut RecordKeys,
        receive: &RecordKeys,
        out: &mut [u8],
    ) -> Result<usize, Alert> {
        let ask = !self.asked
            && self
                .ask_after_records
                .is_some_and(|after| send.records().max(receive.records()) >= after);
        if !self.owed && !ask {
            return Ok(0);
        }
        // An answer updates this direction and the peer's KeyUpdate did the
        // other: asking again would only ask for another answer.
        let request = if self.owed { NOT_REQUESTED } else { REQUESTED };
        let len = send.seal(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, request], out)?;
        send.update();
        self.asked = request == REQUESTED;
        self.owed = false;
        self.sent += 1;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::keys::{record_len, CipherSuite};
    use crate::tls::APPLICATION_DATA;

    /// Two sides of one stream: (client's send, server's receive) share a
    /// secret, and (server's send, client's receive) another.
    fn pair(suite: CipherSuite) -> [RecordKeys; 4] {
        let (c, s) = ([1u8; 32], [2u8; 32]);
        [
            RecordKeys::new(suite, &c),
            RecordKeys::new(suite, &c),
            RecordKeys::new(suite, &s),
            RecordKeys::new(suite, &s),
        ]
    }

    /// Seals `data` after whatever update is due; the wire bytes.
    fn send(
        updates: &mut KeyUpdates,
        send: &mut RecordKeys,
        receive: &RecordKeys,
        data: &[u8],
    ) -> Vec<u8> {
        let mut out = vec![0u8; KEY_UPDATE_RECORD];
        let len = updates.send_due(send, receive, &mut out).unwrap();
        out.truncate(len);
        send.seal_to(APPLICATION_DATA, data, &mut out).unwrap();
        out
    }

    /// Opens every record of `wire`; the application data.
    fn receive(
        updates: &mut KeyUpdates,
        receive: &mut RecordKeys,
        mut wire: Vec<u8>,
    ) -> Result<Vec<u8>, Alert> {
        let mut data = Vec::new();
        let mut at = 0;
        while let Some(len) = record_len(&wire[at..])? {
            let record = &mut wire[at..at + len];
            let (kind, range) = receive.open(record)?;
            match kind {
                APPLICATION_DATA => data.extend_from_slice(&record[range]),
                _ => updates.received(&record[range], receive)?,
            }
            at += len;
        }
        Ok(data)
    }

    #[test]
    fn an_asking_side_renews_both_directions_and_data_flows_under_each_key() {
        for suite in [
            CipherSuite::Aes128GcmSha256,
            CipherSuite::Chacha20Poly1305Sha256,
        ] {
            let [mut c_send, mut s_receive, mut s_send, mut c_receive] = pair(suite);
            let mut client = KeyUpdates::asking_after(Some(3));
            let mut server = KeyUpdates::answering();
            for round in 0..10u8 {
                let wire = send(&mut client, &mut c_send, &c_receive, &[round; 100]);
                let got = receive(&mut server, &mut s_receive, wire).unwrap();
                assert_eq!(got, [round; 100]);
                let wire = send(&mut server, &mut s_send, &s_receive, &[!round; 50]);
                let got = receive(&mut client, &mut c_receive, wire).unwrap();
                assert_eq!(got, [!round; 50]);
                // Never more than the limit and the one in flight under a key.
                for keys in [&c_send, &s_receive, &s_send, &c_receive] {
                    assert!(keys.records() <= 4, "round {round}: {keys:?}");
                }
            }
            // Every third round trip: the client asked, the server answered.
            assert_eq!(client.counts(), (3, 3));
            assert_eq!(server.counts(), (3, 3));
        }
    }

    #[test]
    fn an_answering_side_never_asks_and_a_request_is_answered_once() {
        let [mut c_send, mut s_receive, mut s_send, c_receive] = pair(CipherSuite::Aes128GcmSha256);
        let mut server = KeyUpdates::answering();
        for _ in 0..100 {
            let mut out = vec![0u8; KEY_UPDATE_RECORD];
            assert_eq!(server.send_due(&mut s_send, &s_receive, &mut out), Ok(0));
            s_send.seal_to(APPLICATION_DATA, b"x", &mut out).unwrap();
        }
        let mut client = KeyUpdates::asking_after(Some(0));
        let wire = send(&mut client, &mut c_send, &c_receive, b"ask");
        assert_eq!(wire.len(), KEY_UPDATE_RECORD + HEADER_LEN + 3 + OVERHEAD);
        receive(&mut server, &mut s_receive, wire).unwrap();
        let mut out = vec![0u8; KEY_UPDATE_RECORD];
        assert_eq!(
            server.send_due(&mut s_send, &s_receive, &mut out),
            Ok(KEY_UPDATE_RECORD)
        );
        assert_eq!(server.send_due(&mut s_send, &s_receive, &mut out), Ok(0));
        // Asked and not answered yet: the client does not ask again.
        let mut out = vec![0u8; KEY_UPDATE_RECORD];
        assert_eq!(client.send_due(&mut c_send, &c_receive, &mut out), Ok(0));
    }

    #[test]
    fn a_malformed_or_foreign_post_handshake_message_ends_the_stream() {
        let [_, mut receive, ..] = pair(CipherSuite::Aes128GcmSha256);
        let mut updates = KeyUpdates::answering();
        for (message, alert) in [
            (&[24u8, 0, 0, 1, 2][..], Alert::IllegalParameter),
            (&[24, 0, 0, 2, 0, 0], Alert::UnexpectedMessage),
            (&[4, 0, 0, 1, 0], Alert::UnexpectedMessage),
            (&[24, 0, 0, 1], Alert::UnexpectedMessage),
            (&[], Alert::UnexpectedMessage),
        ] {
            assert_eq!(updates.received(message, &mut receive), Err(alert));
        }
        assert_eq!(updates.counts(), (0, 0));
    }

    #[test]
    fn the_next_traffic_secret_is_rfc_8446s_traffic_upd() {
        // HKDF-Expand-Label(secret, "traffic upd", "", 32) computed apart:
        // HMAC-SHA256(secret, 0x0020 || 0x11 "tls13 traffic upd" || 0x00 || 0x01).
        let secret = [0x42u8; 32];
        let mut label = vec![0x00, 0x20, 17];
        label.extend_from_slice(b"tls13 traffic upd");
        label.extend_from_slice(&[0x00, 0x01]);
        let expected = crate::auth::HashFunction::Sha256.hmac(&secret, &[&label]);
        let mut keys = RecordKeys::new(CipherSuite::Aes128GcmSha256, &secret);
        let mut same = RecordKeys::new(
            CipherSuite::Aes128GcmSha256,
            &expected.as_ref().try_into().unwrap(),
        );
        keys.update();
        let mut wire = Vec::new();
        keys.seal_to(APPLICATION_DATA, b"under the next key", &mut wire)
            .unwrap();
        let (_, range) = same.open(&mut wire).unwrap();
        assert_eq!(&wire[range], b"under the next key");
    }
}
