//! The API of a cluster node: every node's API shows and changes the whole
//! cluster. A call about something another node holds (a volume, a pool)
//! is forwarded to that node's API, marked `local=1` so that it is not
//! forwarded again, and its answer passed back as it is; lists are
//! gathered from every node that is up (volumes of nodes that are down are
//! shown `unavailable`); a new volume is placed first (weft-cluster's
//! policy: most free bytes among up, uncordoned nodes) and created by the
//! node chosen. Nodes themselves (`nodes/...`) are records in the store,
//! read and changed here.
//!
//! Nodes call each other over the API address each advertises: with their
//! certificates from the cluster's CA when they have them (weft-cluster's
//! `pki`: over TLS only, each end checking that the other's certificate
//! names the node it is, so that a member record pointed elsewhere
//! redirects nothing), else with the cluster's API token (weft-cluster's
//! `token`).
//!
//! What it does not do: hold state (the store does) or create anything
//! itself (the owning node's volume manager does).

use crate::views::NodeView as NodeJson;
use crate::{failure, Response};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_cluster::nodes::{self, NodeError};
use weft_cluster::placement::{place_replicas, Placement, PlacementError, PlacementRequest};
use weft_cluster::replica_members::replace_replicas_on;
use weft_cluster::NodeView;
use weft_control::{Store, StoreError, VolumeRecord};
use weft_http::{self as http, Request};

/// How long a forwarded change may take, at each step of the exchange
/// (creating a thick volume writes it).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a forwarded read may wait at each step of the exchange
/// (connect, send, each receive): reads answer from what the node
/// published, in milliseconds, so a node that takes longer is hung (its
/// lease has not ended yet), and `volume show` or `volume list` during its
/// failover answers without it instead of waiting the write timeout.
const READ_FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// The least time placement waits for a heartbeat to report a pool just
/// created (heartbeats are a third of the lease apart, 1 s by default; see
/// [`Cluster::with_heartbeat_interval`]).
const HEARTBEAT_WAIT: Duration = Duration::from_secs(3);

/// The query mark of a call forwarded by another node.
const LOCAL_MARK: &str = "local=1";

/// What the API of a cluster node needs.
pub struct Cluster {
    store: Arc<dyn Store>,
    /// The store itself (etcd), not this node's copy: asked for its health.
    remote: Option<Arc<dyn Store>>,
    node: String,
    /// How long placement waits for new pools' first heartbeats.
    heartbeat_wait: Duration,
    identity: Option<http::tls::NodeIdentity>,
    /// What lets new nodes join with a token (nodes with certificates).
    joins: Option<Arc<crate::join::Joins>>,
}

/// How a node proves itself when it calls another.
#[derive(Clone, Copy)]
pub(crate) enum Credential<'a> {
    /// The cluster's admin token (nodes without certificates).
    Token(&'a str),
    /// Its certificate from the cluster's CA.
    Certificate(&'a http::tls::NodeIdentity),
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Where a call is served.
pub(crate) enum Route {
    /// Here, with this body instead of the request's if given.
    Local(Option<Vec<u8>>),
    /// By node `.0`'s API, with this body instead of the request's if given.
    Forward(String, Option<Vec<u8>>),
    /// By every node that is up, answers merged.
    Gather,
    /// Answered at once.
    Respond(Response),
    /// A replicated volume's deletion: the primary's node first (it refuses
    /// while hosts are connected, and forgets the record), then each
    /// replica's node (a local call each).
    DeleteReplicated {
        /// Nodes of the replicas other than the primary.
        replicas: Vec<String>,
        /// The primary's node.
        primary: String,
    },
}

impl Cluster {
    /// The cluster's records (this node's mirror of them).
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
    /// The API of node `node`, whose copy of the cluster's store is `store`.
    pub fn new(store: Arc<dyn Store>, node: &str) -> Cluster {
        Cluster {
            store,
            remote: None,
            node: node.to_string(),
            heartbeat_wait: HEARTBEAT_WAIT,
            identity: None,
            joins: None,
        }
    }

    /// Heartbeats `interval` apart (a third of the lease): placement waits
    /// two of them (3 s at least) for a pool just created to be reported.
    pub fn with_heartbeat_interval(mut self, interval: Duration) -> Cluster {
        self.heartbeat_wait = (2 * interval).max(HEARTBEAT_WAIT);
        self
    }

    /// With the cluster's store itself (`store` is this node's copy of it):
    /// `GET cluster/store` reads from it to tell whether it answers.
    pub fn with_remote_store(mut self, remote: Arc<dyn Store>) -> Cluster {
        self.remote = Some(remote);
        self
    }

    /// Letting new nodes join with one-time tokens (`joins`).
    pub fn with_joins(mut self, joins: crate::join::Joins) -> Cluster {
        self.joins = Some(Arc::new(joins));
        self
    }

    /// What lets new nodes join, if this node can.
    pub(crate) fn joins(&self) -> Option<&crate::join::Joins> {
        self.joins.as_deref()
    }

    /// With this node's certificate from the cluster's CA: it calls the
    /// other nodes with it, over TLS only, and only they may forward calls.
    pub fn with_identity(mut self, identity: http::tls::NodeIdentity) -> Cluster {
        self.identity = Some(identity);
        self
    }

    /// Whether nodes prove themselves with certificates (not the token).
    pub(crate) fn nodes_have_certificates(&self) -> bool {
        self.identity.is_some()
    }

    /// How this node proves itself to another: its certificate if it has
    /// one, else `token`.
    pub(crate) fn credential<'a>(&'a self, token: &'a str) -> Credential<'a> {
        match &self.identity {
            Some(identity) => Credential::Certificate(identity),
            None => Credential::Token(token),
        }
    }

    /// Whether `node` (named by a verified certificate) is a member now (a
    /// node removed keeps its certificate until it expires, not its place):
    /// 403 if not, 503 if the store cannot say.
    pub(crate) fn membership(&self, node: &str) -> Result<(), Response> {
        match nodes::get(self.store.as_ref(), node) {
            Ok(_) => Ok(()),
            Err(NodeError::NotFound(_)) => Err(failure(
                403,
                "forbidden",
                &format!("node {node} is not a member of this cluster"),
                "a node removed from the cluster joins again as a new one",
            )),
            Err(error) => Err(node_failure(&error)),
        }
    }

    /// This node's name.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// Where the call `request`, matched as `pattern` with `params`, is served.
    pub(crate) fn route(&self, pattern: &str, params: &[String], request: &Request) -> Route {
        if is_forwarded(request) {
            return Route::Local(None);
        }
        let result = match (request.method.as_str(), pattern) {
            ("GET", "volumes" | "pools") => Ok(Route::Gather),
            // Another node's statistics (the dashboard's charts per node).
            ("GET", "stats") => Ok(match query_value(&request.query, "node") {
                Some(node) => self.to_node(node.to_string(), None),
                None => Route::Local(None),
            }),
            ("POST", "volumes") => self.route_new_volume(&request.body),
            ("POST", "pools") => self.route_new_pool(&request.body),
            ("DELETE", "volumes/{volume}") => self.route_volume_deletion(&params[0]),
            ("POST", "volumes/{volume}/move-primary") => {
                let to = serde_json::from_slice::<Value>(&request.body)
                    .ok()
                    .and_then(|body| body["to"].as_str().map(str::to_string));
                Ok(Route::Respond(self.move_primary(&params[0], to.as_deref())))
            }
            ("PATCH", "volumes/{volume}/replicas") => {
                Ok(Route::Respond(self.set_replicas(&params[0], &request.body)))
            }
            (_, pattern) if pattern.starts_with("volumes/{volume}") => {
                self.route_volume(&params[0])
            }
            (_, pattern) if pattern.starts_with("pools/{pool}") => {
                self.route_pool(&params[0], &request.query)
            }
            _ => Ok(Route::Local(None)),
        };
        result.unwrap_or_else(Route::Respond)
    }

    /// A volume's calls go to the node that holds it.
    fn route_volume(&self, volume: &str) -> Result<Route, Response> {
        match self.volume_node(volume)? {
            Some(node) if node != self.node => Ok(Route::Forward(node, None)),
            _ => Ok(Route::Local(None)),
        }
    }

    /// A volume's deletion goes to the node that holds it; a replicated
    /// volume's to every replica's node, each of which must be up (a
    /// replica left behind would hold the name and space on its node).
    fn route_volume_deletion(&self, volume: &str) -> Result<Route, Response> {
        // As any volume call: the store itself if this node's copy lags (a
        // replicated volume's deletion sent as a plain one would leave its
        // replicas behind).
        let record = self.volume_record(volume)?;
        let Some(replication) = record.and_then(|record| record.replication) else {
            return self.route_volume(volume);
        };
        let replicas: Vec<String> = replication
            .members
            .iter()
            .map(|m| m.node.clone())
            .filter(|node| *node != replication.primary)
            .collect();
        for node in replicas.iter().chain([&replication.primary]) {
            let view = nodes::get(self.store.as_ref(), node).map_err(|e| node_failure(&e))?;
            if !view.is_alive() {
                return Err(failure(
                    503,
                    "node_down",
                    &format!("node {node}, which holds a replica of {volume}, is down: the replica cannot be deleted now"),
                    &format!("start weft on {node} again, then delete; if {node} is gone for good, `weft node remove {node}` first"),
                ));
            }
        }
        Ok(Route::DeleteReplicated {
            replicas,
            primary: replication.primary,
        })
    }

    /// The record of `volume`, if the cluster has it. This node's copy of
    /// the store may lag behind a create that another node made and already
    /// answered (the caller's next call, `volume attach` right after
    /// `volume create`, came here first): a volume missing from the copy is
    /// looked for in the store itself before it is called missing.
    fn volume_record(&self, volume: &str) -> Result<Option<VolumeRecord>, Response> {
        let key = format!("volumes/{volume}");
        let record = weft_control::records::read::<VolumeRecord>(self.store.as_ref(), &key)
            .map_err(|e| store_failure(&e))?;
        if let (None, Some(remote)) = (&record, &self.remote) {
            // A store that does not answer leaves the copy's answer.
            if let Ok(Some(found)) =
                weft_control::records::read::<VolumeRecord>(remote.as_ref(), &key)
            {
                return Ok(Some(found.record));
            }
        }
        Ok(record.map(|found| found.record))
    }

    /// The node a volume's record names: a replicated volume's primary
    /// (none: no such volume in the cluster).
    fn volume_node(&self, volume: &str) -> Result<Option<String>, Response> {
        Ok(self
            .volume_record(volume)?
            .and_then(|record| match record.replication {
                Some(replication) => Some(replication.primary),
                None => record.node,
            }))
    }

    /// Where a clone of `source` (VOLUME@SNAPSHOT) is made: beside its
    /// source; for a replicated volume on a node whose copy holds the
    /// snapshot (`wanted` if given, else the primary if it holds it, else
    /// the first that does). The node checks it holds it.
    fn clone_node(&self, source: &str, wanted: Option<&str>) -> Result<Option<String>, Response> {
        let (volume, snapshot) = source.split_once('@').unwrap_or((source, ""));
        let Some(record) = self.volume_record(volume)? else {
            return Ok(None);
        };
        let Some(replication) = record.replication else {
            if let (Some(wanted), Some(node)) = (wanted, &record.node) {
                if wanted != node {
                    return Err(failure(
                        400,
                        "invalid",
                        &format!("volume {volume} is on node {node}: a clone of it is made there, not on {wanted}"),
                        "leave --node out, or give its node",
                    ));
                }
            }
            return Ok(record.node);
        };
        let holders = replication
            .snapshot(snapshot)
            .map(|s| replication.holders(s))
            .unwrap_or_default();
        Ok(Some(match wanted {
            Some(node) => node.to_string(),
            None if holders.contains(&replication.primary) || holders.is_empty() => {
                replication.primary
            }
            None => holders[0].clone(),
        }))
    }

    /// A new volume: a clone is made beside its source; otherwise placed
    /// (unless both node and pool are given) and created by the node chosen.
    fn route_new_volume(&self, body: &[u8]) -> Result<Route, Response> {
        let mut fields: serde_json::Map<String, Value> = crate::parse(body)?;
        if let Some(source) = fields.get("source").and_then(Value::as_str) {
            let wanted = fields.get("node").and_then(Value::as_str);
            return match self.clone_node(source, wanted)? {
                Some(node) if node != self.node => Ok(Route::Forward(node, None)),
                _ => Ok(Route::Local(None)),
            };
        }
        let text = |name: &str| fields.get(name).and_then(Value::as_str).map(str::to_string);
        let (node, pool) = (text("node"), text("pool"));
        let size_bytes = fields.get("size_bytes").and_then(Value::as_u64);
        let layout = erasure_layout(&fields)?;
        let replicas = match layout {
            Some(layout) => layout.shards(),
            None => replica_count(&fields)?,
        };
        let (node, pool) = match (node, pool, size_bytes) {
            // One copy where the operator says; more are placed (the first
            // where the operator says, the others on other nodes).
            (Some(node), Some(pool), _) if replicas == 1 => (node, pool),
            // The node that creates it says what is missing.
            (node, pool, None) => (
                node.unwrap_or_else(|| self.node.clone()),
                pool.unwrap_or_default(),
            ),
            (node, pool, Some(size_bytes)) => {
                let thick = fields
                    .get("thick")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let encrypted = fields
                    .get("encrypted")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                // A member of an erasure-coded volume holds a k-th of it
                // (whole stripes) and its journal.
                let block_size = fields
                    .get("block_size")
                    .and_then(Value::as_u64)
                    .unwrap_or(4096);
                let member_bytes = match layout {
                    Some(layout) => crate::shard_bytes(layout, size_bytes, block_size as u32),
                    None => size_bytes,
                };
                let wanted = (node.as_deref(), pool.as_deref());
                let mut placed = self
                    .place(member_bytes, (thick, encrypted), wanted, replicas)
                    .map_err(|response| match layout {
                        Some(layout) => erasure_unplaceable(layout, response),
                        None => response,
                    })?;
                if replicas > 1 {
                    let placements: Vec<Value> = placed
                        .iter()
                        .map(|p| json!({"node": p.node, "pool": p.pool}))
                        .collect();
                    fields.insert("placements".into(), Value::Array(placements));
                }
                let primary = placed.swap_remove(0);
                (primary.node, primary.pool)
            }
        };
        fields.insert("node".into(), json!(node));
        if !pool.is_empty() {
            fields.insert("pool".into(), json!(pool));
        }
        let body = Some(Value::Object(fields).to_string().into_bytes());
        Ok(self.to_node(node, body))
    }

    /// Where a new volume goes (weft-cluster's policy). Pools are known
    /// to placement from heartbeats, a third of the lease apart: a pool
    /// whose record is in the store but not yet in its node's heartbeat
    /// (just created) is waited for, briefly, rather than refused.
    fn place(
        &self,
        size_bytes: u64,
        (thick, encrypted): (bool, bool),
        (node, pool): (Option<&str>, Option<&str>),
        replicas: usize,
    ) -> Result<Vec<Placement>, Response> {
        let deadline = Instant::now() + self.heartbeat_wait;
        loop {
            let nodes = nodes::list(self.store.as_ref()).map_err(|e| store_failure(&e))?;
            let volumes_by_node = weft_cluster::placement::volumes_by_node(self.store.as_ref())
                .map_err(|e| store_failure(&e))?;
            let request = PlacementRequest {
                size_bytes,
                thick,
                encrypted,
                node,
                pool,
                volumes_by_node: &volumes_by_node,
            };
            match place_replicas(&nodes, request, replicas) {
                Ok(placed) => return Ok(placed),
                // A node just started publishes its keys at its next heartbeat.
                Err(
                    PlacementError::NoSuchPool(_)
                    | PlacementError::NoNode
                    | PlacementError::NoKeys(_),
                ) if Instant::now() < deadline && self.pool_recorded(pool, &nodes)? => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                // Pools just made on other nodes may be the replicas' room.
                Err(PlacementError::TooFewZones { .. })
                    if Instant::now() < deadline && self.pool_unreported(&nodes)? =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(error) => return Err(placement_failure(&error)),
            }
        }
    }

    /// Whether an up node has a pool (named `pool`, if given) in the store.
    fn pool_recorded(
        &self,
        pool: Option<&str>,
        nodes: &BTreeMap<String, NodeView>,
    ) -> Result<bool, Response> {
        Ok(self.recorded_pools()?.into_iter().any(|(node, name)| {
            pool.is_none_or(|pool| pool == name) && nodes.get(&node).is_some_and(NodeView::is_alive)
        }))
    }

    /// Whether an up node has a pool in the store that its heartbeat does
    /// not report yet (created since its last heartbeat).
    fn pool_unreported(&self, nodes: &BTreeMap<String, NodeView>) -> Result<bool, Response> {
        Ok(self.recorded_pools()?.into_iter().any(|(node, name)| {
            nodes
                .get(&node)
                .and_then(|view| view.alive.as_ref())
                .is_some_and(|alive| alive.pools.iter().all(|pool| pool.name != name))
        }))
    }

    /// Every pool recorded in the store, as (node, pool): the keys
    /// `nodes/<node>/pools/<pool>`.
    fn recorded_pools(&self) -> Result<Vec<(String, String)>, Response> {
        let listing = self.store.list("nodes/").map_err(|e| store_failure(&e))?;
        Ok(listing
            .entries
            .iter()
            .filter_map(|entry| {
                let (node, rest) = entry.key["nodes/".len()..].split_once('/')?;
                let pool = rest.strip_prefix("pools/")?;
                Some((node.to_string(), pool.to_string()))
            })
            .collect())
    }

    /// A new pool is made by the node named (this one by default).
    fn route_new_pool(&self, body: &[u8]) -> Result<Route, Response> {
        let fields: serde_json::Map<String, Value> = crate::parse(body)?;
        let node = fields.get("node").and_then(Value::as_str);
        Ok(match node {
            Some(node) if node != self.node => {
                nodes::get(self.store.as_ref(), node).map_err(|e| node_failure(&e))?;
                Route::Forward(node.to_string(), None)
            }
            _ => Route::Local(None),
        })
    }

    /// A pool's calls go to its node: the one named by `?node=`, or the
    /// only one with a pool of that name.
    fn route_pool(&self, pool: &str, query: &str) -> Result<Route, Response> {
        if let Some(node) = query_value(query, "node") {
            return Ok(self.to_node(node.to_string(), None));
        }
        let holders = self.pool_nodes(pool)?;
        match holders.as_slice() {
            [] => Ok(Route::Local(None)),
            [node] => Ok(self.to_node(node.clone(), None)),
            several => Err(failure(
                409,
                "ambiguous",
                &format!(
                    "nodes {} each have a pool {pool}: name one with --node NODE",
                    several.join(", ")
                ),
                "name the node: --node NODE (API: ?node=NODE)",
            )),
        }
    }

    /// The nodes with a pool named `pool`.
    fn pool_nodes(&self, pool: &str) -> Result<Vec<String>, Response> {
        let recorded = self.recorded_pools()?.into_iter();
        Ok(recorded
            .filter(|(_, name)| name == pool)
            .map(|(node, _)| node)
            .collect())
    }

    fn to_node(&self, node: String, body: Option<Vec<u8>>) -> Route {
        if node == self.node {
            Route::Local(body)
        } else {
            Route::Forward(node, body)
        }
    }

    /// Sends `request` (with `body` instead of its own if given) to node
    /// `node`'s API and answers what it answers.
    pub(crate) fn forward(
        &self,
        node: &str,
        request: &Request,
        body: Option<&[u8]>,
        credential: Credential<'_>,
    ) -> Response {
        let view = match nodes::get(self.store.as_ref(), node) {
            Ok(view) => view,
            Err(error) => return node_failure(&error),
        };
        if !view.is_alive() {
            return failure(
                503,
                "node_down",
                &format!("node {node}, which holds it, is down"),
                &format!("start weft on {node} again (its data dir keeps everything); `weft node list` shows the nodes"),
            );
        }
        call_node(&view, request, body.or(Some(&request.body)), credential)
    }

    /// Merges a list (`volumes` or `pools`) from every node that is up;
    /// `local` is this node's own. A node that does not answer is named in
    /// the log and its items are missing (volumes: shown unavailable).
    pub(crate) fn gather(
        &self,
        pattern: &str,
        request: &Request,
        local: Value,
        credential: Credential<'_>,
    ) -> Response {
        let nodes = match nodes::list(self.store.as_ref()) {
            Ok(nodes) => nodes,
            Err(error) => return store_failure(&error),
        };
        let mut items: Vec<Value> = local.as_array().cloned().unwrap_or_default();
        let mut answered = BTreeSet::from([self.node.clone()]);
        for (name, view) in &nodes {
            if *name == self.node || !view.is_alive() {
                continue;
            }
            match call_node(view, request, None, credential) {
                (200, Value::Array(theirs)) => {
                    items.extend(theirs);
                    answered.insert(name.clone());
                }
                (status, body) => log::warn!("listing {pattern} of node {name}: {status} {body}"),
            }
        }
        if pattern == "volumes" {
            let listed: BTreeSet<String> = items
                .iter()
                .filter_map(|item| Some(item["name"].as_str()?.to_string()))
                .collect();
            match self.unlisted_volumes(&answered, &listed) {
                Ok(missing) => items.extend(missing),
                Err(response) => return response,
            }
        }
        (200, Value::Array(items))
    }

    /// Volumes recorded but not listed: `unavailable` when their node did
    /// not answer, `missing` when it did (a creation that never finished, a
    /// pool lost), so that neither disappears silently.
    fn unlisted_volumes(
        &self,
        answered: &BTreeSet<String>,
        listed: &BTreeSet<String>,
    ) -> Result<Vec<Value>, Response> {
        let listing = self.store.list("volumes/").map_err(|e| store_failure(&e))?;
        let mut missing = Vec::new();
        for entry in listing.entries {
            let name = &entry.key["volumes/".len()..];
            let Ok(record) = serde_json::from_value::<VolumeRecord>(entry.value) else {
                continue;
            };
            let Some(node) = record.node.filter(|_| !listed.contains(name)) else {
                continue;
            };
            let (state, failure) = if answered.contains(&node) {
                ("missing", format!("recorded on node {node}, which does not hold it (a creation that did not finish, or its pool was lost); `weft volume delete {name}` forgets it"))
            } else {
                (
                    "unavailable",
                    format!("node {node}, which holds it, is down or does not answer"),
                )
            };
            missing.push(json!({
                "name": name,
                "node": node,
                "pool": record.pool.unwrap_or_default(),
                "nqn": weft_node::manager::volume_nqn(name),
                "size_bytes": 0, "block_size": 0, "thick": false, "allocated_bytes": 0,
                "origin": null, "snapshots": [], "connected_hosts": [], "nguid": "",
                "hosts": record.hosts, "qos": crate::views::QosView::from(record.qos),
                "state": state,
                "failure": failure,
            }));
        }
        Ok(missing)
    }

    /// The answer of a `nodes` route.
    pub(crate) fn nodes_call(&self, method: &str, pattern: &str, params: &[String]) -> Response {
        let store = self.store.as_ref();
        let result = match (method, pattern) {
            ("GET", "nodes") => nodes::list(store)
                .map(|nodes| json!(nodes.values().map(NodeJson::from).collect::<Vec<_>>()))
                .map_err(NodeError::from),
            ("GET", "nodes/{node}") => {
                nodes::get(store, &params[0]).map(|n| json!(NodeJson::from(&n)))
            }
            ("POST", "nodes/{node}/cordon") => {
                nodes::set_cordoned(store, &params[0], true).map(|()| json!({"ok": true}))
            }
            ("POST", "nodes/{node}/uncordon") => {
                nodes::set_cordoned(store, &params[0], false).map(|()| json!({"ok": true}))
            }
            ("DELETE", "nodes/{node}") => return self.remove_node(&params[0]),
            ("POST", "nodes/{node}/drain") => return self.drain(&params[0]),
            _ => unreachable!("every nodes route is answered: {method} {pattern}"),
        };
        match result {
            Ok(value) => (200, value),
            Err(error) => node_failure(&error),
        }
    }

    /// Whether the cluster's store answers a read, and how fast: the
    /// dashboard's "etcd health". A store that does not answer is reported
    /// (200, reachable false), not failed: the answer is the finding.
    pub(crate) fn store_health(&self) -> Response {
        let store = self.remote.as_ref().unwrap_or(&self.store);
        let started = std::time::Instant::now();
        let read = store.get(&format!("nodes/{}", self.node));
        let answer_ms = started.elapsed().as_secs_f64() * 1000.0;
        (
            200,
            json!({
                "location": store.location(),
                "reachable": read.is_ok(),
                "answer_ms": (answer_ms * 100.0).round() / 100.0,
                "error": read.err().map(|e| e.to_string()),
            }),
        )
    }

    /// Forgets a node that is down, with its pools' records: the replicas it
    /// held are replaced on other nodes first (it is lost for good); a volume
    /// of one copy, or a primary, on it keeps it.
    fn remove_node(&self, name: &str) -> Response {
        let store = self.store.as_ref();
        match nodes::get(store, name) {
            Ok(view) if view.is_alive() => return node_failure(&NodeError::Up(name.to_string())),
            Ok(_) => {}
            Err(error) => return node_failure(&error),
        }
        let replaced = match replace_replicas_on(store, name) {
            Ok(replaced) => replaced,
            Err(error) => return crate::replicas::replica_change_failure(&error),
        };
        for (volume, _) in &replaced {
            if let Err(response) = self.await_retired(volume) {
                return response;
            }
        }
        let held = |record: &VolumeRecord| match &record.replication {
            Some(replication) => replication.member(name).is_some(),
            None => record.node.as_deref() == Some(name),
        };
        let listing = match store.list("volumes/") {
            Ok(listing) => listing,
            Err(error) => return store_failure(&error),
        };
        let volumes = listing
            .entries
            .into_iter()
            .filter(|entry| {
                serde_json::from_value::<VolumeRecord>(entry.value.clone())
                    .is_ok_and(|record| held(&record))
            })
            .map(|entry| entry.key["volumes/".len()..].to_string())
            .collect();
        let own = match store.list(&format!("nodes/{name}/")) {
            Ok(listing) => listing.entries.into_iter().map(|entry| entry.key).collect(),
            Err(error) => return store_failure(&error),
        };
        match nodes::remove(store, name, volumes, own) {
            Ok(()) => {
                let replaced: Vec<Value> = replaced
                    .iter()
                    .flat_map(|(volume, change)| {
                        change
                            .added
                            .iter()
                            .map(move |p| json!({"volume": volume, "node": p.node, "pool": p.pool}))
                    })
                    .collect();
                (200, json!({"ok": true, "replaced": replaced}))
            }
            Err(error) => node_failure(&error),
        }
    }
}

/// The most replicas a volume may have.
const REPLICAS_MAX: u64 = weft_cluster::replica_members::REPLICAS_MAX as u64;

/// How many copies a new volume asks for (1 to [`REPLICAS_MAX`]).
fn replica_count(fields: &serde_json::Map<String, Value>) -> Result<usize, Response> {
    match fields.get("replicas") {
        None | Some(Value::Null) => Ok(1),
        Some(value) => match value.as_u64() {
            Some(n @ 1..=REPLICAS_MAX) => Ok(n as usize),
            _ => Err(failure(
                400,
                "invalid",
                &format!("replicas is {value}; a volume has 1 to {REPLICAS_MAX} replicas"),
                "ask for 2 or 3 replicas (on as many nodes in distinct zones), or 1",
            )),
        },
    }
}

/// The erasure code a new volume asks for (`"ec": "4+2"`), if any.
fn erasure_layout(
    fields: &serde_json::Map<String, Value>,
) -> Result<Option<weft_ec::Layout>, Response> {
    let Some(value) = fields.get("ec").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if fields.get("replicas").is_some_and(|r| !r.is_null()) {
        return Err(failure(
            400,
            "invalid",
            "a volume is either replicated (replicas) or erasure-coded (ec), not both",
            "give one of them",
        ));
    }
    let text = value.as_str().unwrap_or_default();
    text.parse::<weft_ec::Layout>()
        .map(Some)
        .map_err(|message| {
            failure(
                400,
                "invalid",
                &format!("ec is {value}: {message}"),
                "e.g. \"ec\": \"4+2\" (k data and m parity shards, each on its own node)",
            )
        })
}

/// Placement's refusal of an erasure-coded volume, said in its terms.
fn erasure_unplaceable(layout: weft_ec::Layout, (status, body): Response) -> Response {
    if status != 409 {
        return (status, body);
    }
    let why = body
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    failure(
        409,
        "unplaceable",
        &format!(
            "an erasure-coded {layout} volume needs {} nodes in distinct zones, each with a pool that can hold a {}th of it ({why})",
            layout.shards(),
            layout.data(),
        ),
        "add, start or uncordon nodes, or ask for a layout with fewer shards (e.g. 2+1 needs 3 nodes)",
    )
}

/// Whether another node forwarded this call (it is served here, not again forwarded).
pub(crate) fn is_forwarded(request: &Request) -> bool {
    request.query.split('&').any(|part| part == LOCAL_MARK)
}

/// The value of `name` in a query string.
fn query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
}

/// Calls node `view`'s API with `request` marked as forwarded.
fn call_node(
    view: &NodeView,
    request: &Request,
    body: Option<&[u8]>,
    credential: Credential<'_>,
) -> Response {
    let timeout = forward_timeout(&request.method);
    call_node_within(view, request, body, credential, timeout)
}

/// How long a forwarded call of `method` may wait.
fn forward_timeout(method: &str) -> Duration {
    if method == "GET" {
        READ_FORWARD_TIMEOUT
    } else {
        FORWARD_TIMEOUT
    }
}

/// [`call_node`], waiting `timeout` at each step of the exchange.
fn call_node_within(
    view: &NodeView,
    request: &Request,
    body: Option<&[u8]>,
    credential: Credential<'_>,
    timeout: Duration,
) -> Response {
    let node = &view.member.name;
    let api = &view.member.api;
    let unreachable = |error: String| {
        failure(
            502,
            "node_unreachable",
            &format!("node {node} (API {api}) did not answer: {error}"),
            "check that weft runs on it and that this node reaches its API address (--advertise)",
        )
    };
    let (endpoint, token) = match credential {
        Credential::Token(token) => match http::Endpoint::parse(api, None) {
            Ok(endpoint) => (endpoint, Some(token)),
            Err(error) => return unreachable(error),
        },
        Credential::Certificate(identity) => match node_endpoint(node, api, identity) {
            Ok(endpoint) => (endpoint, None),
            Err(response) => return response,
        },
    };
    let query = if request.query.is_empty() {
        LOCAL_MARK.to_string()
    } else {
        format!("{}&{LOCAL_MARK}", request.query)
    };
    let path = format!("{}?{query}", request.path);
    let body = body.filter(|_| request.method != "GET");
    match http::call(&endpoint, token, &request.method, &path, body, timeout) {
        Ok((status, bytes)) => match serde_json::from_slice(&bytes) {
            Ok(value) => (status, value),
            Err(error) => unreachable(format!("its answer is not JSON: {error}")),
        },
        Err(error) if http::is_timeout(&error) => {
            unreachable(format!("nothing within {timeout:?}"))
        }
        Err(error) => unreachable(error.to_string()),
    }
}

/// Node `node`'s API at `api` for a node with a certificate: over TLS
/// only, trusting the cluster's CA only, the server's certificate naming
/// `node` (whatever address the member record gives).
fn node_endpoint(
    node: &str,
    api: &str,
    identity: &http::tls::NodeIdentity,
) -> Result<http::Endpoint, Response> {
    let Some(address) = api.strip_prefix("https://") else {
        return Err(failure(
            502,
            "node_not_tls",
            &format!("node {node} advertises its API at {api}, not over TLS: nodes with certificates call each other over https only"),
            &format!("start {node} with its certificates (--pki DIR, `weft cluster issue {node}`)"),
        ));
    };
    let client = identity
        .client_for(&weft_cluster::pki::node_identity(node))
        .map_err(|error| failure(502, "node_unreachable", &error, "check the node's name"))?;
    Ok(http::Endpoint {
        address: address.trim_end_matches('/').to_string(),
        tls: Some(client),
    })
}

/// Adds `"node": NODE` to a view or to each view of a list.
impl Cluster {
    /// `view` (a volume's) with its replicas as the volume record has them
    /// now: the node's published status follows the record a moment later.
    pub(crate) fn live_replicas(&self, mut view: Value) -> Value {
        let Some(name) = view["name"].as_str() else {
            return view;
        };
        let key = format!("volumes/{name}");
        let record = weft_control::records::read::<VolumeRecord>(self.store.as_ref(), &key);
        if let Ok(Some(found)) = record {
            if let Some(replication) = &found.record.replication {
                // The rebuilds' progress is this node's (its primary's).
                let rebuilds: Vec<crate::views::ReplicaRebuild> = view["replicas"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|replica| {
                        let node = replica["node"].as_str()?.to_string();
                        let rebuild = serde_json::from_value(replica["rebuild"].clone()).ok()?;
                        Some((node, rebuild))
                    })
                    .collect();
                let replicas = crate::views::replica_views(replication, &rebuilds);
                view["replicas"] = json!(replicas);
                view["snapshots"] = json!(crate::views::snapshot_names(replication));
                view["snapshot_copies"] = json!(crate::views::snapshot_copies(replication));
                if let Some(erasure) = crate::views::erasure_view(replication) {
                    view["erasure"] = json!(erasure);
                    view["size_bytes"] = json!(replication.size_bytes);
                }
            }
        }
        view
    }
}

pub(crate) fn tag_node(mut value: Value, node: &str) -> Value {
    match &mut value {
        Value::Array(items) => items.iter_mut().for_each(|item| tag_object(item, node)),
        item => tag_object(item, node),
    }
    value
}

fn tag_object(item: &mut Value, node: &str) {
    if let Value::Object(fields) = item {
        fields.insert("node".into(), json!(node));
    }
}

/// The one place store errors become HTTP statuses.
pub(crate) fn store_failure(error: &StoreError) -> Response {
    let message = error.to_string();
    match error {
        StoreError::Unavailable { .. } => failure(
            503,
            "store_unavailable",
            &message,
            "volumes keep serving I/O; check the store named (etcd: is it up and reachable from this node? a file: disk full, permissions) and retry",
        ),
        StoreError::Conflict { .. } => failure(
            409,
            "conflict",
            &message,
            "another call changed it at the same time; read it again and retry",
        ),
        StoreError::LeaseExpired { .. } | StoreError::Compacted { .. } => {
            failure(503, "store", &message, "retry in a moment")
        }
        StoreError::Corrupt { .. } => failure(
            500,
            "store_corrupt",
            &message,
            "check the data directory (disk full, permissions) and weft's log",
        ),
    }
}

pub(crate) fn node_failure(error: &NodeError) -> Response {
    let message = error.to_string();
    match error {
        NodeError::NotFound(_) => failure(
            404,
            "not_found",
            &message,
            "`weft node list` shows the nodes",
        ),
        NodeError::Up(_) => failure(409, "node_up", &message, "stop weft on it, then remove it"),
        NodeError::HoldsVolumes { .. } => {
            failure(409, "holds_volumes", &message, "delete its volumes first")
        }
        NodeError::Store(store) => store_failure(store),
    }
}

pub(crate) fn placement_failure(error: &PlacementError) -> Response {
    let message = error.to_string();
    let (status, code) = match error {
        PlacementError::NoSuchNode(_) | PlacementError::NoSuchPool(_) => (404, "not_found"),
        PlacementError::NoRoom { .. } => (507, "no_room"),
        _ => (409, "unplaceable"),
    };
    failure(
        status,
        code,
        &message,
        "`weft node list` shows each node's state and pools",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_calls_are_recognised_and_queries_read() {
        let request = |query: &str| Request {
            method: "GET".into(),
            path: "/api/v1/volumes".into(),
            query: query.into(),
            authorization: None,
            body: Vec::new(),
        };
        assert!(is_forwarded(&request("local=1")));
        assert!(is_forwarded(&request("force=true&local=1")));
        assert!(!is_forwarded(&request("local=10")));
        assert_eq!(query_value("force=true&node=n2", "node"), Some("n2"));
        assert_eq!(query_value("nodes=n2", "node"), None);
    }

    #[test]
    fn a_call_forwarded_to_a_hung_node_fails_within_its_timeout() {
        assert_eq!(forward_timeout("GET"), READ_FORWARD_TIMEOUT);
        assert_eq!(forward_timeout("POST"), FORWARD_TIMEOUT);
        // A node whose process is stopped: its kernel accepts, nobody answers.
        let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let view = NodeView {
            member: weft_cluster::records::MemberRecord {
                name: "n1".into(),
                api: format!("http://{}", hung.local_addr().unwrap()),
                ..Default::default()
            },
            alive: None,
            controller: false,
        };
        let request = Request {
            method: "GET".into(),
            path: "/api/v1/volumes/rep".into(),
            query: String::new(),
            authorization: None,
            body: Vec::new(),
        };
        let timeout = Duration::from_millis(200);
        let started = Instant::now();
        let credential = Credential::Token("token");
        let (status, body) = call_node_within(&view, &request, None, credential, timeout);
        let took = started.elapsed();
        assert_eq!(status, 502);
        assert!(
            body.to_string()
                .contains("did not answer: nothing within 200ms"),
            "{body}"
        );
        assert!(took >= timeout && took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn a_volume_this_nodes_copy_has_not_seen_yet_is_routed_by_the_store_itself() {
        // The copy lags: the record is in the store (etcd) only.
        let copy: Arc<dyn Store> = Arc::new(weft_control::MemoryStore::default());
        let remote: Arc<dyn Store> = Arc::new(weft_control::MemoryStore::default());
        let record = VolumeRecord {
            id: "00".into(),
            node: Some("n2".into()),
            ..VolumeRecord::default()
        };
        let txn =
            weft_control::Txn::new().create("volumes/v", weft_control::records::encode(&record));
        remote.commit(txn).unwrap();
        let request = Request {
            method: "POST".into(),
            path: "/api/v1/volumes/v/hosts".into(),
            query: String::new(),
            authorization: None,
            body: br#"{"host": "h"}"#.to_vec(),
        };
        let params = ["v".to_string()];
        let lagging = Cluster::new(Arc::clone(&copy), "n1");
        assert!(
            matches!(
                lagging.route("volumes/{volume}/hosts", &params, &request),
                Route::Local(_)
            ),
            "without the store itself, the copy's answer: served here, where it is missing"
        );
        let cluster = Cluster::new(copy, "n1").with_remote_store(remote);
        match cluster.route("volumes/{volume}/hosts", &params, &request) {
            Route::Forward(node, None) => assert_eq!(node, "n2"),
            _ => panic!("not forwarded to the node that holds it"),
        }
    }

    #[test]
    fn a_replicated_volume_this_nodes_copy_has_not_seen_is_not_deleted_as_a_plain_one() {
        let copy: Arc<dyn Store> = Arc::new(weft_control::MemoryStore::default());
        let remote: Arc<dyn Store> = Arc::new(weft_control::MemoryStore::default());
        let member = |node: &str| json!({"node": node, "pool": "p", "state": "in_sync"});
        let record = json!({
            "id": "00", "hosts": [], "qos": {}, "node": "n2", "pool": "p",
            "replication": {
                "epoch": 1, "primary": "n2", "members": [member("n2"), member("n3")],
                "size_bytes": 1 << 20, "block_size": 512,
            },
        });
        // What the store's own reader makes of it: a replicated volume.
        let decoded: VolumeRecord =
            weft_control::records::decode("volumes/r", record.clone()).unwrap();
        assert!(decoded.replication.is_some());
        remote
            .commit(weft_control::Txn::new().create("volumes/r", record))
            .unwrap();
        let request = Request {
            method: "DELETE".into(),
            path: "/api/v1/volumes/r".into(),
            query: String::new(),
            authorization: None,
            body: Vec::new(),
        };
        let cluster = Cluster::new(copy, "n1").with_remote_store(remote);
        // The copy knows no nodes either: refused (no such node), as a
        // replicated deletion whose replicas' nodes are checked first; never
        // forwarded to the primary alone.
        let route = cluster.route("volumes/{volume}", &["r".to_string()], &request);
        if let Route::Forward(node, _) = route {
            panic!("a plain deletion sent to {node}: its replicas would stay");
        }
        assert!(matches!(route, Route::Respond(_)));
    }

    #[test]
    fn views_are_tagged_with_their_node() {
        let list = tag_node(json!([{"name": "a"}, {"name": "b"}]), "n1");
        assert_eq!(list[1]["node"], "n1");
        assert_eq!(tag_node(json!({"name": "a"}), "n2")["node"], "n2");
    }
}
