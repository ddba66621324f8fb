//! A handshake's incoming side: bytes buffered into records, records opened
//! (once the peer protects them) and their handshake bytes assembled into
//! messages. Bounded: a peer cannot make it hold more than one record and
//! one handshake message of [`MAX_MESSAGE`].

use super::codec::content;
use super::keys::{record_len, RecordKeys, HEADER_LEN, MAX_RECORD};
use super::Alert;

/// The largest handshake message taken (a ClientHello with a few
/// identities is far below; RFC 8446 allows 2^24, which no peer here needs).
pub(crate) const MAX_MESSAGE: usize = 16 * 1024;

#[derive(Debug, Default)]
pub(crate) struct Incoming {
    received: Vec<u8>,
    messages: Vec<u8>,
    /// Set once the peer protects its records.
    pub(crate) keys: Option<RecordKeys>,
    /// Whether a handshake message was taken (a change_cipher_spec may follow).
    started: bool,
}

impl Incoming {
    /// Takes `bytes` as received; more than a record's worth beyond what
    /// is being assembled is refused (the peer must wait for an answer).
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<(), Alert> {
        if self.received.len() + bytes.len() > 2 * MAX_RECORD {
            return Err(Alert::UnexpectedMessage);
        }
        self.received.extend_from_slice(bytes);
        Ok(())
    }

    /// The next whole handshake message (header included), opening records as needed.
    pub(crate) fn next_message(&mut self) -> Result<Option<Vec<u8>>, Alert> {
        loop {
            if self.messages.len() >= 4 {
                let len = usize::from(self.messages[1]) << 16
                    | usize::from(self.messages[2]) << 8
                    | usize::from(self.messages[3]);
                if 4 + len > MAX_MESSAGE {
                    return Err(Alert::DecodeError);
                }
                if self.messages.len() >= 4 + len {
                    self.started = true;
                    return Ok(Some(self.messages.drain(..4 + len).collect()));
                }
            }
            let Some((kind, payload, protected)) = self.next_record()? else {
                return Ok(None);
            };
            match kind {
                content::HANDSHAKE if !payload.is_empty() => {
                    if self.messages.len() + payload.len() > MAX_MESSAGE + 4 {
                        return Err(Alert::DecodeError);
                    }
                    self.messages.extend_from_slice(&payload);
                }
                // RFC 8446 section 5: a change_cipher_spec of one byte 1,
                // in the clear, after the first ClientHello, is dropped
                // during the handshake (middlebox compatibility); any other
                // is unexpected.
                content::CHANGE_CIPHER_SPEC if payload == [1] && !protected && self.started => {}
                content::ALERT if payload.len() == 2 => return Err(Alert::Received(payload[1])),
                _ => return Err(Alert::UnexpectedMessage),
            }
        }
    }

    /// Whether handshake bytes wait that do not make a whole message yet
    /// (a key change must fall on a record's end: RFC 8446 section 5.1).
    pub(crate) fn has_partial_message(&self) -> bool {
        !self.messages.is_empty()
    }

    /// The next whole record: its (inner) content type, its payload, and
    /// whether it was protected.
    fn next_record(&mut self) -> Result<Option<(u8, Vec<u8>, bool)>, Alert> {
        let Some(len) = record_len(&self.received)? else {
            return Ok(None);
        };
        if self.received.len() < len {
            return Ok(None);
        }
        let mut record: Vec<u8> = self.received.drain(..len).collect();
        let kind = record[0];
        match (&mut self.keys, kind) {
            (Some(keys), content::APPLICATION_DATA) => {
                let (inner, range) = keys.open(&mut record)?;
                Ok(Some((inner, record[range].to_vec(), true)))
            }
            (Some(_), content::HANDSHAKE) | (None, content::APPLICATION_DATA) => {
                Err(Alert::UnexpectedMessage)
            }
            _ => Ok(Some((kind, record[HEADER_LEN..].to_vec(), false))),
        }
    }

    /// What was received past the handshake.
    pub(crate) fn into_rest(self) -> Vec<u8> {
        self.received
    }
}
