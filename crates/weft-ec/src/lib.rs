//! weft's erasure code: a stripe of `k` data shards (k in {2, 4, 8}) and
//! `m` parity shards (m in {1, 2}) of equal length, any `k` of which give
//! back the rest, so that a volume spread over `k + m` nodes survives the
//! loss of `m` of them at `(k + m) / k` times its size in flash instead of
//! 2x or 3x.
//!
//! The code is RAID-6's (as Linux md computes it, H. Peter Anvin, "The
//! mathematics of RAID-6"): P is the XOR of the data shards and Q their sum
//! weighted by powers of the generator 2 in GF(2^8) (polynomial 0x11d). With
//! m <= 2 this needs no matrix: encoding is XOR and a multiply by 2 per
//! shard (eight bytes at a time), and one or two lost shards are solved for
//! directly. A write smaller than a stripe updates the parity from the
//! difference of the old and new data ([`update`]) instead of reading the
//! whole stripe.
//!
//! [`Geometry`] says where a volume's bytes go: stripes of `k` chunks,
//! each shard on a member, parity rotating over the members.
//!
//! What this does not do: choose the members' nodes, read or write devices,
//! or order writes against crashes (a torn stripe is the volume layer's to
//! prevent); it is arithmetic on buffers, sans-IO, with no unsafe code.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod codec;
pub mod controller;
pub mod gather;
mod geometry;
mod gf256;
pub mod journal;
pub mod locks;
pub mod messages;
pub mod primary;

pub use codec::{encode, reconstruct, update};
pub use geometry::{Geometry, Piece};
pub use journal::JournalLayout;
pub use messages::{EcAction, FromMember, MemberControl, MemberOp, ToMember};
pub use primary::{ControlRefused, EcConfig, EcPhase, EcPrimary, RebuildProgress};

/// Why a layout or a reconstruction is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EcError {
    /// A layout this code does not make.
    #[error("{data}+{parity}: erasure coding takes k data shards of 2, 4 or 8 and m parity shards of 1 or 2 (e.g. 4+2)")]
    Layout {
        /// The data shards asked for.
        data: usize,
        /// The parity shards asked for.
        parity: usize,
    },
    /// More shards lost than parity can make up.
    #[error("{lost} shards of a {layout} stripe are lost: at most {parity} can be rebuilt")]
    TooManyLost {
        /// How many.
        lost: usize,
        /// The layout, e.g. `4+2`.
        layout: Layout,
        /// Its parity shards.
        parity: usize,
    },
    /// A chunk size this code does not take.
    #[error("a chunk of {0} bytes: give a power of two of 4 KiB or more")]
    Chunk(u32),
    /// Shards of different lengths, or not as many as the layout has.
    #[error(
        "a {layout} stripe has {expected} shards of one length: given {given} shard(s){lengths}"
    )]
    Shape {
        /// The layout.
        layout: Layout,
        /// The shards it has.
        expected: usize,
        /// The shards given.
        given: usize,
        /// ", of different lengths" when that was wrong.
        lengths: &'static str,
    },
}

/// A stripe's shape: `k` data shards and `m` parity shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    data: usize,
    parity: usize,
}

impl Layout {
    /// `k` data shards (2, 4 or 8) and `m` parity shards (1 or 2).
    pub fn new(data: usize, parity: usize) -> Result<Layout, EcError> {
        if matches!(data, 2 | 4 | 8) && matches!(parity, 1 | 2) {
            Ok(Layout { data, parity })
        } else {
            Err(EcError::Layout { data, parity })
        }
    }

    /// Its data shards, `k`.
    pub fn data(&self) -> usize {
        self.data
    }

    /// Its parity shards, `m`.
    pub fn parity(&self) -> usize {
        self.parity
    }

    /// Every shard: `k + m`, the nodes a stripe spans.
    pub fn shards(&self) -> usize {
        self.data + self.parity
    }

    /// Raw bytes per usable byte, `(k + m) / k`.
    pub fn raw_per_usable(&self) -> f64 {
        self.shards() as f64 / self.data as f64
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.data, self.parity)
    }
}

impl std::str::FromStr for Layout {
    type Err = String;

    /// `K+M`, e.g. `4+2`.
    fn from_str(text: &str) -> Result<Layout, String> {
        let (data, parity) = text
            .split_once('+')
            .ok_or_else(|| format!("{text:?}: give K+M, e.g. 4+2"))?;
        let number = |part: &str| {
            part.trim()
                .parse::<usize>()
                .map_err(|_| format!("{text:?}: give K+M, e.g. 4+2"))
        };
        Layout::new(number(data)?, number(parity)?).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_those_of_the_issue_and_say_their_cost() {
        for (k, m) in [(2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)] {
            let layout = Layout::new(k, m).unwrap();
            assert_eq!(layout.shards(), k + m);
            assert_eq!(layout.to_string().parse::<Layout>(), Ok(layout));
        }
        assert_eq!("4+2".parse::<Layout>().unwrap().raw_per_usable(), 1.5);
        for (k, m) in [(3, 1), (4, 0), (4, 3), (16, 2), (1, 1)] {
            assert_eq!(
                Layout::new(k, m),
                Err(EcError::Layout { data: k, parity: m })
            );
        }
        assert!("4-2".parse::<Layout>().unwrap_err().contains("K+M"));
        assert!("3+1".parse::<Layout>().unwrap_err().contains("2, 4 or 8"));
    }
}
