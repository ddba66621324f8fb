//! The node's control API (HTTP/JSON, default 127.0.0.1:9440): pools,
//! volumes and snapshots. Every call becomes one admin operation of the
//! volume manager; errors are `{code, message, hint}` with the HTTP status
//! the failure calls for. The API never touches the I/O path.
//!
//! Routes (sizes in bytes):
//! - `GET /api/v1/pools`, `POST /api/v1/pools {name, devices, allocation_unit_bytes?, device_size_bytes?, force?}`
//! - `GET /api/v1/volumes`, `POST /api/v1/volumes {name, pool, size_bytes, block_size?, thick?}`
//!   or `{name, source: "volume@snapshot"}` (a clone)
//! - `GET|DELETE /api/v1/volumes/NAME` (`?force=true` disconnects hosts)
//! - `POST /api/v1/volumes/NAME/resize {size_bytes}`, `POST /api/v1/volumes/NAME/flatten`
//! - `POST /api/v1/volumes/NAME/snapshots {name}`, `DELETE /api/v1/volumes/NAME/snapshots/SNAP`

use crate::http::{self, Request};
use crate::volumes::{AdminError, AdminOp, AdminReply, ManagerHandle, DEFAULT_CHUNK_BYTES};
use serde::Deserialize;
use serde_json::json;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use weft_volume::{VolumeError, VolumeSpec};

/// Default API address.
pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:9440";

/// Binds `address` and serves the API on a thread; returns the bound address.
pub fn start(address: SocketAddr, manager: ManagerHandle) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind(address).map_err(|e| {
        format!("cannot listen on {address} for the API: {e} (choose another with --api-listen)")
    })?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("weft-api".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let manager = manager.clone();
                let _ = std::thread::Builder::new()
                    .name("weft-api-call".into())
                    .spawn(move || serve_connection(stream, &manager));
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(bound)
}

fn serve_connection(mut stream: TcpStream, manager: &ManagerHandle) {
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let (status, body) = match http::read_request(&mut stream) {
        Ok(request) => route(&request, manager),
        Err(error) => failure(
            400,
            "bad_request",
            &error.to_string(),
            "send an HTTP/1.1 request with a JSON body",
        ),
    };
    let _ = http::write_response(&mut stream, status, body.to_string().as_bytes());
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreatePool {
    name: String,
    devices: Vec<PathBuf>,
    allocation_unit_bytes: Option<u32>,
    device_size_bytes: Option<u64>,
    #[serde(default)]
    force: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateVolume {
    name: String,
    pool: Option<String>,
    size_bytes: Option<u64>,
    block_size: Option<u32>,
    #[serde(default)]
    thick: bool,
    source: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resize {
    size_bytes: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Named {
    name: String,
}

type Response = (u16, serde_json::Value);

fn route(request: &Request, manager: &ManagerHandle) -> Response {
    let segments: Vec<&str> = request
        .path
        .trim_start_matches("/api/v1/")
        .split('/')
        .collect();
    let op = match (request.method.as_str(), segments.as_slice()) {
        ("GET", ["pools"]) => Ok(AdminOp::ListPools),
        ("POST", ["pools"]) => parse(&request.body).map(|p: CreatePool| AdminOp::CreatePool {
            name: p.name,
            devices: p.devices,
            chunk_bytes: p.allocation_unit_bytes.unwrap_or(DEFAULT_CHUNK_BYTES),
            device_bytes: p.device_size_bytes,
            force: p.force,
        }),
        ("GET", ["volumes"]) => Ok(AdminOp::ListVolumes),
        ("POST", ["volumes"]) => parse(&request.body).and_then(create_volume),
        ("GET", ["volumes", name]) => Ok(AdminOp::ShowVolume(name.to_string())),
        ("DELETE", ["volumes", name]) => Ok(AdminOp::DeleteVolume {
            name: name.to_string(),
            force: request.query.split('&').any(|q| q == "force=true"),
        }),
        ("POST", ["volumes", name, "resize"]) => {
            parse(&request.body).map(|r: Resize| AdminOp::ResizeVolume {
                name: name.to_string(),
                size_bytes: r.size_bytes,
            })
        }
        ("POST", ["volumes", name, "flatten"]) => Ok(AdminOp::FlattenVolume(name.to_string())),
        ("POST", ["volumes", volume, "snapshots"]) => {
            parse(&request.body).map(|n: Named| AdminOp::CreateSnapshot {
                volume: volume.to_string(),
                name: n.name,
            })
        }
        ("DELETE", ["volumes", volume, "snapshots", name]) => Ok(AdminOp::DeleteSnapshot {
            volume: volume.to_string(),
            name: name.to_string(),
        }),
        _ => Err(failure(
            404,
            "no_route",
            &format!("no API route {} {}", request.method, request.path),
            "see the route list in weft's README (API section)",
        )),
    };
    let op = match op {
        Ok(op) => op,
        Err(response) => return response,
    };
    let created = matches!(
        op,
        AdminOp::CreatePool { .. }
            | AdminOp::CreateVolume { .. }
            | AdminOp::CloneVolume { .. }
            | AdminOp::CreateSnapshot { .. }
    );
    match manager.call(op) {
        Ok(AdminReply::Done) => (if created { 201 } else { 200 }, json!({"ok": true})),
        Ok(reply) => (200, serde_json::to_value(reply).expect("serialisable")),
        Err(error) => admin_failure(&error),
    }
}

fn create_volume(body: CreateVolume) -> Result<AdminOp, Response> {
    if let Some(source) = body.source {
        let Some((volume, snapshot)) = source.split_once('@') else {
            return Err(failure(
                400,
                "invalid",
                &format!("source {source:?} is not VOLUME@SNAPSHOT"),
                "clone from a snapshot, e.g. db1@s1",
            ));
        };
        return Ok(AdminOp::CloneVolume {
            volume: volume.to_string(),
            snapshot: snapshot.to_string(),
            name: body.name,
        });
    }
    let (Some(pool), Some(size_bytes)) = (body.pool, body.size_bytes) else {
        return Err(failure(
            400,
            "invalid",
            "a new volume needs pool and size_bytes (or source for a clone)",
            "e.g. {\"name\": \"db1\", \"pool\": \"fast\", \"size_bytes\": 107374182400}",
        ));
    };
    Ok(AdminOp::CreateVolume {
        pool,
        spec: VolumeSpec {
            name: body.name,
            size_bytes,
            block_size: body.block_size.unwrap_or(4096),
            thick: body.thick,
        },
    })
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|error| {
        failure(
            400,
            "invalid_json",
            &format!("request body: {error}"),
            "send the JSON fields this route documents",
        )
    })
}

fn failure(status: u16, code: &str, message: &str, hint: &str) -> Response {
    (
        status,
        json!({"code": code, "message": message, "hint": hint}),
    )
}

/// The one place volume and node errors become HTTP statuses.
fn admin_failure(error: &AdminError) -> Response {
    let message = error.to_string();
    let (status, code, hint) = match error {
        AdminError::Volume(volume) => match volume {
            VolumeError::NotFound { .. } => (
                404,
                "not_found",
                "list what exists with `weft pool list` or `weft volume list`",
            ),
            VolumeError::Exists { .. } => (409, "exists", "choose another name"),
            VolumeError::Invalid { .. } => {
                (400, "invalid", "correct the value as the message says")
            }
            VolumeError::Limit(_) => (409, "limit", "delete something first"),
            VolumeError::HasSnapshots { .. } => {
                (409, "has_snapshots", "delete its snapshots first")
            }
            VolumeError::PoolFull { .. } => {
                (507, "pool_full", "free space: delete snapshots or volumes")
            }
            VolumeError::MetadataFull { .. } => {
                (507, "metadata_full", "delete snapshots or clones")
            }
            VolumeError::Io { .. } => (500, "io", "check the device (dmesg) and retry"),
            VolumeError::Failed { .. } => (
                503,
                "pool_failed",
                "restart weft to reopen the pool at its last committed state",
            ),
            VolumeError::Corrupt(_) => (500, "corrupt", "restore the pool's devices"),
        },
        AdminError::Busy { .. } => (409, "busy", "disconnect the hosts or pass force"),
        AdminError::Node(_) => (500, "node", "check weft's log"),
    };
    failure(status, code, &message, hint)
}
