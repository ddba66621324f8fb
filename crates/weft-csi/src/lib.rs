//! weft's Container Storage Interface plugin (CSI 1.x, gRPC on a Unix
//! socket): Kubernetes provisions weft volumes through it. Each service is
//! a thin translation onto weft's HTTP API (any node's: a cluster forwards),
//! so the plugin keeps no state of its own.
//!
//! Built so far: the Identity service and the Controller service: volumes
//! created, deleted, validated, listed (with the nodes they are published
//! to), found, expanded, published to and unpublished from nodes, and the
//! capacity; the Node service: volumes connected (nvme-cli, multipath),
//! formatted when empty, mounted, bind-mounted, unmounted, disconnected,
//! grown and measured; snapshots taken, listed, deleted and cloned into
//! new volumes; volumes cloned; topology reported by nodes and used to
//! steer placement.
//!
//! What this does not do: talk NVMe itself (the node service runs
//! nvme-cli and the kernel's initiator does the rest), or place replicas
//! (the API does; topology only names the node or zone of a volume).

pub mod api;
mod controller;
mod errors;
mod host;
mod identity;
mod node;
mod parameters;
mod publish;
mod server;
mod snapshots;
mod topology;

/// The CSI messages and services, generated from the spec's `csi.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

pub use errors::CsiError;
pub use server::{serve, Mode, NodeOptions, Options};

/// The plugin's name, as Kubernetes' CSIDriver object names it.
pub const DRIVER_NAME: &str = "csi.weft.io";
