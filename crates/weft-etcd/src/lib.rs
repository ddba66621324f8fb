//! weft's cluster store: [`EtcdStore`], the [`weft_control::Store`] trait
//! over an etcd cluster's v3 API (etcd 3.4 and later), so that every node
//! of a weft cluster shares one desired state.
//!
//! What it does:
//! - Every key lives under [`EtcdConfig::prefix`] (`/weft/` by default);
//!   the trait's callers see relative keys, and values are JSON.
//! - Transactions, leases and watches behave as
//!   [`weft_control::MemoryStore`]'s do (the conformance suite of
//!   weft-control checks it against a real etcd), with these differences:
//!   a commit that changes nothing returns the current revision instead of
//!   a new one; a transaction that changes one key several times applies
//!   only its last change of that key (the end state is the same; a watch
//!   sees one event); lease times to live are whole seconds, rounded up;
//!   etcd refuses transactions of more than 128 changes by default
//!   (`--max-txn-ops`).
//! - A watch ends with [`weft_control::WatchEvent::Lost`] when etcd
//!   compacts the history it still had to deliver, loses its leader, or
//!   the connection to the member breaks; the caller lists again.
//! - Connecting: plain `http://` endpoints, or TLS with a CA certificate
//!   and optionally a client certificate and key ([`EtcdTls`], PEM files,
//!   rustls); etcd users with a password ([`EtcdConfig::user`]), whose
//!   token is renewed when it expires. Any member that answers is used;
//!   one that is down, or an election, only delays a request, up to
//!   [`EtcdConfig::request_timeout`], after which it fails with
//!   [`weft_control::StoreError::Unavailable`] saying that the cluster
//!   store is unreachable and naming the endpoints.
//!
//! What it does not do: start, configure, compact or back up etcd
//! (`harness/etcd.sh` starts local members for tests and trials), nor
//! discover members beyond the configured endpoints. Calls block the
//! calling thread; do not make them from inside a tokio runtime.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod codec;
mod config;
mod failure;
mod members;
mod store;
mod watch;

pub use config::{EtcdConfig, EtcdTls, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT};
pub use store::EtcdStore;
