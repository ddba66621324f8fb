//! [`EtcdStore`]: the [`Store`] trait over etcd's v3 API. Calls are
//! synchronous for weft's threads: each one runs on the store's own small
//! tokio runtime (one worker thread, which also carries the watches) and
//! gives up when [`EtcdConfig::request_timeout`] has passed.
//!
//! Requests go to one member at a time ([`Members`]). A request that failed
//! because its member could not be reached is tried again on the next one,
//! until the timeout, so that a stopped member does not fail it; reads are
//! also tried again when a member takes more than half the timeout to
//! answer (it may be cut off from the others). A commit is only tried again
//! when it certainly did not reach etcd (connecting failed, or etcd said it
//! has no leader), since a commit that timed out may still have been
//! applied: commits made while etcd elects a new leader can fail.

use crate::codec::{etcd_revision, first_failing, leases_of, revision, Keys};
use crate::config::EtcdConfig;
use crate::failure::{Context, Failure};
use crate::members::Members;
use crate::watch::{cancel_failure, follow, Running};
use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions, WatchOptions,
};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weft_control::{Entry, LeaseId, Listing, Revision, Store, StoreError, Txn, WatchEvent};

/// Entries read per request when listing (etcd answers in one message, which
/// must stay well below gRPC's 4 MiB limit).
const LIST_PAGE: i64 = 256;

/// Pause before trying an unreachable cluster again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// HTTP/2 pings on idle connections notice a member that vanished without
/// closing them; etcd refuses pings more often than every 5 s.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Which failures a request may be tried again after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Any failure to reach the cluster (the request is idempotent, or
    /// harmless to repeat).
    Unreachable,
    /// Only failures that prove the request was not applied.
    NotSent,
}

impl Retry {
    fn allows(self, failure: &Failure) -> bool {
        match (self, failure) {
            (Retry::Unreachable, Failure::Unreachable(_)) => true,
            (Retry::NotSent, Failure::Unreachable(cause)) => {
                // Not "connection ...": a connection that broke may have
                // carried the request.
                cause.contains("tcp connect error") || cause.contains("no leader")
            }
            _ => false,
        }
    }
}

/// The cluster's desired state in etcd.
pub struct EtcdStore {
    /// Runs every request and watch; dropping it ends the watches.
    runtime: tokio::runtime::Runtime,
    members: Members,
    keys: Keys,
    context: Context,
    timeout: Duration,
    watches: Arc<AtomicUsize>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.context.endpoints)
            .field("prefix", &self.context.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster `config` names and checks that a member
    /// answers (and lets the user read the prefix) within the timeout.
    pub fn connect(config: EtcdConfig) -> Result<EtcdStore, StoreError> {
        let context = Context {
            endpoints: config.endpoint_list(),
            prefix: config.prefix.clone(),
            user: config.user.as_ref().map(|(user, _)| user.clone()),
        };
        let refused = |message: String| StoreError::Unavailable {
            location: context.location(),
            message,
        };
        config.check().map_err(refused)?;
        let options = connect_options(&config).map_err(refused)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weft-etcd")
            .enable_all()
            .build()
            .map_err(|error| refused(format!("cannot start the etcd client runtime: {error}")))?;
        let timeout = config.request_timeout;
        let store = EtcdStore {
            runtime,
            members: Members::new(config.endpoints.clone(), options),
            keys: Keys::new(&config.prefix),
            context,
            timeout,
            watches: Arc::new(AtomicUsize::new(0)),
        };
        let prefix = store.keys.full("");
        store
            .call(Retry::Unreachable, |client| {
                let mut kv = client.kv_client();
                let prefix = prefix.clone();
                async move {
                    let options = GetOptions::new().with_prefix().with_count_only();
                    kv.get(prefix, Some(options)).await
                }
            })
            .map_err(|failure| store.context.error(failure))?;
        Ok(store)
    }

    /// How many watches still run (each ends at its first event after its
    /// receiver was dropped, when it is lost, or with the store).
    pub fn watches(&self) -> usize {
        self.watches.load(Ordering::SeqCst)
    }

    /// Runs `attempt` with a client of the member in use until it
    /// succeeds, fails in a way `retry` does not allow, or the timeout has
    /// passed; after a failure to reach a member, the next one is used.
    fn call<T, F, Fut>(&self, retry: Retry, mut attempt: F) -> Result<T, Failure>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.timeout;
        self.runtime.block_on(async {
            let deadline = Instant::now() + timeout;
            let mut last = None;
            let mut failed_in_turn = 0;
            let mut maybe_applied = false;
            loop {
                let patience = match retry {
                    Retry::Unreachable => timeout / 2,
                    Retry::NotSent => timeout,
                };
                let index = self.members.current();
                let answered =
                    tokio::time::timeout_at(deadline.min(Instant::now() + patience), async {
                        let client = self.members.client(index).await?;
                        attempt(client).await.map_err(Failure::from)
                    })
                    .await;
                match answered {
                    Ok(Ok(value)) => return Ok(value),
                    Ok(Err(failure)) if !retry.allows(&failure) => return Err(failure),
                    Ok(Err(failure)) => last = Some(failure),
                    // A commit that got no answer may yet be applied.
                    Err(_) if retry == Retry::NotSent => {
                        maybe_applied = true;
                        break;
                    }
                    Err(_) => {}
                }
                self.members.failed(index);
                failed_in_turn += 1;
                // Pause once every member has failed in turn.
                let pause = if failed_in_turn % self.members.count() == 0 {
                    RETRY_PAUSE
                } else {
                    Duration::ZERO
                };
                if Instant::now() + pause >= deadline {
                    break;
                }
                tokio::time::sleep(pause).await;
            }
            let mut cause = format!("no answer within {timeout:?}");
            if let Some(last) = last {
                cause.push_str(&format!(" (last error: {last})"));
            }
            if maybe_applied {
                cause.push_str("; the change may or may not have been made: read it again");
            }
            Err(Failure::Unreachable(cause))
        })
    }

    fn entry(
        &self,
        key: &[u8],
        value: &[u8],
        mod_revision: i64,
        lease: i64,
    ) -> Result<Entry, StoreError> {
        self.keys
            .entry(key, value, mod_revision, lease)
            .map_err(|message| StoreError::Corrupt {
                location: self.context.location(),
                message,
            })
    }

    /// After a transaction failed for want of a lease: the first of its
    /// leases (in order) that is gone.
    fn missing_lease(&self, txn: &Txn) -> LeaseId {
        let leases = leases_of(txn.changes());
        for lease in &leases {
            let found = self.call(Retry::Unreachable, |client| {
                let mut client = client.lease_client();
                let id = lease.0;
                async move { client.time_to_live(id, None).await }
            });
            match found {
                Ok(response) if response.ttl() < 0 => return *lease,
                Err(Failure::LeaseNotFound) => return *lease,
                _ => {}
            }
        }
        leases.first().copied().unwrap_or(LeaseId(0))
    }
}

/// etcd-client's options for `config`, with the TLS files read.
fn connect_options(config: &EtcdConfig) -> Result<ConnectOptions, String> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.request_timeout)
        .with_keep_alive(KEEP_ALIVE_INTERVAL, config.request_timeout)
        .with_keep_alive_while_idle(true)
        // A member cut off from the others answers "no leader" at once
        // instead of hanging, and ends its watches.
        .with_require_leader(true);
    if let Some((user, password)) = &config.user {
        options = options
            .with_user(user.clone(), password.clone())
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = &config.tls {
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|error| format!("cannot read the etcd {what} {}: {error}", path.display()))
        };
        let mut settings = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read("CA certificate", &tls.ca)?));
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            settings = settings.identity(Identity::from_pem(
                read("client certificate", cert)?,
                read("client key", key)?,
            ));
        }
        options = options.with_tls(settings);
    }
    Ok(options)
}

impl Store for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let full = self.keys.full(key);
        let response = self
            .call(Retry::Unreachable, |client| {
                let mut kv = client.kv_client();
                let full = full.clone();
                async move { kv.get(full, None).await }
            })
            .map_err(|failure| self.context.error(failure))?;
        response
            .kvs()
            .first()
            .map(|kv| self.entry(kv.key(), kv.value(), kv.mod_revision(), kv.lease()))
            .transpose()
    }

    fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let full = self.keys.full(prefix);
        let mut listing = Listing::default();
        // Pages after the first are read at the first one's revision: one
        // consistent snapshot.
        let mut from = full.clone();
        loop {
            let pinned = listing.revision;
            let response = self
                .call(Retry::Unreachable, |client| {
                    let mut kv = client.kv_client();
                    let mut options = GetOptions::new()
                        .with_range(prefix_end(full.as_bytes()))
                        .with_limit(LIST_PAGE);
                    if pinned != Revision(0) {
                        options = options.with_revision(etcd_revision(pinned));
                    }
                    let from = from.clone();
                    async move { kv.get(from, Some(options)).await }
                })
                .map_err(|failure| self.context.error(failure))?;
            if pinned == Revision(0) {
                listing.revision = revision(response.header().map_or(0, |h| h.revision()));
            }
            for kv in response.kvs() {
                listing.entries.push(self.entry(
                    kv.key(),
                    kv.value(),
                    kv.mod_revision(),
                    kv.lease(),
                )?);
            }
            match response.kvs().last() {
                Some(last) if response.more() => {
                    // The next page starts just after the last key read.
                    let mut next = last.key().to_vec();
                    next.push(0);
                    from = String::from_utf8(next).map_err(|_| StoreError::Corrupt {
                        location: self.context.location(),
                        message: "a key under the prefix is not UTF-8".into(),
                    })?;
                }
                _ => return Ok(listing),
            }
        }
    }

    fn commit(&self, txn: Txn) -> Result<Revision, StoreError> {
        let request = self.keys.transaction(&txn);
        let response = self.call(Retry::NotSent, |client| {
            let mut kv = client.kv_client();
            let request = request.clone();
            async move { kv.txn(request).await }
        });
        match response {
            Ok(response) if response.succeeded() => Ok(revision(
                response.header().map_or(0, |header| header.revision()),
            )),
            Ok(response) => {
                let reads = response.op_responses();
                let key = first_failing(txn.conditions(), &reads)
                    .or(txn.conditions().first().map(|c| c.key()))
                    .unwrap_or_default();
                Err(StoreError::Conflict {
                    key: key.to_string(),
                })
            }
            Err(Failure::LeaseNotFound) => Err(StoreError::LeaseExpired {
                lease: self.missing_lease(&txn).0,
            }),
            Err(failure) => Err(self.context.error(failure)),
        }
    }

    fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        // etcd counts whole seconds; round up so that no lease ends early.
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let seconds = i64::try_from(seconds.max(1)).unwrap_or(i64::MAX);
        let response = self
            .call(Retry::Unreachable, |client| {
                let mut lease = client.lease_client();
                async move { lease.grant(seconds, None).await }
            })
            .map_err(|failure| self.context.error(failure))?;
        Ok(LeaseId(response.id()))
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        let kept = self.call(Retry::Unreachable, |client| {
            let mut client = client.lease_client();
            async move { client.keep_alive(lease.0).await }
        });
        match kept {
            Ok(_) => Ok(()),
            // etcd answers a keep-alive of an unknown lease with a time to
            // live of 0, which etcd-client reports as this error.
            Err(Failure::LeaseNotFound) => Err(StoreError::LeaseExpired { lease: lease.0 }),
            Err(Failure::Refused(message)) if message.contains("lease not found") => {
                Err(StoreError::LeaseExpired { lease: lease.0 })
            }
            Err(failure) => Err(self.context.error(failure)),
        }
    }

    fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        let revoked = self.call(Retry::Unreachable, |client| {
            let mut client = client.lease_client();
            async move { client.revoke(lease.0).await }
        });
        match revoked {
            // Already ended: as in the memory store, nothing to do.
            Ok(_) | Err(Failure::LeaseNotFound) => Ok(()),
            Err(failure) => Err(self.context.error(failure)),
        }
    }

    fn watch(&self, prefix: &str, after: Revision) -> Result<Receiver<WatchEvent>, StoreError> {
        let full = self.keys.full(prefix);
        let start = etcd_revision(after).saturating_add(1);
        // A watch from a compacted revision would be cancelled moments
        // after it starts; a read at that revision is refused at once, so
        // the caller learns it here, as from the memory store.
        let checked = self.call(Retry::Unreachable, |client| {
            let mut kv = client.kv_client();
            let options = GetOptions::new()
                .with_range(prefix_end(full.as_bytes()))
                .with_revision(start)
                .with_count_only();
            let full = full.clone();
            async move { kv.get(full, Some(options)).await }
        });
        match checked {
            Ok(_) | Err(Failure::FutureRevision) => {}
            Err(Failure::Compacted) => return Err(StoreError::Compacted { after }),
            Err(failure) => return Err(self.context.error(failure)),
        }
        let created = self.call(Retry::Unreachable, |client| {
            let mut client = client.watch_client();
            let options = WatchOptions::new().with_prefix().with_start_revision(start);
            let full = full.clone();
            async move {
                let mut stream = client.watch(full, Some(options)).await?;
                let first = stream.message().await?;
                Ok((stream, first))
            }
        });
        let stream = match created {
            Ok((stream, Some(first))) if !first.canceled() => stream,
            Ok((_, Some(cancelled))) => {
                return Err(match cancel_failure(&cancelled) {
                    Failure::Compacted => StoreError::Compacted { after },
                    failure => self.context.error(failure),
                })
            }
            Ok((_, None)) => {
                return Err(self.context.error(Failure::Unreachable(
                    "etcd closed the watch as it started".into(),
                )))
            }
            Err(failure) => return Err(self.context.error(failure)),
        };
        let (sender, receiver) = mpsc::channel();
        let running = Running::new(&self.watches);
        self.runtime.spawn(follow(
            stream,
            sender,
            self.keys.clone(),
            self.context.clone(),
            running,
        ));
        Ok(receiver)
    }

    fn location(&self) -> String {
        self.context.location()
    }
}

/// The end of the range of keys starting with `prefix` (etcd's convention:
/// the prefix with its last byte below 0xff incremented).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // Every key.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_follow_etcd() {
        assert_eq!(prefix_end(b"/weft/"), b"/weft0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }

    #[test]
    fn only_commits_that_never_reached_etcd_are_tried_again() {
        let refused = Failure::Unreachable("tcp connect error: Connection refused".into());
        let timed_out = Failure::Unreachable("request timed out".into());
        assert!(Retry::NotSent.allows(&refused));
        assert!(Retry::NotSent.allows(&Failure::Unreachable("no leader".into())));
        assert!(!Retry::NotSent.allows(&timed_out));
        let broken = Failure::Unreachable("h2 protocol error: connection reset".into());
        assert!(!Retry::NotSent.allows(&broken));
        assert!(Retry::Unreachable.allows(&timed_out));
        assert!(!Retry::Unreachable.allows(&Failure::LeaseNotFound));
    }

    #[test]
    fn an_unreachable_cluster_fails_within_the_timeout_naming_it() {
        // Nothing listens on port 1 of the loopback.
        let mut config = EtcdConfig::new(vec!["http://127.0.0.1:1".into()]);
        config.request_timeout = Duration::from_millis(500);
        let started = std::time::Instant::now();
        let error = EtcdStore::connect(config).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let text = error.to_string();
        eprintln!("{text}");
        assert!(text.contains("the cluster store is unreachable"), "{text}");
        assert!(text.contains("http://127.0.0.1:1"), "{text}");
    }
}
