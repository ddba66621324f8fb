//! The plugin's gRPC server on a Unix socket, as the CSI sidecars and the
//! kubelet reach it.

use crate::api::Api;
use crate::controller::ControllerService;
use crate::csi::controller_server::ControllerServer;
use crate::csi::identity_server::IdentityServer;
use crate::csi::node_server::NodeServer;
use crate::identity::IdentityService;
use crate::node::NodeService;
use crate::CsiError;
use std::path::PathBuf;

/// Which services the plugin serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Identity and Controller (the controller Deployment).
    Controller,
    /// Identity and Node (the node DaemonSet).
    Node,
    /// All three.
    All,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(text: &str) -> Result<Mode, String> {
        match text {
            "controller" => Ok(Mode::Controller),
            "node" => Ok(Mode::Node),
            "all" => Ok(Mode::All),
            _ => Err(format!("--mode {text}: give controller, node or all")),
        }
    }
}

/// What the node service needs.
pub struct NodeOptions {
    /// This node's host NQN (`/etc/nvme/hostnqn`).
    pub host_nqn: String,
    /// A weft node's NVMe/TCP address, `ADDR:PORT`, for discovery.
    pub discovery: String,
    /// Where staged volumes are noted.
    pub state_dir: PathBuf,
    /// The Kubernetes node's name (its `weft.io/node` topology segment).
    pub node_name: String,
    /// Its zone (its `weft.io/zone` segment), if it has one.
    pub zone: Option<String>,
}

/// How the plugin runs.
pub struct Options {
    /// `unix:///path/to/csi.sock` (or the path alone).
    pub endpoint: String,
    /// Which services.
    pub mode: Mode,
    /// weft's API.
    pub api: Api,
    /// The controller gives each node DH-HMAC-CHAP secrets of its own
    /// (`publish`); off for nodes whose kernel cannot authenticate.
    pub node_secrets: bool,
    /// The node service's settings (node and all modes).
    pub node: Option<NodeOptions>,
}

/// Serves until the process ends (the sidecars and the kubelet reconnect
/// to the socket when it is back).
pub fn serve(options: Options) -> Result<(), CsiError> {
    let path = socket_path(&options.endpoint)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CsiError::Serve(e.to_string()))?;
    runtime.block_on(async move {
        // A socket left by an earlier run would refuse the bind.
        let _ = std::fs::remove_file(&path);
        let listener =
            tokio::net::UnixListener::bind(&path).map_err(|source| CsiError::Listen {
                path: path.display().to_string(),
                source,
            })?;
        log::info!(
            "CSI plugin {} serving on {}",
            crate::DRIVER_NAME,
            path.display()
        );
        let controller = options.mode != Mode::Node;
        let identity = IdentityService {
            api: options.api.clone(),
            controller,
        };
        let controllers = controller.then(|| {
            ControllerServer::new(ControllerService {
                api: options.api,
                node_secrets: options.node_secrets,
            })
        });
        let nodes = match (options.mode, options.node) {
            (Mode::Controller, _) => None,
            (_, Some(node)) => Some(NodeServer::new(NodeService {
                host_nqn: node.host_nqn,
                discovery: node.discovery,
                state_dir: node.state_dir,
                node_name: node.node_name,
                zone: node.zone,
            })),
            (_, None) => {
                return Err(CsiError::Serve(
                    "the node service needs its settings".into(),
                ))
            }
        };
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(identity))
            .add_optional_service(controllers)
            .add_optional_service(nodes)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .map_err(|e| CsiError::Serve(e.to_string()))
    })
}

fn socket_path(endpoint: &str) -> Result<PathBuf, CsiError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(CsiError::Endpoint(endpoint.to_string()));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_a_socket_path() {
        let path = |e: &str| socket_path(e).map(|p| p.display().to_string());
        assert_eq!(path("unix:///csi/csi.sock").unwrap(), "/csi/csi.sock");
        assert_eq!(path("unix:/csi/csi.sock").unwrap(), "/csi/csi.sock");
        assert_eq!(path("/csi/csi.sock").unwrap(), "/csi/csi.sock");
        assert!(path("tcp://0.0.0.0:1").is_err());
    }
}
