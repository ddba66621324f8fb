//! weft's replica fence: which primary session may write to a replica.
//!
//! A replicated volume's secondary exports its replica on a private
//! subsystem ([`crate::target::SubsystemConfig::fenced`]), where only the
//! controller holding the fence may run I/O; every other controller's I/O
//! completes with Reservation Conflict (with DNR). A primary takes the fence
//! with a vendor-specific Set Features ([`FENCE_FEATURE`], C0h, in the
//! vendor range C0h-FFh of NVMe Base 2.0, Figure 317) carrying its token:
//! session in CDW11, epoch in CDW12 (low) and CDW13 (high). Tokens only
//! grow: a fence with a token no larger than the current one is refused
//! with Reservation Conflict, and the current epoch in the completion's
//! result, so that a deposed primary learns a newer one exists.
//!
//! Taking the fence takes it from every other controller at once (their new
//! commands are refused, and a write whose data arrives later is refused
//! then), but the Set Features completes only once no other controller of
//! the subsystem has a command on its way to the media: after the answer,
//! no write of an older session can reach the media. Commands count from
//! the moment they are handed to the media (not while their data is still
//! awaited, which an unreachable old primary could make last for ever).
//!
//! The target's own node may write to the same media outside any
//! connection: a replicated volume's primary writes its local copy, which
//! its node's replica subsystem exports. It takes the fence like any
//! controller ([`Fences::fence_local`], session 0 of its epoch) and counts
//! each local write ([`LocalFence::enter`]): a newer primary's fence then
//! refuses its later writes and is answered only once those on their way
//! (held in a volume manager's queue, say) reached the media, so that none
//! lands on a region the newer primary copied after it.
//!
//! Who may fence: a replica's node knows, from its volume's record, the
//! primary and its epoch ([`FenceAuthority`]). A fence from another host,
//! or at another epoch, is not taken: an older epoch is refused at once
//! (with the record's epoch, so a deposed primary learns of the newer
//! one); a newer epoch, or another host at the record's epoch, waits a
//! while for the node to see a newer record (a new primary may fence
//! before the replica's node has read the record that made it so), then
//! is refused. Whoever holds a node's keys can then no longer fence a
//! replica with the largest epoch and stop its volume's writes.
//!
//! Read grants: a primary serves reads from its own copy, and a new
//! primary must not serve before the old one stopped. The node's lease
//! says so once it ran out; a replica says so sooner. Every command of the
//! fence's holder that reaches the replica grants that holder reads for
//! [`READ_GRANT`] from then on (the holder counts from when it *sent* a
//! command the replica answered, less a margin, and keeps idle links busy
//! with [`GRANT_OPCODE`], a vendor I/O command with no data that does
//! nothing else). A fence that takes the subsystem from another node's
//! session after a promotion ([`FenceAuthority::waits_for_grants`]) is
//! answered only once the grant it ends ran out ([`Fences::grant_ends`]),
//! and so is a new primary's own local fence: by the time the new primary
//! serves, the old one stopped serving reads, whether it is dead, hung or
//! cut off. A planned handover's old primary stopped serving before it
//! committed the record, and is not waited for; neither is a session of
//! the same node (a primary re-attaching, or serving its next epoch). A
//! target that restarted does not know whom its last process granted
//! reads: the target's clock starts with its process, so such grants ran
//! out [`READ_GRANT`] after it at the latest, and a fence that finds no
//! earlier holder waits until then.
//!
//! What this does not do: persist the fence (a restarted target admits
//! nothing until fenced anew, and a restart ends every connection, so no
//! older session can speak again), or know what an epoch means (weft's
//! replication core does).

use crate::target::ControllerShared;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Feature identifier of the replica fence (vendor specific).
pub const FENCE_FEATURE: u8 = 0xC0;

/// A primary's fencing token: its epoch, then its session with this replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceToken {
    /// The primary's epoch.
    pub epoch: u64,
    /// Its attachment of this replica within the epoch.
    pub session: u32,
}

impl FenceToken {
    /// The token of a fence Set Features (CDW11 to CDW13).
    pub fn from_cdws(cdw11: u32, cdw12: u32, cdw13: u32) -> FenceToken {
        FenceToken {
            epoch: u64::from(cdw12) | (u64::from(cdw13) << 32),
            session: cdw11,
        }
    }

    /// CDW11 to CDW13 of a fence Set Features carrying this token.
    pub fn cdws(&self) -> [u32; 3] {
        [self.session, self.epoch as u32, (self.epoch >> 32) as u32]
    }
}

/// How long a command of the fence's holder lets it serve reads (see the
/// module's docs): a promotion's fence waits this long after the old
/// holder's last command reached this replica.
pub const READ_GRANT: std::time::Duration = std::time::Duration::from_secs(1);

/// weft's read-grant command: a vendor-specific I/O command (opcodes 80h
/// to FFh, NVM Command Set 1.0, Figure 11; bits 1:0 clear: no data) that a
/// fenced subsystem's holder sends on an idle link to renew its grant.
/// Refused with Reservation Conflict, as any I/O, once another fenced.
pub const GRANT_OPCODE: u8 = 0x88;

/// How long a fence its node's record does not admit yet waits for one
/// that does: the time a node takes to see a new primary's record, with
/// room to spare.
pub const FENCE_ADMISSION_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Who may take a replica subsystem's fence: the primary its node's copy
/// of the volume's record names (by its host NQN), at the record's epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceAuthority {
    /// The host NQN the record's primary connects with.
    pub host_nqn: String,
    /// The record's epoch.
    pub epoch: u64,
    /// The record made its primary by promotion, deposing the previous one
    /// (not by the previous primary's own handover): a fence waits out the
    /// read grant of the other node that held it (see the module's docs).
    pub waits_for_grants: bool,
}

/// What a [`FenceAuthority`] says of a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceAdmission {
    /// The record's primary at the record's epoch: it may be taken.
    Admitted,
    /// An older epoch than the record's (given): refused.
    Stale(u64),
    /// A newer epoch, or another host: only a newer record could admit it.
    Unknown,
}

impl FenceAuthority {
    /// Whether host `host_nqn` may fence with `token`.
    pub fn admits(&self, host_nqn: &str, token: FenceToken) -> FenceAdmission {
        if token.epoch < self.epoch {
            FenceAdmission::Stale(self.epoch)
        } else if token.epoch == self.epoch && host_nqn == self.host_nqn {
            FenceAdmission::Admitted
        } else {
            FenceAdmission::Unknown
        }
    }
}

#[derive(Debug, Default)]
struct Fence {
    token: FenceToken,
    holder: Option<Arc<ControllerShared>>,
    /// Controllers that have run fenced I/O on the subsystem: a new fence
    /// waits until none but the new holder has any on its way.
    participants: Vec<Arc<ControllerShared>>,
    /// The last host's controller that held the fence: the one whose reads
    /// a grant from this replica may let go on.
    grantee: Option<Arc<ControllerShared>>,
    /// The grant the holder took the fence from.
    owed: Owed,
    /// The holder's fence was answered: until then it waits on this
    /// replica, and its silence says nothing.
    answered: bool,
}

/// The read grant a fence ended (see the module's docs).
#[derive(Debug, Default)]
enum Owed {
    /// None: the fence's first holder since the target started, whose
    /// previous process may have granted reads to anyone.
    #[default]
    SinceStart,
    /// None but its own node's.
    Nothing,
    /// Another node's session's: it runs out [`READ_GRANT`] after its last
    /// command was heard.
    Grantee(Arc<ControllerShared>),
}

/// The fences of a target's fenced subsystems, by subsystem NQN. Touched by
/// fence commands, an I/O queue's first fenced command and controller
/// teardown, never per I/O (a controller's own flag says whether it holds
/// its fence, and its own counter what it has on its way to the media).
#[derive(Debug, Default)]
pub struct Fences {
    inner: Mutex<BTreeMap<String, Fence>>,
}

impl Fences {
    /// `controller` asks to fence its subsystem with `token`: on success it
    /// holds the fence and every other controller lost it; the caller
    /// answers once [`Fences::drained`]. Refused with the current token if
    /// `token` is not larger.
    pub fn fence(
        &self,
        token: FenceToken,
        controller: &Arc<ControllerShared>,
    ) -> Result<(), FenceToken> {
        let mut inner = self.lock();
        let fence = inner.entry(controller.subnqn.clone()).or_default();
        if token <= fence.token {
            return Err(fence.token);
        }
        fence.token = token;
        if let Some(previous) = fence.holder.replace(Arc::clone(controller)) {
            previous.set_fence_holder(false);
        }
        controller.set_fence_holder(true);
        fence.answered = false;
        fence.owed = match &fence.grantee {
            None => Owed::SinceStart,
            // Its own node's session: what that one's fence was owed, still.
            Some(grantee) if grantee.hostnqn == controller.hostnqn => {
                std::mem::replace(&mut fence.owed, Owed::Nothing)
            }
            Some(grantee) => Owed::Grantee(Arc::clone(grantee)),
        };
        if controller.is_remote() {
            fence.grantee = Some(Arc::clone(controller));
        }
        Ok(())
    }

    /// When the read grant `holder`'s fence ended runs out: the last
    /// command of the other node's session it took the fence from, heard
    /// plus [`READ_GRANT`] (none if its own node's, or never heard); if the
    /// fence had no holder since the target started, [`READ_GRANT`] after
    /// the start of the target's clock. Read once the fence
    /// [`Fences::drained`]: every command let through before it was taken
    /// was heard by then.
    pub fn grant_ends(&self, holder: &ControllerShared) -> Option<crate::types::Timestamp> {
        let inner = self.lock();
        let fence = inner.get(&holder.subnqn)?;
        if !fence
            .holder
            .as_ref()
            .is_some_and(|h| std::ptr::eq(Arc::as_ptr(h), holder))
        {
            return None;
        }
        match &fence.owed {
            Owed::SinceStart => Some(crate::types::Timestamp(READ_GRANT)),
            Owed::Nothing => None,
            Owed::Grantee(grantee) => Some(grantee.heard_at()?.after(READ_GRANT)),
        }
    }

    /// Whether no controller of `holder`'s subsystem but `holder` has fenced
    /// I/O on its way to the media (participants that are gone and idle are
    /// forgotten).
    pub fn drained(&self, holder: &ControllerShared) -> bool {
        let mut inner = self.lock();
        let Some(fence) = inner.get_mut(&holder.subnqn) else {
            return true;
        };
        fence
            .participants
            .retain(|c| c.is_alive() || c.fenced_io_in_flight() > 0);
        fence
            .participants
            .iter()
            .all(|c| std::ptr::eq(Arc::as_ptr(c), holder) || c.fenced_io_in_flight() == 0)
    }

    /// This target's own writer to subsystem `subnqn`'s media takes its
    /// fence with `token` and joins it (see the module's docs); refused
    /// with the current token if `token` is not larger. The caller waits
    /// for [`LocalFence::drained`] before it writes.
    pub fn fence_local(
        self: &Arc<Self>,
        subnqn: &str,
        token: FenceToken,
    ) -> Result<LocalFence, FenceToken> {
        let writer = Arc::new(ControllerShared::local_writer(subnqn));
        self.fence(token, &writer)?;
        self.join(&writer);
        Ok(LocalFence {
            fences: Arc::clone(self),
            writer,
        })
    }

    /// `controller` is about to run fenced I/O for the first time on a queue.
    pub fn join(&self, controller: &Arc<ControllerShared>) {
        let mut inner = self.lock();
        let fence = inner.entry(controller.subnqn.clone()).or_default();
        if !fence
            .participants
            .iter()
            .any(|c| Arc::ptr_eq(c, controller))
        {
            fence.participants.push(Arc::clone(controller));
        }
    }

    /// Whether the primary `authority` names, at its epoch, holds (or was
    /// the last of another node to hold) subsystem `subnqn`'s fence and
    /// has not been heard for [`READ_GRANT`] at `now`: dead, hung or cut
    /// off from this replica, and no longer granted reads by it. What a
    /// replica's node tells the cluster's controller, which may then promote
    /// without waiting for the primary's lease (see the module's docs).
    pub fn holder_silent(
        &self,
        subnqn: &str,
        authority: &FenceAuthority,
        now: crate::types::Timestamp,
    ) -> bool {
        let inner = self.lock();
        let Some(fence) = inner.get(subnqn) else {
            return false;
        };
        let Some(grantee) = &fence.grantee else {
            return false;
        };
        // Not once this target's own writer holds it (its node is
        // primary), nor while a holder's fence waits to be answered.
        fence
            .holder
            .as_ref()
            .is_none_or(|h| h.is_remote() && fence.answered)
            && fence.token.epoch == authority.epoch
            && grantee.hostnqn == authority.host_nqn
            && grantee
                .heard_at()
                .is_some_and(|heard| now >= heard.after(READ_GRANT))
    }

    /// `holder`'s fence was answered at `now` (it settled): its grant, and
    /// its silence, run from here.
    pub fn answered(&self, holder: &ControllerShared, now: crate::types::Timestamp) {
        holder.heard(now);
        let mut inner = self.lock();
        if let Some(fence) = inner.get_mut(&holder.subnqn) {
            if fence
                .holder
                .as_ref()
                .is_some_and(|h| std::ptr::eq(Arc::as_ptr(h), holder))
            {
                fence.answered = true;
            }
        }
    }

    /// The current token of subsystem `subnqn`'s fence (the default before any).
    pub fn token(&self, subnqn: &str) -> FenceToken {
        self.lock().get(subnqn).map(|f| f.token).unwrap_or_default()
    }

    /// A controller is torn down: it holds nothing any more (the token stays,
    /// so that only a larger one may fence again).
    pub fn forget(&self, controller: &Arc<ControllerShared>) {
        let mut inner = self.lock();
        if let Some(fence) = inner.get_mut(&controller.subnqn) {
            if fence
                .holder
                .as_ref()
                .is_some_and(|h| Arc::ptr_eq(h, controller))
            {
                fence.holder = None;
            }
        }
        controller.set_fence_holder(false);
    }

    /// Forgets the fences of subsystems that are no longer exported (a
    /// volume deleted and created again starts from epoch 1), but for one
    /// a live holder has (a local writer's, whose subsystem may be
    /// exported a moment after it fenced); of one whose read grant may
    /// still run at `now`, it keeps the grantee alone (a subsystem exported
    /// again at once must not forget whom it granted reads).
    pub fn retain(&self, exported: impl Fn(&str) -> bool, now: crate::types::Timestamp) {
        self.lock().retain(|subnqn, fence| {
            if exported(subnqn) || fence.holder.as_ref().is_some_and(|h| h.is_alive()) {
                return true;
            }
            let granting = fence
                .grantee
                .as_ref()
                .and_then(|grantee| grantee.heard_at())
                .is_some_and(|heard| now < heard.after(READ_GRANT));
            if granting {
                *fence = Fence {
                    grantee: fence.grantee.take(),
                    owed: std::mem::take(&mut fence.owed),
                    ..Fence::default()
                };
            }
            granting
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Fence>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The target's own writer holding (or having held) a fenced subsystem's
/// fence; dropped when it stops writing.
#[derive(Debug)]
pub struct LocalFence {
    fences: Arc<Fences>,
    writer: Arc<ControllerShared>,
}

impl LocalFence {
    /// Whether no other writer of the subsystem has I/O on its way to the
    /// media (the fence is then its own).
    pub fn drained(&self) -> bool {
        self.fences.drained(&self.writer)
    }

    /// When the read grant of the other node it took the fence from runs
    /// out (see [`Fences::grant_ends`]): a promoted primary serves after it.
    pub fn grant_ends(&self) -> Option<crate::types::Timestamp> {
        self.fences.grant_ends(&self.writer)
    }

    /// A write is about to go to the media: counted until the guard drops,
    /// or refused (none) if a newer fence took the subsystem: it must not run.
    pub fn enter(&self) -> Option<FencedIo> {
        self.writer
            .fenced_io_enter()
            .then(|| FencedIo(Arc::clone(&self.writer)))
    }

    /// Whether it still holds the fence.
    pub fn holds(&self) -> bool {
        self.writer.holds_fence()
    }
}

impl Drop for LocalFence {
    fn drop(&mut self) {
        self.fences.forget(&self.writer);
        self.writer.set_gone();
    }
}

/// A local write counted against a fence until it is dropped (it reached
/// the media, or failed).
#[derive(Debug)]
pub struct FencedIo(Arc<ControllerShared>);

impl Drop for FencedIo {
    fn drop(&mut self) {
        self.0.fenced_io_done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::ControllerRegistry;

    fn token(epoch: u64, session: u32) -> FenceToken {
        FenceToken { epoch, session }
    }

    #[test]
    fn only_the_records_primary_at_the_records_epoch_is_admitted() {
        let authority = FenceAuthority {
            host_nqn: "nqn.node:n1".into(),
            epoch: 4,
            waits_for_grants: true,
        };
        let admits = |host: &str, epoch| authority.admits(host, token(epoch, 7));
        assert_eq!(admits("nqn.node:n1", 4), FenceAdmission::Admitted);
        assert_eq!(admits("nqn.node:n1", 3), FenceAdmission::Stale(4));
        assert_eq!(admits("nqn.node:n2", 3), FenceAdmission::Stale(4));
        assert_eq!(admits("nqn.node:n1", u64::MAX), FenceAdmission::Unknown);
        assert_eq!(admits("nqn.node:n2", 4), FenceAdmission::Unknown);
        assert_eq!(admits("nqn.node:n2", 5), FenceAdmission::Unknown);
    }

    #[test]
    fn tokens_only_grow_and_a_fence_waits_for_every_other_controller() {
        let registry = ControllerRegistry::default();
        let a = registry.create("nqn.r", "nqn.a", [1; 16], 8).unwrap();
        let b = registry.create("nqn.r", "nqn.b", [2; 16], 8).unwrap();
        let fences = Fences::default();
        assert!(!a.fenced_io_enter(), "no fence: no I/O");
        fences.fence(token(1, 1), &a).unwrap();
        fences.join(&a);
        assert!(a.fenced_io_enter() && a.holds_fence() && !b.holds_fence());
        fences.fence(token(2, 1), &b).unwrap();
        assert!(!a.holds_fence() && b.holds_fence());
        assert!(!fences.drained(&b), "a's write is on its way");
        assert!(!a.fenced_io_enter(), "a's next is refused");
        a.fenced_io_done();
        assert!(fences.drained(&b));
        assert_eq!(fences.fence(token(1, 9), &a).unwrap_err(), token(2, 1));
        assert_eq!(fences.fence(token(2, 1), &a).unwrap_err(), token(2, 1));
        fences.forget(&b);
        assert!(!b.holds_fence());
        assert_eq!(
            fences.token("nqn.r"),
            token(2, 1),
            "the token outlives its holder"
        );
        fences.retain(|_| false, crate::types::Timestamp::default());
        assert_eq!(
            fences.token("nqn.r"),
            FenceToken::default(),
            "gone with its subsystem"
        );
    }

    #[test]
    fn a_newer_fence_waits_for_the_local_writes_on_their_way_and_refuses_later_ones() {
        let registry = ControllerRegistry::default();
        let fences = Arc::new(Fences::default());
        let local = fences.fence_local("nqn.r", token(3, 0)).unwrap();
        assert!(local.drained() && local.holds());
        let held = local.enter().expect("its own fence: it writes");
        let newer = registry.create("nqn.r", "nqn.b", [2; 16], 8).unwrap();
        fences.fence(token(4, 1), &newer).unwrap();
        assert!(!local.holds());
        assert!(local.enter().is_none(), "a later local write is refused");
        assert!(
            !fences.drained(&newer),
            "the held local write is on its way"
        );
        drop(held);
        assert!(fences.drained(&newer));
        assert_eq!(
            fences.fence_local("nqn.r", token(4, 0)).unwrap_err(),
            token(4, 1),
            "tokens only grow for local writers too"
        );
        drop(local);
        assert!(fences.drained(&newer), "a dropped writer is forgotten");
        let writer = fences.fence_local("nqn.s", token(1, 0)).unwrap();
        fences.retain(|_| false, crate::types::Timestamp::default());
        assert_eq!(
            fences.token("nqn.s"),
            token(1, 0),
            "kept for its live holder"
        );
        drop(writer);
        fences.retain(|_| false, crate::types::Timestamp::default());
        assert_eq!(fences.token("nqn.s"), FenceToken::default());
    }

    #[test]
    fn a_local_writer_waits_for_the_old_primarys_session_before_it_writes() {
        let registry = ControllerRegistry::default();
        let fences = Arc::new(Fences::default());
        let old = registry.create("nqn.r", "nqn.a", [1; 16], 8).unwrap();
        fences.fence(token(1, 1), &old).unwrap();
        fences.join(&old);
        assert!(old.fenced_io_enter());
        let local = fences.fence_local("nqn.r", token(2, 0)).unwrap();
        assert!(!local.drained(), "the old primary's write is on its way");
        old.fenced_io_done();
        assert!(local.drained());
    }

    #[test]
    fn a_fence_learns_when_the_grant_it_ended_runs_out_and_a_same_node_session_ends_none() {
        use crate::types::Timestamp;
        let at = |ms| Timestamp(std::time::Duration::from_millis(ms));
        let registry = ControllerRegistry::default();
        let fences = Arc::new(Fences::default());
        let old = registry.create("nqn.r", "nqn.a", [1; 16], 8).unwrap();
        fences.fence(token(1, 1), &old).unwrap();
        assert_eq!(
            fences.grant_ends(&old),
            Some(at(1000)),
            "the first since the target started: its last process may have granted reads"
        );
        old.heard(at(100));
        old.heard(at(400));
        old.heard(at(300));
        assert_eq!(
            old.heard_at(),
            Some(at(400)),
            "the last heard, not the latest call"
        );
        let again = registry.create("nqn.r", "nqn.a", [1; 16], 8).unwrap();
        fences.fence(token(1, 2), &again).unwrap();
        assert_eq!(
            fences.grant_ends(&again),
            Some(at(1000)),
            "its own node's session: what the first was owed, still"
        );
        again.heard(at(500));
        // Its connection ends (a kill -9): the grant it holds does not.
        fences.forget(&again);
        let newer = registry.create("nqn.r", "nqn.b", [2; 16], 8).unwrap();
        fences.fence(token(2, 1), &newer).unwrap();
        assert_eq!(fences.grant_ends(&newer), Some(at(1500)));
        assert_eq!(fences.grant_ends(&old), None, "only for the holder");
        // The new primary's own copy, which the old one also wrote to.
        let on_b = registry.create("nqn.q", "nqn.a", [1; 16], 8).unwrap();
        fences.fence(token(1, 1), &on_b).unwrap();
        on_b.heard(at(700));
        let local = fences.fence_local("nqn.q", token(2, 0)).unwrap();
        assert_eq!(local.grant_ends(), Some(at(1700)));
        // A session never heard granted nothing.
        let silent = registry.create("nqn.s", "nqn.a", [1; 16], 8).unwrap();
        fences.fence(token(1, 1), &silent).unwrap();
        let after = fences.fence_local("nqn.s", token(2, 0)).unwrap();
        assert_eq!(after.grant_ends(), None);
        assert_eq!(
            fences
                .fence_local("nqn.t", token(1, 0))
                .unwrap()
                .grant_ends(),
            Some(at(1000)),
            "none held it since the start"
        );
    }

    #[test]
    fn a_holder_is_silent_once_unheard_for_the_grant_and_only_if_the_record_names_it() {
        use crate::types::Timestamp;
        let at = |ms| Timestamp(std::time::Duration::from_millis(ms));
        let registry = ControllerRegistry::default();
        let fences = Arc::new(Fences::default());
        let authority = FenceAuthority {
            host_nqn: "nqn.a".into(),
            epoch: 3,
            waits_for_grants: true,
        };
        assert!(
            !fences.holder_silent("nqn.r", &authority, at(5000)),
            "never fenced"
        );
        let primary = registry.create("nqn.r", "nqn.a", [1; 16], 8).unwrap();
        primary.heard(at(100));
        fences.fence(token(3, 1), &primary).unwrap();
        assert!(
            !fences.holder_silent("nqn.r", &authority, at(5000)),
            "its fence waits to be answered: it waits on this replica"
        );
        fences.answered(&primary, at(200));
        assert!(!fences.holder_silent("nqn.r", &authority, at(1199)));
        assert!(fences.holder_silent("nqn.r", &authority, at(1200)));
        // Its connection ended (a kill -9): still silent.
        fences.forget(&primary);
        assert!(fences.holder_silent("nqn.r", &authority, at(1200)));
        let newer = FenceAuthority {
            epoch: 4,
            ..authority.clone()
        };
        assert!(
            !fences.holder_silent("nqn.r", &newer, at(9000)),
            "another epoch's primary"
        );
        let other = FenceAuthority {
            host_nqn: "nqn.b".into(),
            ..authority.clone()
        };
        assert!(
            !fences.holder_silent("nqn.r", &other, at(9000)),
            "another primary"
        );
        // This node's own primary took it: nobody else's silence counts.
        let _local = fences.fence_local("nqn.r", token(4, 0)).unwrap();
        assert!(
            !fences.holder_silent("nqn.r", &newer, at(9000)),
            "even under a record that still named the old primary"
        );
    }

    #[test]
    fn tokens_travel_in_three_command_dwords() {
        let t = token(0x1_0000_0002, 7);
        let [cdw11, cdw12, cdw13] = t.cdws();
        assert_eq!((cdw11, cdw12, cdw13), (7, 2, 1));
        assert_eq!(FenceToken::from_cdws(cdw11, cdw12, cdw13), t);
    }
}
