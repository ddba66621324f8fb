//! The primary's files, written off the replicator's turns: the write
//! intent's marked and kept regions (`crate::intents`) and its
//! run file (`super::run`) change on a thread of their own, in the order
//! the replication core asked, and each answer comes back as an event.
//! The replicator holds the core's actions after each change until its
//! answer is in (a write intent is durable before the writes it covers go
//! anywhere), but goes on reaping its ring meanwhile: a file write and its
//! `fsync`s take milliseconds, which the replicator, a reactor's guest,
//! must not spend on that reactor (every connection on it would wait).
//!
//! What this does not do: decide what is written (the core's actions do),
//! or write the intent's cleared regions (the manager does, lazily).

use super::run::RunFile;
use super::{Event, Events};
use crate::intents::IntentFile;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;

/// A change to the primary's files.
#[derive(Debug)]
pub(crate) enum FileChange {
    /// Mark a region in the write intent (durable before its writes).
    Mark(u32),
    /// Keep a region (durable before the clean that follows).
    Keep(u32),
    /// Every member is in sync: none kept, none to rebuild in full.
    AllInSync,
    /// The member on this node is rebuilt in full (durable: after a
    /// restart it would pass for one whose missed regions are known).
    Full(String),
}

/// The thread that writes the files, as the replicator holds it.
pub(crate) struct Durable {
    changes: Sender<FileChange>,
    /// Changes queued or being made.
    pending: Arc<AtomicUsize>,
}

impl Durable {
    /// Starts the thread of `volume`'s files; answers go to `events` as
    /// [`Event::Durable`]. It ends once this is dropped.
    pub(crate) fn start(
        volume: &str,
        intent: Arc<IntentFile>,
        mut run_file: RunFile,
        events: Events,
    ) -> std::io::Result<Durable> {
        let (changes, queue) = mpsc::channel::<FileChange>();
        let pending = Arc::new(AtomicUsize::new(0));
        let (name, done) = (volume.to_string(), Arc::clone(&pending));
        std::thread::Builder::new()
            .name(format!("files-{volume}"))
            .spawn(move || {
                for change in queue {
                    let result = apply(&name, &intent, &mut run_file, change);
                    done.fetch_sub(1, Ordering::AcqRel);
                    if events.send(Event::Durable(result)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Durable { changes, pending })
    }

    /// Queues `change`; its answer comes as an event.
    pub(crate) fn change(&self, change: FileChange) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        // The thread ends only once this is dropped.
        let _ = self.changes.send(change);
    }

    /// Whether no change is queued or being made (a primary that stopped
    /// waits for that before the next may begin: they write the same files).
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }
}

/// Makes `change`; what could not be made durable, if anything.
fn apply(
    volume: &str,
    intent: &IntentFile,
    run_file: &mut RunFile,
    change: FileChange,
) -> Result<(), String> {
    match change {
        FileChange::Mark(region) => intent
            .mark(region..region + 1)
            .map_err(|error| format!("its write intent: {error}")),
        FileChange::Keep(region) => intent
            .keep(region)
            .map_err(|error| format!("its kept regions: {error}")),
        FileChange::AllInSync => {
            intent.forget_kept();
            if let Err(error) = run_file.all_in_sync() {
                // Only costs a larger rebuild after a restart.
                log::warn!("volume {volume}: {error} (its primary file)");
            }
            Ok(())
        }
        FileChange::Full(name) => run_file
            .add_full(&name)
            .map_err(|error| format!("that the replica on {name} is rebuilt in full: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn answer(inbox: &super::super::Inbox) -> Result<(), String> {
        match inbox.receiver.recv_timeout(Duration::from_secs(5)) {
            Ok(Event::Durable(result)) => result,
            _ => panic!("no answer from the files' thread"),
        }
    }

    #[test]
    fn changes_are_made_in_order_and_each_is_answered_with_its_failure() {
        let dir = std::env::temp_dir().join(format!("weft-durable-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let intent = Arc::new(IntentFile::open(&dir, "db1", 8 << 20));
        let mut run_file = RunFile::load(&dir, "db1", "id-1");
        run_file.begin(3, false).unwrap();
        let (events, inbox) = Events::channel().unwrap();
        let files = Durable::start("db1", Arc::clone(&intent), run_file, events).unwrap();

        files.change(FileChange::Mark(2));
        files.change(FileChange::Full("n2".into()));
        assert_eq!(answer(&inbox), Ok(()));
        assert_eq!(answer(&inbox), Ok(()));
        assert!(files.is_idle());
        assert_eq!(
            IntentFile::open(&dir, "db1", 8 << 20).intent().marked(),
            vec![2]
        );
        assert_eq!(
            RunFile::load(&dir, "db1", "id-1").full,
            vec!["n2".to_string()]
        );

        files.change(FileChange::AllInSync);
        assert_eq!(answer(&inbox), Ok(()));
        assert!(RunFile::load(&dir, "db1", "id-1").full.is_empty());

        // A file where its directory was: the next mark cannot be made durable.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::write(&dir, b"").unwrap();
        files.change(FileChange::Mark(5));
        let failed = answer(&inbox).unwrap_err();
        assert!(failed.starts_with("its write intent: "), "{failed}");
        assert!(files.is_idle());
        std::fs::remove_file(&dir).unwrap();
    }
}
