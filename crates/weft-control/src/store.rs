//! The [`Store`] trait: the subset of etcd's v3 API the control plane needs,
//! so that one node keeps its desired state in an embedded file and a
//! cluster in etcd, and tests run on a deterministic in-memory copy.
//!
//! - Keys are `/`-separated paths; values are JSON records.
//! - Every commit is one transaction with a new store [`Revision`]; each
//!   entry remembers the revision that last changed it, and a transaction
//!   may require entries to be absent or unchanged since a revision
//!   (compare-and-swap): of two API calls racing to create one volume,
//!   exactly one wins and the other gets [`StoreError::Conflict`].
//! - Leases: an entry put under a lease disappears when the lease is not
//!   kept alive within its time to live (node liveness, the controller's
//!   election). Leased entries are never persisted by the embedded store.
//! - Watch: every change under a prefix after a revision, in order, so that
//!   a reconciler lists once and then follows changes; a watcher that falls
//!   too far behind (or whose store connection breaks) is told to list again.
//!
//! Implementations: [`crate::MemoryStore`], [`crate::EmbeddedStore`], and
//! etcd (`weft_etcd::EtcdStore`); `conformance` (feature `testing`) is the
//! suite that holds them to the memory store's behaviour.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// A store revision: it grows with every commit; each entry carries the
/// revision of the commit that last wrote it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Revision(pub u64);

impl std::fmt::Display for Revision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A lease: entries put under it live as long as it is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub i64);

/// One key with its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: Value,
    /// The revision that last wrote it.
    pub revision: Revision,
    /// The lease it lives under, if any.
    pub lease: Option<LeaseId>,
}

/// Every entry under a prefix, as of one revision.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Listing {
    /// The entries, in key order.
    pub entries: Vec<Entry>,
    /// The store's revision when they were read: watch after it.
    pub revision: Revision,
}

/// A condition of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// The key must not exist.
    Absent(String),
    /// The key must exist, last written at exactly this revision.
    At(String, Revision),
}

impl Condition {
    /// The key it is about.
    pub fn key(&self) -> &str {
        match self {
            Condition::Absent(key) | Condition::At(key, _) => key,
        }
    }
}

/// One change of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Set the key to the value (under a lease: the key dies with it).
    Put {
        /// Key.
        key: String,
        /// Value.
        value: Value,
        /// Lease, if any.
        lease: Option<LeaseId>,
    },
    /// Remove the key (no error if absent).
    Delete(String),
}

impl Change {
    /// A put without a lease (for [`Txn::raw`]).
    #[cfg(any(test, feature = "testing"))]
    pub fn put(key: impl Into<String>, value: Value) -> Change {
        Change::Put {
            key: key.into(),
            value,
            lease: None,
        }
    }
}

/// Conditions and changes applied all or none.
///
/// Built only by naming, for every key it writes, what the writer read
/// there: [`Txn::create`] (it was absent), [`Txn::update`] and
/// [`Txn::remove`] (it was at this revision). A change made from a stale
/// read then fails with [`StoreError::Conflict`] instead of undoing what was
/// written meanwhile (a lost update): there is no blind put. Conditions on
/// keys the transaction does not write (the controller's key, a record the
/// change depends on) are added with [`Txn::require`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Txn {
    conditions: Vec<Condition>,
    changes: Vec<Change>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Txn {
        Txn::default()
    }

    /// Creates `key` with `value`: it must be absent.
    pub fn create(self, key: impl Into<String>, value: Value) -> Txn {
        self.create_leased(key, value, None)
    }

    /// Creates `key` with `value` under `lease` (none: no lease): it must be absent.
    pub fn create_leased(
        self,
        key: impl Into<String>,
        value: Value,
        lease: Option<LeaseId>,
    ) -> Txn {
        let key = key.into();
        self.require(Condition::Absent(key.clone()))
            .with(Change::Put { key, value, lease })
    }

    /// Replaces `key` with `value`: it must still be at `revision`.
    pub fn update(self, key: impl Into<String>, value: Value, revision: Revision) -> Txn {
        self.update_leased(key, value, revision, None)
    }

    /// Replaces `key` with `value` under `lease` (none: no lease): it must still be at `revision`.
    pub fn update_leased(
        self,
        key: impl Into<String>,
        value: Value,
        revision: Revision,
        lease: Option<LeaseId>,
    ) -> Txn {
        let key = key.into();
        self.require(Condition::At(key.clone(), revision))
            .with(Change::Put { key, value, lease })
    }

    /// Removes `key`: it must still be at `revision`.
    pub fn remove(self, key: impl Into<String>, revision: Revision) -> Txn {
        let key = key.into();
        self.require(Condition::At(key.clone(), revision))
            .with(Change::Delete(key))
    }

    /// Adds a condition (on a key the transaction need not write).
    pub fn require(mut self, condition: Condition) -> Txn {
        self.conditions.push(condition);
        self
    }

    /// `conditions` and `changes` as given, whatever keys they name: for
    /// the tests of the store implementations (the conformance suite), never
    /// for records, so it is compiled only for tests.
    #[cfg(any(test, feature = "testing"))]
    pub fn raw(conditions: Vec<Condition>, changes: Vec<Change>) -> Txn {
        Txn {
            conditions,
            changes,
        }
    }

    /// Its conditions: all must hold, or nothing changes ([`StoreError::Conflict`]).
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// Its changes, applied in order when the conditions hold.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// Its conditions and changes, for a store to apply.
    pub fn into_parts(self) -> (Vec<Condition>, Vec<Change>) {
        (self.conditions, self.changes)
    }

    fn with(mut self, change: Change) -> Txn {
        self.changes.push(change);
        self
    }
}

/// What a watch reports.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// The key was written.
    Put(Entry),
    /// The key was removed (deleted, or its lease ended) at the revision.
    Delete(String, Revision),
    /// Changes were missed (the watcher fell behind, or the store's
    /// connection broke): list again and watch after the listing.
    Lost(String),
}

/// Why the store failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// The backing file or service failed.
    #[error("state store {location}: {message}")]
    Unavailable {
        /// File or endpoint.
        location: String,
        /// What failed.
        message: String,
    },
    /// What the store holds cannot be read.
    #[error("state store {location}: {message}; restore it from a backup or fix it by hand")]
    Corrupt {
        /// File or endpoint.
        location: String,
        /// What is wrong.
        message: String,
    },
    /// A condition of the transaction did not hold: someone else changed
    /// the record first.
    #[error("{key} was changed by someone else at the same time; read it again and retry")]
    Conflict {
        /// The key whose condition failed.
        key: String,
    },
    /// The lease ended (not kept alive in time, or revoked).
    #[error("lease {lease:x} has expired")]
    LeaseExpired {
        /// The lease.
        lease: i64,
    },
    /// The revision a watch should start after is no longer kept.
    #[error("changes after revision {after} are no longer kept; list again")]
    Compacted {
        /// The revision asked for.
        after: Revision,
    },
}

/// Desired state storage, shared by the threads of a node. Every commit is
/// atomic and durable when it returns.
pub trait Store: Send + Sync {
    /// The entry at `key`.
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError>;
    /// Every entry whose key starts with `prefix`.
    fn list(&self, prefix: &str) -> Result<Listing, StoreError>;
    /// Shows `visit` every entry whose key starts with `prefix`, in key
    /// order, without copying them where the store holds them in memory
    /// (a node's copy of the cluster store: a reconcile that listed
    /// 10,000 records copied every one); the listing's revision.
    fn visit(&self, prefix: &str, visit: &mut dyn FnMut(&Entry)) -> Result<Revision, StoreError> {
        let listing = self.list(prefix)?;
        listing.entries.iter().for_each(visit);
        Ok(listing.revision)
    }
    /// Applies `txn` if its conditions hold; the commit's revision.
    fn commit(&self, txn: Txn) -> Result<Revision, StoreError>;
    /// A new lease that ends `ttl` after it was last kept alive.
    fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError>;
    /// Restarts the lease's time to live; [`StoreError::LeaseExpired`] if
    /// it has already ended.
    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError>;
    /// Ends the lease now, removing its entries.
    fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError>;
    /// Every change under `prefix` after revision `after`, in order; the
    /// watch ends when the receiver is dropped.
    fn watch(&self, prefix: &str, after: Revision) -> Result<Receiver<WatchEvent>, StoreError>;
    /// Where the store lives, for messages.
    fn location(&self) -> String;
}
