//! "Logged once when reached": a limit that refuses something is worth one
//! line when it starts refusing and one when it admits again (with how many
//! it refused meanwhile), not a line per refusal, which a flood would turn
//! into a flood of logs. Shared by every limit of the node (connections,
//! the API, the volume manager's queue).

use std::sync::atomic::{AtomicU64, Ordering};

/// Refusals of one limit since it last admitted something.
#[derive(Debug, Default)]
pub struct LimitReached {
    refused: AtomicU64,
}

impl LimitReached {
    /// Counts a refusal; true for the first since the limit last admitted
    /// (the caller logs that the limit is reached then, and only then).
    pub fn refuse(&self) -> bool {
        self.refused.fetch_add(1, Ordering::AcqRel) == 0
    }

    /// Something was admitted: how many were refused since the limit was
    /// reached, if any (the caller logs that it admits again). One load when
    /// nothing was refused.
    pub fn admit(&self) -> Option<u64> {
        if self.refused.load(Ordering::Relaxed) == 0 {
            return None;
        }
        Some(self.refused.swap(0, Ordering::AcqRel)).filter(|&refused| refused > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_refusal_and_the_first_admission_after_are_told() {
        let limit = LimitReached::default();
        assert_eq!(limit.admit(), None);
        assert!(limit.refuse());
        assert!(!limit.refuse());
        assert_eq!(limit.admit(), Some(2));
        assert_eq!(limit.admit(), None);
        assert!(limit.refuse(), "a new episode");
    }
}
