//! [`Members`]: which etcd member the store talks to. Requests go to one
//! member until reaching it fails, then to the next configured endpoint in
//! turn. etcd-client's own balancing channel keeps choosing a member that is
//! down (a refused connection leaves it "ready"), so the store keeps one
//! client per endpoint and fails over itself; it does not balance load.
//! Retrying and timeouts are the store's job.

use crate::failure::Failure;
use etcd_client::{Client, ConnectOptions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The configured members and the one in use.
pub(crate) struct Members {
    endpoints: Vec<String>,
    options: ConnectOptions,
    /// One client per endpoint, made when first needed (with a user,
    /// making one authenticates, which needs the member up).
    clients: Vec<Mutex<Option<Client>>>,
    current: AtomicUsize,
}

impl Members {
    pub(crate) fn new(endpoints: Vec<String>, options: ConnectOptions) -> Members {
        assert!(!endpoints.is_empty(), "the configuration was checked");
        let clients = endpoints.iter().map(|_| Mutex::new(None)).collect();
        Members {
            endpoints,
            options,
            clients,
            current: AtomicUsize::new(0),
        }
    }

    /// How many members are configured.
    pub(crate) fn count(&self) -> usize {
        self.endpoints.len()
    }

    /// The member in use.
    pub(crate) fn current(&self) -> usize {
        self.current.load(Ordering::SeqCst)
    }

    /// A client of member `index`.
    pub(crate) async fn client(&self, index: usize) -> Result<Client, Failure> {
        let made = self.clients[index].lock().expect("client lock").clone();
        if let Some(client) = made {
            return Ok(client);
        }
        let endpoint = [self.endpoints[index].as_str()];
        let client = Client::connect(endpoint, Some(self.options.clone())).await?;
        // Two threads may both have made one; either will do.
        *self.clients[index].lock().expect("client lock") = Some(client.clone());
        Ok(client)
    }

    /// Reaching member `index` failed: use the next one (unless another
    /// request already moved on).
    pub(crate) fn failed(&self, index: usize) {
        let next = (index + 1) % self.endpoints.len();
        let _ = self
            .current
            .compare_exchange(index, next, Ordering::SeqCst, Ordering::SeqCst);
    }
}
