//! One cluster controller at a time: the node whose lease holds the
//! `cluster/controller` key. A node campaigns at each heartbeat by creating
//! the key under its lease if it is absent; when the controller's lease
//! ends (it stopped, crashed or lost the store), the key goes with it and
//! the next node to campaign takes over. Only the controller makes
//! cluster-wide decisions (marking nodes down now, failover later), and it
//! checks it still holds the key in the same transaction as each decision
//! (see [`holds`]), so that a deposed controller's late decision fails.

use crate::records::{ControllerRecord, CONTROLLER_KEY};
use weft_control::records::{encode, read};
use weft_control::{Condition, LeaseId, Revision, Store, StoreError, Txn};

/// Makes `node` the controller if there is none; whether it is.
pub fn campaign(
    store: &dyn Store,
    node: &str,
    lease: LeaseId,
    now_unix_ms: u64,
) -> Result<bool, StoreError> {
    if let Some(entry) = store.get(CONTROLLER_KEY)? {
        return Ok(entry.lease == Some(lease));
    }
    let record = ControllerRecord {
        node: node.to_string(),
        since_unix_ms: now_unix_ms,
    };
    let txn = Txn::new().create_leased(CONTROLLER_KEY, encode(&record), Some(lease));
    match store.commit(txn) {
        Ok(_) => {
            log::info!("node {node} is now the cluster controller");
            Ok(true)
        }
        Err(StoreError::Conflict { .. }) => Ok(false),
        Err(error) => Err(error),
    }
}

/// The current controller, if any.
pub fn controller(store: &dyn Store) -> Result<Option<ControllerRecord>, StoreError> {
    Ok(read::<ControllerRecord>(store, CONTROLLER_KEY)?.map(|found| found.record))
}

/// The condition that `lease` still holds the controller key at `revision`
/// (as read by the controller): add it to every transaction that carries a
/// controller's decision.
pub fn holds(revision: Revision) -> Condition {
    Condition::At(CONTROLLER_KEY.into(), revision)
}

/// The revision of the controller key if `lease` holds it.
pub fn held_at(store: &dyn Store, lease: LeaseId) -> Result<Option<Revision>, StoreError> {
    Ok(store
        .get(CONTROLLER_KEY)?
        .filter(|entry| entry.lease == Some(lease))
        .map(|entry| entry.revision))
}
