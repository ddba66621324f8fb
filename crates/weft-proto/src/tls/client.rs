//! The initiator's side of the handshake (weft's own links to other
//! nodes): a ClientHello offering one external PSK with psk_dhe_ke over
//! x25519 out; ServerHello, EncryptedExtensions and Finished in; the
//! client's Finished out.

use super::codec::{self, content, handshake, ServerHello, BINDERS_LEN};
use super::incoming::Incoming;
use super::keys::{self, CipherSuite, RecordKeys, Secret};
use super::{Alert, Established};
use crate::auth::SecureRandom;
use sha2::{Digest as _, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};

/// An initiator's handshake: send what it gives, feed it what the target
/// sends, until it is established or fails.
pub struct ClientHandshake {
    identity: Vec<u8>,
    early: Secret,
    ephemeral: StaticSecret,
    session_id: [u8; 32],
    transcript: Sha256,
    incoming: Incoming,
    output: Vec<u8>,
    state: State,
}

enum State {
    ServerHello,
    EncryptedExtensions(Box<Keys>),
    ServerFinished(Box<Keys>),
    Done(Option<Box<Established>>),
    Failed,
}

/// The handshake secrets once the ServerHello is in.
struct Keys {
    suite: CipherSuite,
    handshake: Secret,
    client_handshake: Secret,
    server_handshake: Secret,
}

impl std::fmt::Debug for ClientHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::ServerHello => "awaiting ServerHello",
            State::EncryptedExtensions(_) => "awaiting EncryptedExtensions",
            State::ServerFinished(_) => "awaiting server Finished",
            State::Done(_) => "done",
            State::Failed => "failed",
        };
        write!(f, "ClientHandshake({state})")
    }
}

impl ClientHandshake {
    /// Starts a handshake offering `identity` with TLS PSK `psk`; its
    /// ClientHello is in the output.
    pub fn new(identity: &[u8], psk: &[u8], random: &dyn SecureRandom) -> ClientHandshake {
        assert!(
            !identity.is_empty() && identity.len() <= 1024,
            "an identity of 1 to 1024 bytes"
        );
        let (mut hello_random, mut session_id, mut secret) = ([0u8; 32], [0u8; 32], [0u8; 32]);
        random.fill(&mut hello_random);
        random.fill(&mut session_id);
        random.fill(&mut secret);
        let ephemeral = StaticSecret::from(secret);
        let public = PublicKey::from(&ephemeral);
        let mut hello =
            codec::client_hello(&hello_random, &session_id, public.as_bytes(), identity);
        let early = keys::early_secret(psk);
        let cut = hello.len() - BINDERS_LEN;
        let truncated: [u8; 32] = Sha256::digest(&hello[..cut]).into();
        let binder = keys::binder(&early, &truncated);
        let at = hello.len() - 32;
        hello[at..].copy_from_slice(binder.as_ref());
        let mut transcript = Sha256::new();
        transcript.update(&hello);
        let mut output = keys::record_header(content::HANDSHAKE, hello.len()).to_vec();
        output.extend_from_slice(&hello);
        ClientHandshake {
            identity: identity.to_vec(),
            early,
            ephemeral,
            session_id,
            transcript,
            incoming: Incoming::default(),
            output,
            state: State::ServerHello,
        }
    }

    /// Takes bytes the target sent. On an error the handshake has failed
    /// (the alert to send, if any, is in the output).
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), Alert> {
        let result = self.incoming.push(bytes).and_then(|()| self.advance());
        if let Err(alert) = result {
            self.state = State::Failed;
            if let Some(code) = alert.code() {
                // In the clear: enough for the target to log why.
                self.output
                    .extend_from_slice(&keys::record_header(content::ALERT, 2));
                self.output.extend_from_slice(&[2, code]);
            }
        }
        result
    }

    /// What to send the target now.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// The established stream, once (after the target's Finished verified).
    pub fn established(&mut self) -> Option<Established> {
        match &mut self.state {
            State::Done(established) => established.take().map(|e| *e),
            _ => None,
        }
    }

    fn advance(&mut self) -> Result<(), Alert> {
        while let Some(message) = self.incoming.next_message()? {
            let state = std::mem::replace(&mut self.state, State::Failed);
            self.state = match state {
                State::ServerHello => self.on_server_hello(&message)?,
                State::EncryptedExtensions(keys) => {
                    if message[0] != handshake::ENCRYPTED_EXTENSIONS {
                        return Err(Alert::UnexpectedMessage);
                    }
                    self.transcript.update(&message);
                    State::ServerFinished(keys)
                }
                State::ServerFinished(keys) => self.on_server_finished(&message, &keys)?,
                State::Done(_) | State::Failed => return Err(Alert::UnexpectedMessage),
            };
        }
        Ok(())
    }

    fn on_server_hello(&mut self, message: &[u8]) -> Result<State, Alert> {
        let hello = ServerHello::parse(message)?;
        if hello.session_id != self.session_id || hello.selected_identity != 0 {
            return Err(Alert::IllegalParameter);
        }
        let suite = CipherSuite::choose(&[hello.cipher_suite]).ok_or(Alert::IllegalParameter)?;
        if self.incoming.has_partial_message() {
            return Err(Alert::UnexpectedMessage);
        }
        let server_public: [u8; 32] = hello.x25519_share.try_into().expect("checked: 32 bytes");
        let shared = self
            .ephemeral
            .diffie_hellman(&PublicKey::from(server_public));
        if !shared.was_contributory() {
            return Err(Alert::IllegalParameter);
        }
        self.transcript.update(message);
        let handshake = keys::handshake_secret(&self.early, shared.as_bytes());
        let hash: [u8; 32] = self.transcript.clone().finalize().into();
        let keys = Keys {
            suite,
            handshake,
            client_handshake: keys::derive_secret(&handshake, b"c hs traffic", &hash),
            server_handshake: keys::derive_secret(&handshake, b"s hs traffic", &hash),
        };
        self.incoming.keys = Some(RecordKeys::new(suite, &keys.server_handshake));
        Ok(State::EncryptedExtensions(Box::new(keys)))
    }

    fn on_server_finished(&mut self, message: &[u8], keys: &Keys) -> Result<State, Alert> {
        if message[0] != handshake::FINISHED {
            return Err(Alert::UnexpectedMessage);
        }
        let hash: [u8; 32] = self.transcript.clone().finalize().into();
        let expected = keys::finished_mac(&keys.server_handshake, &hash);
        if !keys::same(&message[4..], expected.as_ref()) {
            return Err(Alert::DecryptError);
        }
        if self.incoming.has_partial_message() {
            return Err(Alert::UnexpectedMessage);
        }
        self.transcript.update(message);
        let hash: [u8; 32] = self.transcript.clone().finalize().into();
        let master = keys::master_secret(&keys.handshake);
        let verify = keys::finished_mac(&keys.client_handshake, &hash);
        let mut finished = Vec::with_capacity(36);
        codec::handshake_message(&mut finished, handshake::FINISHED, |out| {
            out.extend_from_slice(verify.as_ref())
        });
        // RFC 8446 appendix D.4: this client is in compatibility mode.
        self.output
            .extend_from_slice(&[content::CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1]);
        RecordKeys::new(keys.suite, &keys.client_handshake).seal_to(
            content::HANDSHAKE,
            &finished,
            &mut self.output,
        )?;
        let client = keys::derive_secret(&master, b"c ap traffic", &hash);
        let server = keys::derive_secret(&master, b"s ap traffic", &hash);
        let incoming = std::mem::take(&mut self.incoming);
        Ok(State::Done(Some(Box::new(Established {
            suite: keys.suite,
            identity: self.identity.clone(),
            receive: RecordKeys::new(keys.suite, &server),
            send: RecordKeys::new(keys.suite, &client),
            leftover: incoming.into_rest(),
        }))))
    }
}
