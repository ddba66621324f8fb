//! The task behind one [`weft_control::Store::watch`]: it turns an etcd
//! watch stream into [`WatchEvent`]s on a channel, and ends with
//! [`WatchEvent::Lost`] when etcd cancels the watch (compaction, no leader)
//! or the stream breaks. Starting the watch (and refusing compacted
//! revisions) is the store's job.

use crate::codec::{revision, Keys};
use crate::failure::{Context, Failure};
use etcd_client::{EventType, WatchResponse, WatchStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use weft_control::WatchEvent;

/// Counts a running watch task for as long as it lives.
pub(crate) struct Running(Arc<AtomicUsize>);

impl Running {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Running {
        count.fetch_add(1, Ordering::SeqCst);
        Running(count.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why etcd ended a watch, from its cancel response.
pub(crate) fn cancel_failure(response: &WatchResponse) -> Failure {
    let reason = response.cancel_reason();
    if response.compact_revision() != 0 {
        Failure::Compacted
    } else if reason.contains("permission denied") {
        Failure::PermissionDenied
    } else if reason.contains("no leader") || reason.is_empty() {
        Failure::Unreachable(format!("etcd cancelled the watch: {reason}"))
    } else {
        Failure::Refused(reason.trim_start_matches("etcdserver: ").to_string())
    }
}

/// Forwards the events of `stream` to `sender` until the watch is lost or
/// the receiver is gone (noticed at the next event: a std channel tells
/// its sender only when sent to, as the memory store's watchers are).
pub(crate) async fn follow(
    mut stream: WatchStream,
    sender: Sender<WatchEvent>,
    keys: Keys,
    context: Context,
    _running: Running,
) {
    let lost = loop {
        let response = match stream.message().await {
            Ok(Some(response)) => response,
            Ok(None) => break "etcd ended the watch".to_string(),
            Err(error) => break lost_message(&context, Failure::from(error)),
        };
        if response.canceled() || response.compact_revision() != 0 {
            let failure = cancel_failure(&response);
            break match failure {
                Failure::Compacted => format!(
                    "etcd no longer keeps the changes this watch missed (compacted at revision {})",
                    response.compact_revision()
                ),
                other => lost_message(&context, other),
            };
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let decoded = match event.event_type() {
                EventType::Put => keys
                    .entry(kv.key(), kv.value(), kv.mod_revision(), kv.lease())
                    .map(WatchEvent::Put),
                EventType::Delete => keys
                    .relative(kv.key())
                    .map(|key| WatchEvent::Delete(key, revision(kv.mod_revision()))),
            };
            let event = match decoded {
                Ok(event) => event,
                Err(message) => {
                    let _ = sender.send(WatchEvent::Lost(format!(
                        "{}: {message}",
                        context.location()
                    )));
                    return;
                }
            };
            if sender.send(event).is_err() {
                return; // The receiver was dropped; dropping the stream cancels the watch.
            }
        }
    };
    let _ = sender.send(WatchEvent::Lost(lost));
}

/// A lost watch's reason, in the words a store error would use.
fn lost_message(context: &Context, failure: Failure) -> String {
    context.error(failure).to_string()
}
