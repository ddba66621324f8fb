//! The Controller service: volumes made, found, listed and deleted through
//! weft's API. A CSI volume's id is its weft volume's name: the CSI name
//! itself when weft accepts it as a name, else `csi-` and 32 hex digits of
//! its SHA-256, so that a name always leads to the same volume (CreateVolume
//! is idempotent by name) and `weft volume list` shows Kubernetes' names.
//!
//! A volume made from a snapshot (content source) is weft's clone of it,
//! beside its source, grown if a larger size is asked. A volume made from a
//! volume is a clone of a snapshot taken for it, flattened (its data
//! copied) before the snapshot is deleted, so that either volume can be
//! deleted later. Accessibility requirements steer placement (see
//! [`crate::topology`]).
//!
//! StorageClass parameters: see [`crate::parameters`].

use crate::api::Api;
use crate::csi::controller_server::Controller;
use crate::csi::controller_service_capability::{rpc, Rpc, Type};
use crate::csi::validate_volume_capabilities_response::Confirmed;
use crate::csi::volume_capability::access_mode::Mode;
use crate::csi::volume_capability::AccessType;
use crate::csi::{
    controller_get_volume_response, list_snapshots_response, list_volumes_response,
    volume_content_source, ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerServiceCapability, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest, GetCapacityResponse,
    ListSnapshotsRequest, ListSnapshotsResponse, ListVolumesRequest, ListVolumesResponse,
    TopologyRequirement, ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
    Volume, VolumeCapability,
};
use crate::errors::status;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tonic::{Code, Request, Response, Status};

/// The start of the name of the snapshot a volume's clone is made from
/// (deleted once the clone is independent of it).
pub(crate) const CLONE_SNAPSHOT_PREFIX: &str = "csi-clone-";

/// Where a new volume's data comes from.
enum Source {
    /// A CSI snapshot (`VOLUME@SNAPSHOT`).
    Snapshot(String),
    /// A volume, cloned.
    Volume(String),
}

/// A volume's size when the caller gives none.
const DEFAULT_SIZE_BYTES: i64 = 1 << 30;
/// Sizes are rounded up to whole MiB (the pools' allocation unit), unless
/// the caller's limit is tighter, then to whole 4 KiB blocks.
const SIZE_UNIT_BYTES: i64 = 1 << 20;
const BLOCK_BYTES: i64 = 4096;

pub(crate) struct ControllerService {
    pub(crate) api: Api,
    /// Each node gets DH-HMAC-CHAP secrets of its own (`publish`).
    pub(crate) node_secrets: bool,
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.name.is_empty() {
            return Err(invalid("name is required"));
        }
        check_capabilities(&request.volume_capabilities)?;
        let source = match request
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            None => None,
            Some(volume_content_source::Type::Snapshot(snapshot)) => {
                Some(Source::Snapshot(snapshot.snapshot_id.clone()))
            }
            Some(volume_content_source::Type::Volume(volume)) => {
                Some(Source::Volume(volume.volume_id.clone()))
            }
        };
        let range = request.capacity_range.unwrap_or_default();
        let size_bytes = size_of(range.required_bytes, range.limit_bytes)?;
        let id = volume_id(&request.name);
        let mut body = json!({"name": id, "size_bytes": size_bytes});
        let settings = crate::parameters::parse(&request.parameters, &mut body)?;
        let fits = |volume: &Value| {
            let size = volume["size_bytes"].as_i64().unwrap_or(0);
            size >= range.required_bytes && (range.limit_bytes == 0 || size <= range.limit_bytes)
        };
        let made = match self.find(&id).await? {
            Some(existing) => existing,
            None => {
                let placement = request.accessibility_requirements.as_ref();
                let mut made = self
                    .make(&id, &request.name, body, &source, placement)
                    .await?;
                // A clone is its source's size unless a size is asked.
                let asked = range.required_bytes > 0;
                if source.is_some()
                    && asked
                    && made["size_bytes"].as_i64().unwrap_or(0) < size_bytes
                {
                    let path = format!("volumes/{id}/resize");
                    let body = json!({"size_bytes": size_bytes});
                    self.api
                        .call("POST", path, Some(body))
                        .await
                        .map_err(|e| status(&e))?;
                    made["size_bytes"] = json!(size_bytes);
                }
                made
            }
        };
        if !fits(&made) {
            return Err(Status::new(
                Code::AlreadyExists,
                format!("volume {} exists with another size", request.name),
            ));
        }
        if !settings.qos.is_empty() {
            let path = format!("volumes/{id}/qos");
            let body = Value::Object(settings.qos);
            self.api
                .call("PATCH", path, Some(body))
                .await
                .map_err(|e| status(&e))?;
        }
        let mut volume = csi_volume(&made);
        if let Some(fs_type) = settings.fs_type {
            let key = crate::parameters::FS_TYPE_CONTEXT.to_string();
            volume.volume_context.insert(key, fs_type);
        }
        volume.content_source = request.volume_content_source;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let id = request.into_inner().volume_id;
        if id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        if !is_weft_name(&id) {
            return Ok(Response::new(DeleteVolumeResponse {}));
        }
        match self.api.call("DELETE", format!("volumes/{id}"), None).await {
            Ok(_) => Ok(Response::new(DeleteVolumeResponse {})),
            // Deleted already: deletion is idempotent.
            Err(error) if error.status == Some(404) => Ok(Response::new(DeleteVolumeResponse {})),
            Err(error) => Err(status(&error)),
        }
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        if request.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities are required"));
        }
        if self.find(&request.volume_id).await?.is_none() {
            return Err(Status::not_found(format!(
                "no volume {}",
                request.volume_id
            )));
        }
        let answer = match check_capabilities(&request.volume_capabilities) {
            Ok(()) => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: request.volume_context,
                    volume_capabilities: request.volume_capabilities,
                    parameters: request.parameters,
                    mutable_parameters: request.mutable_parameters,
                }),
                message: String::new(),
            },
            Err(refusal) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: refusal.message().to_string(),
            },
        };
        Ok(Response::new(answer))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let request = request.into_inner();
        let mut volumes = self.volumes().await?;
        volumes.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        let (entries, next_token) = page(&volumes, &request.starting_token, request.max_entries)?;
        let mut listed = Vec::with_capacity(entries.len());
        for volume in entries {
            let published_node_ids = self.published_nodes(volume).await?;
            listed.push(list_volumes_response::Entry {
                volume: Some(csi_volume(volume)),
                status: Some(list_volumes_response::VolumeStatus { published_node_ids }),
            });
        }
        let entries = listed;
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    /// Free bytes in every pool (or in the `pool` parameter's); for a
    /// topology segment that names storage nodes, in theirs.
    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let request = request.into_inner();
        let wanted = request.parameters.get("pool");
        let pools = self.list("pools").await?;
        let mut free: u64 = pools
            .iter()
            .filter(|pool| wanted.is_none_or(|name| pool["name"].as_str() == Some(name)))
            .filter(|pool| pool["state"].as_str() != Some("failed"))
            .map(|pool| pool["free_bytes"].as_u64().unwrap_or(0))
            .sum();
        if let Some(topology) = request.accessible_topology.filter(|_| clustered(&pools)) {
            let nodes = self.list("nodes").await?;
            let named = crate::topology::named(&nodes, &topology.segments);
            if !named.is_empty() {
                free = named
                    .iter()
                    .map(|node| crate::topology::free_bytes(node, wanted.map(String::as_str)))
                    .sum();
            }
        }
        Ok(Response::new(GetCapacityResponse {
            available_capacity: i64::try_from(free).unwrap_or(i64::MAX),
            maximum_volume_size: None,
            minimum_volume_size: None,
        }))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let capability = request
            .volume_capability
            .ok_or_else(|| invalid("volume_capability is required"))?;
        check_capabilities(&[capability])?;
        let publish_context = self.publish(&request.volume_id, &request.node_id).await?;
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context,
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        self.unpublish(&request.volume_id, &request.node_id).await?;
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    /// Grows the volume online (never shrinks it); a filesystem on it is
    /// grown by the node.
    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        let range = request
            .capacity_range
            .ok_or_else(|| invalid("capacity_range is required"))?;
        let volume = self
            .find(&request.volume_id)
            .await?
            .ok_or_else(|| Status::not_found(format!("no volume {}", request.volume_id)))?;
        let current = volume["size_bytes"].as_i64().unwrap_or(0);
        let wanted = size_of(range.required_bytes, range.limit_bytes)?;
        if wanted > current {
            let path = format!("volumes/{}/resize", request.volume_id);
            let body = json!({"size_bytes": wanted});
            self.api
                .call("POST", path, Some(body))
                .await
                .map_err(|e| status(&e))?;
        }
        let block = matches!(
            request.volume_capability.and_then(|c| c.access_type),
            Some(AccessType::Block(_))
        );
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: wanted.max(current),
            node_expansion_required: !block,
        }))
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let id = request.into_inner().volume_id;
        if id.is_empty() {
            return Err(invalid("volume_id is required"));
        }
        let volume = self
            .find(&id)
            .await?
            .ok_or_else(|| Status::not_found(format!("no volume {id}")))?;
        let published_node_ids = self.published_nodes(&volume).await?;
        Ok(Response::new(ControllerGetVolumeResponse {
            volume: Some(csi_volume(&volume)),
            status: Some(controller_get_volume_response::VolumeStatus { published_node_ids }),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let request = request.into_inner();
        let snapshot = self
            .create_snapshot(&request.source_volume_id, &request.name)
            .await?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        self.delete_snapshot(&request.into_inner().snapshot_id)
            .await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let request = request.into_inner();
        let snapshots = self
            .list_snapshots(&request.source_volume_id, &request.snapshot_id)
            .await?;
        let (entries, next_token) = page(&snapshots, &request.starting_token, request.max_entries)?;
        let entries = entries
            .iter()
            .map(|snapshot| list_snapshots_response::Entry {
                snapshot: Some(snapshot.clone()),
            })
            .collect();
        Ok(Response::new(ListSnapshotsResponse {
            entries,
            next_token,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            rpc::Type::CreateDeleteVolume,
            rpc::Type::PublishUnpublishVolume,
            rpc::Type::ListVolumes,
            rpc::Type::ListVolumesPublishedNodes,
            rpc::Type::GetCapacity,
            rpc::Type::ExpandVolume,
            rpc::Type::GetVolume,
            rpc::Type::CreateDeleteSnapshot,
            rpc::Type::ListSnapshots,
            rpc::Type::CloneVolume,
        ]
        .into_iter()
        .map(|kind| ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc {
                r#type: kind.into(),
            })),
        })
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }
}

impl ControllerService {
    /// Every volume, as the API lists them.
    pub(crate) async fn volumes(&self) -> Result<Vec<Value>, Status> {
        self.list("volumes").await
    }

    /// What the API lists at `path` (`volumes`, `hosts`, `pools`, `nodes`).
    pub(crate) async fn list(&self, path: &str) -> Result<Vec<Value>, Status> {
        let listed = self.api.call("GET", path.into(), None).await;
        match listed.map_err(|e| status(&e))? {
            Value::Array(items) => Ok(items),
            _ => Err(Status::internal(format!(
                "the weft API listed no array at {path}"
            ))),
        }
    }

    /// No `pool` parameter: a cluster places the volume itself, on the
    /// storage node the accessibility requirements name if they name one
    /// (see [`crate::topology`]); a single node's pool with the most free
    /// bytes takes it.
    async fn place(
        &self,
        body: &mut Value,
        requirement: Option<&TopologyRequirement>,
    ) -> Result<(), Status> {
        let pools = self.list("pools").await?;
        if clustered(&pools) {
            if let Some(requirement) = requirement {
                let nodes = self.list("nodes").await?;
                let encrypted = body["encrypted"] == json!(true);
                if let Some(node) = crate::topology::choose(&nodes, requirement, encrypted) {
                    body["node"] = json!(node);
                }
            }
            return Ok(());
        }
        let roomiest = pools
            .iter()
            .filter(|pool| pool["state"].as_str() != Some("failed"))
            .max_by_key(|pool| pool["free_bytes"].as_u64().unwrap_or(0))
            .and_then(|pool| pool["name"].as_str())
            .ok_or_else(|| {
                Status::resource_exhausted(
                    "weft has no pool to put the volume in: create one (weft pool create)",
                )
            })?;
        body["pool"] = json!(roomiest);
        Ok(())
    }

    /// Makes volume `id` (CSI name `name`) from `body`, or from `source`,
    /// placed by `placement`; the volume as the API shows it (one made
    /// meanwhile by another call of the same name, if one was).
    async fn make(
        &self,
        id: &str,
        name: &str,
        mut body: Value,
        source: &Option<Source>,
        placement: Option<&TopologyRequirement>,
    ) -> Result<Value, Status> {
        if body["encrypted"] == json!(true) {
            self.check_encrypted_source(source).await?;
        }
        let snapshot = match source {
            Some(Source::Snapshot(snapshot)) => {
                if crate::snapshots::split_id(snapshot).is_none() {
                    return Err(Status::not_found(format!("no snapshot {snapshot}")));
                }
                snapshot.clone()
            }
            Some(Source::Volume(volume)) => self.clone_point(volume, name).await?,
            None => String::new(),
        };
        if source.is_some() {
            // A clone is made beside its source, of its size.
            body = json!({"name": id, "source": snapshot});
        } else if body.get("pool").is_none() {
            self.place(&mut body, placement).await?;
        }
        match self.api.call("POST", "volumes".into(), Some(body)).await {
            Ok(_) => {}
            Err(error) if error.status == Some(409) => {}
            Err(error) if error.status == Some(404) && source.is_some() => {
                return Err(Status::not_found(error.message))
            }
            Err(error) => return Err(status(&error)),
        }
        if let Some(Source::Volume(volume)) = source {
            self.detach_clone(id, volume, &snapshot).await?;
        }
        self.find(id)
            .await?
            .ok_or_else(|| Status::internal(format!("volume {id} was made but cannot be found")))
    }

    /// A class that encrypts makes clones only of encrypted volumes (a
    /// clone shares its source's blocks and key: it is encrypted exactly
    /// when its source is), rather than an unencrypted volume silently.
    async fn check_encrypted_source(&self, source: &Option<Source>) -> Result<(), Status> {
        let volume = match source {
            None => return Ok(()),
            Some(Source::Volume(volume)) => volume.clone(),
            Some(Source::Snapshot(snapshot)) => match crate::snapshots::split_id(snapshot) {
                Some((volume, _)) => volume.to_string(),
                None => return Ok(()),
            },
        };
        match self.find(&volume).await? {
            Some(view) if view["encryption"].is_null() => Err(Status::invalid_argument(format!(
                "the StorageClass encrypts, but the source volume {volume} is not encrypted: a clone is encrypted exactly when its source is; use a class without encrypted: \"true\" for it"
            ))),
            _ => Ok(()),
        }
    }

    /// The snapshot a clone of `volume` named `name` is made from:
    /// `VOLUME@csi-clone-HASH`, taken now unless an earlier try took it.
    async fn clone_point(&self, volume: &str, name: &str) -> Result<String, Status> {
        if self.find(volume).await?.is_none() {
            return Err(Status::not_found(format!("no volume {volume} to clone")));
        }
        let snapshot = format!("{CLONE_SNAPSHOT_PREFIX}{}", hashed(name, 12));
        let path = format!("volumes/{volume}/snapshots");
        match self
            .api
            .call("POST", path, Some(json!({"name": snapshot})))
            .await
        {
            Ok(_) => {}
            Err(error) if error.status == Some(409) => {}
            Err(error) => return Err(status(&error)),
        }
        Ok(format!("{volume}@{snapshot}"))
    }

    /// Makes clone `id` independent of `snapshot` of `volume` (its data
    /// copied), then deletes the snapshot: the clone is a volume like any.
    async fn detach_clone(&self, id: &str, volume: &str, snapshot: &str) -> Result<(), Status> {
        self.api
            .call("POST", format!("volumes/{id}/flatten"), None)
            .await
            .map_err(|e| status(&e))?;
        let (_, name) = crate::snapshots::split_id(snapshot).expect("made by clone_point");
        let path = format!("volumes/{volume}/snapshots/{name}");
        match self.api.call("DELETE", path, None).await {
            Ok(_) => Ok(()),
            Err(error) if error.status == Some(404) => Ok(()),
            Err(error) => Err(status(&error)),
        }
    }

    /// The weft volume `id`, if it exists.
    pub(crate) async fn find(&self, id: &str) -> Result<Option<Value>, Status> {
        if !is_weft_name(id) {
            return Ok(None);
        }
        match self.api.call("GET", format!("volumes/{id}"), None).await {
            Ok(volume) => Ok(Some(volume)),
            Err(error) if error.status == Some(404) => Ok(None),
            Err(error) => Err(status(&error)),
        }
    }
}

/// Whether the API's pools are a cluster's (each names its node).
fn clustered(pools: &[Value]) -> bool {
    pools
        .iter()
        .any(|pool| pool.get("node").is_some_and(|n| !n.is_null()))
}

fn invalid(message: &str) -> Status {
    Status::invalid_argument(message)
}

/// The weft volume name of CSI volume `name` (see the module's docs); also
/// a file name.
pub(crate) fn volume_id(name: &str) -> String {
    if is_weft_name(name) {
        return name.to_string();
    }
    format!("csi-{}", hashed(name, 16))
}

/// The first `bytes` bytes of the SHA-256 of `text`, in hex: how the
/// plugin names what weft cannot take by its CSI name.
pub(crate) fn hashed(text: &str, bytes: usize) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest[..bytes].iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether weft takes `name` as a volume name: 1 to 64 of letters, digits,
/// '.', '_' and '-', starting with a letter or digit.
fn is_weft_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A volume's size from the caller's range: the required size (1 GiB if
/// none, within the limit), rounded up to whole MiB, or to whole blocks
/// if the limit is tighter.
fn size_of(required: i64, limit: i64) -> Result<i64, Status> {
    if required < 0 || limit < 0 {
        return Err(Status::out_of_range(
            "capacity_range: sizes are never negative",
        ));
    }
    if limit > 0 && required > limit {
        return Err(Status::out_of_range(format!(
            "capacity_range: required {required} bytes is more than the limit of {limit}"
        )));
    }
    let wanted = match (required, limit) {
        (0, 0) => DEFAULT_SIZE_BYTES,
        (0, limit) => DEFAULT_SIZE_BYTES.min(limit),
        (required, _) => required,
    };
    let round = |unit: i64| (wanted.saturating_add(unit - 1) / unit).saturating_mul(unit);
    let size = match round(SIZE_UNIT_BYTES) {
        size if limit == 0 || size <= limit => size,
        _ => round(BLOCK_BYTES),
    };
    if limit > 0 && size > limit {
        return Err(Status::out_of_range(format!(
            "capacity_range: no size of whole {BLOCK_BYTES}-byte blocks between {required} and {limit} bytes"
        )));
    }
    Ok(size)
}

/// What weft serves: a volume on one node at a time, as a block device or
/// a filesystem on it.
fn check_capabilities(capabilities: &[VolumeCapability]) -> Result<(), Status> {
    if capabilities.is_empty() {
        return Err(invalid("volume_capabilities are required"));
    }
    for capability in capabilities {
        if !matches!(
            capability.access_type,
            Some(AccessType::Block(_) | AccessType::Mount(_))
        ) {
            return Err(invalid(
                "each volume capability needs an access type (block or mount)",
            ));
        }
        let mode = capability
            .access_mode
            .as_ref()
            .and_then(|m| Mode::try_from(m.mode).ok());
        match mode {
            Some(
                Mode::SingleNodeWriter
                | Mode::SingleNodeReaderOnly
                | Mode::SingleNodeSingleWriter
                | Mode::SingleNodeMultiWriter,
            ) => {}
            Some(mode) => {
                return Err(invalid(&format!(
                    "access mode {}: weft volumes are used by one node at a time",
                    mode.as_str_name()
                )))
            }
            None => return Err(invalid("each volume capability needs an access mode")),
        }
    }
    Ok(())
}

/// The answer to a CreateVolume whose volume exists already.
/// A weft volume (the API's JSON) as a CSI volume.
fn csi_volume(volume: &Value) -> Volume {
    let text = |key: &str| volume[key].as_str().unwrap_or_default().to_string();
    let context = [("nqn", text("nqn")), ("uuid", text("uuid"))]
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| (key.to_string(), value))
        .collect();
    Volume {
        capacity_bytes: volume["size_bytes"].as_i64().unwrap_or(0),
        volume_id: text("name"),
        volume_context: context,
        content_source: None,
        accessible_topology: Vec::new(),
    }
}

/// The page of `items` from `token` (an index, empty: the first), at most
/// `max_entries` (0: all), and the token of the next page.
pub(crate) fn page<'a, T>(
    items: &'a [T],
    token: &str,
    max_entries: i32,
) -> Result<(&'a [T], String), Status> {
    let start: usize = match token {
        "" => 0,
        token => token
            .parse()
            .ok()
            .filter(|&start| start <= items.len())
            .ok_or_else(|| {
                Status::aborted(format!(
                    "starting_token {token:?} is not one this plugin gave"
                ))
            })?,
    };
    if max_entries < 0 {
        return Err(invalid("max_entries is never negative"));
    }
    let end = match max_entries {
        0 => items.len(),
        most => (start + most as usize).min(items.len()),
    };
    let next = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((&items[start..end], next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csi_names_weft_cannot_take_become_a_stable_hashed_name() {
        assert_eq!(volume_id("pvc-1234"), "pvc-1234");
        let long = "x".repeat(80);
        assert_eq!(volume_id(&long), volume_id(&long));
        assert!(volume_id(&long).starts_with("csi-") && volume_id(&long).len() == 36);
        assert_ne!(volume_id("a/b"), volume_id("a/c"));
    }

    #[test]
    fn sizes_round_up_to_mib_within_the_limit() {
        assert_eq!(size_of(0, 0).unwrap(), 1 << 30);
        assert_eq!(size_of(1, 0).unwrap(), 1 << 20);
        assert_eq!(size_of(0, 8 << 20).unwrap(), 8 << 20);
        assert_eq!(
            size_of(5000, 9000).unwrap(),
            8192,
            "whole blocks when MiB do not fit"
        );
        assert_eq!(size_of(10 << 20, 0).unwrap(), 10 << 20);
        assert_eq!(size_of(5000, 6000).unwrap_err().code(), Code::OutOfRange);
        assert_eq!(size_of(10, 5).unwrap_err().code(), Code::OutOfRange);
    }

    #[test]
    fn pages_follow_their_tokens() {
        let items: Vec<Value> = (0..5).map(|i| json!({"name": i})).collect();
        let (first, next) = page(&items, "", 2).unwrap();
        assert_eq!((first.len(), next.as_str()), (2, "2"));
        let (last, next) = page(&items, "4", 2).unwrap();
        assert_eq!((last.len(), next.as_str()), (1, ""));
        assert_eq!(page(&items, "9", 2).unwrap_err().code(), Code::Aborted);
        assert_eq!(page(&items, "x", 0).unwrap_err().code(), Code::Aborted);
    }
}
