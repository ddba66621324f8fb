//! The target's side of the handshake (RFC 8446 section 2.2 with an
//! external PSK, psk_dhe_ke): ClientHello in; ServerHello, EncryptedExtensions
//! and Finished out; the client's Finished in. No certificate, no
//! HelloRetryRequest (a ClientHello without an x25519 share is refused), no
//! 0-RTT, no session tickets (the Linux host takes nothing but application
//! data after the handshake).

use super::codec::{self, content, handshake, ClientHello};
use super::incoming::Incoming;
use super::keys::{self, CipherSuite, RecordKeys, Secret};
use super::{Alert, Established};
use crate::auth::SecureRandom;
use sha2::{Digest as _, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};

/// The PSKs a target knows, by identity.
pub trait PskStore {
    /// The TLS PSKs `identity` may stand for (several candidates when the
    /// derivation's form is unknown; the binder tells); empty if unknown.
    fn tls_psks(&self, identity: &[u8]) -> Vec<Vec<u8>>;
}

/// A target's handshake: feed it what the host sends, send what it gives,
/// until it is established or fails.
pub struct ServerHandshake {
    random: [u8; 32],
    ephemeral: StaticSecret,
    incoming: Incoming,
    output: Vec<u8>,
    state: State,
}

enum State {
    Hello,
    ClientFinished(Box<AwaitingFinished>),
    Done(Option<Box<Established>>),
    Failed,
}

struct AwaitingFinished {
    suite: CipherSuite,
    identity: Vec<u8>,
    /// Transcript hash through the server's Finished.
    transcript: [u8; 32],
    client_handshake_secret: Secret,
    master: Secret,
    /// For an alert after the server's Finished: the host reads the
    /// server's records with its application keys from then on (RFC 8446
    /// section 7.1).
    server_keys: RecordKeys,
}

impl std::fmt::Debug for ServerHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Hello => "awaiting ClientHello",
            State::ClientFinished(_) => "awaiting client Finished",
            State::Done(_) => "done",
            State::Failed => "failed",
        };
        write!(f, "ServerHandshake({state})")
    }
}

impl ServerHandshake {
    /// A handshake whose randomness (ServerHello's random and the
    /// ephemeral x25519 key) comes from `random`.
    pub fn new(random: &dyn SecureRandom) -> ServerHandshake {
        let mut server_random = [0u8; 32];
        random.fill(&mut server_random);
        let mut secret = [0u8; 32];
        random.fill(&mut secret);
        ServerHandshake {
            random: server_random,
            ephemeral: StaticSecret::from(secret),
            incoming: Incoming::default(),
            output: Vec::new(),
            state: State::Hello,
        }
    }

    /// Takes bytes the host sent. On an error the handshake has failed and
    /// the alert to send is in the output.
    pub fn handle_input(&mut self, bytes: &[u8], psks: &dyn PskStore) -> Result<(), Alert> {
        let result = self.incoming.push(bytes).and_then(|()| self.advance(psks));
        if let Err(alert) = result {
            self.fail(alert);
        }
        result
    }

    /// What to send the host now.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// The established stream, once (after the host's Finished verified).
    pub fn established(&mut self) -> Option<Established> {
        match &mut self.state {
            State::Done(established) => established.take().map(|e| *e),
            _ => None,
        }
    }

    fn advance(&mut self, psks: &dyn PskStore) -> Result<(), Alert> {
        while let Some(message) = self.incoming.next_message()? {
            match &self.state {
                State::Hello => self.on_client_hello(&message, psks)?,
                State::ClientFinished(_) => self.on_client_finished(&message)?,
                State::Done(_) | State::Failed => return Err(Alert::UnexpectedMessage),
            }
        }
        Ok(())
    }

    fn on_client_hello(&mut self, message: &[u8], psks: &dyn PskStore) -> Result<(), Alert> {
        let hello = ClientHello::parse(message)?;
        if !hello.tls13 {
            return Err(Alert::ProtocolVersion);
        }
        if hello.psks.is_empty() {
            return Err(Alert::MissingExtension);
        }
        let suite = CipherSuite::choose(&hello.cipher_suites).ok_or(Alert::HandshakeFailure)?;
        if !hello.psk_dhe_ke {
            return Err(Alert::HandshakeFailure);
        }
        if hello.early_data {
            // 0-RTT data would follow under keys this profile never takes.
            return Err(Alert::IllegalParameter);
        }
        let client_share = hello.x25519_share.ok_or(Alert::HandshakeFailure)?;
        // The ClientHello must end its record: the next records are protected.
        if self.incoming.has_partial_message() {
            return Err(Alert::UnexpectedMessage);
        }
        let (selected, early) = select_psk(&hello, message, psks)?;
        let client_public: [u8; 32] = client_share.try_into().expect("checked: 32 bytes");
        let shared = self
            .ephemeral
            .diffie_hellman(&PublicKey::from(client_public));
        // RFC 8446 section 7.4.2: an all-zero shared secret is refused.
        if !shared.was_contributory() {
            return Err(Alert::IllegalParameter);
        }
        let public = PublicKey::from(&self.ephemeral);
        let mut transcript = Sha256::new();
        transcript.update(message);
        let server_hello = codec::server_hello(
            &self.random,
            hello.session_id,
            suite.code(),
            public.as_bytes(),
            selected as u16,
        );
        transcript.update(&server_hello);
        self.output
            .extend_from_slice(&keys::record_header(content::HANDSHAKE, server_hello.len()));
        self.output.extend_from_slice(&server_hello);
        if !hello.session_id.is_empty() {
            // RFC 8446 appendix D.4: the client is in compatibility mode.
            self.output
                .extend_from_slice(&[content::CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1]);
        }
        let handshake_secret = keys::handshake_secret(&early, shared.as_bytes());
        let hash: [u8; 32] = transcript.clone().finalize().into();
        let client_handshake_secret =
            keys::derive_secret(&handshake_secret, b"c hs traffic", &hash);
        let server_handshake_secret =
            keys::derive_secret(&handshake_secret, b"s hs traffic", &hash);
        let mut flight = Vec::with_capacity(64);
        codec::handshake_message(&mut flight, handshake::ENCRYPTED_EXTENSIONS, |out| {
            codec::vec16(out, |_| {})
        });
        transcript.update(&flight);
        let verify = keys::finished_mac(
            &server_handshake_secret,
            &transcript.clone().finalize().into(),
        );
        let finished_at = flight.len();
        codec::handshake_message(&mut flight, handshake::FINISHED, |out| {
            out.extend_from_slice(verify.as_ref())
        });
        transcript.update(&flight[finished_at..]);
        RecordKeys::new(suite, &server_handshake_secret).seal_to(
            content::HANDSHAKE,
            &flight,
            &mut self.output,
        )?;
        self.incoming.keys = Some(RecordKeys::new(suite, &client_handshake_secret));
        let transcript: [u8; 32] = transcript.finalize().into();
        let master = keys::master_secret(&handshake_secret);
        let server_application = keys::derive_secret(&master, b"s ap traffic", &transcript);
        self.state = State::ClientFinished(Box::new(AwaitingFinished {
            suite,
            identity: hello.psks[selected].identity.to_vec(),
            transcript,
            client_handshake_secret,
            master,
            server_keys: RecordKeys::new(suite, &server_application),
        }));
        Ok(())
    }

    fn on_client_finished(&mut self, message: &[u8]) -> Result<(), Alert> {
        let State::ClientFinished(awaiting) = &self.state else {
            unreachable!("called in that state")
        };
        if message[0] != handshake::FINISHED {
            return Err(Alert::UnexpectedMessage);
        }
        let expected = keys::finished_mac(&awaiting.client_handshake_secret, &awaiting.transcript);
        if !keys::same(&message[4..], expected.as_ref()) {
            return Err(Alert::DecryptError);
        }
        if self.incoming.has_partial_message() {
            return Err(Alert::UnexpectedMessage);
        }
        let State::ClientFinished(awaiting) = std::mem::replace(&mut self.state, State::Failed)
        else {
            unreachable!("checked above")
        };
        let client = keys::derive_secret(&awaiting.master, b"c ap traffic", &awaiting.transcript);
        let incoming = std::mem::take(&mut self.incoming);
        self.state = State::Done(Some(Box::new(Established {
            suite: awaiting.suite,
            identity: awaiting.identity,
            receive: RecordKeys::new(awaiting.suite, &client),
            send: awaiting.server_keys,
            leftover: incoming.into_rest(),
        })));
        Ok(())
    }

    /// Ends the handshake with `alert` (protected once the server's records are).
    fn fail(&mut self, alert: Alert) {
        let state = std::mem::replace(&mut self.state, State::Failed);
        let Some(code) = alert.code() else {
            return;
        };
        let body = [2, code]; // fatal
        match state {
            State::ClientFinished(mut awaiting) => {
                // Sealing only fails when the sequence wraps: nothing to send then.
                let _ = awaiting
                    .server_keys
                    .seal_to(content::ALERT, &body, &mut self.output);
            }
            _ => {
                self.output
                    .extend_from_slice(&keys::record_header(content::ALERT, 2));
                self.output.extend_from_slice(&body);
            }
        }
    }
}

/// The first offered identity the store knows, once its binder verifies
/// under one of its candidate PSKs; and that PSK's early secret. Only that
/// identity's binder is tried (RFC 8446 section 4.2.11: a server SHOULD
/// validate a single binder), so a hello listing many identities costs
/// one lookup each and the HMACs of one.
fn select_psk(
    hello: &ClientHello<'_>,
    message: &[u8],
    psks: &dyn PskStore,
) -> Result<(usize, Secret), Alert> {
    let (index, offered, candidates) = hello
        .psks
        .iter()
        .enumerate()
        .find_map(|(index, offered)| {
            let candidates = psks.tls_psks(offered.identity);
            (!candidates.is_empty()).then_some((index, offered, candidates))
        })
        .ok_or(Alert::UnknownPskIdentity)?;
    let truncated: [u8; 32] = Sha256::digest(&message[..hello.binders_at]).into();
    candidates
        .iter()
        .map(|psk| keys::early_secret(psk))
        .find(|early| keys::same(keys::binder(early, &truncated).as_ref(), offered.binder))
        .map(|early| (index, early))
        .ok_or(Alert::DecryptError)
}
