//! Translation between weft's store types and etcd's: keys under the
//! prefix, JSON values, and a [`Txn`] as one etcd transaction whose failure
//! branch reads the keys of its conditions, so that a failed commit names
//! the first condition (in order) that did not hold, as read at the
//! revision the transaction was decided at. No I/O here.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, TxnOp, TxnOpResponse};
use std::collections::HashMap;
use weft_control::{Change, Condition, Entry, LeaseId, Revision, Txn};

/// The key prefix of one store.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    /// The etcd key of `key`.
    pub(crate) fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The weft key of an etcd key under the prefix.
    pub(crate) fn relative(&self, key: &[u8]) -> Result<String, String> {
        let key = std::str::from_utf8(key)
            .map_err(|_| format!("key {} is not UTF-8", String::from_utf8_lossy(key)))?;
        key.strip_prefix(&self.prefix)
            .map(str::to_string)
            .ok_or_else(|| format!("key {key} is not under {}", self.prefix))
    }

    /// The entry etcd holds as `key` = `value`, last written at
    /// `mod_revision` under `lease` (0: none).
    pub(crate) fn entry(
        &self,
        key: &[u8],
        value: &[u8],
        mod_revision: i64,
        lease: i64,
    ) -> Result<Entry, String> {
        let key = self.relative(key)?;
        let value =
            serde_json::from_slice(value).map_err(|error| format!("{key} is not JSON: {error}"))?;
        Ok(Entry {
            key,
            value,
            revision: revision(mod_revision),
            lease: (lease != 0).then_some(LeaseId(lease)),
        })
    }

    /// `txn` as an etcd transaction: its conditions as comparisons, its
    /// changes when they hold, and reads of the conditions' keys when not.
    pub(crate) fn transaction(&self, txn: &Txn) -> etcd_client::Txn {
        let compares: Vec<Compare> = txn
            .conditions()
            .iter()
            .map(|condition| match condition {
                Condition::Absent(key) => {
                    Compare::create_revision(self.full(key), CompareOp::Equal, 0)
                }
                // No entry was ever written at revision 0, but an absent
                // key compares as mod revision 0: make it never hold.
                Condition::At(key, Revision(0)) => {
                    Compare::create_revision(self.full(key), CompareOp::Less, 0)
                }
                Condition::At(key, revision) => Compare::mod_revision(
                    self.full(key),
                    CompareOp::Equal,
                    etcd_revision(*revision),
                ),
            })
            .collect();
        let changes: Vec<TxnOp> = last_change_of_each_key(txn.changes())
            .into_iter()
            .map(|change| match change {
                Change::Put { key, value, lease } => {
                    let options = lease.map(|lease| PutOptions::new().with_lease(lease.0));
                    TxnOp::put(self.full(key), value.to_string(), options)
                }
                Change::Delete(key) => TxnOp::delete(self.full(key), None),
            })
            .collect();
        let reads: Vec<TxnOp> = txn
            .conditions()
            .iter()
            .map(|condition| {
                TxnOp::get(
                    self.full(condition.key()),
                    Some(GetOptions::new().with_keys_only()),
                )
            })
            .collect();
        etcd_client::Txn::new()
            .when(compares)
            .and_then(changes)
            .or_else(reads)
    }
}

/// The key of the first condition of `conditions` that does not hold,
/// given the failure branch's reads of a transaction built by
/// [`Keys::transaction`].
pub(crate) fn first_failing<'a>(
    conditions: &'a [Condition],
    reads: &[TxnOpResponse],
) -> Option<&'a str> {
    conditions
        .iter()
        .zip(reads)
        .find(|(condition, read)| {
            let found = match read {
                TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.mod_revision()),
                _ => None,
            };
            !holds(condition, found)
        })
        .map(|(condition, _)| condition.key())
}

/// Whether `condition` holds for a key last written at `found` (None:
/// absent), as [`weft_control::MemoryStore`] decides it.
fn holds(condition: &Condition, found: Option<i64>) -> bool {
    match (condition, found) {
        (Condition::Absent(_), found) => found.is_none(),
        (Condition::At(_, revision), Some(found)) => etcd_revision(*revision) == found,
        (Condition::At(..), None) => false,
    }
}

/// The changes that decide each key's end state, in order: etcd refuses a
/// transaction that changes one key twice, and applying all of them in
/// order ends where applying the last change of each key does.
fn last_change_of_each_key(changes: &[Change]) -> Vec<&Change> {
    let key = |change: &Change| match change {
        Change::Put { key, .. } | Change::Delete(key) => key.clone(),
    };
    let last: HashMap<String, usize> = changes
        .iter()
        .enumerate()
        .map(|(index, change)| (key(change), index))
        .collect();
    changes
        .iter()
        .enumerate()
        .filter(|(index, change)| last[&key(change)] == *index)
        .map(|(_, change)| change)
        .collect()
}

/// A revision as etcd's signed number (revisions beyond i64 never occur).
pub(crate) fn etcd_revision(revision: Revision) -> i64 {
    i64::try_from(revision.0).unwrap_or(i64::MAX)
}

/// An etcd revision as weft's (etcd's are never negative).
pub(crate) fn revision(etcd: i64) -> Revision {
    Revision(u64::try_from(etcd).unwrap_or(0))
}

/// The leases `changes` put under, in order, without repeats.
pub(crate) fn leases_of(changes: &[Change]) -> Vec<LeaseId> {
    let mut leases = Vec::new();
    for change in changes {
        if let Change::Put {
            lease: Some(lease), ..
        } = change
        {
            if !leases.contains(lease) {
                leases.push(*lease);
            }
        }
    }
    leases
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_live_under_the_prefix() {
        let keys = Keys::new("/weft/");
        assert_eq!(keys.full("volumes/db1"), "/weft/volumes/db1");
        assert_eq!(keys.relative(b"/weft/volumes/db1").unwrap(), "volumes/db1");
        assert!(keys.relative(b"/other/x").is_err());
        assert!(keys.relative(b"/weft/\xff").is_err());
        let entry = keys.entry(b"/weft/a", br#"{"n":1}"#, 7, 0).unwrap();
        assert_eq!(
            entry,
            Entry {
                key: "a".into(),
                value: json!({"n": 1}),
                revision: Revision(7),
                lease: None
            }
        );
        assert_eq!(
            keys.entry(b"/weft/a", b"1", 7, 9).unwrap().lease,
            Some(LeaseId(9))
        );
        let error = keys.entry(b"/weft/a", b"{nope", 7, 0).unwrap_err();
        assert!(error.starts_with("a is not JSON"), "{error}");
    }

    #[test]
    fn a_key_changed_twice_keeps_its_last_change() {
        let changes = vec![
            Change::put("a", json!(1)),
            Change::put("b", json!(1)),
            Change::Delete("a".into()),
            Change::put("c", json!(1)),
            Change::put("b", json!(2)),
        ];
        let kept: Vec<&Change> = last_change_of_each_key(&changes);
        assert_eq!(kept, [&changes[2], &changes[3], &changes[4]]);
    }

    #[test]
    fn conditions_hold_as_in_the_memory_store() {
        assert!(holds(&Condition::Absent("k".into()), None));
        assert!(!holds(&Condition::Absent("k".into()), Some(3)));
        assert!(holds(&Condition::At("k".into(), Revision(3)), Some(3)));
        assert!(!holds(&Condition::At("k".into(), Revision(3)), Some(4)));
        assert!(!holds(&Condition::At("k".into(), Revision(3)), None));
        assert!(!holds(&Condition::At("k".into(), Revision(0)), None));
    }

    #[test]
    fn leases_are_listed_once_in_order() {
        let put = |key: &str, lease| Change::Put {
            key: key.into(),
            value: json!(0),
            lease: Some(LeaseId(lease)),
        };
        let changes = vec![
            put("a", 5),
            Change::put("b", json!(0)),
            put("c", 3),
            put("d", 5),
        ];
        assert_eq!(leases_of(&changes), [LeaseId(5), LeaseId(3)]);
    }
}
