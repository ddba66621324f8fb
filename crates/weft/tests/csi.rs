//! `weft csi --mode controller` against a running node, through the CSI
//! client generated from the same `csi.proto`: volumes made idempotently by
//! name, validated, listed in pages, counted in capacity and deleted, with
//! the gRPC codes the CSI spec names.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use support::{ok, start_node, temp_dir, Node, WEFT};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use weft_csi::csi::controller_client::ControllerClient;
use weft_csi::csi::identity_client::IdentityClient;
use weft_csi::csi::volume_capability::access_mode::Mode;
use weft_csi::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use weft_csi::csi::*;

/// `weft csi` serving `socket` over `node`'s API; killed when dropped.
struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The CSI token of `node`'s cluster (derived from its admin token).
fn csi_token(node: &Node) -> String {
    let credentials =
        weft_api::token::Credentials::of(&node.token, weft_api::token::Generations::default());
    credentials.token_of(weft_api::token::Role::Csi).to_string()
}

fn start_plugin(node: &Node, socket: &Path) -> Plugin {
    let endpoint = format!("unix://{}", socket.display());
    let plugin = Plugin(
        Command::new(WEFT)
            .args(["csi", "--endpoint", &endpoint, "--mode", "controller"])
            .args(["--api", &node.api_url])
            // The CSI token: what the controller may do is enough.
            .env("WEFT_API_TOKEN", csi_token(node))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..100 {
        if socket.exists() {
            return plugin;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("weft csi made no socket at {}", socket.display());
}

/// `call` again while it answers Unavailable (a volume's primary starting or handing
/// over), every 100 ms for up to 5 s, as the CSI sidecars retry.
async fn retried<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    for _ in 0..50 {
        match call().await {
            Err(status) if status.code() == Code::Unavailable => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            answered => return answered,
        }
    }
    call().await
}

async fn channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    Endpoint::from_static("http://[::]:1")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap()
}

fn mount_writer() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter.into(),
        }),
    }
}

fn create(name: &str, required_bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_writer()],
        ..Default::default()
    }
}

#[test]
fn the_controller_service_makes_finds_lists_and_deletes_volumes() {
    let dir = temp_dir("csi");
    let node = start_node(&dir.join("node"), &[]);
    let device = dir.join("p.img");
    let device = device.to_str().unwrap();
    ok(
        &node,
        &[
            "pool",
            "create",
            "p",
            "--device",
            device,
            "--device-size",
            "1GiB",
        ],
    );
    let socket = dir.join("csi.sock");
    let _plugin = start_plugin(&node, &socket);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = channel(&socket).await;
        let mut identity = IdentityClient::new(channel.clone());
        let info = identity
            .get_plugin_info(GetPluginInfoRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, "csi.weft.io");
        let probe = identity.probe(ProbeRequest::default()).await.unwrap();
        assert_eq!(probe.into_inner().ready, Some(true));

        let mut controller = ControllerClient::new(channel);
        // Made in the only pool, 1 MiB granular; again by name: the same volume.
        let made = controller
            .create_volume(create("pvc-1", 5 << 20))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(
            (made.volume_id.as_str(), made.capacity_bytes),
            ("pvc-1", 5 << 20)
        );
        assert_eq!(made.volume_context["nqn"], "nqn.2026-11.io.weft:vol:pvc-1");
        let again = controller
            .create_volume(create("pvc-1", 5 << 20))
            .await
            .unwrap();
        assert_eq!(again.into_inner().volume.unwrap().volume_id, "pvc-1");
        let bigger = controller.create_volume(create("pvc-1", 9 << 20)).await;
        assert_eq!(bigger.unwrap_err().code(), Code::AlreadyExists);
        let shown = ok(&node, &["volume", "show", "pvc-1"]);
        assert!(shown.contains("5 MiB"), "{shown}");

        // A name weft cannot take gets a stable name of its own.
        let long = "k".repeat(80);
        let hashed = controller.create_volume(create(&long, 0)).await.unwrap();
        let hashed = hashed.into_inner().volume.unwrap();
        assert!(hashed.volume_id.starts_with("csi-"), "{}", hashed.volume_id);
        assert_eq!(hashed.capacity_bytes, 1 << 30, "the default size");

        // Bad requests, with the codes the spec names.
        let nameless = controller.create_volume(create("", 0)).await;
        assert_eq!(nameless.unwrap_err().code(), Code::InvalidArgument);
        let mut typo = create("pvc-2", 0);
        typo.parameters = HashMap::from([("replica".into(), "2".into())]);
        let refused = controller.create_volume(typo).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused.message().contains("unknown parameter replica"),
            "{refused}"
        );
        // QoS limits and a filesystem from the StorageClass.
        let mut limited = create("pvc-q", 4 << 20);
        limited.parameters = HashMap::from([
            ("iopsMax".into(), "1000".into()),
            ("writeBwMax".into(), "10485760".into()),
            ("fsType".into(), "xfs".into()),
        ]);
        let limited = controller.create_volume(limited).await.unwrap();
        let limited = limited.into_inner().volume.unwrap();
        assert_eq!(limited.volume_context["fsType"], "xfs");
        let shown = support::api(
            &node,
            Some(&node.token),
            "GET",
            "/api/v1/volumes/pvc-q",
            None,
        )
        .1;
        assert_eq!(shown["qos"]["iops_max"], 1000, "{shown}");
        assert_eq!(shown["qos"]["write_bw_max"], 10485760, "{shown}");
        controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: "pvc-q".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut shared = create("pvc-2", 0);
        shared.volume_capabilities[0].access_mode = Some(AccessMode {
            mode: Mode::MultiNodeMultiWriter.into(),
        });
        let refused = controller.create_volume(shared).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);

        let validated = controller
            .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: "pvc-1".into(),
                volume_capabilities: vec![mount_writer()],
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(validated.into_inner().confirmed.is_some());
        let missing = controller
            .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                volume_id: "pvc-9".into(),
                volume_capabilities: vec![mount_writer()],
                ..Default::default()
            })
            .await;
        assert_eq!(missing.unwrap_err().code(), Code::NotFound);

        // Listed in pages of one; a token this plugin never gave is refused.
        let first = controller
            .list_volumes(ListVolumesRequest {
                max_entries: 1,
                starting_token: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(first.entries.len(), 1);
        let rest = controller
            .list_volumes(ListVolumesRequest {
                max_entries: 0,
                starting_token: first.next_token,
            })
            .await
            .unwrap()
            .into_inner();
        let mut ids: Vec<String> = first
            .entries
            .iter()
            .chain(&rest.entries)
            .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
            .collect();
        ids.sort();
        assert_eq!(ids, [hashed.volume_id.clone(), "pvc-1".to_string()]);
        let bad = controller
            .list_volumes(ListVolumesRequest {
                max_entries: 1,
                starting_token: "nonsense".into(),
            })
            .await;
        assert_eq!(bad.unwrap_err().code(), Code::Aborted);

        let capacity = controller
            .get_capacity(GetCapacityRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(
            capacity.available_capacity > 900 << 20,
            "thin volumes take no space: {}",
            capacity.available_capacity
        );

        // Published to one node at a time; its id is its host NQN.
        let node_a = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000a";
        let node_b = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000000b";
        let publish = |node: &str| ControllerPublishVolumeRequest {
            volume_id: "pvc-1".into(),
            node_id: node.into(),
            volume_capability: Some(mount_writer()),
            ..Default::default()
        };
        // With DH-HMAC-CHAP secrets of the node's own, the same at every
        // publish, set on its host (bidirectional).
        let mut secrets = Vec::new();
        for _ in 0..2 {
            let published = controller.controller_publish_volume(publish(node_a)).await;
            let context = published.unwrap().into_inner().publish_context;
            assert_eq!(context["nqn"], "nqn.2026-11.io.weft:vol:pvc-1");
            assert!(
                context["dhchapSecret"].starts_with("DHHC-1:"),
                "{context:?}"
            );
            assert_ne!(context["dhchapSecret"], context["dhchapCtrlSecret"]);
            secrets.push(context["dhchapSecret"].clone());
        }
        assert_eq!(secrets[0], secrets[1]);
        let host_a = ok(&node, &["host", "list", "-o", "json"]);
        let host_a: serde_json::Value = serde_json::from_str(&host_a).unwrap();
        let host_a = host_a
            .as_array()
            .unwrap()
            .iter()
            .find(|host| host["nqn"] == node_a)
            .unwrap()
            .clone();
        assert_eq!(host_a["dhchap"], "bidirectional", "{host_a}");
        let elsewhere = controller.controller_publish_volume(publish(node_b)).await;
        assert_eq!(elsewhere.unwrap_err().code(), Code::FailedPrecondition);
        let unknown = controller
            .controller_publish_volume(publish("some-node"))
            .await;
        assert_eq!(unknown.unwrap_err().code(), Code::NotFound);
        let found = controller
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: "pvc-1".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(found.status.unwrap().published_node_ids, [node_a]);
        let hosts = ok(&node, &["host", "list"]);
        assert!(hosts.contains(node_a), "{hosts}");
        for _ in 0..2 {
            controller
                .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                    volume_id: "pvc-1".into(),
                    node_id: node_a.into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let moved = controller.controller_publish_volume(publish(node_b)).await;
        assert!(moved.is_ok(), "free again: {moved:?}");
        controller
            .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: "pvc-1".into(),
                ..Default::default()
            })
            .await
            .unwrap();

        // Expanded online; never shrunk.
        let expand = |required_bytes: i64| ControllerExpandVolumeRequest {
            volume_id: "pvc-1".into(),
            capacity_range: Some(CapacityRange {
                required_bytes,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        let grown = controller.controller_expand_volume(expand(8 << 20)).await;
        let grown = grown.unwrap().into_inner();
        assert_eq!(grown.capacity_bytes, 8 << 20);
        assert!(
            grown.node_expansion_required,
            "a filesystem grows on the node"
        );
        let kept = controller.controller_expand_volume(expand(2 << 20)).await;
        assert_eq!(kept.unwrap().into_inner().capacity_bytes, 8 << 20);
        let shown = ok(&node, &["volume", "show", "pvc-1"]);
        assert!(shown.contains("8 MiB"), "{shown}");

        // A snapshot (idempotent by name) and a volume made from it.
        let snap = |name: &str| CreateSnapshotRequest {
            source_volume_id: "pvc-1".into(),
            name: name.into(),
            ..Default::default()
        };
        let taken = controller.create_snapshot(snap("snap-1")).await.unwrap();
        let taken = taken.into_inner().snapshot.unwrap();
        assert!(
            taken.snapshot_id.starts_with("pvc-1@csi-"),
            "{}",
            taken.snapshot_id
        );
        assert!(taken.creation_time.unwrap().seconds > 1_700_000_000);
        let again = controller.create_snapshot(snap("snap-1")).await.unwrap();
        assert_eq!(
            again.into_inner().snapshot.unwrap().snapshot_id,
            taken.snapshot_id
        );
        let listed = controller
            .list_snapshots(ListSnapshotsRequest {
                source_volume_id: "pvc-1".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.entries.len(), 1);
        let mut from_snapshot = create("pvc-3", 16 << 20);
        from_snapshot.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: taken.snapshot_id.clone(),
                },
            )),
        });
        let clone = controller.create_volume(from_snapshot).await.unwrap();
        let clone = clone.into_inner().volume.unwrap();
        assert_eq!(
            (clone.volume_id.as_str(), clone.capacity_bytes),
            ("pvc-3", 16 << 20)
        );
        controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: "pvc-3".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        for _ in 0..2 {
            controller
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: taken.snapshot_id.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }

        // A volume cloned from a volume: independent of its source at once
        // (its snapshot of the source is gone, the source deletes).
        let mut from_volume = create("pvc-4", 0);
        from_volume.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: "pvc-1".into(),
                },
            )),
        });
        let cloned = controller.create_volume(from_volume.clone()).await.unwrap();
        let cloned = cloned.into_inner().volume.unwrap();
        assert_eq!(
            (cloned.volume_id.as_str(), cloned.capacity_bytes),
            ("pvc-4", 8 << 20)
        );
        assert!(cloned.content_source.is_some());
        let again = controller.create_volume(from_volume).await.unwrap();
        assert_eq!(again.into_inner().volume.unwrap().volume_id, "pvc-4");
        let shown = ok(&node, &["volume", "show", "pvc-1"]);
        assert!(!shown.contains("csi-clone-"), "{shown}");
        let mut from_nothing = create("pvc-5", 0);
        from_nothing.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: "pvc-9".into(),
                },
            )),
        });
        let missing = controller.create_volume(from_nothing).await;
        assert_eq!(missing.unwrap_err().code(), Code::NotFound);

        // A single node takes every volume: a topology changes no capacity.
        let in_zone = GetCapacityRequest {
            accessible_topology: Some(Topology {
                segments: HashMap::from([("weft.io/zone".into(), "z1".into())]),
            }),
            ..Default::default()
        };
        let zoned = controller.get_capacity(in_zone).await.unwrap().into_inner();
        assert!(zoned.available_capacity > 800 << 20, "{zoned:?}");

        // Deleted, and deleting again is fine.
        for _ in 0..2 {
            controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: "pvc-1".into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let listed = ok(&node, &["volume", "list"]);
        assert!(!listed.contains("pvc-1"), "{listed}");
    });
}

/// A cluster of two zones: accessibility requirements place a volume on a
/// storage node they name (or in their zone), GetCapacity counts a zone's
/// pools, and the volume is left accessible from every node.
#[test]
fn topology_places_volumes_in_the_zone_asked_for() {
    let dir = temp_dir("csi-topology");
    let etcd = support::etcd::Etcd::start(1, &dir);
    let endpoints = etcd.endpoints();
    let start = |name: &str, zone: &str, token: Option<&Path>| {
        let listen = format!("127.0.0.1:{}", support::etcd::free_port());
        support::cluster_node(&dir, name, &listen, &endpoints, token, &["--zone", zone])
    };
    let n1 = start("n1", "z1", None);
    let token_file = dir.join("n1").join("api-token");
    let n2 = start("n2", "z2", Some(&token_file));
    for (node, name) in [(&n1, "n1"), (&n2, "n2")] {
        let device = dir.join(format!("{name}.img"));
        let device = device.to_str().unwrap();
        let args = ["pool", "create", "p", "--node", name, "--device", device];
        ok(node, &[&args[..], &["--device-size", "256MiB"]].concat());
    }
    let socket = dir.join("csi.sock");
    let _plugin = start_plugin(&n1, &socket);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let segment = |pairs: &[(&str, &str)]| Topology {
        segments: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    runtime.block_on(async {
        let mut controller = ControllerClient::new(channel(&socket).await);
        // A compute node of zone z2 (not a storage node) prefers its zone.
        let mut request = create("pvc-z2", 4 << 20);
        request.accessibility_requirements = Some(TopologyRequirement {
            requisite: vec![segment(&[
                ("weft.io/node", "worker-1"),
                ("weft.io/zone", "z1"),
            ])],
            preferred: vec![segment(&[
                ("weft.io/node", "worker-2"),
                ("weft.io/zone", "z2"),
            ])],
        });
        let mut made = None;
        for _ in 0..50 {
            // Placement waits for the pools to be in their nodes' heartbeats.
            match controller.create_volume(request.clone()).await {
                Ok(response) => {
                    made = response.into_inner().volume;
                    break;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
            }
        }
        let made = made.expect("the volume made");
        assert!(
            made.accessible_topology.is_empty(),
            "reachable from every node"
        );
        let shown = support::api(&n1, Some(&n1.token), "GET", "/api/v1/volumes/pvc-z2", None).1;
        assert_eq!(shown["node"], "n2", "{shown}");
        // A storage node named by a segment takes it itself.
        let mut request = create("pvc-n1", 4 << 20);
        request.accessibility_requirements = Some(TopologyRequirement {
            requisite: Vec::new(),
            preferred: vec![segment(&[("weft.io/node", "n1"), ("weft.io/zone", "z2")])],
        });
        controller.create_volume(request).await.unwrap();
        let shown = support::api(&n1, Some(&n1.token), "GET", "/api/v1/volumes/pvc-n1", None).1;
        assert_eq!(shown["node"], "n1", "{shown}");
        // Capacity per zone: one 256 MiB pool each; both without a topology.
        let capacity = |topology: Option<Topology>| {
            let mut controller = controller.clone();
            async move {
                let request = GetCapacityRequest {
                    accessible_topology: topology,
                    ..Default::default()
                };
                controller
                    .get_capacity(request)
                    .await
                    .unwrap()
                    .into_inner()
                    .available_capacity
            }
        };
        let z1 = capacity(Some(segment(&[("weft.io/zone", "z1")]))).await;
        let all = capacity(None).await;
        assert!(z1 > 200 << 20 && z1 <= 256 << 20, "{z1}");
        assert!(all > z1 + (200 << 20), "{all} against {z1}");
    });
    drop((n1, n2, etcd));
}

/// An erasure-coded, encrypted StorageClass (`ec: "2+1"`, `encrypted:
/// "true"`) on three nodes with keys of their own: its volumes are made,
/// expanded, snapshotted, cloned from a snapshot and from a volume, and
/// deleted as any other; a clone of an unencrypted volume is refused.
#[test]
fn an_erasure_coded_class_makes_expands_snapshots_and_clones_volumes() {
    let dir = temp_dir("csi-erasure");
    std::fs::create_dir_all(&*dir).unwrap();
    let keys = |name: &str| support::kek_args(&dir, name);
    let (etcd, _, _, nodes) = support::cluster::nodes_with(&dir, "", 3, keys);
    for (node, name) in nodes.iter().zip(["n1", "n2", "n3"]) {
        let device = dir.join(format!("{name}.img"));
        let device = device.to_str().unwrap();
        let args = ["pool", "create", "p", "--node", name, "--device", device];
        ok(node, &[&args[..], &["--device-size", "256MiB"]].concat());
    }
    let n1 = &nodes[0];
    let socket = dir.join("csi.sock");
    let _plugin = start_plugin(n1, &socket);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let shown = |volume: &str| {
        let path = format!("/api/v1/volumes/{volume}");
        support::api(n1, Some(&n1.token), "GET", &path, None).1
    };
    runtime.block_on(async {
        let mut controller = ControllerClient::new(channel(&socket).await);
        let mut request = create("pvc-ec", 16 << 20);
        let class = HashMap::from([
            ("ec".into(), "2+1".into()),
            ("encrypted".into(), "true".into()),
        ]);
        request.parameters = class.clone();
        let mut made = None;
        for _ in 0..50 {
            // Placement waits for the pools to be in their nodes' heartbeats.
            match controller.create_volume(request.clone()).await {
                Ok(response) => {
                    made = response.into_inner().volume;
                    break;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
            }
        }
        assert_eq!(made.expect("the volume made").capacity_bytes, 16 << 20);
        assert_eq!(shown("pvc-ec")["erasure"]["layout"], "2+1");
        assert_eq!(shown("pvc-ec")["encryption"]["state"], "unlocked");

        let expand = ControllerExpandVolumeRequest {
            volume_id: "pvc-ec".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 32 << 20,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        // Unavailable while its first primary starts: the resizer retries.
        let grown = retried(|| {
            let (mut controller, expand) = (controller.clone(), expand.clone());
            async move { controller.controller_expand_volume(expand).await }
        })
        .await;
        assert_eq!(grown.unwrap().into_inner().capacity_bytes, 32 << 20);
        assert_eq!(shown("pvc-ec")["size_bytes"], 32 << 20);

        let snap = CreateSnapshotRequest {
            source_volume_id: "pvc-ec".into(),
            name: "snap-ec".into(),
            ..Default::default()
        };
        // The snapshotter retries too (a primary may still be starting on a loaded machine).
        let taken = retried(|| {
            let (mut controller, snap) = (controller.clone(), snap.clone());
            async move { controller.create_snapshot(snap).await }
        })
        .await
        .unwrap();
        let taken = taken.into_inner().snapshot.unwrap();
        let sources = [
            volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
                snapshot_id: taken.snapshot_id.clone(),
            }),
            volume_content_source::Type::Volume(volume_content_source::VolumeSource {
                volume_id: "pvc-ec".into(),
            }),
        ];
        for (name, source) in ["pvc-ec-a", "pvc-ec-b"].into_iter().zip(sources) {
            let mut clone = create(name, 0);
            clone.parameters = class.clone();
            clone.volume_content_source = Some(VolumeContentSource {
                r#type: Some(source),
            });
            let made = retried(|| {
                let (mut controller, clone) = (controller.clone(), clone.clone());
                async move { controller.create_volume(clone).await }
            })
            .await
            .unwrap();
            assert_eq!(made.into_inner().volume.unwrap().capacity_bytes, 32 << 20);
            assert_eq!(shown(name)["erasure"]["layout"], "2+1", "{name}");
            assert_eq!(shown(name)["encryption"]["state"], "unlocked", "{name}");
        }
        // An encrypting class does not clone an unencrypted volume.
        let plain = controller.create_volume(create("pvc-plain", 8 << 20)).await;
        assert!(plain.is_ok(), "{plain:?}");
        let mut clone = create("pvc-plain-copy", 0);
        clone.parameters = class.clone();
        clone.volume_content_source = Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Volume(
                volume_content_source::VolumeSource {
                    volume_id: "pvc-plain".into(),
                },
            )),
        });
        let refused = controller.create_volume(clone).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused}");
        assert!(refused.message().contains("not encrypted"), "{refused}");
        controller
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: taken.snapshot_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        for volume in ["pvc-ec-a", "pvc-ec-b", "pvc-ec", "pvc-plain"] {
            controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: volume.into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let listed = ok(n1, &["volume", "list"]);
        assert!(!listed.contains("pvc-ec"), "{listed}");
    });
    drop(etcd);
}
