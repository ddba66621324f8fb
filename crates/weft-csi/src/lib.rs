//! weft's Container Storage Interface plugin (CSI 1.x, gRPC on a Unix
//! socket): Kubernetes provisions weft volumes through it. Each service is
//! a thin translation onto weft's HTTP API (any node's: a cluster forwards),
//! so the plugin keeps no state of its own.
//!
//! Built so far: the Identity service and the Controller service: volumes
//! created, deleted, validated, listed (with the nodes they are published
//! to), found, expanded, published to and unpublished from nodes, and the
//! capacity. The node service and snapshots are to come (issue 15).
//!
//! What this does not do: talk NVMe (the node service will run nvme-cli),
//! or decide placement (the API does).

pub mod api;
mod controller;
mod errors;
mod identity;
mod publish;
mod server;

/// The CSI messages and services, generated from the spec's `csi.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}

pub use errors::CsiError;
pub use server::{serve, Mode, Options};

/// The plugin's name, as Kubernetes' CSIDriver object names it.
pub const DRIVER_NAME: &str = "csi.weft.io";
