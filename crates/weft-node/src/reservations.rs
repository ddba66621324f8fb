//! The NVMe reservations of the node's volumes: one cell per volume that the
//! data plane checks I/O against (see `weft_proto::reservation`), and a
//! keeper thread that runs the reservation commands hosts send.
//!
//! The store is the truth: `reservations/<volume>` ([`ReservationRecord`]).
//! The keeper applies a command to the recorded state, commits the new
//! state, installs it in the cell and only then completes the command; so a
//! state a host was told about survives a restart of the node, and whichever
//! node serves the volume next (a replicated volume's new primary) loads it
//! when it builds its exports, since every change is committed under the
//! volume record it read: a node that lost the volume (a deposed primary)
//! commits nothing.
//!
//! A change that takes write access from a host (a preemption) completes
//! only once that host's writes already on their way to the media are done
//! (see `ReservationCell::drained`).
//!
//! What this does not do: serve reservations on device namespaces (they have
//! no record in the store).

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use weft_control::{
    reservation_key, Condition, DesiredState, HeldReservation, RegistrantRecord, ReservationRecord,
    StoreError, Txn, VolumeRecord,
};
use weft_proto::reservation::{
    HostIdentifier, Registrant, Reservation, ReservationCell, ReservationCommand, ReservationState,
    ReservationType,
};
use weft_proto::status::Status;
use weft_proto::IoError;
use weft_target::{VolumeOutcome, VolumeReply};

/// How many times a commit that lost a race with another change of the
/// volume's record is tried again (from a fresh read) before the host is
/// told to retry.
const COMMIT_ATTEMPTS: u32 = 20;

/// Pause between attempts: the node's copy of the store catches up.
const RETRY_PAUSE: Duration = Duration::from_millis(25);

/// How long a preemption waits at most for the fenced hosts' writes already
/// on their way to the media: well within a Linux host's 30 s command
/// timeout (a write that takes longer has failed on its path: replication
/// and device timeouts are shorter).
const DRAIN_WAIT_MAX: Duration = Duration::from_secs(10);

/// How often the drain is looked at.
const DRAIN_POLL: Duration = Duration::from_millis(1);

/// One reservation command for the keeper.
#[derive(Debug)]
pub(crate) struct ReservationJob {
    /// The volume.
    pub volume: String,
    /// Its id (hex) as its record has it: a replicated volume's copies
    /// each have a local id of their own, but one record.
    pub id: String,
    /// This node's name in a cluster: it must serve the volume.
    pub node: Option<String>,
    /// Who sent the command.
    pub host: HostIdentifier,
    /// The command.
    pub command: ReservationCommand,
    /// Where the result goes.
    pub reply: VolumeReply,
}

/// The cells of the node's volumes and the keeper's queue.
#[derive(Debug)]
pub(crate) struct Reservations {
    shared: Arc<Shared>,
    jobs: Sender<ReservationJob>,
}

#[derive(Debug)]
struct Shared {
    desired: DesiredState,
    /// By volume name: the volume's id and its cell.
    cells: Mutex<BTreeMap<String, (String, Arc<ReservationCell>)>>,
}

impl Reservations {
    /// Starts the keeper; it stops when this is dropped.
    pub(crate) fn start(desired: DesiredState) -> std::io::Result<Reservations> {
        let shared = Arc::new(Shared {
            desired,
            cells: Mutex::default(),
        });
        let (jobs, queue) = mpsc::channel();
        let keeper = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("weft-reservations".into())
            .spawn(move || keeper.run(&queue))?;
        Ok(Reservations { shared, jobs })
    }

    /// Queues a command; the keeper answers through its reply.
    pub(crate) fn submit(&self, job: ReservationJob) {
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            job.reply.send(VolumeOutcome::Done(Err(IoError::Busy)));
        }
    }

    /// The cell of volume `name` (id `id`), with the recorded state loaded
    /// unless the cell holds a later one.
    pub(crate) fn cell(&self, name: &str, id: &str) -> Arc<ReservationCell> {
        let cell = {
            let mut cells = self.shared.lock();
            match cells.get(name) {
                Some((known, cell)) if known == id => Arc::clone(cell),
                _ => {
                    let cell = Arc::new(ReservationCell::new());
                    cells.insert(name.to_string(), (id.to_string(), Arc::clone(&cell)));
                    cell
                }
            }
        };
        match self.shared.recorded(name, id) {
            Ok((Some(revision), state)) => {
                cell.install(revision, state);
            }
            Ok((None, _)) => {}
            Err(error) => log::warn!("volume {name}: its reservations could not be read: {error}"),
        }
        cell
    }

    /// Forgets the cells of volumes not in `names`.
    pub(crate) fn retain(&self, names: &std::collections::BTreeSet<String>) {
        self.shared.lock().retain(|name, _| names.contains(name));
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, Arc<ReservationCell>)>> {
        self.cells.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run(&self, queue: &Receiver<ReservationJob>) {
        while let Ok(job) = queue.recv() {
            let result = self.execute(&job);
            job.reply.send(VolumeOutcome::Done(result));
        }
    }

    fn execute(&self, job: &ReservationJob) -> Result<(), IoError> {
        for _ in 0..COMMIT_ATTEMPTS {
            match self.try_execute(job) {
                Err(Attempt::Raced) => std::thread::sleep(RETRY_PAUSE),
                Err(Attempt::Failed(error)) => return Err(error),
                Ok(()) => return Ok(()),
            }
        }
        log::warn!(
            "volume {}: a reservation command lost {COMMIT_ATTEMPTS} races with other changes of the volume's record; the host may retry",
            job.volume
        );
        Err(IoError::Busy)
    }

    /// One read, apply and commit.
    fn try_execute(&self, job: &ReservationJob) -> Result<(), Attempt> {
        let volume_key = format!("volumes/{}", job.volume);
        let volume = self
            .desired
            .read::<VolumeRecord>(&volume_key)
            .map_err(Attempt::store)?;
        if let Some(volume) = &volume {
            check_served(&volume.record, job)?;
        }
        let (revision, state) = self
            .recorded(&job.volume, &job.id)
            .map_err(Attempt::store)?;
        let next = state
            .apply(job.host, job.command)
            .map_err(|status| Attempt::Failed(refusal(status)))?;
        let key = reservation_key(&job.volume);
        let record = to_record(&job.id, &next);
        let served = match &volume {
            Some(volume) => Condition::At(volume_key, volume.revision),
            None => Condition::Absent(volume_key),
        };
        let value = weft_control::records::encode(&record);
        let txn = match revision {
            Some(revision) => Txn::new().update(key, value, weft_control::Revision(revision)),
            None => Txn::new().create(key, value),
        }
        .require(served);
        let committed = self.desired.store().commit(txn).map_err(Attempt::store)?;
        // Out of the map's lock before the drain: exports are built meanwhile.
        let cell = self
            .lock()
            .get(&job.volume)
            .filter(|(id, _)| *id == job.id)
            .map(|(_, cell)| Arc::clone(cell));
        if let Some(cell) = cell {
            // The state the cell served until now too, should it have been
            // behind the store's: writes admitted under it count.
            let (_, served) = cell.state();
            cell.install(committed.0, next);
            drain(&cell, &[&state, &served], &job.volume);
        }
        Ok(())
    }

    /// The recorded state of volume `name` (id `id`) and the revision of its
    /// record (also when the record is a deleted volume's: it is replaced).
    fn recorded(
        &self,
        name: &str,
        id: &str,
    ) -> Result<(Option<u64>, ReservationState), StoreError> {
        let Some(versioned) = self
            .desired
            .read::<ReservationRecord>(&reservation_key(name))?
        else {
            return Ok((None, ReservationState::default()));
        };
        let state = if versioned.record.id == id {
            from_record(&versioned.record)
        } else {
            ReservationState::default()
        };
        Ok((Some(versioned.revision.0), state))
    }
}

/// Waits until no host that one of `befores` let write and the new state
/// does not has a write on its way to the media (a preempted host's): only
/// then is the host that fenced it told so. Bounded by [`DRAIN_WAIT_MAX`].
fn drain(cell: &ReservationCell, befores: &[&ReservationState], volume: &str) {
    let start = Instant::now();
    while !befores.iter().all(|before| cell.drained(before)) {
        if start.elapsed() > DRAIN_WAIT_MAX {
            log::warn!(
                "volume {volume}: a fenced host still has writes on their way to the media after {DRAIN_WAIT_MAX:?}; the reservation command completes anyway"
            );
            return;
        }
        std::thread::sleep(DRAIN_POLL);
    }
}

/// Why one attempt did not commit.
enum Attempt {
    /// The volume's record or the reservations changed since they were read.
    Raced,
    /// The command fails with this.
    Failed(IoError),
}

impl Attempt {
    fn store(error: StoreError) -> Attempt {
        match error {
            StoreError::Conflict { .. } => Attempt::Raced,
            error => {
                log::warn!("a reservation command could not reach the store: {error}");
                Attempt::Failed(IoError::Busy)
            }
        }
    }
}

/// Refuses the command if this node does not serve the volume: a
/// replicated volume's primary, or a cluster volume's node, serves it.
fn check_served(record: &VolumeRecord, job: &ReservationJob) -> Result<(), Attempt> {
    let Some(node) = &job.node else {
        return Ok(());
    };
    if record.id != job.id {
        return Err(Attempt::Failed(IoError::Other));
    }
    let serving = match &record.replication {
        Some(replication) => &replication.primary == node,
        None => record.node.as_ref().is_none_or(|owner| owner == node),
    };
    if serving {
        Ok(())
    } else {
        Err(Attempt::Failed(IoError::PathInaccessible))
    }
}

fn refusal(status: Status) -> IoError {
    if status == Status::RESERVATION_CONFLICT {
        IoError::ReservationConflict
    } else {
        IoError::InvalidField
    }
}

fn to_record(id: &str, state: &ReservationState) -> ReservationRecord {
    ReservationRecord {
        id: id.to_string(),
        generation: state.generation,
        registrants: state
            .registrants
            .iter()
            .map(|r| RegistrantRecord {
                host_id: crate::identity::hex(&r.host.0),
                key: r.key,
            })
            .collect(),
        reservation: state.reservation.map(|r| HeldReservation {
            holder: crate::identity::hex(&r.holder.0),
            kind: r.kind as u8,
        }),
    }
}

/// The state a record holds; entries it cannot read are left out (and
/// logged), which releases rather than invents a reservation.
fn from_record(record: &ReservationRecord) -> ReservationState {
    let host = |text: &str| {
        let parsed = crate::identity::parse_hex16(text).map(HostIdentifier);
        if parsed.is_none() {
            log::warn!("a reservation record holds a damaged host identifier {text:?}: left out");
        }
        parsed
    };
    let registrants: Vec<Registrant> = record
        .registrants
        .iter()
        .filter_map(|r| {
            Some(Registrant {
                host: host(&r.host_id)?,
                key: r.key,
            })
        })
        .collect();
    let reservation = record.reservation.as_ref().and_then(|held| {
        Some(Reservation {
            holder: host(&held.holder)?,
            kind: ReservationType::from_raw(held.kind)?,
        })
    });
    ReservationState {
        generation: record.generation,
        registrants,
        reservation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_control::{MemoryStore, Store};
    use weft_proto::reservation::{AcquireAction, RegisterAction};

    const A: HostIdentifier = HostIdentifier([0xA; 16]);

    fn job(
        volume: &str,
        command: ReservationCommand,
    ) -> (ReservationJob, mpsc::Receiver<VolumeOutcome>) {
        let (reply, answer) = mpsc::channel();
        let job = ReservationJob {
            volume: volume.into(),
            id: "00".repeat(16),
            node: None,
            host: A,
            command,
            reply: VolumeReply::channel(reply),
        };
        (job, answer)
    }

    fn register(key: u64) -> ReservationCommand {
        ReservationCommand::Register {
            action: RegisterAction::Register,
            ignore_key: false,
            current_key: 0,
            new_key: key,
        }
    }

    #[test]
    fn a_command_is_recorded_before_it_completes_and_loaded_by_the_next_node() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let desired = DesiredState::shared(Arc::clone(&store), "n1");
        let reservations = Reservations::start(desired.clone()).expect("starts");
        let id = "00".repeat(16);
        let cell = reservations.cell("v", &id);
        let (job1, answer) = job("v", register(7));
        reservations.submit(job1);
        assert_eq!(answer.recv(), Ok(VolumeOutcome::Done(Ok(()))));
        let acquire = ReservationCommand::Acquire {
            action: AcquireAction::Acquire,
            kind: ReservationType::WriteExclusive,
            current_key: 7,
            preempt_key: 0,
        };
        let (job2, answer) = job("v", acquire);
        reservations.submit(job2);
        assert_eq!(answer.recv(), Ok(VolumeOutcome::Done(Ok(()))));
        let (_, installed) = cell.state();
        assert!(installed.holds(A));
        // Another node (or this one restarted) loads the same state.
        let other = Reservations::start(DesiredState::shared(store, "n2")).expect("starts");
        assert_eq!(other.cell("v", &id).state().1, installed);
        // A recreated volume (another id) starts with none.
        assert_eq!(
            other.cell("v", &"11".repeat(16)).state().1,
            ReservationState::default()
        );
        // A conflict is answered as one and changes nothing.
        let (job3, answer) = job("v", register(8));
        reservations.submit(job3);
        assert_eq!(
            answer.recv(),
            Ok(VolumeOutcome::Done(Err(IoError::ReservationConflict)))
        );
        assert_eq!(cell.state().1, installed);
    }

    #[test]
    fn a_node_that_does_not_serve_the_volume_changes_nothing() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let desired = DesiredState::shared(Arc::clone(&store), "n1");
        let id = "00".repeat(16);
        desired
            .change_volume("v", &id, |record| record.node = Some("n2".into()))
            .expect("recorded");
        let reservations = Reservations::start(desired.clone()).expect("starts");
        let (mut refused, answer) = job("v", register(7));
        refused.node = Some("n1".into());
        reservations.submit(refused);
        assert_eq!(
            answer.recv(),
            Ok(VolumeOutcome::Done(Err(IoError::PathInaccessible)))
        );
        assert_eq!(
            desired.read::<ReservationRecord>("reservations/v"),
            Ok(None)
        );
    }

    #[test]
    fn records_round_trip_and_damaged_entries_are_left_out() {
        let state = ReservationState {
            generation: 3,
            registrants: vec![Registrant { host: A, key: 5 }],
            reservation: Some(Reservation {
                holder: A,
                kind: ReservationType::ExclusiveAccessAllRegistrants,
            }),
        };
        let record = to_record("ab", &state);
        assert_eq!(from_record(&record), state);
        let mut damaged = record;
        damaged.registrants[0].host_id = "zz".into();
        damaged.reservation.as_mut().unwrap().kind = 9;
        let read = from_record(&damaged);
        assert_eq!(read.registrants, vec![]);
        assert_eq!(read.reservation, None);
    }
}
