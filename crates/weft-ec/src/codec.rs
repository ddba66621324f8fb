//! One stripe's arithmetic: parity from data ([`encode`]), parity after a
//! write to one data shard ([`update`]), and lost shards from the others
//! ([`reconstruct`]). A stripe's shards are ordered data 0..k, then P, then
//! Q; all have one length.

use crate::gf256;
use crate::{EcError, Layout};

/// Computes the parity shards of `data` (the layout's `k` data shards) into
/// `parity` (its `m` parity shards): P, the XOR of the data, and with two,
/// Q = sum of 2^i * data i.
pub fn encode(layout: Layout, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), EcError> {
    let len = data.first().map_or(0, |d| d.len());
    let equal = data.iter().all(|d| d.len() == len) && parity.iter().all(|p| p.len() == len);
    if data.len() != layout.data() || parity.len() != layout.parity() || !equal {
        return Err(shape(layout, data.len() + parity.len(), equal));
    }
    let (p, q) = parity.split_first_mut().expect("a parity shard at least");
    p.fill(0);
    for shard in data {
        xor_into(p, shard);
    }
    if let Some(q) = q.first_mut() {
        // Horner: ((d[k-1] * 2 + d[k-2]) * 2 + ...) * 2 + d[0].
        q.fill(0);
        for shard in data.iter().rev() {
            double_and_add(q, Some(shard));
        }
    }
    Ok(())
}

/// After data shard `index` changed from `old` to `new` over some range,
/// updates the same range of each `parity` shard (P, then Q if there is
/// one) without reading the other data shards: P ^= old ^ new, Q ^=
/// 2^index * (old ^ new).
pub fn update(
    layout: Layout,
    index: usize,
    old: &[u8],
    new: &[u8],
    parity: &mut [&mut [u8]],
) -> Result<(), EcError> {
    let equal = old.len() == new.len() && parity.iter().all(|p| p.len() == old.len());
    if index >= layout.data() || parity.len() != layout.parity() || !equal {
        return Err(shape(layout, parity.len() + 1, equal));
    }
    let weight = gf256::table(gf256::pow2(index));
    let (p, q) = parity.split_first_mut().expect("a parity shard at least");
    for (at, (o, n)) in old.iter().zip(new).enumerate() {
        let delta = o ^ n;
        p[at] ^= delta;
        if let Some(q) = q.first_mut() {
            q[at] ^= weight[delta as usize];
        }
    }
    Ok(())
}

/// Rebuilds the shards at `lost` (indices into `shards`: data 0..k, P at k,
/// Q at k + 1) from the others, in place; at most the layout's `m` may be
/// lost.
pub fn reconstruct(
    layout: Layout,
    shards: &mut [&mut [u8]],
    lost: &[usize],
) -> Result<(), EcError> {
    let len = shards.first().map_or(0, |s| s.len());
    let equal = shards.iter().all(|s| s.len() == len);
    if shards.len() != layout.shards() || !equal || lost.iter().any(|&i| i >= layout.shards()) {
        return Err(shape(layout, shards.len(), equal));
    }
    let mut lost = lost.to_vec();
    lost.sort_unstable();
    lost.dedup();
    if lost.len() > layout.parity() {
        return Err(EcError::TooManyLost {
            lost: lost.len(),
            layout,
            parity: layout.parity(),
        });
    }
    let k = layout.data();
    let data_lost: Vec<usize> = lost.iter().copied().filter(|&i| i < k).collect();
    match data_lost[..] {
        [] => {}
        [x] if !lost.contains(&k) => one_from_p(shards, k, x),
        [x] => one_from_q(shards, k, x),
        [x, y] => two_from_p_and_q(shards, k, x, y),
        _ => unreachable!("at most two shards are lost"),
    }
    if lost.iter().any(|&i| i >= k) {
        let (data, parity) = shards.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
        encode(layout, &data, parity)?;
    }
    Ok(())
}

/// Data shard `x` = P ^ the other data shards.
fn one_from_p(shards: &mut [&mut [u8]], k: usize, x: usize) {
    let lost = std::mem::take(&mut shards[x]);
    lost.copy_from_slice(shards[k]);
    for (i, shard) in shards[..k].iter().enumerate() {
        if i != x {
            xor_into(lost, shard);
        }
    }
    shards[x] = lost;
}

/// Data shard `x` (P lost too) = (Q ^ Q without shard x) / 2^x.
fn one_from_q(shards: &mut [&mut [u8]], k: usize, x: usize) {
    let lost = std::mem::take(&mut shards[x]);
    weighted_sum(lost, shards, k, &[x]);
    xor_into(lost, shards[k + 1]);
    let divide = gf256::table(gf256::inverse(gf256::pow2(x)));
    for byte in lost.iter_mut() {
        *byte = divide[*byte as usize];
    }
    shards[x] = lost;
}

/// Data shards `x` < `y` from P and Q: with p = P ^ the other data (= d_x ^
/// d_y) and q = Q ^ the others' weighted sum (= 2^x d_x ^ 2^y d_y),
/// d_x = (q ^ 2^y p) / (2^x ^ 2^y) and d_y = p ^ d_x.
fn two_from_p_and_q(shards: &mut [&mut [u8]], k: usize, x: usize, y: usize) {
    let dx = std::mem::take(&mut shards[x]);
    let dy = std::mem::take(&mut shards[y]);
    dx.copy_from_slice(shards[k]);
    for (i, shard) in shards[..k].iter().enumerate() {
        if i != x && i != y {
            xor_into(dx, shard);
        }
    }
    weighted_sum(dy, shards, k, &[x, y]);
    xor_into(dy, shards[k + 1]);
    let times_gy = gf256::table(gf256::pow2(y));
    let divide = gf256::table(gf256::inverse(gf256::pow2(x) ^ gf256::pow2(y)));
    for (p, q) in dx.iter_mut().zip(dy.iter_mut()) {
        let data_x = divide[(*q ^ times_gy[*p as usize]) as usize];
        *q = *p ^ data_x;
        *p = data_x;
    }
    shards[x] = dx;
    shards[y] = dy;
}

/// `out` = sum of 2^i * data shard i, the shards at `skip` taken as zero.
fn weighted_sum(out: &mut [u8], shards: &[&mut [u8]], k: usize, skip: &[usize]) {
    out.fill(0);
    for i in (0..k).rev() {
        let shard = (!skip.contains(&i)).then(|| &*shards[i]);
        double_and_add(out, shard);
    }
}

/// `acc` = `acc` * 2 ^ `add` (or just doubled), eight bytes at a time.
fn double_and_add(acc: &mut [u8], add: Option<&[u8]>) {
    let mut words = acc.chunks_exact_mut(8);
    let zeros = [0u8; 8];
    let mut adds = add.map(|a| a.chunks_exact(8));
    for word in &mut words {
        let addend = adds
            .as_mut()
            .map_or(&zeros[..], |a| a.next().expect("equal lengths"));
        let value = gf256::times_two_u64(u64::from_le_bytes((&*word).try_into().expect("8 bytes")))
            ^ u64::from_le_bytes(addend.try_into().expect("8 bytes"));
        word.copy_from_slice(&value.to_le_bytes());
    }
    let tail = words.into_remainder();
    let add_tail = adds.map_or(&[][..], |a| a.remainder());
    for (at, byte) in tail.iter_mut().enumerate() {
        let doubled = gf256::mul(*byte, 2);
        *byte = doubled ^ add_tail.get(at).copied().unwrap_or(0);
    }
}

/// `acc` ^= `other`, eight bytes at a time.
fn xor_into(acc: &mut [u8], other: &[u8]) {
    let mut words = acc.chunks_exact_mut(8);
    let mut others = other.chunks_exact(8);
    for (word, with) in (&mut words).zip(&mut others) {
        let value = u64::from_le_bytes((&*word).try_into().expect("8 bytes"))
            ^ u64::from_le_bytes(with.try_into().expect("8 bytes"));
        word.copy_from_slice(&value.to_le_bytes());
    }
    for (byte, with) in words.into_remainder().iter_mut().zip(others.remainder()) {
        *byte ^= with;
    }
}

fn shape(layout: Layout, given: usize, equal: bool) -> EcError {
    EcError::Shape {
        layout,
        expected: layout.shards(),
        given,
        lengths: if equal { "" } else { ", of different lengths" },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUTS: [(usize, usize); 6] = [(2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)];

    /// Bytes that differ per shard and offset (a xorshift).
    fn stripe(layout: Layout, len: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut state = seed | 1;
        let mut shards: Vec<Vec<u8>> = (0..layout.shards())
            .map(|_| {
                (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        state as u8
                    })
                    .collect()
            })
            .collect();
        let (data, parity) = shards.split_at_mut(layout.data());
        let data: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        encode(layout, &data, &mut parity).unwrap();
        shards
    }

    #[test]
    fn p_and_q_are_linux_raid6s() {
        // Computed apart (Python, shift-and-add over 0x11d): D0..D3 as below.
        let layout = Layout::new(4, 2).unwrap();
        let data: [&[u8]; 4] = [
            &[0x01, 0x10, 0xff],
            &[0x02, 0x20, 0xfe],
            &[0x04, 0x40, 0x7f],
            &[0x80, 0x80, 0x01],
        ];
        let (mut p, mut q) = ([0u8; 3], [0u8; 3]);
        encode(layout, &data, &mut [&mut p, &mut q]).unwrap();
        assert_eq!((p, q), ([0x87, 0xf0, 0x7f], [0x61, 0x39, 0xf7]));
    }

    #[test]
    fn every_loss_of_up_to_m_shards_is_rebuilt_exactly() {
        for (k, m) in LAYOUTS {
            let layout = Layout::new(k, m).unwrap();
            // Lengths with and without a tail past the last eight bytes.
            for len in [0, 1, 8, 13, 4096 + 5] {
                let whole = stripe(layout, len, (k * 10 + m) as u64 + len as u64);
                let mut losses: Vec<Vec<usize>> = (0..layout.shards()).map(|a| vec![a]).collect();
                if m == 2 {
                    for a in 0..layout.shards() {
                        for b in a + 1..layout.shards() {
                            losses.push(vec![a, b]);
                        }
                    }
                }
                for lost in losses {
                    let mut damaged = whole.clone();
                    for &i in &lost {
                        damaged[i].fill(0x5a);
                    }
                    let mut shards: Vec<&mut [u8]> =
                        damaged.iter_mut().map(Vec::as_mut_slice).collect();
                    reconstruct(layout, &mut shards, &lost).unwrap();
                    assert!(damaged == whole, "{layout} len {len} lost {lost:?}");
                }
            }
        }
    }

    #[test]
    fn more_losses_than_parity_or_a_misshapen_stripe_are_refused() {
        let layout = Layout::new(4, 1).unwrap();
        let mut whole = stripe(layout, 16, 3);
        let mut shards: Vec<&mut [u8]> = whole.iter_mut().map(Vec::as_mut_slice).collect();
        assert!(matches!(
            reconstruct(layout, &mut shards, &[0, 2]),
            Err(EcError::TooManyLost { lost: 2, .. })
        ));
        assert!(matches!(
            reconstruct(layout, &mut shards, &[5]),
            Err(EcError::Shape { .. })
        ));
        assert!(matches!(
            reconstruct(layout, &mut shards[..4], &[0]),
            Err(EcError::Shape { .. })
        ));
        let short = [0u8; 15];
        let data: [&[u8]; 4] = [&short, &[0u8; 16], &[0u8; 16], &[0u8; 16]];
        let mut p = [0u8; 16];
        let error = encode(layout, &data, &mut [&mut p]).unwrap_err();
        assert!(error.to_string().contains("different lengths"), "{error}");
    }

    #[test]
    fn a_partial_write_updates_parity_as_a_full_encode() {
        for (k, m) in LAYOUTS {
            let layout = Layout::new(k, m).unwrap();
            let mut shards = stripe(layout, 64, 7);
            for index in 0..k {
                // Bytes 10..30 of data shard `index` are written.
                let old = shards[index][10..30].to_vec();
                let new: Vec<u8> = (0..20).map(|i| (i * 31 + index) as u8).collect();
                shards[index][10..30].copy_from_slice(&new);
                let (_, parity) = shards.split_at_mut(k);
                let mut ranges: Vec<&mut [u8]> =
                    parity.iter_mut().map(|p| &mut p[10..30]).collect();
                update(layout, index, &old, &new, &mut ranges).unwrap();
                let (data, parity) = shards.split_at(k);
                let data: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                let mut fresh: Vec<Vec<u8>> = vec![vec![0; 64]; m];
                let mut refs: Vec<&mut [u8]> = fresh.iter_mut().map(Vec::as_mut_slice).collect();
                encode(layout, &data, &mut refs).unwrap();
                assert_eq!(parity, &fresh[..], "{layout} shard {index}");
            }
        }
    }
}
