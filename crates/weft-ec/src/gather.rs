//! Reading what a stripe job needs from a stripe: column ranges of some of
//! its shards, each from its own member while that member is available,
//! and otherwise rebuilt from `k` others (a degraded read).
//!
//! What this does not do: send the reads (the primary's) or know why a
//! member is unavailable.

use crate::{reconstruct, EcError, Layout};
use std::ops::Range;

/// Columns (bytes within a chunk) of one shard of a stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The shard (data 0..k, P at k, Q at k + 1).
    pub shard: usize,
    /// Its columns.
    pub columns: Range<u32>,
}

/// Which reads give a job's wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadPlan {
    /// Each wanted range from its own shard, in the wants' order.
    Direct(Vec<Want>),
    /// `columns` of `from` (k shards), from which the wants are rebuilt.
    Degraded {
        /// The union of the wanted columns.
        columns: Range<u32>,
        /// The shards read, in order.
        from: Vec<usize>,
    },
}

impl ReadPlan {
    /// The reads to make, in order: (shard, columns).
    pub fn reads(&self) -> Vec<Want> {
        match self {
            ReadPlan::Direct(wants) => wants.clone(),
            ReadPlan::Degraded { columns, from } => from
                .iter()
                .map(|&shard| Want {
                    shard,
                    columns: columns.clone(),
                })
                .collect(),
        }
    }
}

/// How to read `wants` when `available(shard)` says which shards' members
/// can be read; `None` when fewer than `k` can.
pub fn plan(layout: Layout, wants: &[Want], available: impl Fn(usize) -> bool) -> Option<ReadPlan> {
    if wants.iter().all(|w| available(w.shard)) {
        return Some(ReadPlan::Direct(wants.to_vec()));
    }
    let start = wants.iter().map(|w| w.columns.start).min()?;
    let end = wants.iter().map(|w| w.columns.end).max()?;
    // The wanted shards that are there, then data, then parity: k of them.
    let wanted = |shard: usize| wants.iter().any(|w| w.shard == shard);
    let mut from: Vec<usize> = (0..layout.shards())
        .filter(|&s| available(s) && wanted(s))
        .collect();
    from.extend((0..layout.shards()).filter(|&s| available(s) && !wanted(s)));
    if from.len() < layout.data() {
        return None;
    }
    from.truncate(layout.data());
    Some(ReadPlan::Degraded {
        columns: start..end,
        from,
    })
}

/// The wants' bytes, in the wants' order, from the reads `plan` made (in
/// its order).
pub fn solve(
    layout: Layout,
    plan: &ReadPlan,
    wants: &[Want],
    reads: Vec<Vec<u8>>,
) -> Result<Vec<Vec<u8>>, EcError> {
    let (columns, from) = match plan {
        ReadPlan::Direct(_) => return Ok(reads),
        ReadPlan::Degraded { columns, from } => (columns, from),
    };
    let len = (columns.end - columns.start) as usize;
    let mut shards = vec![Vec::new(); layout.shards()];
    for (&shard, data) in from.iter().zip(reads) {
        shards[shard] = data;
    }
    let lost: Vec<usize> = (0..layout.shards())
        .filter(|&s| shards[s].is_empty())
        .collect();
    for &s in &lost {
        shards[s] = vec![0; len];
    }
    let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
    reconstruct(layout, &mut refs, &lost)?;
    Ok(wants
        .iter()
        .map(|w| {
            let at = (w.columns.start - columns.start) as usize;
            shards[w.shard][at..at + (w.columns.end - w.columns.start) as usize].to_vec()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode;

    /// A 4+2 stripe of 64-byte shards with known data.
    fn stripe() -> (Layout, Vec<Vec<u8>>) {
        let layout = Layout::new(4, 2).unwrap();
        let data: Vec<Vec<u8>> = (0..4)
            .map(|i| (0..64).map(|b| (b * 7 + i * 31) as u8).collect())
            .collect();
        let mut parity = vec![vec![0; 64]; 2];
        {
            let d: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
            encode(layout, &d, &mut p).unwrap();
        }
        (layout, data.into_iter().chain(parity).collect())
    }

    fn read(shards: &[Vec<u8>], plan: &ReadPlan) -> Vec<Vec<u8>> {
        plan.reads()
            .iter()
            .map(|w| shards[w.shard][w.columns.start as usize..w.columns.end as usize].to_vec())
            .collect()
    }

    #[test]
    fn wants_on_available_members_are_read_directly() {
        let (layout, shards) = stripe();
        let wants = vec![
            Want {
                shard: 0,
                columns: 60..64,
            },
            Want {
                shard: 1,
                columns: 0..8,
            },
        ];
        let plan = plan(layout, &wants, |_| true).unwrap();
        assert_eq!(plan, ReadPlan::Direct(wants.clone()));
        let got = solve(layout, &plan, &wants, read(&shards, &plan)).unwrap();
        assert_eq!(got, vec![shards[0][60..].to_vec(), shards[1][..8].to_vec()]);
    }

    #[test]
    fn a_want_on_a_lost_member_is_rebuilt_from_k_others() {
        let (layout, shards) = stripe();
        let wants = vec![
            Want {
                shard: 0,
                columns: 60..64,
            },
            Want {
                shard: 1,
                columns: 0..8,
            },
        ];
        for lost in [[1, 6], [0, 1], [1, 4], [0, 5]] {
            let available = |s: usize| !lost.contains(&s);
            let plan = plan(layout, &wants, available).unwrap();
            let ReadPlan::Degraded { columns, from } = &plan else {
                panic!("degraded")
            };
            assert_eq!((columns.clone(), from.len()), (0..64, 4));
            assert!(from.iter().all(|&s| available(s)));
            let got = solve(layout, &plan, &wants, read(&shards, &plan)).unwrap();
            assert_eq!(got, vec![shards[0][60..].to_vec(), shards[1][..8].to_vec()]);
        }
        // Three lost of a 4+2 stripe: nothing can be read.
        assert_eq!(plan(layout, &wants, |s| s > 2), None);
    }

    #[test]
    fn a_lost_parity_shard_is_rebuilt_too() {
        let (layout, shards) = stripe();
        let wants = vec![Want {
            shard: 5,
            columns: 0..64,
        }];
        let plan = plan(layout, &wants, |s| s != 5).unwrap();
        let got = solve(layout, &plan, &wants, read(&shards, &plan)).unwrap();
        assert_eq!(got, vec![shards[5].clone()]);
    }
}
