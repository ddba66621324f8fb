//! A store whose calls a test sees on their way to another store, and may
//! stop or answer otherwise: a commit held while another writer commits, a
//! store that is down, calls noted in order, a commit applied but answered
//! with an error (as when etcd applies a transaction and the connection
//! breaks before its answer). Built with the `testing` feature only.
//!
//! What this does not do: change a call that goes through; a hook acts
//! before a call, or on a commit's answer.

use crate::store::{Entry, LeaseId, Listing, Revision, Store, StoreError, Txn, WatchEvent};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// A store call, as a hook sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// [`Store::get`].
    Get,
    /// [`Store::list`].
    List,
    /// [`Store::commit`].
    Commit,
    /// [`Store::grant_lease`].
    GrantLease,
    /// [`Store::keep_alive`].
    KeepAlive,
    /// [`Store::revoke_lease`].
    RevokeLease,
    /// [`Store::watch`].
    Watch,
}

impl Call {
    /// The method's name.
    pub fn name(self) -> &'static str {
        match self {
            Call::Get => "get",
            Call::List => "list",
            Call::Commit => "commit",
            Call::GrantLease => "grant_lease",
            Call::KeepAlive => "keep_alive",
            Call::RevokeLease => "revoke_lease",
            Call::Watch => "watch",
        }
    }
}

/// What a test does with the calls.
pub trait Hook: Send + Sync {
    /// Before `call` reaches `inner`: an error is its answer instead.
    fn before(&self, _call: Call, _inner: &Arc<dyn Store>) -> Result<(), StoreError> {
        Ok(())
    }

    /// The answer to a commit `inner` applied at `applied` (an error loses it).
    fn answer(&self, applied: Revision) -> Result<Revision, StoreError> {
        Ok(applied)
    }
}

/// `inner` with `hook` on its calls.
pub struct Intercepted<H> {
    inner: Arc<dyn Store>,
    hook: H,
}

impl<H: Hook> Intercepted<H> {
    /// `inner`'s calls pass `hook`.
    pub fn new(inner: Arc<dyn Store>, hook: H) -> Intercepted<H> {
        Intercepted { inner, hook }
    }

    /// The hook (a test changes what it does).
    pub fn hook(&self) -> &H {
        &self.hook
    }

    /// The store behind (calls to it pass no hook).
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }
}

impl<H: Hook> Store for Intercepted<H> {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.hook.before(Call::Get, &self.inner)?;
        self.inner.get(key)
    }

    fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        self.hook.before(Call::List, &self.inner)?;
        self.inner.list(prefix)
    }

    fn commit(&self, txn: Txn) -> Result<Revision, StoreError> {
        self.hook.before(Call::Commit, &self.inner)?;
        let applied = self.inner.commit(txn)?;
        self.hook.answer(applied)
    }

    fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.hook.before(Call::GrantLease, &self.inner)?;
        self.inner.grant_lease(ttl)
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.hook.before(Call::KeepAlive, &self.inner)?;
        self.inner.keep_alive(lease)
    }

    fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.hook.before(Call::RevokeLease, &self.inner)?;
        self.inner.revoke_lease(lease)
    }

    fn watch(&self, prefix: &str, after: Revision) -> Result<Receiver<WatchEvent>, StoreError> {
        self.hook.before(Call::Watch, &self.inner)?;
        self.inner.watch(prefix, after)
    }

    fn location(&self) -> String {
        self.inner.location()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Change;
    use crate::MemoryStore;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct LoseNext(AtomicBool);

    impl Hook for LoseNext {
        fn before(&self, call: Call, _inner: &Arc<dyn Store>) -> Result<(), StoreError> {
            if call == Call::Get && self.0.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable {
                    location: "test".into(),
                    message: "down".into(),
                });
            }
            Ok(())
        }

        fn answer(&self, applied: Revision) -> Result<Revision, StoreError> {
            if self.0.swap(false, Ordering::SeqCst) {
                return Err(StoreError::Unavailable {
                    location: "test".into(),
                    message: "the answer was lost".into(),
                });
            }
            Ok(applied)
        }
    }

    #[test]
    fn a_hook_stops_calls_and_loses_answers_of_commits_made() {
        let store = Intercepted::new(
            Arc::new(MemoryStore::default()),
            LoseNext(AtomicBool::new(true)),
        );
        assert!(store.get("k").is_err(), "stopped before the store");
        let put = Txn::raw(vec![], vec![Change::put("k", serde_json::json!(1))]);
        assert!(store.commit(put).is_err(), "its answer lost");
        let made = store.get("k").unwrap().expect("the commit was made");
        assert_eq!(made.value, serde_json::json!(1));
        assert_eq!(store.location(), store.inner().location());
    }
}
