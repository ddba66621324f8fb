//! The Identity service: the plugin's name and version, what it offers,
//! and whether weft's API answers (Probe).

use crate::api::Api;
use crate::csi::identity_server::Identity;
use crate::csi::plugin_capability::{service, Service, Type};
use crate::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

pub(crate) struct IdentityService {
    pub(crate) api: Api,
    /// Whether this plugin serves the Controller service.
    pub(crate) controller: bool,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: crate::DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let controller = self.controller.then(|| PluginCapability {
            r#type: Some(Type::Service(Service {
                r#type: service::Type::ControllerService.into(),
            })),
        });
        // Nodes report their topology and requirements steer placement
        // (see crate::topology).
        let topology = PluginCapability {
            r#type: Some(Type::Service(Service {
                r#type: service::Type::VolumeAccessibilityConstraints.into(),
            })),
        };
        let capabilities = controller.into_iter().chain([topology]).collect();
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    /// Ready when weft's API answers (its OpenAPI document, which needs no
    /// token: a node plugin holds none).
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.api
            .call("GET", "openapi.json".into(), None)
            .await
            .map_err(|e| crate::errors::status(&e))?;
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
