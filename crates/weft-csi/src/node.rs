//! The Node service, on every Kubernetes node: a published volume is
//! connected (nvme-cli, every path the discovery controllers list; Linux's
//! native multipath makes them one device), found by its namespace UUID,
//! given a filesystem if it has none (ext4 unless the capability says xfs)
//! and mounted at the staging path; published by bind mounts (a raw block
//! volume: its device bound onto a file). Unstaging unmounts and
//! disconnects. Every call is idempotent: done already is success.
//!
//! The node's id is its host NQN. What staging learned of a volume (its
//! NQN and namespace UUID) is kept in a file per volume under the state
//! directory, for the calls that do not carry it.

use crate::csi::node_server::Node;
use crate::csi::node_service_capability::{rpc, Rpc, Type};
use crate::csi::volume_capability::AccessType;
use crate::csi::volume_usage::Unit;
use crate::csi::*;
use crate::host::{self, HostError};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::{Request, Response, Status};

/// How long a connected namespace may take to appear.
const APPEAR_WAIT: Duration = Duration::from_secs(20);

pub(crate) struct NodeService {
    /// This node's host NQN (its CSI node id).
    pub(crate) host_nqn: String,
    /// A weft discovery controller, `ADDR:PORT`.
    pub(crate) discovery: String,
    /// Where what staging learned is kept.
    pub(crate) state_dir: PathBuf,
    /// The Kubernetes node's name (its `weft.io/node` segment).
    pub(crate) node_name: String,
    /// Its zone (its `weft.io/zone` segment), if given.
    pub(crate) zone: Option<String>,
}

/// A staged volume, as its state file holds it.
struct Staged {
    nqn: String,
    uuid: String,
}

fn internal(error: HostError) -> Status {
    Status::internal(error.to_string())
}

fn required(value: &str, what: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    Ok(())
}

/// Runs `work` on the blocking pool (it calls the host's tools).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Status::internal(e.to_string()))?
}

impl NodeService {
    fn state_file(&self, volume_id: &str) -> PathBuf {
        self.state_dir
            .join(format!("{}.json", crate::controller::volume_id(volume_id)))
    }

    fn staged(&self, volume_id: &str) -> Option<Staged> {
        let text = std::fs::read_to_string(self.state_file(volume_id)).ok()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        Some(Staged {
            nqn: value["nqn"].as_str()?.to_string(),
            uuid: value["uuid"].as_str()?.to_string(),
        })
    }

    fn device_of(&self, volume_id: &str) -> Result<PathBuf, Status> {
        let staged = self
            .staged(volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {volume_id} is not staged here")))?;
        host::namespace_device(&staged.uuid, Duration::ZERO)
            .ok_or_else(|| Status::not_found(format!("volume {volume_id} has no device here")))
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.host_nqn.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(crate::topology::of_node(
                &self.node_name,
                self.zone.as_deref(),
            )),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = [
            rpc::Type::StageUnstageVolume,
            rpc::Type::GetVolumeStats,
            rpc::Type::ExpandVolume,
        ]
        .into_iter()
        .map(|kind| NodeServiceCapability {
            r#type: Some(Type::Rpc(Rpc {
                r#type: kind.into(),
            })),
        })
        .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let request = request.into_inner();
        required(&request.volume_id, "volume_id")?;
        required(&request.staging_target_path, "staging_target_path")?;
        let capability = request
            .volume_capability
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        let context = |key: &str| {
            request
                .publish_context
                .get(key)
                .or_else(|| request.volume_context.get(key))
                .cloned()
                .unwrap_or_default()
        };
        let (nqn, uuid) = (context("nqn"), context("uuid"));
        let secrets = Some(host::Secrets {
            host: context(crate::publish::HOST_SECRET),
            controller: context(crate::publish::CONTROLLER_SECRET),
        })
        .filter(|secrets| !secrets.host.is_empty() && !secrets.controller.is_empty());
        let context_fs_type = context(crate::parameters::FS_TYPE_CONTEXT);
        if nqn.is_empty() || uuid.is_empty() {
            // Only ControllerPublishVolume tells where a volume is.
            return Err(Status::not_found(format!(
                "volume {}: not published to this node (its publish_context names no nqn and uuid)",
                request.volume_id
            )));
        }
        let state = json!({"nqn": nqn, "uuid": uuid}).to_string();
        std::fs::create_dir_all(&self.state_dir)
            .and_then(|()| std::fs::write(self.state_file(&request.volume_id), state))
            .map_err(|e| Status::internal(format!("{}: {e}", self.state_dir.display())))?;
        let (host_nqn, discovery) = (self.host_nqn.clone(), self.discovery.clone());
        let staging = request.staging_target_path;
        blocking(move || {
            let places = host::discover(&discovery, &host_nqn, &nqn).map_err(internal)?;
            if places.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "no discovery controller lists {nqn} for this node ({host_nqn}): is the volume published to it?"
                )));
            }
            let failed = host::connect(&places, &host_nqn, &nqn, secrets.as_ref());
            let device = host::namespace_device(&uuid, APPEAR_WAIT).ok_or_else(|| {
                let said: Vec<String> = failed.iter().map(ToString::to_string).collect();
                Status::unavailable(format!(
                    "namespace {uuid} of {nqn} did not appear after connecting ({})",
                    said.join("; ")
                ))
            })?;
            let Some(AccessType::Mount(mount)) = capability.access_type else {
                // A raw block volume: published as its device.
                return Ok(());
            };
            if host::is_mounted(&staging) {
                return Ok(());
            }
            // The capability's filesystem, else the StorageClass's fsType.
            let fs_type = match mount.fs_type.as_str() {
                "" => context_fs_type,
                named => named.to_string(),
            };
            let kind = match fs_type.as_str() {
                "" => "ext4",
                kind @ ("ext4" | "xfs") => kind,
                other => {
                    return Err(Status::invalid_argument(format!(
                        "fs_type {other}: weft's node plugin makes ext4 or xfs"
                    )))
                }
            };
            match host::filesystem_of(&device) {
                None => host::make_filesystem(&device, kind).map_err(internal)?,
                Some(found) if found != kind => {
                    return Err(Status::already_exists(format!(
                        "volume holds a {found} filesystem, not {kind}"
                    )))
                }
                Some(_) => {}
            }
            std::fs::create_dir_all(&staging)
                .map_err(|e| Status::internal(format!("{staging}: {e}")))?;
            let device = device.to_string_lossy().into_owned();
            let mut args = vec!["-t", kind];
            let options = mount.mount_flags.join(",");
            if !options.is_empty() {
                args.extend(["-o", &options]);
            }
            args.extend([device.as_str(), staging.as_str()]);
            host::run("mount", &args).map_err(internal)?;
            log::info!("{nqn}: {device} ({kind}) mounted at {staging}");
            Ok(())
        })
        .await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let request = request.into_inner();
        required(&request.volume_id, "volume_id")?;
        required(&request.staging_target_path, "staging_target_path")?;
        let staged = self.staged(&request.volume_id);
        let state_file = self.state_file(&request.volume_id);
        let staging = request.staging_target_path;
        blocking(move || {
            if host::is_mounted(&staging) {
                host::run("umount", &[&staging]).map_err(internal)?;
            }
            if let Some(staged) = staged {
                host::disconnect(&staged.nqn).map_err(internal)?;
                log::info!("{}: unstaged, disconnected", staged.nqn);
            }
            let _ = std::fs::remove_file(state_file);
            Ok(())
        })
        .await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        required(&request.volume_id, "volume_id")?;
        required(&request.staging_target_path, "staging_target_path")?;
        required(&request.target_path, "target_path")?;
        let capability = request
            .volume_capability
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        let block = matches!(capability.access_type, Some(AccessType::Block(_)));
        let source = match block {
            true => self.device_of(&request.volume_id)?,
            false => {
                if self.staged(&request.volume_id).is_none() {
                    return Err(Status::failed_precondition(format!(
                        "volume {} is not staged here",
                        request.volume_id
                    )));
                }
                PathBuf::from(&request.staging_target_path)
            }
        };
        let (target, readonly) = (request.target_path, request.readonly);
        blocking(move || {
            if host::is_mounted(&target) {
                return Ok(());
            }
            let made = match block {
                true => Path::new(&target)
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::File::create(&target).map(|_| ())),
                false => std::fs::create_dir_all(&target),
            };
            made.map_err(|e| Status::internal(format!("{target}: {e}")))?;
            let source = source.to_string_lossy().into_owned();
            host::run("mount", &["--bind", &source, &target]).map_err(internal)?;
            if readonly {
                host::run("mount", &["-o", "remount,bind,ro", &target]).map_err(internal)?;
            }
            Ok(())
        })
        .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        required(&request.volume_id, "volume_id")?;
        required(&request.target_path, "target_path")?;
        let target = request.target_path;
        blocking(move || {
            if host::is_mounted(&target) {
                host::run("umount", &[&target]).map_err(internal)?;
            }
            let path = Path::new(&target);
            let removed = match path.is_dir() {
                true => std::fs::remove_dir(path),
                false => std::fs::remove_file(path),
            };
            match removed {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Status::internal(format!("{target}: {e}")))
                }
                _ => Ok(()),
            }
        })
        .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let request = request.into_inner();
        required(&request.volume_id, "volume_id")?;
        required(&request.volume_path, "volume_path")?;
        if self.staged(&request.volume_id).is_none() {
            return Err(Status::not_found(format!(
                "volume {} is not staged here",
                request.volume_id
            )));
        }
        let path = request.volume_path;
        if !Path::new(&path).exists() {
            return Err(Status::not_found(format!("no volume at {path}")));
        }
        let device = self.device_of(&request.volume_id);
        let usage = blocking(move || {
            let usage = |unit: Unit, [total, available, used]: [u64; 3]| VolumeUsage {
                total: i64::try_from(total).unwrap_or(i64::MAX),
                available: i64::try_from(available).unwrap_or(i64::MAX),
                used: i64::try_from(used).unwrap_or(i64::MAX),
                unit: unit.into(),
            };
            if Path::new(&path).is_dir() {
                let [b0, b1, b2, i0, i1, i2] = host::filesystem_usage(&path).map_err(internal)?;
                return Ok(vec![
                    usage(Unit::Bytes, [b0, b1, b2]),
                    usage(Unit::Inodes, [i0, i1, i2]),
                ]);
            }
            let bytes = host::device_bytes(&device?).map_err(internal)?;
            Ok(vec![usage(Unit::Bytes, [bytes, 0, bytes])])
        })
        .await?;
        Ok(Response::new(NodeGetVolumeStatsResponse { usage }))
    }

    /// Grows the filesystem to the device's new size (a raw block volume
    /// needs nothing: the device grew already).
    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let request = request.into_inner();
        required(&request.volume_id, "volume_id")?;
        required(&request.volume_path, "volume_path")?;
        let device = self.device_of(&request.volume_id)?;
        let path = request.volume_path;
        let capacity_bytes = blocking(move || {
            if Path::new(&path).is_dir() {
                if let Some(kind) = host::filesystem_of(&device) {
                    host::grow_filesystem(&device, &kind, &path).map_err(internal)?;
                }
            }
            host::device_bytes(&device).map_err(internal)
        })
        .await?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(capacity_bytes).unwrap_or(i64::MAX),
        }))
    }
}
