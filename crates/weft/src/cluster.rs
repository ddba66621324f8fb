//! `weft serve --cluster ...`: the cluster options (command line, and the
//! `[cluster]` table of weft.toml with the same keys) and what a node does
//! at start to be a member: connect to etcd, keep a local copy of the
//! desired state (weft-control's `Mirror`), join (weft-node's `join`), and
//! afterwards heartbeat and follow the store.

use crate::config::ConfigError;
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use weft_cluster::membership::DEFAULT_LEASE_TTL;
use weft_cluster::{Agent, MemberConfig};
use weft_control::{DesiredState, Mirror, Store};
use weft_etcd::{EtcdConfig, EtcdStore, EtcdTls};
use weft_node::cluster::join;
use weft_node::{identity, ManagerHandle, NodeId, StatusReader};

/// The `[cluster]` table of weft.toml.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    endpoints: Vec<String>,
    node: String,
    advertise: Option<String>,
    peer_advertise: Option<String>,
    api_advertise: Option<String>,
    zone: Option<String>,
    etcd_user: Option<String>,
    etcd_password_file: Option<PathBuf>,
    etcd_ca: Option<PathBuf>,
    etcd_cert: Option<PathBuf>,
    etcd_key: Option<PathBuf>,
    pki: Option<PathBuf>,
    lease_ttl_ms: Option<u64>,
    rebuild_mib_per_s: Option<u64>,
    replace_replica_after_s: Option<u64>,
    insecure_store: Option<bool>,
}

/// A replica is rebuilt at most this fast by default (MiB/s, per volume).
pub const REBUILD_MIB_PER_S_DEFAULT: u64 = 256;

/// A validated cluster membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// This node's name.
    pub node: String,
    /// The address other nodes and hosts reach this node at (None: the
    /// listen address, unless it is unspecified).
    pub advertise: Option<IpAddr>,
    /// The address the other nodes reach this node's NVMe/TCP listeners at
    /// for replication, when not where hosts do (a storage network apart
    /// from the hosts' network). None: the listen address when it is a
    /// specific one other than the advertised one, else the advertised one.
    pub peer_advertise: Option<IpAddr>,
    /// The URL other nodes call this node's API at, when not the advertised
    /// address (e.g. a management network apart from the storage network).
    pub api_advertise: Option<String>,
    /// Failure domain.
    pub zone: Option<String>,
    /// etcd user (with its password in `etcd_password_file`).
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password.
    pub etcd_password_file: Option<PathBuf>,
    /// CA certificate of etcd's TLS (PEM); with it, endpoints are https.
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd (PEM).
    pub etcd_cert: Option<PathBuf>,
    /// Client key for etcd (PEM).
    pub etcd_key: Option<PathBuf>,
    /// The node's certificates from the cluster's CA (`weft cluster issue`):
    /// `ca.crt`, `node.crt`, `node.key`; etcd's CA and client certificate
    /// unless given apart.
    pub pki: Option<PathBuf>,
    /// The node's lease: it is shown down this long after its last heartbeat.
    pub lease_ttl: Duration,
    /// How fast a primary on this node copies to a replica it rebuilds (per volume).
    pub rebuild_bytes_per_s: u64,
    /// How long a replica's node may be down before the controller (when
    /// this node is it) replaces the replica elsewhere.
    pub replace_replica_after: Duration,
    /// The operator accepts a store reached without any credential
    /// (`--insecure-store`): whoever reaches it owns the cluster.
    pub insecure_store: bool,
}

impl ClusterFile {
    /// Checks the table; `origin` names the file in errors.
    pub fn validate(self, origin: &str) -> Result<ClusterSpec, ConfigError> {
        let error = |field: &str, message: String| {
            ConfigError::new(origin, format!("cluster.{field}"), message)
        };
        let endpoints = check_endpoints(&self.endpoints).map_err(|m| error("endpoints", m))?;
        weft_cluster::records::check_node_name(&self.node).map_err(|m| error("node", m))?;
        let address = |field: &str, text: Option<&str>| {
            text.map(parse_advertise)
                .transpose()
                .map_err(|m| error(field, m))
        };
        let advertise = address("advertise", self.advertise.as_deref())?;
        let peer_advertise = address("peer_advertise", self.peer_advertise.as_deref())?;
        if self.etcd_user.is_some() != self.etcd_password_file.is_some() {
            return Err(error(
                "etcd_user",
                "etcd_user and etcd_password_file go together".into(),
            ));
        }
        if self.etcd_cert.is_some() != self.etcd_key.is_some() {
            return Err(error(
                "etcd_cert",
                "etcd_cert and etcd_key go together (PEM files)".into(),
            ));
        }
        let lease_ttl = match self.lease_ttl_ms {
            None => DEFAULT_LEASE_TTL,
            Some(ms) if (2_000..=60_000).contains(&ms) => Duration::from_millis(ms),
            Some(ms) => {
                return Err(error(
                    "lease_ttl_ms",
                    format!("{ms} is not between 2000 and 60000"),
                ))
            }
        };
        let rebuild_mib_per_s = self.rebuild_mib_per_s.unwrap_or(REBUILD_MIB_PER_S_DEFAULT);
        if !(1..=100_000).contains(&rebuild_mib_per_s) {
            return Err(error(
                "rebuild_mib_per_s",
                format!("{rebuild_mib_per_s} is not between 1 and 100000"),
            ));
        }
        let replace_replica_after = match self.replace_replica_after_s {
            None => weft_cluster::agent::REPLACE_AFTER_DEFAULT,
            Some(s) if (1..=30 * 86_400).contains(&s) => Duration::from_secs(s),
            Some(s) => {
                return Err(error(
                    "replace_replica_after_s",
                    format!("{s} is not between 1 and 2592000 (30 days)"),
                ))
            }
        };
        let api_advertise = self
            .api_advertise
            .map(|url| check_api_url(&url).map(|()| url))
            .transpose()
            .map_err(|m| error("api_advertise", m))?;
        let spec = ClusterSpec {
            endpoints,
            node: self.node,
            advertise,
            peer_advertise,
            api_advertise,
            zone: self.zone,
            etcd_user: self.etcd_user,
            etcd_password_file: self.etcd_password_file,
            etcd_ca: self.etcd_ca,
            etcd_cert: self.etcd_cert,
            etcd_key: self.etcd_key,
            pki: None,
            lease_ttl,
            rebuild_bytes_per_s: rebuild_mib_per_s << 20,
            replace_replica_after,
            insecure_store: self.insecure_store.unwrap_or(false),
        };
        Ok(match self.pki {
            Some(dir) => spec.with_pki(dir),
            None => spec,
        })
    }
}

impl ClusterSpec {
    /// With the node's certificates in `dir` (`weft cluster issue`): they
    /// are its credential for etcd too, unless others were given.
    fn with_pki(mut self, dir: PathBuf) -> ClusterSpec {
        // The command line's directory replaces the file's, and what etcd
        // was given from it.
        if let Some(old) = self.pki.take() {
            if self.etcd_ca.as_deref() == Some(&old.join(crate::pki::CA_CERT)) {
                self.etcd_ca = None;
            }
            if self.etcd_cert.as_deref() == Some(&old.join(crate::pki::NODE_CERT)) {
                self.etcd_cert = None;
                self.etcd_key = None;
            }
        }
        if self.etcd_ca.is_none() {
            self.etcd_ca = Some(dir.join(crate::pki::CA_CERT));
        }
        if self.etcd_cert.is_none() {
            self.etcd_cert = Some(dir.join(crate::pki::NODE_CERT));
            self.etcd_key = Some(dir.join(crate::pki::NODE_KEY));
        }
        self.pki = Some(dir);
        self
    }

    /// The node's identity from its certificates, when it has them: they
    /// must name this node.
    pub fn identity(&self) -> Result<Option<weft_http::tls::NodeIdentity>, String> {
        let Some(dir) = &self.pki else {
            return Ok(None);
        };
        let file = |name: &str| dir.join(name);
        let identity = weft_http::tls::NodeIdentity::from_pem_files(
            &file(crate::pki::CA_CERT),
            &file(crate::pki::NODE_CERT),
            &file(crate::pki::NODE_KEY),
        )
        .map_err(|e| {
            format!(
                "--pki {}: {e} (made by `weft cluster issue {}`)",
                dir.display(),
                self.node
            )
        })?;
        if let Some(url) = self
            .api_advertise
            .as_deref()
            .filter(|u| !u.starts_with("https://"))
        {
            return Err(format!(
                "--api-advertise {url}: a node with --pki serves its API over TLS, and the other nodes call it over https only: advertise https://..."
            ));
        }
        let name = weft_cluster::pki::node_identity(&self.node);
        if !identity.names().contains(&name) {
            return Err(format!(
                "--pki {}: its certificate is not node {}'s (it names {}): give this node's directory, or issue one with `weft cluster issue {}`",
                dir.display(),
                self.node,
                identity.names().join(", "),
                self.node
            ));
        }
        Ok(Some(identity))
    }
}

/// A store this node reaches without any credential (no etcd user, no
/// client certificate) lets whoever reaches it own the cluster: refused
/// unless the operator says so, and then said loudly at every start.
fn check_store_credential(spec: &ClusterSpec) -> Result<(), String> {
    if spec.etcd_user.is_some() || spec.etcd_cert.is_some() {
        return Ok(());
    }
    let endpoints = spec.endpoints.join(",");
    if !spec.insecure_store {
        return Err(format!(
            "the cluster store ({endpoints}) would be reached without any credential, and whoever reaches an etcd that asks for none owns the cluster (attaches hosts to volumes, redirects nodes): give weft an etcd user (etcd_user and etcd_password_file in [cluster]) or a client certificate (etcd_ca, etcd_cert, etcd_key), or, on a network nobody else reaches, say --insecure-store (insecure_store = true); see docs/SECURITY.md"
        ));
    }
    log::warn!(
        "INSECURE: the cluster store ({endpoints}) is reached without any credential (--insecure-store): whoever reaches it can change every volume, host and node record; lock it down (docs/SECURITY.md)"
    );
    Ok(())
}

/// The cluster options of the command line: each replaces the file's.
#[derive(Debug, Default)]
pub struct ClusterArgs {
    /// `--cluster URL[,URL...]`.
    pub endpoints: Option<Vec<String>>,
    /// `--node NAME`.
    pub node: Option<String>,
    /// `--advertise ADDRESS`.
    pub advertise: Option<IpAddr>,
    /// `--zone ZONE`.
    pub zone: Option<String>,
    /// `--api-advertise URL`.
    pub api_advertise: Option<String>,
    /// `--insecure-store`.
    pub insecure_store: bool,
    /// `--pki DIR`.
    pub pki: Option<PathBuf>,
}

impl ClusterArgs {
    /// The membership the file (`from_file`) and the options give, if any.
    pub fn apply(self, from_file: Option<ClusterSpec>) -> Result<Option<ClusterSpec>, String> {
        let mut spec = match (from_file, &self.endpoints) {
            (Some(spec), _) => spec,
            (None, Some(_)) => ClusterSpec {
                endpoints: Vec::new(),
                node: self
                    .node
                    .clone()
                    .ok_or("--cluster needs --node NAME: this node's name in the cluster, e.g. n1")?,
                advertise: None,
                peer_advertise: None,
                api_advertise: None,
                zone: None,
                etcd_user: None,
                etcd_password_file: None,
                etcd_ca: None,
                etcd_cert: None,
                etcd_key: None,
                pki: None,
                lease_ttl: DEFAULT_LEASE_TTL,
                rebuild_bytes_per_s: REBUILD_MIB_PER_S_DEFAULT << 20,
                replace_replica_after: weft_cluster::agent::REPLACE_AFTER_DEFAULT,
                insecure_store: false,
            },
            (None, None)
                if self.node.is_some()
                    || self.advertise.is_some()
                    || self.zone.is_some()
                    || self.api_advertise.is_some()
                    || self.insecure_store
                    || self.pki.is_some() =>
            {
                return Err("--node, --advertise, --zone, --pki and --insecure-store are for a cluster node: give --cluster ETCD_URLS too".into())
            }
            (None, None) => return Ok(None),
        };
        if let Some(endpoints) = self.endpoints {
            spec.endpoints = check_endpoints(&endpoints).map_err(|m| format!("--cluster: {m}"))?;
        }
        if let Some(node) = self.node {
            weft_cluster::records::check_node_name(&node).map_err(|m| format!("--node: {m}"))?;
            spec.node = node;
        }
        spec.insecure_store |= self.insecure_store;
        spec.advertise = self.advertise.or(spec.advertise);
        if let Some(url) = self.api_advertise {
            check_api_url(&url).map_err(|m| format!("--api-advertise: {m}"))?;
            spec.api_advertise = Some(url);
        }
        spec.zone = self.zone.or(spec.zone);
        if let Some(dir) = self.pki {
            spec = spec.with_pki(dir);
        }
        Ok(Some(spec))
    }
}

/// Checks etcd client URLs (`http://HOST:PORT` or `https://HOST:PORT`).
pub fn check_endpoints(endpoints: &[String]) -> Result<Vec<String>, String> {
    if endpoints.is_empty() {
        return Err("no etcd endpoint given, e.g. http://127.0.0.1:2379".into());
    }
    for endpoint in endpoints {
        let rest = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"))
            .ok_or_else(|| {
                format!(
                    "{endpoint:?} is not an etcd client URL: write http://HOST:PORT (or https://)"
                )
            })?;
        if rest
            .rsplit_once(':')
            .is_none_or(|(_, port)| port.parse::<u16>().is_err())
        {
            return Err(format!(
                "{endpoint:?} has no port, e.g. http://127.0.0.1:2379"
            ));
        }
    }
    Ok(endpoints.to_vec())
}

/// Checks an API URL: `http://HOST:PORT` or `https://HOST:PORT`.
fn check_api_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest.and_then(|r| r.rsplit_once(':')) {
        Some((_, port)) if port.trim_end_matches('/').parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!(
            "{url:?} is not an API URL, e.g. http://10.1.0.5:9440"
        )),
    }
}

/// Parses the advertised address (an IP address, without port).
pub fn parse_advertise(text: &str) -> Result<IpAddr, String> {
    text.parse().map_err(|_| {
        format!("{text:?} is not an IP address; give the address other nodes and hosts reach this node at, e.g. 10.0.0.5")
    })
}

/// What the node tells the cluster about itself: its NVMe/TCP addresses
/// (each listener's port at the advertised address; for the other nodes,
/// at the peer address if one is given, else the listeners' own addresses
/// when they are specific ones) and its API's URL.
pub fn member_config(
    spec: &ClusterSpec,
    node_id: &str,
    listening: &[SocketAddr],
    api: (&str, SocketAddr),
) -> Result<MemberConfig, String> {
    let advertise = advertised_ip(spec, listening)?;
    let nvme = advertised(spec, listening)?;
    Ok(MemberConfig {
        name: spec.node.clone(),
        node_id: node_id.to_string(),
        nvme: nvme.iter().map(SocketAddr::to_string).collect(),
        peer_nvme: match spec.peer_advertise {
            Some(ip) => listening
                .iter()
                .map(|a| SocketAddr::new(ip, a.port()).to_string())
                .collect(),
            None => peer_addresses(listening, &nvme),
        },
        api: spec
            .api_advertise
            .clone()
            .unwrap_or_else(|| format!("{}://{}", api.0, SocketAddr::new(advertise, api.1.port()))),
        zone: spec.zone.clone(),
        lease_ttl: spec.lease_ttl,
        certificate: None,
    })
}

/// Where the other nodes reach this node's listeners: the listeners'
/// addresses when they are specific and differ from what hosts are told
/// (a node on a private network that hosts reach through another address),
/// else nothing (the advertised ones).
fn peer_addresses(listening: &[SocketAddr], advertised: &[SocketAddr]) -> Vec<String> {
    let specific = listening.iter().all(|a| !a.ip().is_unspecified());
    if !specific || listening == advertised {
        return Vec::new();
    }
    listening.iter().map(SocketAddr::to_string).collect()
}

/// A node connected to its cluster's store, not yet a member.
pub struct Connected {
    spec: ClusterSpec,
    remote: Arc<dyn Store>,
    mirror: Arc<Mirror>,
}

impl Connected {
    /// Connects to the cluster's etcd and copies the desired state. A node
    /// without a token file of its own (`token_path`) may only start the
    /// cluster: a joining node must be given the cluster's token.
    pub fn connect(spec: &ClusterSpec, token_path: &Path) -> Result<Connected, String> {
        check_store_credential(spec)?;
        let remote = connect_etcd(spec)?;
        let has_token = remote
            .get(weft_cluster::token::TOKEN_KEY)
            .map_err(|e| e.to_string())?
            .is_some();
        if has_token && !token_path.exists() {
            return Err(format!(
                "the cluster has an API token and this node has none ({} is missing): copy the api-token file of a node in the cluster (the first node's data directory holds it) and give it with --api-token-file FILE",
                token_path.display()
            ));
        }
        let mirror = Mirror::open(Arc::clone(&remote)).map_err(|e| e.to_string())?;
        Ok(Connected {
            spec: spec.clone(),
            remote,
            mirror: Arc::new(mirror),
        })
    }

    /// Before joining: the replicas this node holds that may have lost
    /// writes in a power loss (their write intent was written under another
    /// boot) leave their volumes' in-sync sets, so that no host's write is
    /// served from, or counted on, a copy that lost it.
    pub fn leave_in_sync_sets_after_power_loss(&self, data_dir: &Path) -> Result<(), String> {
        for unclean in weft_node::manager::replicas_after_power_loss(data_dir) {
            weft_cluster::replicas::leave_in_sync_set(
                self.remote.as_ref(),
                &unclean.volume,
                &self.spec.node,
                unclean.served_epoch,
            )
            .map_err(|e| {
                format!(
                    "volume {}: leaving its in-sync set after a reboot: {e}",
                    unclean.volume
                )
            })?;
        }
        Ok(())
    }

    /// Joins the cluster as this data directory's node, listening on
    /// `listen` (NVMe/TCP) and serving its API as `api`, publishing its
    /// certificate if it has one (`pair`).
    #[allow(clippy::too_many_arguments)]
    pub fn join(
        self,
        data_dir: &Path,
        node: &NodeId,
        listen: &[SocketAddr],
        api: (&str, SocketAddr),
        api_token: &str,
        token_path: &Path,
        pair: Option<&CertificatePair>,
    ) -> Result<Member, String> {
        let mut config = member_config(&self.spec, &identity::hex(&node.0), listen, api)?;
        config.certificate = pair.map(|p| identity::hex(p.0.certificate_der()));
        let member = join::join(
            Arc::clone(&self.remote),
            data_dir,
            config,
            api_token,
            token_path,
        )?;
        log::info!(
            "node {} joined cluster {} (store {})",
            member.name(),
            member.cluster_id(),
            self.remote.location()
        );
        Ok(Member {
            connected: self,
            member,
        })
    }
}

/// A node's certificate, with which it shares a secret with each other node
/// for their replication links (`weft_node::link_keys`).
#[derive(Debug)]
pub struct CertificatePair(pub weft_http::tls::NodeIdentity);

impl weft_node::link_keys::PairSecrets for CertificatePair {
    fn own_certificate(&self) -> Vec<u8> {
        self.0.certificate_der().to_vec()
    }

    fn shared_with(&self, node: &str, certificate: &[u8]) -> Result<[u8; 32], String> {
        let name = weft_cluster::pki::node_identity(node);
        self.0.shared_secret(&name, certificate)
    }
}

/// A node that joined its cluster.
pub struct Member {
    connected: Connected,
    member: weft_cluster::Member,
}

/// A member's heartbeats running.
pub struct Running {
    agent: Agent,
}

impl Member {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.connected.spec.node
    }

    /// Its ordinal in the cluster.
    pub fn ordinal(&self) -> u16 {
        self.member.ordinal()
    }

    /// The controller IDs this node hands out: its ordinal's range, so that
    /// a host connected to several nodes exporting one subsystem never sees
    /// one ID twice.
    pub fn controller_ids(&self) -> Result<std::ops::RangeInclusive<u16>, String> {
        weft_proto::target::cntlid_range_for_ordinal(self.ordinal()).map_err(|e| e.to_string())
    }

    /// How fast its primaries copy to a replica they rebuild.
    pub fn rebuild_bytes_per_s(&self) -> u64 {
        self.connected.spec.rebuild_bytes_per_s
    }

    /// One line for the banner: who it is in which cluster.
    pub fn describe(&self) -> String {
        format!(
            "node {} (ordinal {}) of cluster {} (store {})",
            self.name(),
            self.member.ordinal(),
            self.member.cluster_id(),
            self.connected.remote.location()
        )
    }

    /// Its records in the cluster's desired state (read from the local copy).
    pub fn desired_state(&self) -> DesiredState {
        let mirror: Arc<dyn Store> = self.connected.mirror.clone();
        DesiredState::shared(mirror, self.name())
    }

    /// What its API needs to serve the cluster.
    pub fn api(&self) -> weft_api::cluster::Cluster {
        let mirror: Arc<dyn Store> = self.connected.mirror.clone();
        weft_api::cluster::Cluster::new(mirror, self.name())
            .with_heartbeat_interval(self.connected.spec.lease_ttl / 3)
            .with_remote_store(Arc::clone(&self.connected.remote))
    }

    /// Starts heartbeats (publishing what `status` reports) and following
    /// the store (changes become reconciles through `manager`).
    /// Each successful heartbeat renews `lease` (replicated volumes'
    /// primaries serve within it).
    pub fn run(
        self,
        manager: ManagerHandle,
        status: StatusReader,
        lease: Arc<weft_cluster::LeaseClock>,
        plane: Arc<weft_target::DataPlane>,
    ) -> Result<Running, String> {
        let interval = self.connected.spec.lease_ttl / 3;
        let reader = status.clone();
        let agent = Agent::start(
            self.member,
            Arc::clone(&self.connected.remote),
            interval,
            move || weft_node::cluster::node_status(&reader),
            lease,
            self.connected.spec.replace_replica_after,
        )
        .map_err(|e| format!("cannot start the cluster agent: {e}"))?;
        let mirror: Arc<dyn Store> = self.connected.mirror.clone();
        agent
            .wake_on_departures(self.connected.mirror.subscribe(), Arc::clone(&mirror))
            .map_err(|e| format!("cannot start the cluster agent: {e}"))?;
        weft_node::cluster::silence::watch(
            plane,
            Arc::clone(&mirror),
            self.connected.spec.node.clone(),
        )
        .map_err(|e| format!("cannot start the cluster agent: {e}"))?;
        let referrals = weft_node::cluster::referral_keeper(
            Arc::clone(&mirror),
            self.connected.spec.node.clone(),
            manager.clone(),
        );
        let interest = weft_node::cluster::Interest {
            node: self.connected.spec.node.clone(),
            store: mirror,
            status,
        };
        weft_node::cluster::follow(
            self.connected.mirror.subscribe(),
            manager,
            interest,
            referrals,
        )
        .map_err(|e| format!("cannot follow the cluster store: {e}"))?;
        Ok(Running { agent })
    }
}

impl Running {
    /// Leaves the cluster (the node is shown down at once).
    pub fn stop(self) {
        self.agent.stop();
    }
}

/// The address hosts and other nodes reach this node at.
fn advertised_ip(spec: &ClusterSpec, listening: &[SocketAddr]) -> Result<IpAddr, String> {
    match spec.advertise {
        Some(address) => Ok(address),
        None => listening
            .iter()
            .map(SocketAddr::ip)
            .find(|ip| !ip.is_unspecified())
            .ok_or_else(|| "the node listens on every address (0.0.0.0 or ::): give --advertise ADDRESS, the one other nodes and hosts reach it at".into()),
    }
}

/// The NVMe/TCP addresses hosts and other nodes reach this node at: each
/// listener's port at the advertised address (what its discovery log and
/// the other nodes' referrals report).
pub fn advertised(spec: &ClusterSpec, listening: &[SocketAddr]) -> Result<Vec<SocketAddr>, String> {
    let advertise = advertised_ip(spec, listening)?;
    if let Some(any) = listening.iter().find(|a| a.port() == 0) {
        return Err(format!(
            "a cluster node advertises its NVMe/TCP ports: listen on a port of your choice, not {any}"
        ));
    }
    Ok(listening
        .iter()
        .map(|a| SocketAddr::new(advertise, a.port()))
        .collect())
}

/// Connects to etcd (as the configured user, over TLS when a CA is given).
fn connect_etcd(spec: &ClusterSpec) -> Result<Arc<dyn Store>, String> {
    let mut config = EtcdConfig::new(spec.endpoints.clone());
    if let (Some(user), Some(file)) = (&spec.etcd_user, &spec.etcd_password_file) {
        let password = std::fs::read_to_string(file)
            .map_err(|e| format!("etcd_password_file {}: {e}", file.display()))?;
        config.user = Some((
            user.clone(),
            password.trim_end_matches(['\r', '\n']).to_string(),
        ));
    }
    if let Some(ca) = &spec.etcd_ca {
        config.tls = Some(EtcdTls {
            ca: ca.clone(),
            cert: spec.etcd_cert.clone(),
            key: spec.etcd_key.clone(),
        });
    }
    let store = EtcdStore::connect(config).map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> Result<ClusterSpec, String> {
        toml::from_str::<ClusterFile>(text)
            .map_err(|e| e.to_string())?
            .validate("weft.toml")
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_cluster_table_is_checked_with_reasons() {
        let spec = file(
            "endpoints = [\"http://127.0.0.1:2379\"]\nnode = \"n1\"\nadvertise = \"10.0.0.5\"",
        )
        .unwrap();
        assert_eq!(spec.node, "n1");
        assert_eq!(spec.lease_ttl, DEFAULT_LEASE_TTL);
        assert!(file("endpoints = [\"127.0.0.1:2379\"]\nnode = \"n1\"")
            .unwrap_err()
            .contains("http://HOST:PORT"));
        assert!(file("endpoints = []\nnode = \"n1\"")
            .unwrap_err()
            .contains("no etcd endpoint"));
        assert!(file("endpoints = [\"http://e:2379\"]\nnode = \"N 1\"").is_err());
        assert!(
            file("endpoints = [\"http://e:2379\"]\nnode = \"n1\"\nadvertise = \"host\"")
                .unwrap_err()
                .contains("not an IP address")
        );
        assert!(
            file("endpoints = [\"http://e:2379\"]\nnode = \"n1\"\netcd_user = \"u\"")
                .unwrap_err()
                .contains("go together")
        );
    }

    #[test]
    fn members_advertise_each_listener_and_the_api() {
        let spec = file("endpoints = [\"http://e:2379\"]\nnode = \"n1\"").unwrap();
        let listening = [
            "127.0.0.1:4420".parse().unwrap(),
            "127.0.0.1:4430".parse().unwrap(),
        ];
        let member = member_config(
            &spec,
            "ab",
            &listening,
            ("http", "127.0.0.1:9440".parse().unwrap()),
        )
        .unwrap();
        assert_eq!(member.nvme, ["127.0.0.1:4420", "127.0.0.1:4430"]);
        assert_eq!(member.api, "http://127.0.0.1:9440");
        let any = ["0.0.0.0:4420".parse().unwrap()];
        assert!(
            member_config(&spec, "ab", &any, ("http", "0.0.0.0:9440".parse().unwrap()))
                .unwrap_err()
                .contains("--advertise")
        );
    }

    #[test]
    fn other_nodes_replicate_to_the_peer_address_when_one_is_given() {
        let table = "endpoints = [\"http://e:2379\"]\nnode = \"n1\"\nadvertise = \"10.0.0.5\"";
        let listening = ["10.2.0.5:4420".parse().unwrap()];
        let api = ("http", "10.0.0.5:9440".parse().unwrap());
        let member = member_config(&file(table).unwrap(), "ab", &listening, api).unwrap();
        assert_eq!(member.nvme, ["10.0.0.5:4420"]);
        assert_eq!(member.peer_nvme, ["10.2.0.5:4420"], "the listener's own");
        let table = format!("{table}\npeer_advertise = \"10.3.0.5\"");
        let member = member_config(&file(&table).unwrap(), "ab", &listening, api).unwrap();
        assert_eq!(member.peer_nvme, ["10.3.0.5:4420"]);
        assert!(file(&format!("{table}x"))
            .unwrap_err()
            .to_string()
            .contains("peer_advertise"));
    }
}
