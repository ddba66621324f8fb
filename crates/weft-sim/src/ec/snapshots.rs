//! The erasure-coded simulation's check of snapshots: each one the
//! primary reported taken by `k` members or more decodes, stripe by stripe
//! from those members' own snapshots, to what the host knew when it was
//! taken, and its parity agrees with its data where every member took it.
//!
//! What this does not do: take snapshots (the operator asks the primary;
//! members take them, `node`).

use super::host::Host;
use super::node::Node;
use super::world::EcSimConfig;
use weft_ec::{encode, reconstruct};
use weft_replication::NodeId;

/// A snapshot the primary reported taken.
pub(crate) struct Taken {
    pub name: String,
    /// The members that took it, by place.
    pub members: Vec<usize>,
    /// Per block: its last acknowledged value then, and the value of a
    /// write under way on it then, if any.
    pub expected: Vec<(u64, Option<u64>)>,
}

/// Checks every snapshot taken by enough members to be read.
pub(crate) fn check(
    taken: &[Taken],
    nodes: &[Node],
    config: &EcSimConfig,
    host: &Host,
) -> Result<(), String> {
    let layout = config.layout;
    for snapshot in taken.iter().filter(|t| t.members.len() >= layout.data()) {
        for stripe in 0..config.stripes {
            check_stripe(snapshot, stripe, nodes, config, host)
                .map_err(|e| format!("snapshot {}, stripe {stripe}: {e}", snapshot.name))?;
        }
    }
    Ok(())
}

fn check_stripe(
    snapshot: &Taken,
    stripe: u64,
    nodes: &[Node],
    config: &EcSimConfig,
    host: &Host,
) -> Result<(), String> {
    let primary = config.primary(NodeId(0));
    let layout = config.layout;
    let chunk = config.chunk_bytes as usize;
    let at = (primary.journal.data_base() + stripe * chunk as u64) as usize;
    let mut shards: Vec<Vec<u8>> = Vec::with_capacity(layout.shards());
    let mut lost = Vec::new();
    for shard in 0..layout.shards() {
        let member = primary.geometry.member_of(stripe, shard);
        let held = snapshot
            .members
            .contains(&member)
            .then(|| nodes[member].snapshot(&snapshot.name))
            .flatten();
        match held {
            Some(bytes) => shards.push(bytes[at..at + chunk].to_vec()),
            None => {
                lost.push(shard);
                shards.push(vec![0; chunk]);
            }
        }
    }
    if lost.is_empty() {
        let data: Vec<&[u8]> = shards[..layout.data()].iter().map(Vec::as_slice).collect();
        let mut parity = vec![vec![0u8; chunk]; layout.parity()];
        let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        encode(layout, &data, &mut p).expect("a stripe");
        if parity != shards[layout.data()..] {
            return Err("its parity is not its data's: a torn stripe".into());
        }
    } else {
        let mut views: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
        reconstruct(layout, &mut views, &lost).map_err(|e| e.to_string())?;
    }
    for (s, bytes) in shards[..layout.data()].iter().enumerate() {
        let base = stripe * primary.geometry.stripe_bytes() + (s * chunk) as u64;
        host.check_snapshot(&snapshot.expected, base, bytes)?;
    }
    Ok(())
}
