//! Erasure-coded volumes on real processes: etcd (Debian's etcd-server)
//! and `weft serve` nodes on loopback holding 2+1 and 4+2 volumes, a host
//! played by weft's own initiator. Writes acknowledged by the primary
//! survive the loss of members (read around them, then rebuilt when they
//! return, two at once for 4+2) and of the primary itself (another
//! member's node takes over, with the hosts' reservations); a member whose
//! node is lost for good is replaced on another node and rebuilt there in
//! full; snapshots, clones and growth are made while the host writes; QoS
//! limits hold.

mod support;

use std::path::Path;
use std::time::Instant;
use support::cluster::{eventually, node, nodes, retrying};
use support::{ok, temp_dir, Node};
use weft_initiator::{Controller, Queue};
use weft_proto::reservation::{ACQUIRE_OPCODE, REGISTER_OPCODE};
use weft_proto::status::Status;

const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000ec21a";
const BLOCK: u32 = 4096;
/// Blocks of a 2+1 stripe (two 64 KiB chunks of data).
const STRIPE_BLOCKS: u64 = 32;

/// Through `n1`: a pool on each of `names`, the host "tester", and volume
/// "ec" (16 MiB, erasure-coded `layout`) attached to it.
fn erasure_coded_volume(n1: &Node, dir: &Path, names: &[&str], layout: &str) {
    support::cluster::pool_on_each(n1, dir, names);
    ok(n1, &["host", "add", "tester", "--nqn", HOST_NQN]);
    // At once: placement waits for the new pools' first heartbeats.
    ok(
        n1,
        &["volume", "create", "ec", "--size", "16MiB", "--ec", layout],
    );
    ok(n1, &["volume", "attach", "ec", "--host", "tester"]);
}

/// Started nodes by name (n1, n2, ...), each to be killed by taking it.
fn named(started: Vec<Node>) -> Vec<(String, Option<Node>)> {
    started
        .into_iter()
        .enumerate()
        .map(|(i, n)| (format!("n{}", i + 1), Some(n)))
        .collect()
}

/// The place of node `name` in [`named`]'s list.
fn at(nodes: &[(String, Option<Node>)], name: &str) -> usize {
    nodes.iter().position(|(n, _)| n == name).unwrap()
}

/// `volume show ec` as `node` answers it (null while the call fails).
fn shown(node: &Node) -> serde_json::Value {
    support::cluster::volume_view(node, "ec")
}

fn primary_of(node: &Node) -> String {
    let shown = shown(node);
    let replicas = shown["replicas"].as_array().cloned().unwrap_or_default();
    replicas
        .iter()
        .find(|r| r["role"] == "primary")
        .and_then(|r| r["node"].as_str())
        .unwrap_or_default()
        .to_string()
}

fn in_sync(node: &Node) -> usize {
    let shown = shown(node);
    let replicas = shown["replicas"].as_array().cloned().unwrap_or_default();
    replicas.iter().filter(|r| r["state"] == "in-sync").count()
}

fn connect(node: &Node) -> (Controller, Queue) {
    connect_to(node, "ec", 1)
}

/// An I/O queue to volume `volume` on `node`, as host "tester" with host
/// identifier `host_id` (each byte of it).
fn connect_to(node: &Node, volume: &str, host_id: u8) -> (Controller, Queue) {
    let nqn = format!("nqn.2026-11.io.weft:vol:{volume}");
    support::connect_as(node, &nqn, HOST_NQN, host_id)
}

fn pattern(block: u64, generation: u8) -> Vec<u8> {
    let mut data = vec![generation; BLOCK as usize];
    data[..8].copy_from_slice(&block.to_le_bytes());
    data
}

fn read(queue: &mut Queue, block: u64) -> Vec<u8> {
    retrying("read", || {
        queue.read(1, block, BLOCK, BLOCK).map(<[u8]>::to_vec)
    })
}

/// Blocks `0..blocks`, generation `generation`: one at a time (partial
/// stripes), then a whole stripe in one command.
fn write(queue: &mut Queue, blocks: std::ops::Range<u64>, generation: u8) {
    for block in blocks {
        let data = pattern(block, generation);
        retrying("write", || queue.write(1, block, BLOCK, &data));
    }
}

fn check(
    queue: &mut Queue,
    blocks: std::ops::Range<u64>,
    generation: impl Fn(u64) -> u8,
    on: &str,
) {
    for block in blocks {
        assert_eq!(
            read(queue, block),
            pattern(block, generation(block)),
            "block {block} through {on}"
        );
    }
}

#[test]
fn an_erasure_coded_volume_keeps_its_writes_through_the_loss_of_a_member_of_its_primary_and_a_move()
{
    let dir = temp_dir("erasure");
    let (etcd, endpoints, token_file, started) = nodes(&dir, "", 3);
    erasure_coded_volume(&started[0], &dir, &["n1", "n2", "n3"], "2+1");
    let mut nodes = named(started);
    let first = primary_of(nodes[0].1.as_ref().unwrap());
    assert!(
        !first.is_empty(),
        "a primary: {}",
        shown(nodes[0].1.as_ref().unwrap())
    );

    // Partial stripes, then whole stripes in one command each.
    let p = at(&nodes, &first);
    let log = std::fs::read_to_string(dir.join(format!("{first}.log"))).unwrap();
    assert!(
        log.contains("serves erasure-coded 2+1 under epoch"),
        "{log}"
    );
    // Each member holds a shard: half the volume, and its journal.
    let view = shown(nodes[p].1.as_ref().unwrap());
    assert_eq!(view["size_bytes"], 16 << 20, "{view}");
    assert_eq!(view["erasure"]["layout"], "2+1", "{view}");
    let raw = view["erasure"]["raw_bytes"].as_u64().unwrap();
    let journal = 64 * (4096 + 65536);
    assert_eq!(raw, 3 * ((8 << 20) + journal), "{view}");
    let text = ok(nodes[p].1.as_ref().unwrap(), &["volume", "show", "ec"]);
    assert!(
        text.contains("erasure     2+1 (chunks of 64 KiB): takes 36.8 MiB raw"),
        "{text}"
    );
    let listed = ok(nodes[p].1.as_ref().unwrap(), &["volume", "list"]);
    assert!(
        listed.contains("total: 16 MiB usable, 36.8 MiB raw (2.30 bytes of flash per usable byte)"),
        "{listed}"
    );
    // What an erasure-coded volume cannot have here.
    let n = nodes[p].1.as_ref().unwrap();
    let create = ["volume", "create", "wide", "--size", "16MiB", "--ec", "4+2"];
    let refused = support::refused(n, &create);
    assert!(
        refused.contains("an erasure-coded 4+2 volume needs 6 nodes"),
        "{refused}"
    );
    let create = ["volume", "create", "odd", "--size", "16MiB", "--ec", "3+1"];
    let refused = support::refused(n, &create);
    assert!(refused.contains("2, 4 or 8"), "{refused}");
    let (controller, mut queue) = connect(nodes[p].1.as_ref().unwrap());
    write(&mut queue, 0..64, 1);
    let whole: Vec<u8> = (64..64 + 2 * STRIPE_BLOCKS)
        .flat_map(|b| pattern(b, 1))
        .collect();
    for (i, stripe) in whole
        .chunks(STRIPE_BLOCKS as usize * BLOCK as usize)
        .enumerate()
    {
        let block = 64 + i as u64 * STRIPE_BLOCKS;
        retrying("write a stripe", || queue.write(1, block, BLOCK, stripe));
    }
    let written = 0..64 + 2 * STRIPE_BLOCKS;
    check(&mut queue, written.clone(), |_| 1, &first);
    drop((queue, controller));

    // A member other than the primary dies: reads are rebuilt from the
    // other two, writes go on, and it is faulted.
    let lost = nodes
        .iter()
        .map(|(n, _)| n.clone())
        .find(|n| *n != first)
        .unwrap();
    let l = at(&nodes, &lost);
    nodes[l].1 = None;
    let (controller, mut queue) = connect(nodes[p].1.as_ref().unwrap());
    check(
        &mut queue,
        written.clone(),
        |_| 1,
        "the primary, a member lost",
    );
    write(&mut queue, 0..16, 2);
    let second_generation = |b: u64| if b < 16 { 2 } else { 1 };
    check(
        &mut queue,
        written.clone(),
        second_generation,
        "the primary, a member lost",
    );
    eventually("the lost member faulted", || {
        in_sync(nodes[p].1.as_ref().unwrap()) == 2
    });
    drop((queue, controller));

    // It returns: rebuilt (what it missed), in sync again.
    nodes[l].1 = Some(node(&dir, &lost, &endpoints, Some(&token_file)));
    let took = eventually("the member rebuilt and in sync", || {
        in_sync(nodes[p].1.as_ref().unwrap()) == 3
    });
    eprintln!("{lost} back in sync {took:?} after its restart");

    // The primary dies: another member's node serves every write.
    let killed = Instant::now();
    nodes[p].1 = None;
    let survivor = nodes.iter().find_map(|(_, n)| n.as_ref()).unwrap();
    let mut second = String::new();
    eventually("a promotion", || {
        second = primary_of(survivor);
        !second.is_empty() && second != first
    });
    eprintln!(
        "{second} promoted {:?} after {first}'s kill",
        killed.elapsed()
    );
    let s = at(&nodes, &second);
    let (controller, mut queue) = connect(nodes[s].1.as_ref().unwrap());
    check(&mut queue, written.clone(), second_generation, &second);
    eprintln!(
        "the new primary served every block {:?} after the kill",
        killed.elapsed()
    );
    write(&mut queue, 16..32, 3);
    check(&mut queue, 16..32, |_| 3, &second);
    drop((queue, controller));

    // A planned move to the third node: drained, handed over, every write there.
    let third = nodes
        .iter()
        .find(|(n, node)| node.is_some() && *n != second)
        .map(|(n, _)| n.clone())
        .unwrap();
    let via = nodes[s].1.as_ref().unwrap();
    let moved = Instant::now();
    ok(via, &["volume", "move-primary", "ec", "--to", &third]);
    eprintln!("moved to {third} in {:?}", moved.elapsed());
    assert_eq!(primary_of(via), third);
    let t = at(&nodes, &third);
    let (controller, mut queue) = connect(nodes[t].1.as_ref().unwrap());
    let third_generation = |b: u64| match b {
        0..16 => 2,
        16..32 => 3,
        _ => 1,
    };
    check(&mut queue, written, third_generation, &third);
    drop((queue, controller));
    drop(etcd);
}

/// The nodes of `ec`'s members, in shard order.
fn member_nodes(node: &Node) -> Vec<String> {
    let shown = shown(node);
    let replicas = shown["replicas"].as_array().cloned().unwrap_or_default();
    replicas
        .iter()
        .filter_map(|r| r["node"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn an_erasure_coded_member_down_for_good_is_replaced_and_rebuilt_on_another_node() {
    let dir = temp_dir("erasure-replace");
    // Whichever node is the controller replaces a member down for 2 s.
    let (etcd, _, _, started) = nodes(&dir, "replace_replica_after_s = 2", 4);
    erasure_coded_volume(&started[0], &dir, &["n1", "n2", "n3"], "2+1");
    let mut nodes = named(started);
    let first = primary_of(nodes[0].1.as_ref().unwrap());
    let p = at(&nodes, &first);
    let (controller, mut queue) = connect(nodes[p].1.as_ref().unwrap());
    write(&mut queue, 0..3 * STRIPE_BLOCKS, 1);
    drop((queue, controller));
    let refused = support::refused(
        nodes[p].1.as_ref().unwrap(),
        &["volume", "set", "ec", "--replicas", "3"],
    );
    assert!(refused.contains("one member per shard"), "{refused}");

    // n4 gets a pool; a member other than the primary goes down for good.
    let device = dir.join("n4").join("p.img");
    let pool = ["pool", "create", "p", "--node", "n4", "--device"];
    let pool = [
        &pool[..],
        &[device.to_str().unwrap(), "--device-size", "256MiB"],
    ]
    .concat();
    ok(nodes[p].1.as_ref().unwrap(), &pool);
    let members = member_nodes(nodes[p].1.as_ref().unwrap());
    let lost = members.iter().find(|n| **n != first).unwrap().clone();
    let shard = members.iter().position(|n| *n == lost).unwrap();
    let l = at(&nodes, &lost);
    nodes[l].1 = None;
    let via = nodes[p].1.as_ref().unwrap();
    let took = eventually("the lost member replaced in its place", || {
        member_nodes(via).get(shard).map(String::as_str) == Some("n4")
    });
    let rebuilt = eventually("the replacement rebuilt and in sync", || in_sync(via) == 3);
    eprintln!(
        "{lost}'s shard replaced on n4 {took:?} after {lost} went down, in sync {rebuilt:?} later"
    );

    // The third member goes too: every read needs n4's rebuilt shard.
    let third = members
        .iter()
        .find(|n| **n != first && **n != lost)
        .unwrap()
        .clone();
    let t = at(&nodes, &third);
    nodes[t].1 = None;
    let (controller, mut queue) = connect(nodes[p].1.as_ref().unwrap());
    check(
        &mut queue,
        0..3 * STRIPE_BLOCKS,
        |_| 1,
        "the primary and n4",
    );
    drop((queue, controller));
    drop(etcd);
}

/// The snapshots in node `name`'s pool "p", as `via` tells.
fn pool_snapshots(via: &Node, name: &str) -> Option<u64> {
    let path = format!("/api/v1/pools/p?node={name}");
    let (_, pool) = support::api(via, Some(&via.token), "GET", &path, None);
    pool["snapshots"].as_u64()
}

#[test]
fn an_erasure_coded_volume_grows_and_takes_snapshots_and_clones_while_the_host_writes() {
    let dir = temp_dir("erasure-grow");
    let (etcd, _, _, started) = nodes(&dir, "", 3);
    erasure_coded_volume(&started[0], &dir, &["n1", "n2", "n3"], "2+1");
    let mut nodes: Vec<(String, Option<Node>)> = started
        .into_iter()
        .enumerate()
        .map(|(i, n)| (format!("n{}", i + 1), Some(n)))
        .collect();
    let first = primary_of(nodes[0].1.as_ref().unwrap());
    let p = nodes.iter().position(|(n, _)| *n == first).unwrap();
    let other = (p + 1) % 3;
    let (controller, mut queue) = connect(nodes[p].1.as_ref().unwrap());
    write(&mut queue, 0..64, 1);

    // A snapshot taken while the host writes: the writes wait for the
    // members' snapshots, then go on.
    let writer = std::thread::spawn(move || {
        write(&mut queue, 0..64, 2);
        (controller, queue)
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    let taken = Instant::now();
    ok(
        nodes[other].1.as_ref().unwrap(),
        &["snapshot", "create", "ec@s1"],
    );
    eprintln!("snapshot taken in {:?}", taken.elapsed());
    let (controller, mut queue) = writer.join().unwrap();
    let primary = nodes[p].1.take().unwrap();
    let n = &primary;
    let text = ok(n, &["volume", "show", "ec"]);
    assert!(text.contains("snapshot    s1: taken, on n"), "{text}");
    // Taken again under the same name: refused, the first one kept.
    let again = support::refused(n, &["snapshot", "create", "ec@s1"]);
    assert!(again.contains("exists"), "{again}");
    for name in ["n1", "n2", "n3"] {
        eventually("each member's shard snapshot", || {
            pool_snapshots(n, name) == Some(1)
        });
    }
    check(&mut queue, 0..64, |_| 2, "the primary, after the snapshot");
    drop((queue, controller));

    // A clone of it, on the same members: it holds the rewrite up to one
    // block and none after it.
    ok(n, &["volume", "clone", "ec@s1", "c1"]);
    ok(n, &["volume", "attach", "c1", "--host", "tester"]);
    let text = ok(n, &["volume", "show", "c1"]);
    assert!(text.contains("erasure     2+1"), "{text}");
    let (controller, mut queue) = connect_to(n, "c1", 1);
    let rewritten = (0..64u64)
        .take_while(|&b| read(&mut queue, b) == pattern(b, 2))
        .count() as u64;
    eprintln!("the snapshot holds the rewrite of blocks 0..{rewritten}");
    let snapshot_generation = move |b: u64| if b < rewritten { 2 } else { 1 };
    check(&mut queue, 0..64, snapshot_generation, "the clone");
    // The clone is a volume of its own: written, the source is not.
    write(&mut queue, 0..8, 9);
    drop((queue, controller));

    // Grown while the host writes; then written past its old end.
    let (controller, mut queue) = connect(n);
    let writer = std::thread::spawn(move || {
        write(&mut queue, 0..64, 3);
        (controller, queue)
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    let via = nodes[other].1.as_ref().unwrap();
    let grown = ok(via, &["volume", "resize", "ec", "--size", "32MiB"]);
    assert!(grown.contains("resized"), "{grown}");
    drop(writer.join().unwrap());
    let view = shown(n);
    assert_eq!(view["size_bytes"], 32 << 20, "{view}");
    let journal = 64 * (4096 + 65536);
    let raw = view["erasure"]["raw_bytes"].as_u64().unwrap();
    assert_eq!(raw, 3 * ((16 << 20) + journal), "{view}");
    let shrink = support::refused(n, &["volume", "resize", "ec", "--size", "8MiB"]);
    assert!(shrink.contains("only grow"), "{shrink}");
    eventually("every member in sync", || in_sync(n) == 3);
    let past = 4096..4096 + 2 * STRIPE_BLOCKS;
    let (controller, mut queue) = connect(n);
    write(&mut queue, past.clone(), 4);
    check(&mut queue, past.clone(), |_| 4, "past the old end");
    drop((queue, controller));

    // A member other than the primary dies: read around it, past the old
    // end too (the parity there agrees).
    nodes[other].1 = None;
    let (controller, mut queue) = connect(n);
    check(&mut queue, 0..64, |_| 3, "the grown volume, a member lost");
    check(&mut queue, past, |_| 4, "past the old end, a member lost");
    drop((queue, controller));
    let clone_generation = move |b: u64| if b < 8 { 9 } else { snapshot_generation(b) };
    let (controller, mut queue) = connect_to(n, "c1", 1);
    check(
        &mut queue,
        0..64,
        clone_generation,
        "the clone, a member lost",
    );
    drop((queue, controller));

    // The snapshot goes: from the record, then from every member up (the
    // clone keeps its data).
    let refused = support::refused(n, &["volume", "delete", "ec"]);
    assert!(refused.contains("s1"), "{refused}");
    ok(n, &["snapshot", "delete", "ec@s1"]);
    let third = 3 - p - other;
    for name in [&nodes[p].0, &nodes[third].0] {
        eventually("the shard snapshot deleted", || {
            pool_snapshots(n, name) == Some(0)
        });
    }
    let (controller, mut queue) = connect_to(n, "c1", 1);
    check(
        &mut queue,
        0..64,
        clone_generation,
        "the clone, its source snapshot gone",
    );
    drop((queue, controller));
    drop(etcd);
}

/// The status a write of block 0 ends with, path statuses retried.
fn write_status(queue: &mut Queue, byte: u8) -> Status {
    support::cluster::write_status(queue, BLOCK, byte)
}

#[test]
fn reservations_and_qos_hold_on_an_erasure_coded_volume_and_its_next_primary() {
    let dir = temp_dir("erasure-reservations");
    let (etcd, _, _, started) = nodes(&dir, "", 3);
    erasure_coded_volume(&started[0], &dir, &["n1", "n2", "n3"], "2+1");
    let first = primary_of(&started[0]);
    let p = first[1..].parse::<usize>().unwrap() - 1;
    // Host A registers and takes Write Exclusive (CPTPL 11b, as Linux asks).
    let (ca, mut a) = connect_to(&started[p], "ec", 0xA);
    let (cb, mut b) = connect_to(&started[p], "ec", 0xB);
    retrying("register", || {
        a.reservation(REGISTER_OPCODE, 1, 0xC000_0000, &[0, 0xA1])
    });
    retrying("acquire", || {
        a.reservation(ACQUIRE_OPCODE, 1, 0x100, &[0xA1, 0])
    });
    assert_eq!(write_status(&mut a, 1), Status::SUCCESS);
    assert_eq!(write_status(&mut b, 2), Status::RESERVATION_CONFLICT);
    drop((a, b, ca, cb));

    // A limit of 50 writes a second holds: 100 writes take 2 s at least.
    ok(&started[p], &["volume", "set", "ec", "--iops-max", "50"]);
    let (ca, mut a) = connect_to(&started[p], "ec", 0xA);
    let began = Instant::now();
    for i in 0..100 {
        assert_eq!(write_status(&mut a, i), Status::SUCCESS);
    }
    let took = began.elapsed();
    assert!(took >= std::time::Duration::from_millis(1500), "{took:?}");
    eprintln!("100 writes under a limit of 50 IOPS took {took:?}");
    ok(&started[p], &["volume", "set", "ec", "--iops-max", "none"]);
    drop((a, ca));

    // The primary dies: the next one serves the same reservation.
    let mut started = started;
    let mut names: Vec<String> = (1..=3).map(|i| format!("n{i}")).collect();
    drop(started.remove(p));
    names.remove(p);
    let mut second = String::new();
    eventually("a promotion", || {
        second = primary_of(&started[0]);
        !second.is_empty() && second != first
    });
    let next = &started[names.iter().position(|n| *n == second).unwrap()];
    let (_ca, mut a) = connect_to(next, "ec", 0xA);
    let (_cb, mut b) = connect_to(next, "ec", 0xB);
    assert_eq!(write_status(&mut b, 3), Status::RESERVATION_CONFLICT);
    assert_eq!(write_status(&mut a, 4), Status::SUCCESS);
    drop(etcd);
}

#[test]
fn a_four_plus_two_volume_keeps_its_writes_through_the_loss_of_two_members() {
    let dir = temp_dir("erasure-wide");
    let names = ["n1", "n2", "n3", "n4", "n5", "n6"];
    let (etcd, endpoints, token_file, started) = nodes(&dir, "", 6);
    erasure_coded_volume(&started[0], &dir, &names, "4+2");
    let mut nodes: Vec<(String, Option<Node>)> = names
        .iter()
        .map(|n| n.to_string())
        .zip(started.into_iter().map(Some))
        .collect();
    let first = primary_of(nodes[0].1.as_ref().unwrap());
    let p = nodes.iter().position(|(n, _)| *n == first).unwrap();
    let (controller, mut queue) = connect(nodes[p].1.as_ref().unwrap());
    // A 4+2 stripe is 256 KiB: 64 blocks.
    let stripe = 2 * STRIPE_BLOCKS;
    write(&mut queue, 0..2 * stripe, 1);
    drop((queue, controller));

    // Two members other than the primary die at once: read around both,
    // and write on.
    let lost: Vec<usize> = (0..6).filter(|&i| i != p).take(2).collect();
    for &l in &lost {
        nodes[l].1 = None;
    }
    let n = nodes[p].1.as_ref().unwrap();
    let (controller, mut queue) = connect(n);
    check(
        &mut queue,
        0..2 * stripe,
        |_| 1,
        "the primary, two members lost",
    );
    write(&mut queue, 0..stripe / 2, 2);
    let generation = |b: u64| if b < stripe / 2 { 2 } else { 1 };
    check(
        &mut queue,
        0..2 * stripe,
        generation,
        "the primary, two members lost",
    );
    eventually("both faulted", || in_sync(n) == 4);
    drop((queue, controller));

    // They return: rebuilt, in sync; every block still right.
    for &l in &lost {
        let name = nodes[l].0.clone();
        nodes[l].1 = Some(node(&dir, &name, &endpoints, Some(&token_file)));
    }
    let n = nodes[p].1.as_ref().unwrap();
    let took = eventually("both rebuilt and in sync", || in_sync(n) == 6);
    eprintln!("two members back in sync {took:?} after their restart");
    let (controller, mut queue) = connect(n);
    check(
        &mut queue,
        0..2 * stripe,
        generation,
        "the primary, all back",
    );
    drop((queue, controller));
    drop(etcd);
}
