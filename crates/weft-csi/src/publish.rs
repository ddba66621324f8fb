//! Publishing a volume to a Kubernetes node: the node's id is its NVMe host
//! NQN (`/etc/nvme/hostnqn`, what its node plugin reports): the weft host
//! registered with that NQN, else one registered now as `csi-` and 32 hex
//! digits of the NQN's SHA-256 (weft host names cannot hold an NQN's
//! colons), is attached to the volume, which
//! lets that host connect and see the volume in discovery. Unpublishing
//! detaches it. A volume is published to one node at a time (the access
//! modes are single-node ones).
//!
//! A `csi-` host proves who it is: it gets bidirectional DH-HMAC-CHAP
//! secrets of its own, derived from the controller's token and the node's
//! NQN (so that every publish finds them again with nothing stored, and a
//! node's secrets open no other node's volumes), set on the host at every
//! publish and handed to the node plugin in the publish context, which
//! connects with them. A host an operator registered keeps the secrets the
//! operator gave it (none in the publish context).

use crate::controller::ControllerService;
use crate::errors::status;
use serde_json::{json, Value};
use std::collections::HashMap;
use tonic::Status;

/// The publish context's keys for a node's DH-HMAC-CHAP secrets.
pub(crate) const HOST_SECRET: &str = "dhchapSecret";
/// The controller's secret (the node authenticates the target too).
pub(crate) const CONTROLLER_SECRET: &str = "dhchapCtrlSecret";

/// A node's DH-HMAC-CHAP secrets, `DHHC-1` text.
struct NodeSecrets {
    host: String,
    controller: String,
}

impl NodeSecrets {
    /// Node `nqn`'s, derived from `seed` (the controller's token).
    fn of(seed: &str, nqn: &str) -> NodeSecrets {
        let derive = |purpose: &str| {
            weft_proto::auth::DhchapSecret::derived(
                seed.as_bytes(),
                &format!("weft-csi {purpose} {nqn}"),
            )
            .to_string()
        };
        NodeSecrets {
            host: derive("host"),
            controller: derive("controller"),
        }
    }
}

/// The most an NQN holds (NVMe Base Specification, 4.7).
const NQN_BYTES_MAX: usize = 223;

/// Whether `node_id` is a host NQN (`nqn.` and printable, no space).
fn is_host_nqn(node_id: &str) -> bool {
    node_id.starts_with("nqn.")
        && node_id.len() <= NQN_BYTES_MAX
        && node_id.bytes().all(|b| b.is_ascii_graphic())
}

/// The weft host name of node `nqn`.
pub(crate) fn host_name(nqn: &str) -> String {
    format!("csi-{}", crate::controller::hashed(nqn, 16))
}

/// The names of the weft hosts volume `volume` (the API's JSON) is attached to.
fn attached(volume: &Value) -> Vec<&str> {
    volume["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

impl ControllerService {
    /// Attaches node `node_id` to volume `volume_id` (idempotent); the
    /// publish context names the subsystem and the namespace's UUID.
    pub(crate) async fn publish(
        &self,
        volume_id: &str,
        node_id: &str,
    ) -> Result<HashMap<String, String>, Status> {
        if volume_id.is_empty() || node_id.is_empty() {
            return Err(Status::invalid_argument(
                "volume_id and node_id are required",
            ));
        }
        let volume = self
            .find(volume_id)
            .await?
            .ok_or_else(|| Status::not_found(format!("no volume {volume_id}")))?;
        if !is_host_nqn(node_id) {
            return Err(Status::not_found(format!(
                "no node {node_id}: a node's id is its NVMe host NQN"
            )));
        }
        let (host, secrets) = self.host_for(node_id).await?;
        let elsewhere = attached(&volume).into_iter().find(|other| *other != host);
        if let Some(other) = elsewhere {
            return Err(Status::failed_precondition(format!(
                "volume {volume_id} is published to another node (host {other}); unpublish it there first"
            )));
        }
        let body = json!({"host": host});
        let path = format!("volumes/{volume_id}/hosts");
        self.api
            .call("POST", path, Some(body))
            .await
            .map_err(|e| status(&e))?;
        let text = |key: &str| volume[key].as_str().unwrap_or_default().to_string();
        let mut context = HashMap::from([
            ("nqn".to_string(), text("nqn")),
            ("uuid".to_string(), text("uuid")),
        ]);
        if let Some(secrets) = secrets {
            context.insert(HOST_SECRET.to_string(), secrets.host);
            context.insert(CONTROLLER_SECRET.to_string(), secrets.controller);
        }
        Ok(context)
    }

    /// Detaches node `node_id` (every node if empty) from volume `volume_id`
    /// (a volume or node that does not exist is not published: done).
    pub(crate) async fn unpublish(&self, volume_id: &str, node_id: &str) -> Result<(), Status> {
        if volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let Some(volume) = self.find(volume_id).await? else {
            // Gone: unpublished from every node, as the spec lets it say.
            return Ok(());
        };
        let wanted = match node_id {
            "" => None,
            nqn => match self.registered(nqn).await? {
                Some(name) => Some(name),
                None => return Ok(()),
            },
        };
        for host in attached(&volume) {
            if wanted.as_deref().is_some_and(|w| w != host) {
                continue;
            }
            let path = format!("volumes/{volume_id}/hosts/{host}");
            match self.api.call("DELETE", path, None).await {
                Ok(_) => {}
                Err(error) if error.status == Some(404) => {}
                Err(error) => return Err(status(&error)),
            }
        }
        Ok(())
    }

    /// The weft host of NQN `nqn`: the one registered with it (by an
    /// operator too, with its DH-HMAC-CHAP secrets), else `csi-<hash>`,
    /// registered now; with the secrets the node connects with, for a
    /// `csi-` host (set on it now: idempotent, and right again after the
    /// token changed; with `--dhchap none`, cleared).
    async fn host_for(&self, nqn: &str) -> Result<(String, Option<NodeSecrets>), Status> {
        let name = host_name(nqn);
        let secrets = self
            .api
            .token()
            .filter(|_| self.node_secrets)
            .map(|token| NodeSecrets::of(token, nqn));
        let keys = match &secrets {
            Some(secrets) => {
                json!({"dhchap_secret": secrets.host, "dhchap_ctrl_secret": secrets.controller})
            }
            None => json!({"dhchap_secret": null, "dhchap_ctrl_secret": null}),
        };
        match self.registered(nqn).await? {
            Some(registered) if registered != name => return Ok((registered, None)),
            Some(_) => {}
            None => {
                let mut body = json!({"name": name, "nqn": nqn});
                if secrets.is_some() {
                    let map = body.as_object_mut().expect("an object");
                    map.extend(keys.as_object().expect("an object").clone());
                }
                match self.api.call("POST", "hosts".into(), Some(body)).await {
                    Ok(_) => return Ok((name, secrets)),
                    // Registered meanwhile by another call: by this
                    // controller (set below) or by an operator.
                    Err(error) if error.status == Some(409) => {
                        let registered = self.registered(nqn).await?;
                        match registered {
                            Some(registered) if registered == name => {}
                            Some(registered) => return Ok((registered, None)),
                            None => return Err(status(&error)),
                        }
                    }
                    Err(error) => return Err(status(&error)),
                }
            }
        }
        let path = format!("hosts/{name}");
        self.api
            .call("PATCH", path, Some(keys))
            .await
            .map_err(|e| status(&e))?;
        Ok((name, secrets))
    }

    /// The name of the weft host registered with NQN `nqn`, if any.
    async fn registered(&self, nqn: &str) -> Result<Option<String>, Status> {
        Ok(self
            .list("hosts")
            .await?
            .iter()
            .find(|host| host["nqn"].as_str() == Some(nqn))
            .and_then(|host| host["name"].as_str().map(String::from)))
    }

    /// The NQNs of the nodes volume `volume` is published to.
    pub(crate) async fn published_nodes(&self, volume: &Value) -> Result<Vec<String>, Status> {
        let attached = attached(volume);
        if attached.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .list("hosts")
            .await?
            .iter()
            .filter(|host| attached.contains(&host["name"].as_str().unwrap_or_default()))
            .filter_map(|host| host["nqn"].as_str().map(String::from))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_host_nqns_named_by_their_hash() {
        let nqn = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427";
        assert!(is_host_nqn(nqn));
        assert!(!is_host_nqn("some-fake-node-id"));
        assert!(!is_host_nqn("nqn.with space"));
        assert_eq!(host_name(nqn), host_name(nqn));
        assert_eq!(host_name(nqn).len(), 36);
    }

    #[test]
    fn each_node_has_secrets_of_its_own_found_again_from_the_token() {
        let a = "nqn.2014-08.org.nvmexpress:uuid:0000000a";
        let b = "nqn.2014-08.org.nvmexpress:uuid:0000000b";
        let (first, again) = (NodeSecrets::of("token", a), NodeSecrets::of("token", a));
        assert_eq!(
            (&first.host, &first.controller),
            (&again.host, &again.controller)
        );
        assert_ne!(first.host, first.controller);
        assert_ne!(first.host, NodeSecrets::of("token", b).host);
        assert_ne!(first.host, NodeSecrets::of("another token", a).host);
        for secret in [&first.host, &first.controller] {
            assert!(secret.starts_with("DHHC-1:01:"), "{secret}");
            assert!(weft_proto::auth::DhchapSecret::parse(secret).is_ok());
        }
    }
}
