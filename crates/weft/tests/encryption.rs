//! Encryption at rest through the binary: `weft serve --kek-file`, an
//! encrypted volume written over NVMe/TCP, its device scanned for what was
//! written, a restart without the key (locked, named, not served), with it
//! (everything back), key rotation without rewriting data, and the errors
//! a user sees.

mod support;

use support::{
    connect_as, device_holds, ok, refused, start_node, temp_dir, wait_no_connected_hosts, Node,
};

const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000e0c1";
const KEK_A: &str = "6b1d0e8f2a4c39577e1b0d2f4a6c8e9f1b3d5f7a9c0e2f4b6d8a1c3e5f7b9d0a";
const KEK_B: &str = "b9d0a6b1d0e8f2a4c39577e1b0d2f4a6c8e9f1b3d5f7a9c0e2f4b6d8a1c3e5f7";
const BLOCK: u32 = 4096;
/// `weft volume create` of the single node's encrypted volume.
const CREATE_SEC: [&str; 8] = [
    "volume",
    "create",
    "sec",
    "--pool",
    "p",
    "--size",
    "16MiB",
    "--encrypt",
];
const BLOCKS: u64 = 64;

/// Block `n`'s recognisable content.
fn block(n: u64) -> Vec<u8> {
    format!("weft-plaintext-marker-{n:06}-")
        .repeat(150)
        .into_bytes()[..BLOCK as usize]
        .to_vec()
}

fn write_key_file(path: &std::path::Path, keys: &[&str]) {
    std::fs::write(path, keys.join("\n") + "\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn nqn(volume: &str) -> String {
    format!("nqn.2026-11.io.weft:vol:{volume}")
}

fn write_blocks(node: &Node, volume: &str) {
    let (_controller, mut queue) = connect_as(node, &nqn(volume), HOST_NQN, 1);
    for n in 0..BLOCKS {
        queue.write(1, n * 2, BLOCK, &block(n)).unwrap();
    }
    queue.flush(1).unwrap();
}

fn check_blocks(node: &Node, volume: &str) {
    let (_controller, mut queue) = connect_as(node, &nqn(volume), HOST_NQN, 1);
    for n in 0..BLOCKS {
        assert_eq!(
            queue.read(1, n * 2, BLOCK, BLOCK).unwrap(),
            block(n),
            "{volume} block {n}"
        );
        let gap = queue.read(1, n * 2 + 1, BLOCK, BLOCK).unwrap();
        assert!(
            gap.iter().all(|&b| b == 0),
            "{volume}: a never-written block reads as zeroes"
        );
    }
}

#[test]
fn an_encrypted_volume_is_ciphertext_on_its_device_and_served_only_with_its_key() {
    let dir = temp_dir("encryption");
    let (data, device, keys) = (dir.join("data"), dir.join("d0.img"), dir.join("kek"));
    write_key_file(&keys, &[KEK_A]);
    let keys_arg = keys.to_str().unwrap();

    // A node without keys refuses to encrypt, saying how to fix it.
    let node = start_node(&data, &[]);
    ok(
        &node,
        &[
            "pool",
            "create",
            "p",
            "--device",
            device.to_str().unwrap(),
            "--device-size",
            "256MiB",
        ],
    );
    let error = refused(&node, &CREATE_SEC);
    assert!(
        error.contains("no key-encryption key") && error.contains("--kek-file"),
        "{error}"
    );
    let other = dir.join("q.img");
    let other = other.to_str().unwrap();
    let pool_args = [
        "pool",
        "create",
        "q",
        "--device",
        other,
        "--device-size",
        "64MiB",
        "--encrypt",
    ];
    let error = refused(&node, &pool_args);
    assert!(error.contains("no key-encryption key"), "{error}");
    node.terminate();

    let node = start_node(&data, &["--kek-file", keys_arg]);
    ok(&node, &CREATE_SEC);
    ok(
        &node,
        &[
            "volume", "create", "plain", "--pool", "p", "--size", "16MiB",
        ],
    );
    ok(&node, &["host", "add", "tester", "--nqn", HOST_NQN]);
    for volume in ["sec", "plain"] {
        ok(&node, &["volume", "attach", volume, "--host", "tester"]);
        write_blocks(&node, volume);
    }
    let show = ok(&node, &["volume", "show", "sec"]);
    assert!(
        show.contains("encryption  aes-256-xts, data key wrapped by key-encryption key "),
        "{show}"
    );
    let kek_a_id = show.split("key-encryption key ").nth(1).unwrap()[..16].to_string();
    let list = ok(&node, &["volume", "list"]);
    assert!(list.contains("thin,enc"), "{list}");
    let error = refused(&node, &["volume", "clone", "sec@none", "c2", "--encrypt"]);
    assert!(
        error.contains("--encrypt") || error.contains("encrypted"),
        "{error}"
    );
    node.terminate();

    // The device: the plain volume's blocks are there as written, the
    // encrypted volume's are not, anywhere.
    assert!(
        device_holds(&device, b"weft-plaintext-marker-000007-"),
        "the control is in the clear"
    );
    let bytes = std::fs::read(&device).unwrap();
    let marker = b"weft-plaintext-marker-";
    let found = bytes.windows(marker.len()).filter(|w| w == marker).count();
    let plain_markers = (BLOCKS as usize) * (BLOCK as usize / 29);
    assert_eq!(
        found, plain_markers,
        "markers other than the plain volume's"
    );

    // Without the key: listed as locked (naming the key), not served.
    let node = start_node(&data, &[]);
    let show = ok(&node, &["volume", "show", "sec"]);
    assert!(show.contains("state       locked"), "{show}");
    assert!(
        show.contains(&format!(
            "LOCKED: this node lacks key-encryption key {kek_a_id}"
        )),
        "{show}"
    );
    assert!(ok(&node, &["volume", "list"]).contains("thin,locked"));
    let url = weft_initiator::TargetUrl::parse(&format!("{}/{}", node.nvme, nqn("sec"))).unwrap();
    let options = weft_initiator::ConnectOptions {
        host_nqn: HOST_NQN.into(),
        ..weft_initiator::ConnectOptions::default()
    };
    assert!(
        weft_initiator::Controller::connect(&url, options, 1).is_err(),
        "a locked volume is not served"
    );
    check_blocks(&node, "plain");
    node.terminate();

    // With it: every block back.
    let node = start_node(&data, &["--kek-file", keys_arg]);
    check_blocks(&node, "sec");
    let show = ok(&node, &["volume", "show", "sec"]);
    assert!(
        show.contains("state       online") && !show.contains("LOCKED"),
        "{show}"
    );

    // A pool that encrypts every volume made in it.
    ok(&node, &pool_args);
    assert!(ok(&node, &["pool", "show", "q"]).contains("new volumes are encrypted"));
    ok(
        &node,
        &["volume", "create", "byq", "--pool", "q", "--size", "8MiB"],
    );
    let show = ok(&node, &["volume", "show", "byq"]);
    assert!(show.contains("encryption  aes-256-xts"), "{show}");

    // Rotation: the new key first, the old one kept until the rewrap.
    write_key_file(&keys, &[KEK_B, KEK_A]);
    ok(&node, &["pool", "rewrap", "p"]);
    let show = ok(&node, &["volume", "show", "sec"]);
    assert!(
        !show.contains(&kek_a_id),
        "still wrapped by the old key: {show}"
    );
    node.terminate();
    write_key_file(&keys, &[KEK_B]);
    let node = start_node(&data, &["--kek-file", keys_arg]);
    check_blocks(&node, "sec");

    // Deleting it leaves nothing readable, and a new volume reads zeroes.
    wait_no_connected_hosts(&node, "sec");
    ok(&node, &["volume", "delete", "sec"]);
    ok(
        &node,
        &[
            "volume",
            "create",
            "sec2",
            "--pool",
            "p",
            "--size",
            "16MiB",
            "--encrypt",
        ],
    );
    node.terminate();
}

/// Each member of `volume` as `node` shows it: (node, role, state).
fn member_states(node: &Node, volume: &str) -> Vec<(String, String, String)> {
    let shown = support::cluster::volume_view(node, volume);
    let replicas = shown["replicas"].as_array().cloned().unwrap_or_default();
    replicas
        .iter()
        .map(|r| {
            let text = |field: &str| r[field].as_str().unwrap_or_default().to_string();
            (text("node"), text("role"), text("state"))
        })
        .collect()
}

/// A replicated and an erasure-coded volume, encrypted, on three nodes with
/// a key of their own each: every copy and shard is ciphertext, reads come
/// back through the loss of the primary's node (another node decrypting
/// with its own key), and the node that returns is rebuilt.
#[test]
fn replicas_and_members_each_encrypt_with_their_own_nodes_key() {
    use support::cluster::{eventually, nodes_with, retrying};
    let dir = temp_dir("encryption-cluster");
    let keys = [KEK_A, KEK_B, &KEK_A.replace('6', "7")].map(str::to_string);
    std::fs::create_dir_all(&*dir).unwrap();
    let key_arg = |name: &str| {
        let path = dir.join(format!("{name}.kek"));
        let n: usize = name[1..].parse().unwrap();
        write_key_file(&path, &[&keys[n - 1]]);
        vec!["--kek-file".to_string(), path.to_str().unwrap().to_string()]
    };
    let (_etcd, _endpoints, _token, started) = nodes_with(&dir, "", 3, key_arg);
    let n1 = &started[0];
    support::cluster::pool_on_each(n1, &dir, &["n1", "n2", "n3"]);
    ok(n1, &["host", "add", "tester", "--nqn", HOST_NQN]);
    for (volume, layout) in [("rep", ["--replicas", "3"]), ("ec", ["--ec", "2+1"])] {
        let create = [
            &["volume", "create", volume, "--size", "16MiB", "--encrypt"][..],
            &layout[..],
        ]
        .concat();
        // At once: placement waits for the new pools' first heartbeats.
        ok(n1, &create);
        ok(n1, &["volume", "attach", volume, "--host", "tester"]);
    }
    let primary = |volume: &str| {
        member_states(n1, volume)
            .into_iter()
            .find(|(_, role, _)| role == "primary")
            .map(|(node, _, _)| node)
            .unwrap()
    };
    let node_named = |name: &str| &started[name[1..].parse::<usize>().unwrap() - 1];
    for volume in ["rep", "ec"] {
        let via = node_named(&primary(volume));
        let (_c, mut queue) = connect_as(via, &nqn(volume), HOST_NQN, 1);
        for n in 0..BLOCKS {
            retrying("write", || queue.write(1, n * 2, BLOCK, &block(n)));
        }
        retrying("flush", || queue.flush(1));
        let shown = ok(via, &["volume", "show", volume]);
        assert!(shown.contains("encryption  aes-256-xts"), "{shown}");
    }
    let marker = b"weft-plaintext-marker-";
    for name in ["n1", "n2", "n3"] {
        let device = dir.join(name).join("p.img");
        assert!(
            !device_holds(&device, marker),
            "{name}'s device holds plaintext"
        );
    }

    // The replicated volume's primary dies: another node serves every
    // block from its own copy, decrypted with its own key.
    let lost = primary("rep");
    let mut nodes: Vec<Option<Node>> = started.into_iter().map(Some).collect();
    let index = lost[1..].parse::<usize>().unwrap() - 1;
    drop(nodes[index].take());
    let survivor_index = (0..3).find(|&i| i != index).unwrap();
    let survivor = nodes[survivor_index].as_ref().unwrap();
    eventually("a new primary", || {
        member_states(survivor, "rep")
            .iter()
            .any(|(node, role, _)| role == "primary" && *node != lost)
    });
    let next = member_states(survivor, "rep")
        .into_iter()
        .find(|(_, role, _)| role == "primary")
        .unwrap()
        .0;
    let next_node = nodes[next[1..].parse::<usize>().unwrap() - 1]
        .as_ref()
        .unwrap();
    let (_c, mut queue) = connect_as(next_node, &nqn("rep"), HOST_NQN, 1);
    for n in 0..BLOCKS {
        let read = retrying("read", || {
            queue.read(1, n * 2, BLOCK, BLOCK).map(<[u8]>::to_vec)
        });
        assert_eq!(read, block(n), "rep block {n} through {next}");
    }
    // The erasure-coded volume reads around its lost member (or its
    // primary moved): the same data.
    let ec_primary = retrying_primary(survivor, "ec", &lost);
    let via = nodes[ec_primary[1..].parse::<usize>().unwrap() - 1]
        .as_ref()
        .unwrap();
    let (_c, mut queue) = connect_as(via, &nqn("ec"), HOST_NQN, 1);
    for n in 0..BLOCKS {
        let read = retrying("read", || {
            queue.read(1, n * 2, BLOCK, BLOCK).map(<[u8]>::to_vec)
        });
        assert_eq!(read, block(n), "ec block {n} through {ec_primary}");
    }

    // The lost node returns (with its key): rebuilt, still ciphertext.
    let endpoints = _endpoints.clone();
    let token_file = _token.clone();
    let path = dir.join(format!("{lost}.kek"));
    let more = vec!["--kek-file".to_string(), path.to_str().unwrap().to_string()];
    nodes[index] = Some(support::cluster::node_with(
        &dir,
        &lost,
        &endpoints,
        Some(&token_file),
        "",
        &more,
    ));
    let survivor = nodes[survivor_index].as_ref().unwrap();
    for volume in ["rep", "ec"] {
        eventually("every member in sync", || {
            let states = member_states(survivor, volume);
            states.len() == 3 && states.iter().all(|(_, _, state)| state == "in-sync")
        });
    }
    for name in ["n1", "n2", "n3"] {
        let device = dir.join(name).join("p.img");
        assert!(
            !device_holds(&device, marker),
            "{name}'s device holds plaintext after the rebuild"
        );
    }

    // A pool that encrypts its volumes encrypts a replica placed in it,
    // whatever the volume's primary does: n2's pool `sealed` encrypts,
    // n1's and n3's do not.
    for name in ["n1", "n2", "n3"] {
        let device = dir.join(name).join("sealed.img");
        let mut args = vec!["pool", "create", "sealed", "--node", name];
        args.extend([
            "--device",
            device.to_str().unwrap(),
            "--device-size",
            "64MiB",
        ]);
        if name == "n2" {
            args.push("--encrypt");
        }
        ok(survivor, &args);
    }
    let create = [
        "volume",
        "create",
        "mixed",
        "--size",
        "8MiB",
        "--replicas",
        "3",
    ];
    let create = [&create[..], &["--pool", "sealed", "--node", "n1"]].concat();
    eventually("the volume created", || support::weft(survivor, &create).0);
    ok(survivor, &["volume", "attach", "mixed", "--host", "tester"]);
    eventually("every member in sync", || {
        let states = member_states(survivor, "mixed");
        states.len() == 3 && states.iter().all(|(_, _, state)| state == "in-sync")
    });
    let n1 = nodes[0].as_ref().unwrap();
    let (_c, mut queue) = connect_as(n1, &nqn("mixed"), HOST_NQN, 1);
    for n in 0..8 {
        retrying("write", || queue.write(1, n * 2, BLOCK, &block(n)));
    }
    retrying("flush", || queue.flush(1));
    let sealed = |name: &str| dir.join(name).join("sealed.img");
    assert!(device_holds(&sealed("n1"), marker), "n1's plain copy");
    assert!(!device_holds(&sealed("n2"), marker), "n2's pool encrypts");
}

/// The primary of `volume` other than `lost`, once there is one.
fn retrying_primary(node: &Node, volume: &str, lost: &str) -> String {
    let mut found = String::new();
    support::cluster::eventually("a primary on a live node", || {
        found = member_states(node, volume)
            .into_iter()
            .find(|(_, role, _)| role == "primary")
            .map(|(node, _, _)| node)
            .unwrap_or_default();
        !found.is_empty() && found != lost
    });
    found
}
