//! The node's control API (HTTP/JSON, default 127.0.0.1:9440): pools,
//! volumes, snapshots, hosts, attachments and QoS, over weft-http. Every
//! change becomes one admin operation of the node's volume manager (through
//! its [`ManagerHandle`]); every read (lists, shows, statistics, metrics) is
//! answered from what the node published (its [`StatusReader`]), never
//! through the manager's queue. What the node reports becomes the JSON
//! views of [`views`], defined here and nowhere else. Errors are
//! `{code, message, hint}` with the HTTP status the failure calls for,
//! mapped in one place. Every route but the OpenAPI document needs the
//! bearer token ([`token`]).
//!
//! The routes are the table [`ROUTES`]; `openapi.json` (served at
//! `/api/v1/openapi.json`) documents each of them, which a test checks.
//! Beside them, `GET /metrics` serves the Prometheus exposition (token
//! needed too: Prometheus sends it with `authorization: credentials_file`).
//! `GET /ui/` serves the web dashboard's files ([`ui`]: they hold no data;
//! the page reads everything through the API with the operator's token).
//!
//! What it does not do: touch the I/O path, own or change any state itself
//! (the manager does), or know how pools and volumes are stored.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admission;
pub mod cluster;
pub mod join;
mod moves;
mod replicas;
pub mod scoped_tokens;
pub mod token;
mod ui;
pub mod views;

use serde::Deserialize;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use views::{HostView, PoolDetail, PoolView, VolumeView};
use weft_http::{self as http, Request};
use weft_node::manager::{
    AdminError, AdminOp, HostSecrets, ManagerHandle, QosChanges, ReplicaPlacement, SecretChanges,
    VolumeIdentity, DEFAULT_CHUNK_BYTES,
};
use weft_node::{StatusReader, TierDevice};
use weft_volume::compression::Compression;
use weft_volume::{VolumeError, VolumeSpec};

/// Default API address.
pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:9440";

/// The OpenAPI 3 document of this API.
pub const OPENAPI: &str = include_str!("openapi.json");

/// The longest a `GET changes` waits for a change: a connection it holds
/// is one of the few a client address may hold.
pub const CHANGES_WAIT_MAX: Duration = Duration::from_secs(10);

/// Every route: method and path under `/api/v1/`, `{name}` matching one segment.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "openapi.json"),
    ("GET", "stats"),
    ("GET", "session"),
    ("GET", "changes"),
    ("GET", "pools"),
    ("POST", "pools"),
    ("GET", "pools/{pool}"),
    ("DELETE", "pools/{pool}"),
    ("POST", "pools/{pool}/devices"),
    ("POST", "pools/{pool}/clear-failure"),
    ("POST", "pools/{pool}/rewrap"),
    ("PUT", "pools/{pool}/write-tier"),
    ("DELETE", "pools/{pool}/write-tier"),
    ("POST", "subsystems/{nqn}/namespaces/{nsid}/clear-failure"),
    ("GET", "volumes"),
    ("POST", "volumes"),
    ("GET", "volumes/{volume}"),
    ("DELETE", "volumes/{volume}"),
    ("POST", "volumes/{volume}/resize"),
    ("POST", "volumes/{volume}/flatten"),
    ("POST", "volumes/{volume}/move-primary"),
    ("PATCH", "volumes/{volume}/qos"),
    ("PATCH", "volumes/{volume}/replicas"),
    ("POST", "volumes/{volume}/hosts"),
    ("DELETE", "volumes/{volume}/hosts/{host}"),
    ("POST", "volumes/{volume}/snapshots"),
    ("DELETE", "volumes/{volume}/snapshots/{snapshot}"),
    ("GET", "hosts"),
    ("POST", "hosts"),
    ("GET", "hosts/{host}"),
    ("PATCH", "hosts/{host}"),
    ("DELETE", "hosts/{host}"),
    ("GET", "nodes"),
    ("GET", "nodes/{node}"),
    ("DELETE", "nodes/{node}"),
    ("POST", "nodes/{node}/cordon"),
    ("POST", "nodes/{node}/uncordon"),
    ("POST", "nodes/{node}/drain"),
    ("POST", "tokens/{role}/renew"),
    ("GET", "cluster/ca"),
    ("GET", "cluster/store"),
    ("POST", "cluster/join-tokens"),
    ("POST", "cluster/join"),
];

/// What every API call shares.
struct Api {
    manager: ManagerHandle,
    status: StatusReader,
    /// The admin token (the scoped ones derive from it at the
    /// generations `store` holds: [`token::Credentials`]).
    admin_token: String,
    /// The scoped tokens' generations, as this node holds them.
    scoped: Arc<scoped_tokens::ScopedTokens>,
    /// Set when the node is a member of a cluster.
    cluster: Option<cluster::Cluster>,
}

/// How much of the node the API's clients may hold.
#[derive(Debug, Clone, Copy)]
pub struct ApiLimits {
    /// Connections served at once; more are answered 503 at once.
    pub connections: u32,
    /// Of those, connections from one client address.
    pub connections_per_address: u32,
    /// Time a client has to send its request's head (TLS handshake included).
    pub head_timeout: Duration,
    /// Time a client has to send its whole request.
    pub request_timeout: Duration,
}

/// Binds the API's address (before the node starts, so that a cluster
/// node can advertise the port bound).
pub fn bind(address: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(address).map_err(|e| {
        format!("cannot listen on {address} for the API: {e} (choose another with --api-listen)")
    })
}

/// Serves the API on `listener` on a thread; returns its address. Changes
/// go to the node's manager through `manager`; reads come from `status`;
/// with `cluster`, calls about what other nodes hold go to them. The
/// scoped tokens are those of the generations `scoped` holds.
#[allow(clippy::too_many_arguments)]
pub fn start(
    listener: TcpListener,
    tls: Option<http::tls::Server>,
    manager: ManagerHandle,
    status: StatusReader,
    token: String,
    scoped: Arc<scoped_tokens::ScopedTokens>,
    limits: ApiLimits,
    cluster: Option<cluster::Cluster>,
) -> Result<SocketAddr, String> {
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let api = Arc::new(Api {
        manager,
        status,
        admin_token: token,
        scoped,
        cluster,
    });
    let admission = admission::Admission::new(limits.connections, limits.connections_per_address);
    // Clients over a limit are answered 503 by one thread of their own, a
    // few at a time (more are closed unanswered): the accepting thread never waits.
    let (refusals, refused) = std::sync::mpsc::sync_channel(16);
    std::thread::Builder::new()
        .name("weft-api-busy".into())
        .spawn(move || {
            for (stream, why) in refused {
                admission::refuse_busy(stream, why);
            }
        })
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("weft-api".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let Ok(peer) = stream.peer_addr() else {
                    continue;
                };
                let place = match admission.enter(peer.ip()) {
                    Ok(place) => place,
                    Err(why) => {
                        let _ = refusals.try_send((stream, why));
                        continue;
                    }
                };
                let Ok((stream, deadline)) = http::DeadlineStream::with_head_deadline(
                    stream,
                    limits.head_timeout,
                    limits.request_timeout,
                ) else {
                    continue;
                };
                let api = Arc::clone(&api);
                let tls = tls.clone();
                let _ = std::thread::Builder::new()
                    .name("weft-api-call".into())
                    .spawn(move || {
                        let _place = place;
                        let head_read = move || deadline.allow(limits.request_timeout);
                        match tls {
                            None => serve_connection(stream, &api, head_read, |_| None),
                            Some(tls) => serve_tls_connection(stream, &tls, &api, head_read),
                        }
                    });
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(bound)
}

/// A connection to the TLS API: plain HTTP (a first byte that cannot start a
/// TLS handshake record, 16h) is answered in plain HTTP, naming the fix.
fn serve_tls_connection(
    mut stream: http::DeadlineStream,
    tls: &http::tls::Server,
    api: &Api,
    head_read: impl FnOnce(),
) {
    let mut first = [0u8; 1];
    if matches!(stream.peek(&mut first), Ok(1) if first[0] != 0x16) {
        let (status, body) = failure(
            400,
            "tls_required",
            "this API is served over TLS",
            "use https://HOST:PORT (with --api-ca FILE, or WEFT_API_CA, naming the CA of its certificate)",
        );
        let _ = http::write_response(&mut stream, status, http::JSON, body.to_string().as_bytes());
        return;
    }
    if let Ok(stream) = tls.accept(stream) {
        serve_connection(stream, api, head_read, |stream| {
            http::tls::client_names(&stream.conn)
                .iter()
                .find_map(|name| weft_cluster::pki::node_named(name))
                .map(str::to_string)
        });
    }
}

/// Serves one request; `head_read` is called once its head is in;
/// `peer_node` names the node whose certificate the client presented.
fn serve_connection<S: Read + Write>(
    mut stream: S,
    api: &Api,
    head_read: impl FnOnce(),
    peer_node: impl FnOnce(&S) -> Option<String>,
) {
    let request = http::read_request_after_head(&mut stream, head_read);
    let peer = peer_node(&stream);
    let (status, body) = match request {
        Ok(request) if request.method == "GET" && ui::serve(&mut stream, &request.path) => return,
        Ok(request) if request.path == "/metrics" && request.method == "GET" => {
            match api.caller(&request, peer.as_deref()).and_then(|_| api.metrics()) {
                Ok(text) => {
                    let content_type = "text/plain; version=0.0.4";
                    let _ = http::write_response(&mut stream, 200, content_type, text.as_bytes());
                    return;
                }
                Err(response) => response,
            }
        }
        Ok(request) => api.handle(&request, peer.as_deref()),
        Err(error) if http::is_timeout(&error) => failure(
            408,
            "request_timeout",
            &error.to_string(),
            "send the whole request at once (limits.api_head_timeout_ms and api_request_timeout_ms in weft.toml)",
        ),
        Err(error) => failure(
            400,
            "bad_request",
            &error.to_string(),
            "send an HTTP/1.1 request with a JSON body",
        ),
    };
    let _ = http::write_response(&mut stream, status, http::JSON, body.to_string().as_bytes());
}

type Response = (u16, Value);

/// The names of the hosts the CSI controller registers (weft-csi's `publish`).
const CSI_HOST_PREFIX: &str = "csi-";

/// Who calls the API.
enum Caller {
    /// A client with this bearer token's role.
    Token(token::Role),
    /// The cluster's node of this name, by its certificate.
    Node(String),
}

impl Api {
    fn handle(&self, request: &Request, peer_node: Option<&str>) -> Response {
        let Some(relative) = request.path.strip_prefix("/api/v1/") else {
            return no_route(request);
        };
        let (pattern, params) = match find_route(&request.method, relative) {
            RouteMatch::Found(pattern, params) => (pattern, params),
            RouteMatch::WrongMethod(allowed) => {
                return failure(
                    405,
                    "method_not_allowed",
                    &format!("{} is not allowed on {}", request.method, request.path),
                    &format!("use {}", allowed.join(" or ")),
                )
            }
            RouteMatch::None => return no_route(request),
        };
        if pattern == "openapi.json" {
            return (200, serde_json::from_str(OPENAPI).expect("valid document"));
        }
        // What a joining node calls before it holds any credential.
        if let Some(response) = self.before_credentials(pattern, request) {
            return response;
        }
        // Only nodes forward calls: a call marked as forwarded skips the
        // cluster's own checks (where a volume lives, placement). Nodes with
        // certificates forward with them, and then no token may.
        let forwarded = cluster::is_forwarded(request);
        let certified = self
            .cluster
            .as_ref()
            .is_some_and(cluster::Cluster::nodes_have_certificates);
        let caller = match self.caller(request, peer_node) {
            Ok(caller) => caller,
            Err(response) => return response,
        };
        match &caller {
            Caller::Node(node) if !forwarded => {
                return failure(
                    403,
                    "forbidden",
                    &format!(
                    "node {node}'s certificate may only forward calls (local=1), not call {} {}",
                    request.method, request.path
                ),
                    "call with a token (--api-token-file)",
                )
            }
            Caller::Node(_) => {}
            Caller::Token(role) if !role.allows(&request.method, pattern) => {
                return forbidden(*role, &request.method, &request.path)
            }
            // The CSI controller sets the secrets of the hosts it made only.
            Caller::Token(token::Role::Csi)
                if pattern == "hosts/{host}" && !params[0].starts_with(CSI_HOST_PREFIX) =>
            {
                return forbidden(token::Role::Csi, &request.method, &request.path)
            }
            Caller::Token(role) if forwarded && (certified || *role != token::Role::Admin) => {
                return forbidden(*role, &request.method, "a forwarded call (local=1)")
            }
            Caller::Token(_) => {}
        }
        match pattern {
            "session" => return self.session(&caller),
            "changes" => return self.changes(&request.query),
            "cluster/store" => {
                return match &self.cluster {
                    Some(cluster) => cluster.store_health(),
                    None => not_a_cluster(),
                }
            }
            _ => {}
        }
        let mut body = None;
        if pattern == "tokens/{role}/renew" {
            return self.renew_token(&params[0]);
        }
        if pattern == "cluster/join-tokens" {
            return match self.cluster.as_ref().and_then(|c| Some((c, c.joins()?))) {
                Some((cluster, joins)) => {
                    joins.create_token(cluster.store().as_ref(), &self.admin_token, &request.body)
                }
                None => not_joinable(),
            };
        }
        if pattern.starts_with("nodes") {
            return match &self.cluster {
                Some(cluster) => cluster.nodes_call(&request.method, pattern, &params),
                None => not_a_cluster(),
            };
        }
        if let Some(cluster) = &self.cluster {
            match cluster.route(pattern, &params, request) {
                cluster::Route::Local(replaced) => body = replaced,
                cluster::Route::Forward(node, replaced) => {
                    return cluster.forward(
                        &node,
                        request,
                        replaced.as_deref(),
                        cluster.credential(&self.admin_token),
                    )
                }
                cluster::Route::Gather => {
                    return match self.read(&request.method, pattern, &params) {
                        Some(Ok(local)) => {
                            let local = cluster::tag_node(local, cluster.node());
                            let credential = cluster.credential(&self.admin_token);
                            cluster.gather(pattern, request, local, credential)
                        }
                        Some(Err(error)) => admin_failure(&error),
                        None => unreachable!("gathered routes are reads"),
                    };
                }
                cluster::Route::Respond(response) => return response,
                cluster::Route::DeleteReplicated { replicas, primary } => {
                    for node in [&primary].into_iter().chain(&replicas) {
                        let (status, answer) = if node == cluster.node() {
                            self.local_call(pattern, &params, request, &request.body)
                        } else {
                            let credential = cluster.credential(&self.admin_token);
                            cluster.forward(node, request, None, credential)
                        };
                        // A replica that was never created is no obstacle.
                        let missing = status == 404 && *node != primary;
                        if status >= 300 && !missing {
                            return (status, answer);
                        }
                    }
                    return (200, json!({"ok": true}));
                }
            }
        }
        if let Some(read) = self.read(&request.method, pattern, &params) {
            return match read {
                Ok(view) => (200, self.tag(pattern, view)),
                Err(error) => admin_failure(&error),
            };
        }
        let body = body.as_deref().unwrap_or(&request.body);
        self.local_call(pattern, &params, request, body)
    }

    /// Who the caller is to this node: the role of its token (what it may
    /// do), and where it is (the dashboard shows its actions from this).
    fn session(&self, caller: &Caller) -> Response {
        let role = match caller {
            Caller::Token(role) => role.name(),
            Caller::Node(_) => "node",
        };
        (
            200,
            json!({"role": role, "node": self.node(), "cluster": self.cluster.is_some()}),
        )
    }

    /// Answers this node's status generation once it passes `after`, or
    /// after `wait_ms` (at most [`CHANGES_WAIT_MAX`]) if it does not: a
    /// long poll, so that a dashboard learns of a change at once. It covers
    /// what this node serves; what other nodes serve shows at the next poll.
    fn changes(&self, query: &str) -> Response {
        let mut after = None;
        let mut wait = Duration::ZERO;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if key == "local" {
                continue; // the mark of a call forwarded by another node
            }
            let number = value.parse::<u64>().map_err(|_| {
                failure(
                    400,
                    "invalid",
                    &format!("{key}={value:?} is not a number"),
                    "give after=GENERATION and wait_ms=MILLISECONDS as whole numbers",
                )
            });
            match (key, number) {
                (_, Err(response)) => return response,
                ("after", Ok(n)) => after = Some(n),
                ("wait_ms", Ok(n)) => wait = Duration::from_millis(n).min(CHANGES_WAIT_MAX),
                (other, Ok(_)) => {
                    return failure(
                        400,
                        "invalid",
                        &format!("unknown parameter {other:?}"),
                        "give after=GENERATION and wait_ms=MILLISECONDS",
                    )
                }
            }
        }
        let generation = match after {
            Some(seen) => self.status.wait_for_change(seen, wait),
            None => self.status.generation(),
        };
        (200, json!({ "generation": generation }))
    }

    /// Serves a change on this node.
    fn local_call(
        &self,
        pattern: &str,
        params: &[String],
        request: &Request,
        body: &[u8],
    ) -> Response {
        let op = match operation(&request.method, pattern, params, request, body, self.node()) {
            Ok(op) => op,
            Err(response) => return response,
        };
        let created = request.method == "POST"
            && matches!(
                pattern,
                "pools" | "volumes" | "hosts" | "volumes/{volume}/snapshots"
            );
        match self.manager.call(op) {
            Ok(()) => (if created { 201 } else { 200 }, json!({"ok": true})),
            Err(error) => admin_failure(&error),
        }
    }

    /// This node's name in its cluster.
    fn node(&self) -> Option<&str> {
        self.cluster.as_ref().map(cluster::Cluster::node)
    }

    /// A pool or volume view with the node it is on (in a cluster), and a
    /// volume's replicas as the cluster's record has them now.
    fn tag(&self, pattern: &str, view: Value) -> Value {
        let Some(cluster) = &self.cluster else {
            return view;
        };
        let view = match pattern {
            "volumes/{volume}" => cluster.live_replicas(view),
            _ => view,
        };
        if pattern.starts_with("pools") || pattern.starts_with("volumes") {
            cluster::tag_node(view, cluster.node())
        } else {
            view
        }
    }

    /// The view a read route answers with, from what the node last
    /// published (never through the manager's queue); `None` for the
    /// routes that change something.
    fn read(
        &self,
        method: &str,
        pattern: &str,
        params: &[String],
    ) -> Option<Result<Value, AdminError>> {
        let status = &self.status;
        Some(match (method, pattern) {
            ("GET", "stats") => Ok(json_of(status.stats())),
            ("GET", "pools") => Ok(json_of(list::<_, PoolView>(&status.pools()))),
            ("GET", "pools/{pool}") => status
                .pool(&params[0])
                .map(|pool| json_of(PoolDetail::from(&pool))),
            ("GET", "volumes") => {
                // A replica is listed by its primary's node only.
                let node = self.node();
                let served_here = |v: &weft_node::VolumeStatus| {
                    v.replication
                        .as_ref()
                        .is_none_or(|r| Some(r.primary.as_str()) == node)
                };
                let volumes: Vec<_> = status.volumes().into_iter().filter(served_here).collect();
                Ok(json_of(list::<_, VolumeView>(&volumes)))
            }
            ("GET", "volumes/{volume}") => status
                .volume(&params[0])
                .map(|volume| json_of(VolumeView::from(&volume))),
            ("GET", "hosts") => status
                .hosts()
                .map(|hosts| json_of(list::<_, HostView>(&hosts))),
            ("GET", "hosts/{host}") => status
                .host(&params[0])
                .map(|host| json_of(HostView::from(&host))),
            _ => return None,
        })
    }

    /// The Prometheus exposition (any caller).
    fn metrics(&self) -> Result<String, Response> {
        let mut text = self.status.prometheus();
        let node = self.cluster.as_ref().map_or("", cluster::Cluster::node);
        weft_node::metrics::node_info(&mut text, node);
        Ok(text)
    }

    /// Who calls: the node whose certificate (from the cluster's CA) the
    /// client presented, if that node is a member, else the bearer token's role.
    fn caller(&self, request: &Request, peer_node: Option<&str>) -> Result<Caller, Response> {
        if let (Some(node), Some(cluster)) = (peer_node, &self.cluster) {
            cluster.membership(node)?;
            return Ok(Caller::Node(node.to_string()));
        }
        self.authorize(request).map(Caller::Token)
    }

    fn authorize(&self, request: &Request) -> Result<token::Role, Response> {
        let hint = "send Authorization: Bearer <token>; the token is in the node's DATA_DIR/api-token (CLI: --api-token-file or WEFT_API_TOKEN)";
        match request
            .authorization
            .as_deref()
            .and_then(|h| h.strip_prefix("Bearer "))
        {
            None => Err(failure(
                401,
                "unauthorized",
                "this API needs a bearer token",
                hint,
            )),
            Some(token) if token::matches(&self.admin_token, token.trim()) => {
                Ok(token::Role::Admin)
            }
            Some(token) => self.credentials()?.role_of(token.trim()).ok_or_else(|| {
                failure(
                    401,
                    "unauthorized",
                    "the bearer token is not this node's",
                    hint,
                )
            }),
        }
    }

    /// The routes a joining node calls without a credential: the CA's
    /// certificate, and the join itself (its token is the credential).
    fn before_credentials(&self, pattern: &str, request: &Request) -> Option<Response> {
        if !matches!(pattern, "cluster/ca" | "cluster/join") {
            return None;
        }
        let Some((cluster, joins)) = self.cluster.as_ref().and_then(|c| Some((c, c.joins()?)))
        else {
            return Some(not_joinable());
        };
        Some(match pattern {
            "cluster/ca" => joins.ca(),
            _ => joins.join(cluster.store().as_ref(), &self.admin_token, &request.body),
        })
    }

    /// The tokens accepted now: the scoped ones at the generations the
    /// store holds (a local read).
    fn credentials(&self) -> Result<token::Credentials, Response> {
        let generations = self.scoped.current().map_err(|error| {
            failure(
                503,
                "store_unavailable",
                &format!("the scoped tokens' generations cannot be read: {error}"),
                "call with the admin token, or once the node's store is readable again",
            )
        })?;
        Ok(token::Credentials::of(&self.admin_token, generations))
    }

    /// `POST tokens/{role}/renew`: role `name`'s token moves to its next
    /// generation, in the store every node reads; the old one is refused.
    fn renew_token(&self, name: &str) -> Response {
        let Some(role) = token::Role::scoped_named(name) else {
            return failure(
                404,
                "no_such_token",
                &format!("no scoped token {name:?}: the scoped tokens are csi and read-only"),
                "renew csi or read-only (the admin token is rotated by hand: docs/SECURITY.md)",
            );
        };
        match self.scoped.renew(role) {
            Ok(generations) => (
                200,
                json!({
                    "role": name,
                    "generation": generations.of(role),
                    "file": format!("{}.{name}", token::FILE_NAME),
                }),
            ),
            Err(error @ scoped_tokens::ScopedError::Exhausted(_)) => failure(
                409,
                "exhausted",
                &error.to_string(),
                "rotate the admin token (docs/SECURITY.md)",
            ),
            Err(error) => failure(
                503,
                "store_unavailable",
                &format!("{} was not renewed: {error}", role.describe()),
                "try again once the store is reachable",
            ),
        }
    }
}

enum RouteMatch {
    Found(&'static str, Vec<String>),
    WrongMethod(Vec<&'static str>),
    None,
}

/// Finds the route of `method` and `path` (relative to `/api/v1/`).
fn find_route(method: &str, path: &str) -> RouteMatch {
    let segments: Vec<&str> = path.split('/').collect();
    let mut allowed = Vec::new();
    for &(route_method, pattern) in ROUTES {
        let Some(params) = match_pattern(pattern, &segments) else {
            continue;
        };
        if route_method == method {
            return RouteMatch::Found(pattern, params);
        }
        allowed.push(route_method);
    }
    if allowed.is_empty() {
        RouteMatch::None
    } else {
        RouteMatch::WrongMethod(allowed)
    }
}

fn match_pattern(pattern: &str, segments: &[&str]) -> Option<Vec<String>> {
    let parts: Vec<&str> = pattern.split('/').collect();
    if parts.len() != segments.len() {
        return None;
    }
    let mut params = Vec::new();
    for (part, segment) in parts.iter().zip(segments) {
        if part.starts_with('{') {
            if segment.is_empty() {
                return None;
            }
            params.push(segment.to_string());
        } else if part != segment {
            return None;
        }
    }
    Some(params)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreatePool {
    name: String,
    node: Option<String>,
    devices: Vec<PathBuf>,
    allocation_unit_bytes: Option<u32>,
    device_size_bytes: Option<u64>,
    #[serde(default)]
    force: bool,
    /// Encrypt every volume created in it.
    #[serde(default)]
    encrypt: bool,
    /// Compress the volumes of one copy created in it: "lz4", "zstd" or
    /// "none" (the default).
    compression: Option<String>,
    /// A write tier's device.
    write_tier: Option<PathBuf>,
    /// Creates a missing write tier file sparse with this size.
    write_tier_size_bytes: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetWriteTier {
    device: PathBuf,
    size_bytes: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddDevices {
    devices: Vec<PathBuf>,
    device_size_bytes: Option<u64>,
}

/// An erasure-coded volume's chunk: a 128 KiB sequential write covers two
/// members' chunks of a stripe (docs/ERASURE-CODING-DESIGN.md).
const EC_CHUNK_BYTES: u32 = 64 * 1024;
/// Journal slots per member: stripe updates in flight at once (at most).
const EC_JOURNAL_SLOTS: u32 = 64;

/// The bytes each member of an erasure-coded volume of `size_bytes` takes:
/// its journal and a chunk of every stripe.
pub(crate) fn shard_bytes(layout: weft_ec::Layout, size_bytes: u64, block_size: u32) -> u64 {
    let journal = weft_ec::JournalLayout {
        slots: EC_JOURNAL_SLOTS,
        block_bytes: block_size,
        chunk_bytes: EC_CHUNK_BYTES,
    };
    let shards = weft_ec::Geometry::new(layout, EC_CHUNK_BYTES)
        .map_or(size_bytes, |g| g.shard_volume_bytes(size_bytes));
    journal.data_base() + shards
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateVolume {
    name: String,
    node: Option<String>,
    nqn: Option<String>,
    uuid: Option<String>,
    nguid: Option<String>,
    pool: Option<String>,
    size_bytes: Option<u64>,
    block_size: Option<u32>,
    #[serde(default)]
    thick: bool,
    /// Encrypted at rest (AES-256-XTS, a data key per volume).
    #[serde(default)]
    encrypted: bool,
    /// "lz4", "zstd" or "none" (the default).
    compression: Option<String>,
    source: Option<String>,
    /// Copies on distinct nodes (a cluster's; default 1).
    replicas: Option<u32>,
    /// Where each replica goes, the first the primary: set by the node
    /// that placed them when it routes the call.
    placements: Option<Vec<ReplicaPlacementBody>>,
    /// Erasure-coded across nodes: `"K+M"` (e.g. `"4+2"`); the placements
    /// are then the stripe's members.
    ec: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaPlacementBody {
    node: String,
    pool: String,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateHost {
    name: String,
    nqn: String,
    #[serde(default)]
    dhchap_secret: Option<String>,
    #[serde(default)]
    dhchap_ctrl_secret: Option<String>,
    #[serde(default)]
    tls_psk: Option<String>,
    #[serde(default)]
    dhchap_group: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Attach {
    host: String,
}

/// The admin operation of a matched route.
fn operation(
    method: &str,
    pattern: &str,
    params: &[String],
    request: &Request,
    body: &[u8],
    node: Option<&str>,
) -> Result<AdminOp, Response> {
    let param = |index: usize| params[index].clone();
    Ok(match (method, pattern) {
        ("POST", "pools") => {
            let p: CreatePool = parse(body)?;
            check_node(p.node.as_deref(), node)?;
            AdminOp::CreatePool {
                name: p.name,
                devices: p.devices,
                chunk_bytes: p.allocation_unit_bytes.unwrap_or(DEFAULT_CHUNK_BYTES),
                device_bytes: p.device_size_bytes,
                force: p.force,
                encrypt: p.encrypt,
                compression: compression(p.compression.as_deref())?.unwrap_or_default(),
                write_tier: p.write_tier.map(|path| TierDevice {
                    path,
                    size_bytes: p.write_tier_size_bytes,
                }),
            }
        }
        ("PUT", "pools/{pool}/write-tier") => {
            let tier: SetWriteTier = parse(body)?;
            AdminOp::SetWriteTier {
                pool: param(0),
                tier: TierDevice {
                    path: tier.device,
                    size_bytes: tier.size_bytes,
                },
            }
        }
        ("DELETE", "pools/{pool}/write-tier") => AdminOp::RemoveWriteTier(param(0)),
        ("DELETE", "pools/{pool}") => AdminOp::DeletePool(param(0)),
        ("POST", "pools/{pool}/devices") => {
            let add: AddDevices = parse(body)?;
            AdminOp::AddDevices {
                pool: param(0),
                devices: add.devices,
                device_bytes: add.device_size_bytes,
            }
        }
        ("POST", "pools/{pool}/clear-failure") => AdminOp::ClearPoolFailure(param(0)),
        ("POST", "pools/{pool}/rewrap") => AdminOp::RewrapKeys {
            pool: param(0),
            keyring: None,
        },
        ("POST", "subsystems/{nqn}/namespaces/{nsid}/clear-failure") => {
            AdminOp::ClearNamespaceFailure {
                nqn: param(0),
                nsid: param(1).parse().map_err(|_| {
                    failure(
                        400,
                        "invalid",
                        &format!("namespace ID {:?} is not a number", param(1)),
                        "give the namespace's NSID, e.g. 1",
                    )
                })?,
            }
        }
        ("POST", "volumes") => {
            let create: CreateVolume = parse(body)?;
            check_node(create.node.as_deref(), node)?;
            create_volume(create)?
        }
        ("DELETE", "volumes/{volume}") => AdminOp::DeleteVolume {
            name: param(0),
            force: request.query.split('&').any(|q| q == "force=true"),
        },
        ("POST", "volumes/{volume}/resize") => AdminOp::ResizeVolume {
            name: param(0),
            size_bytes: parse::<Resize>(body)?.size_bytes,
        },
        ("POST", "volumes/{volume}/flatten") => AdminOp::FlattenVolume(param(0)),
        ("PATCH", "volumes/{volume}/qos") => AdminOp::SetQos {
            volume: param(0),
            changes: qos_changes(body)?,
        },
        ("POST", "volumes/{volume}/hosts") => AdminOp::Attach {
            volume: param(0),
            host: parse::<Attach>(body)?.host,
        },
        ("DELETE", "volumes/{volume}/hosts/{host}") => AdminOp::Detach {
            volume: param(0),
            host: param(1),
        },
        ("POST", "volumes/{volume}/snapshots") => AdminOp::CreateSnapshot {
            volume: param(0),
            name: parse::<Named>(body)?.name,
        },
        ("DELETE", "volumes/{volume}/snapshots/{snapshot}") => AdminOp::DeleteSnapshot {
            volume: param(0),
            name: param(1),
        },
        ("POST", "hosts") => {
            let host: CreateHost = parse(body)?;
            AdminOp::CreateHost {
                name: host.name,
                nqn: host.nqn,
                secrets: HostSecrets {
                    host: host.dhchap_secret,
                    controller: host.dhchap_ctrl_secret,
                    tls_psk: host.tls_psk,
                    dh_group: host.dhchap_group,
                },
            }
        }
        ("PATCH", "hosts/{host}") => AdminOp::SetHostSecrets {
            name: param(0),
            changes: secret_changes(body)?,
        },
        ("DELETE", "hosts/{host}") => AdminOp::DeleteHost(param(0)),
        // A cluster serves it before it gets here.
        ("POST", "volumes/{volume}/move-primary") | ("PATCH", "volumes/{volume}/replicas") => {
            return Err(not_a_cluster())
        }
        _ => {
            unreachable!("every route in ROUTES but the reads has an operation: {method} {pattern}")
        }
    })
}

/// A node named in a request must be this one (the cluster routes calls
/// for other nodes to them before they get here).
fn check_node(asked: Option<&str>, this: Option<&str>) -> Result<(), Response> {
    match (asked, this) {
        (None, _) => Ok(()),
        (Some(asked), Some(this)) if asked == this => Ok(()),
        (Some(asked), Some(this)) => Err(failure(
            400,
            "invalid",
            &format!("this is node {this}, not {asked}"),
            "call any node's API without local=1; it forwards the call",
        )),
        (Some(_), None) => Err(not_a_cluster()),
    }
}

/// A call `role` may not make.
fn forbidden(role: token::Role, method: &str, what: &str) -> Response {
    failure(
        403,
        "forbidden",
        &format!("{} may not call {method} {what}", role.describe()),
        "use a token that may (the admin token is DATA_DIR/api-token; the CSI and read-only ones beside it)",
    )
}

fn not_a_cluster() -> Response {
    failure(
        404,
        "not_a_cluster",
        "this node is not a member of a cluster",
        "start weft serve with --cluster ETCD_URLS --node NAME (see docs/guide/04-cluster.md)",
    )
}

fn create_volume(body: CreateVolume) -> Result<AdminOp, Response> {
    if let Some(source) = body.source {
        if body.compression.is_some() {
            return Err(failure(
                400,
                "invalid",
                "a clone is compressed exactly as its source is (it shares its extents)",
                "drop compression",
            ));
        }
        if body.encrypted {
            return Err(failure(
                400,
                "invalid",
                "a clone is encrypted exactly when its source is (it shares its blocks, and its key)",
                "drop encrypted; to encrypt a copy of an unencrypted volume, create an encrypted volume and copy the data",
            ));
        }
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
            "a new volume needs pool and size_bytes (or source for a clone); a cluster node places it when pool is left out",
            "e.g. {\"name\": \"db1\", \"pool\": \"fast\", \"size_bytes\": 107374182400}",
        ));
    };
    let identity = volume_identity(&body.nqn, &body.uuid, &body.nguid)?;
    let replicas: Vec<ReplicaPlacement> = body
        .placements
        .unwrap_or_default()
        .into_iter()
        .map(|p| ReplicaPlacement {
            node: p.node,
            pool: p.pool,
        })
        .collect();
    if (body.replicas.unwrap_or(1) > 1 || body.ec.is_some()) && replicas.is_empty() {
        return Err(not_a_cluster());
    }
    let erasure = match &body.ec {
        Some(text) => {
            let layout: weft_ec::Layout = text.parse().map_err(|message: String| {
                failure(
                    400,
                    "invalid",
                    &format!("ec {text:?}: {message}"),
                    "e.g. \"ec\": \"4+2\"",
                )
            })?;
            Some(weft_control::ErasureRecord {
                data_shards: layout.data() as u32,
                parity_shards: layout.parity() as u32,
                chunk_bytes: EC_CHUNK_BYTES,
                journal_slots: EC_JOURNAL_SLOTS,
            })
        }
        None => None,
    };
    let compression = compression(body.compression.as_deref())?;
    let compressed = compression.is_some_and(|c| c != Compression::None);
    if compressed && (!replicas.is_empty() || erasure.is_some()) {
        return Err(failure(
            400,
            "invalid",
            "compression is for volumes of one copy, for now",
            "drop compression, or replicas and ec",
        ));
    }
    Ok(AdminOp::CreateVolume {
        identity,
        replicas,
        erasure,
        pool,
        spec: VolumeSpec {
            name: body.name,
            size_bytes,
            block_size: body.block_size.unwrap_or(4096),
            thick: body.thick,
            encrypted: body.encrypted,
            compression: Compression::None,
        },
        compression,
    })
}

/// A compression the API was given, parsed.
fn compression(name: Option<&str>) -> Result<Option<Compression>, Response> {
    name.map(|name| {
        name.parse::<Compression>()
            .map_err(|e| failure(400, "invalid", &e, "give compression lz4, zstd or none"))
    })
    .transpose()
}

/// The identity chosen for a new volume, checked: any valid NQN (as nvmet
/// accepts), a UUID and an NGUID of 32 hex digits (dashes allowed), not all zero.
fn volume_identity(
    nqn: &Option<String>,
    uuid: &Option<String>,
    nguid: &Option<String>,
) -> Result<VolumeIdentity, Response> {
    let invalid = |message: String, hint: &str| failure(400, "invalid", &message, hint);
    if let Some(nqn) = nqn {
        weft_control::check_nqn(nqn)
            .map_err(|m| invalid(format!("nqn: {m}"), "give the NQN hosts know the volume by"))?;
        if nqn == weft_proto::target::DISCOVERY_NQN {
            return Err(invalid(
                format!("nqn: {nqn} is the discovery subsystem's"),
                "give the volume's own NQN",
            ));
        }
    }
    let bytes = |field: &str, text: &Option<String>| -> Result<Option<[u8; 16]>, Response> {
        text.as_deref()
            .map(|text| {
                weft_node::identity::parse_hex16(text)
                    .filter(|bytes| *bytes != [0; 16])
                    .ok_or_else(|| {
                        invalid(
                            format!("{field}: {text:?} is not 32 hex digits (or is all zero)"),
                            "e.g. 6f1c9b0e-2a4d-4e8b-9c55-0d3e7a1b2c4d",
                        )
                    })
            })
            .transpose()
    };
    Ok(VolumeIdentity {
        nqn: nqn.clone(),
        uuid: bytes("uuid", uuid)?,
        nguid: bytes("nguid", nguid)?,
    })
}

/// Smallest limits accepted: lower ones are almost certainly a unit mistake.
const QOS_IOPS_MIN: u64 = 10;
const QOS_BYTES_MIN: u64 = 1 << 20;

/// A QoS patch: each field present is a number (the new limit) or null
/// (no limit); absent fields keep their limit.
fn qos_changes(body: &[u8]) -> Result<QosChanges, Response> {
    let fields: serde_json::Map<String, Value> = parse(body)?;
    let mut changes = QosChanges::default();
    for (name, value) in fields {
        let (slot, minimum, unit) = match name.as_str() {
            "iops_max" => (&mut changes.iops_max, QOS_IOPS_MIN, "I/O per second"),
            "read_iops_max" => (&mut changes.read_iops_max, QOS_IOPS_MIN, "I/O per second"),
            "write_iops_max" => (&mut changes.write_iops_max, QOS_IOPS_MIN, "I/O per second"),
            "bw_max" => (&mut changes.bw_max, QOS_BYTES_MIN, "bytes per second"),
            "read_bw_max" => (&mut changes.read_bw_max, QOS_BYTES_MIN, "bytes per second"),
            "write_bw_max" => (&mut changes.write_bw_max, QOS_BYTES_MIN, "bytes per second"),
            _ => {
                return Err(failure(
                    400,
                    "invalid_json",
                    &format!("request body: unknown limit {name:?}"),
                    "limits are iops_max, bw_max, read_iops_max, read_bw_max, write_iops_max and write_bw_max",
                ))
            }
        };
        *slot = Some(match value {
            Value::Null => None,
            _ => match value.as_u64().filter(|&n| n >= minimum) {
                Some(n) => Some(n),
                None => {
                    return Err(failure(
                        400,
                        "invalid",
                        &format!("{name}: {value} is not a limit of at least {minimum} {unit}"),
                        "give a whole number (bytes per second for bandwidth), or null to remove the limit",
                    ))
                }
            },
        });
    }
    Ok(changes)
}

/// A secrets patch: each field present is a `DHHC-1` string (the new
/// secret; `NVMeTLSkey-1` for the TLS PSK) or null (none); absent fields
/// keep their secret. The manager checks the secrets themselves.
fn secret_changes(body: &[u8]) -> Result<SecretChanges, Response> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Patch {
        #[serde(default, deserialize_with = "present")]
        dhchap_secret: Option<Option<String>>,
        #[serde(default, deserialize_with = "present")]
        dhchap_ctrl_secret: Option<Option<String>>,
        #[serde(default, deserialize_with = "present")]
        tls_psk: Option<Option<String>>,
        #[serde(default, deserialize_with = "present")]
        dhchap_group: Option<Option<String>>,
    }
    /// Present fields become `Some`, null or not (absent ones stay `None`).
    fn present<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<String>>, D::Error> {
        Option::<String>::deserialize(deserializer).map(Some)
    }
    let patch: Patch = parse(body)?;
    Ok(SecretChanges {
        host: patch.dhchap_secret,
        controller: patch.dhchap_ctrl_secret,
        tls_psk: patch.tls_psk,
        dh_group: patch.dhchap_group,
    })
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|error| {
        failure(
            400,
            "invalid_json",
            &format!("request body: {error}"),
            "send the JSON fields this route documents (GET /api/v1/openapi.json)",
        )
    })
}

/// The JSON of a view.
fn json_of(view: impl serde::Serialize) -> Value {
    serde_json::to_value(view).expect("views serialise")
}

/// The view `V` of each of `items`.
fn list<'a, T, V: From<&'a T>>(items: &'a [T]) -> Vec<V> {
    items.iter().map(V::from).collect()
}

fn no_route(request: &Request) -> Response {
    failure(
        404,
        "no_route",
        &format!("no API route {} {}", request.method, request.path),
        "the routes are listed in GET /api/v1/openapi.json",
    )
}

/// Joining with a token on a node that cannot take joins.
fn not_joinable() -> Response {
    failure(
        409,
        "not_joinable",
        "nodes join with a token only a cluster whose nodes have certificates",
        "start the cluster's nodes with --pki (weft cluster init, docs/guide/04-cluster.md)",
    )
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
                "list what exists with `weft pool list`, `weft volume list` or `weft host list`",
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
                (507, "metadata_full", "free space: delete snapshots, clones or volumes, or add devices")
            }
            VolumeError::Io { .. } => (500, "io", "check the device (dmesg) and retry"),
            VolumeError::Failed { .. } => (
                503,
                "pool_failed",
                "check the pool's devices, then run weft pool clear-failure POOL",
            ),
            VolumeError::Corrupt(_) => (500, "corrupt", "restore the pool's devices"),
            VolumeError::Locked { .. } => (
                409,
                "locked",
                "give this node the key-encryption key (--kek-file or --kek-command), then run `weft pool rewrap POOL`",
            ),
            VolumeError::NoKeyring { .. } => (
                409,
                "no-key",
                "start weft serve with --kek-file PATH or --kek-command CMD",
            ),
        },
        AdminError::Busy { .. } => (409, "busy", "disconnect the hosts or pass force"),
        AdminError::HostAttached { .. } => {
            (409, "attached", "detach the host from its volumes first")
        }
        AdminError::NqnTaken { .. } => (409, "exists", "use the existing host's name"),
        AdminError::NameTaken { .. }
        | AdminError::NameTakenOnNode { .. }
        | AdminError::IdentityTaken { .. } => (409, "exists", "choose another name"),
        AdminError::Store(store) => return cluster::store_failure(store),
        AdminError::ManagerBusy { .. } => (503, "busy", "retry in a moment"),
        AdminError::Node(_) => (500, "node", "check weft's log"),
        AdminError::Invalid(_) => (400, "invalid", "correct the request as the message says"),
        AdminError::Unavailable(_) => (503, "unavailable", "retry in a moment"),
    };
    failure(status, code, &message, hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_with_parameters_and_wrong_methods_are_named() {
        match find_route("DELETE", "volumes/db1/hosts/web1") {
            RouteMatch::Found(pattern, params) => {
                assert_eq!(pattern, "volumes/{volume}/hosts/{host}");
                assert_eq!(params, ["db1", "web1"]);
            }
            _ => panic!("route not found"),
        }
        match find_route("PUT", "volumes/db1") {
            RouteMatch::WrongMethod(allowed) => assert_eq!(allowed, ["GET", "DELETE"]),
            _ => panic!("PUT is not a method of volumes/NAME"),
        }
        assert!(matches!(find_route("GET", "volumes/"), RouteMatch::None));
        assert!(matches!(find_route("GET", "nothing"), RouteMatch::None));
    }

    #[test]
    fn the_openapi_document_describes_exactly_the_routes() {
        let document: Value = serde_json::from_str(OPENAPI).unwrap();
        assert_eq!(
            document["openapi"].as_str().unwrap().chars().next(),
            Some('3')
        );
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                if method != "parameters" {
                    let relative = path.strip_prefix("/api/v1/").unwrap();
                    documented.push((method.to_uppercase(), relative.to_string()));
                }
            }
        }
        let mut routes: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        documented.sort();
        routes.sort();
        assert_eq!(documented, routes);
        // Every reference resolves.
        let text = OPENAPI.to_string();
        for reference in text.split("\"$ref\": \"#/components/").skip(1) {
            let path = &reference[..reference.find('"').unwrap()];
            let mut node = &document["components"];
            for part in path.split('/') {
                node = &node[part];
            }
            assert!(!node.is_null(), "unresolved $ref {path}");
        }
    }

    #[test]
    fn qos_patches_set_clear_and_refuse_mistakes() {
        let changes = qos_changes(br#"{"iops_max": 20000, "bw_max": null}"#).unwrap();
        assert_eq!(changes.iops_max, Some(Some(20000)));
        assert_eq!(changes.bw_max, Some(None));
        assert_eq!(changes.read_iops_max, None);
        let (status, body) = qos_changes(br#"{"bw_max": 200}"#).unwrap_err();
        assert_eq!(status, 400);
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains("at least 1048576"));
        let (status, _) = qos_changes(br#"{"iops": 5}"#).unwrap_err();
        assert_eq!(status, 400);
    }
}
