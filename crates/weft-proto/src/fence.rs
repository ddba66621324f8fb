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
//! Taking the fence takes it from the previous holder at once (its new
//! commands are refused), but the Set Features completes only once the
//! previous holder's commands in flight are done: after the answer, no
//! write of an older session can still reach the media. The registry only
//! records; the connection parks the Set Features until the drain.
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

#[derive(Debug)]
struct Fence {
    token: FenceToken,
    holder: Option<Arc<ControllerShared>>,
}

/// The fences of a target's fenced subsystems, by subsystem NQN. Touched by
/// fence commands and controller teardown only, never per I/O (a
/// controller's own flag says whether it holds a fence).
#[derive(Debug, Default)]
pub struct Fences {
    inner: Mutex<BTreeMap<String, Fence>>,
}

impl Fences {
    /// `controller` asks to fence its subsystem with `token`. On success the
    /// previous holder, if any, no longer holds it and is returned: the
    /// caller answers once its commands in flight are done. Refused with
    /// the current token if `token` is not larger.
    pub fn fence(
        &self,
        token: FenceToken,
        controller: &Arc<ControllerShared>,
    ) -> Result<Option<Arc<ControllerShared>>, FenceToken> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let fence = inner
            .entry(controller.subnqn.clone())
            .or_insert_with(|| Fence {
                token: FenceToken::default(),
                holder: None,
            });
        if token <= fence.token {
            return Err(fence.token);
        }
        fence.token = token;
        controller.set_fence_holder(true);
        let previous = fence.holder.replace(Arc::clone(controller));
        if let Some(previous) = &previous {
            previous.set_fence_holder(false);
        }
        Ok(previous.filter(|p| !Arc::ptr_eq(p, controller)))
    }

    /// The current token of subsystem `subnqn`'s fence (the default before any).
    pub fn token(&self, subnqn: &str) -> FenceToken {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.get(subnqn).map(|f| f.token).unwrap_or_default()
    }

    /// A controller is torn down: it holds nothing any more (the token stays,
    /// so that only a larger one may fence again).
    pub fn forget(&self, controller: &ControllerShared) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fence) = inner.get_mut(&controller.subnqn) {
            if fence
                .holder
                .as_ref()
                .is_some_and(|h| h.cntlid == controller.cntlid)
            {
                fence.holder = None;
            }
        }
        controller.set_fence_holder(false);
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
    fn tokens_only_grow_and_the_last_fence_holds() {
        let registry = ControllerRegistry::default();
        let a = registry.create("nqn.r", "nqn.a", [1; 16], 8).unwrap();
        let b = registry.create("nqn.r", "nqn.b", [2; 16], 8).unwrap();
        let fences = Fences::default();
        assert_eq!(
            fences.fence(token(1, 1), &a).unwrap().map(|c| c.cntlid),
            None
        );
        assert!(a.holds_fence() && !b.holds_fence());
        let previous = fences.fence(token(2, 1), &b).unwrap().unwrap();
        assert_eq!(
            previous.cntlid, a.cntlid,
            "a must drain before b is answered"
        );
        assert!(!a.holds_fence() && b.holds_fence());
        assert_eq!(fences.fence(token(1, 9), &a).unwrap_err(), token(2, 1));
        assert_eq!(fences.fence(token(2, 1), &a).unwrap_err(), token(2, 1));
        fences.forget(&b);
        assert!(!b.holds_fence());
        assert_eq!(
            fences.token("nqn.r"),
            token(2, 1),
            "the token outlives its holder"
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
