//! `weft`: the storage-node daemon and its command line.
//!
//! `weft serve` exports block storage over NVMe/TCP: with no arguments, one
//! 4 GiB sparse file under ./weft-data as `nqn.2026-11.io.weft:default` on
//! 127.0.0.1:4420; with `--config FILE`, the subsystems the file declares.

#[macro_use]
mod output;

mod bench;
mod cli;
mod cluster;
mod config;
mod csi;
mod help;
mod join;
mod limits;
mod logger;
mod pki;

use config::ServeConfig;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use weft_api as api;
use weft_api::token;
use weft_node::exports::BackendSpec;
use weft_node::{identity, AdminOp, Manager, NodeId};
use weft_target::{Backend, DataPlane, QueuePlacement};

const USAGE: &str = "\
weft: NVMe/TCP storage node

Usage:
  weft serve [--config FILE] [--listen ADDR:PORT]... [--data-dir DIR] [--api-listen ADDR:PORT]
             [--api-token-file FILE] [--reactors N] [--poll-us N] [--log-level LEVEL]
             [--replicated-queues follow|spread] [--kek-file FILE | --kek-command CMD]
             [--cluster https://ETCD:2379[,...] --node NAME [--pki DIR] [--advertise ADDR]
              [--zone ZONE] [--api-advertise URL] [--insecure-store]]

  weft cluster init [--pki DIR] [--etcd-host HOST]...   the cluster's CA and etcd's certificate
  weft cluster issue NODE [--pki DIR] [--address IP]... a node's certificate (DIR/nodes/NODE)
  weft cluster issue-etcd [--pki DIR] [--etcd-host HOST]...   etcd's certificate, renewed

  weft pool create NAME --device PATH [--device PATH]... [--device-size SIZE]
                        [--allocation-unit SIZE] [--force] [--node NODE]
                        [--compression lz4|zstd]   its volumes of one copy compressed by default
                        [--write-tier PATH [--write-tier-size SIZE]]   a fast device in front:
                        writes durable and acknowledged there, destaged to the devices later
  weft pool set NAME --write-tier PATH [--write-tier-size SIZE]   (online; volumes of one copy)
  weft pool set NAME --no-write-tier   destages the tier, then takes it away (online)
  weft pool list | show NAME | delete NAME | clear-failure NAME   [--node NODE]
  weft pool rewrap NAME [--node NODE]   read the node's keys again (unlocking what they open) and
                        wrap every data key with the first (key rotation: no data rewritten)
  weft pool add-device NAME --device PATH [--device PATH]... [--device-size SIZE]   (online)
  weft namespace clear-failure NQN [--nsid N]   (a configured file or block device namespace)
  weft volume create NAME --size SIZE [--pool POOL] [--node NODE] [--replicas N | --ec K+M] [--thick]
                     [--encrypt]   (AES-256-XTS at rest, a data key per volume: needs serve --kek-file)
                     [--compression lz4|zstd|none]   (64 KiB units compressed before they are stored; one copy)
                     [--block-size 512|4096] [--nqn NQN] [--uuid UUID] [--nguid HEX]   (what hosts see; default weft's)
                     (--ec 4+2: erasure-coded over K+M nodes, survives M of them at (K+M)/K the size)
  weft volume list | show NAME | delete NAME [--force] | resize NAME --size SIZE
  weft volume clone VOLUME@SNAPSHOT NAME [--node NODE] | flatten NAME
  weft volume move-primary NAME [--to NODE]   (a replicated volume's primary, planned)
  weft volume set NAME --replicas N   (1 to 3: add replicas, built in full, or remove some)
  weft snapshot create VOLUME@SNAPSHOT | delete VOLUME@SNAPSHOT
  weft host add NAME --nqn NQN [--dhchap-secret S [--dhchap-ctrl-secret S] [--dhchap-group G]]
                     [--tls | --tls-psk K]                                 | list | show NAME
  weft host set NAME [--dhchap-secret S|none] [--dhchap-ctrl-secret S|none] [--dhchap-group G]
                     [--tls-psk K|new|none]                                | delete NAME
                     (G: null, the default, or ffdhe2048, 3072, 4096, 6144, 8192)
  weft volume attach VOLUME --host HOST | detach VOLUME --host HOST
  weft node list | show NAME | cordon NAME | uncordon NAME | drain NAME | remove NAME   (a cluster)
  weft top [--interval D] [--count N]   live per-volume IOPS, MiB/s, p99 latency, queue depth
  weft token renew csi|read-only   revoke a scoped API token: every node refuses it and writes
                                   its successor beside its admin token (DATA_DIR/api-token.csi)
  weft token join [--node NAME] [--ttl D]   a one-time token with which a new node gets its own
                                   certificate (weft serve --join TOKEN --join-via URL; default 1h)
  weft volume set VOLUME [--iops-max N] [--bw-max SIZE] [--read-iops-max N] [--read-bw-max SIZE]
                         [--write-iops-max N] [--write-bw-max SIZE]     (none removes a limit)
      (admin commands talk to a running `weft serve`: --api URL or WEFT_API, default
       127.0.0.1:9440; https://... with --api-ca FILE or WEFT_API_CA for a TLS API), with its
       token: --api-token-file FILE, WEFT_API_TOKEN, or ./weft-data/api-token; -o json
       prints the API's JSON)

  weft bench --target nvme-tcp://HOST:PORT/NQN|PATH [--rw MODE] [--bs SIZE] [--iodepth N] ...
  weft bench compare --local PATH --remote nvme-tcp://HOST:PORT/NQN [--sweep iodepth=1,8,32]
                     [--rounds N] [--json FILE] [--plot FILE.svg] ...
  weft bench floor [--runtime D]

  weft csi --endpoint unix:///csi/csi.sock --mode controller|node|all [--api URL] [--api-token-file FILE]
           [--discovery ADDR:PORT] [--host-nqn NQN] [--state-dir DIR] [--node-name NAME] [--zone ZONE]
           [--dhchap per-node|none]

Commands:
  pool, volume, snapshot
          Carve pools of devices (striped) into thin or thick volumes, each served as
          subsystem nqn.2026-11.io.weft:vol:NAME; snapshots, clones, online growth.
          `volume set` limits a volume's IOPS and bandwidth live. After a failed fdatasync
          or FUA write a pool (or a configured namespace) fails every I/O until
          `clear-failure` (check the device first).
  host    Register hosts by NQN; only hosts attached to a volume may connect to it or
          see it in discovery. With a DH-HMAC-CHAP secret (DHHC-1:.., `nvme gen-dhchap-key`)
          each of the host's queues must authenticate (NULL DH group, SHA-256/384/512);
          with a controller secret too, the host can authenticate the node as well.
  node    A cluster's storage nodes: state (up, cordoned, down), addresses, heartbeat,
          pools, capacity, volumes. Cordoned nodes get no new volumes; `remove` forgets a
          node that is down (lost for good), replacing its replicas on other nodes first.
          --node chooses a pool's or volume's node
          (by default a volume goes to the up, uncordoned node with the most free bytes).
  serve   Export block storage over NVMe/TCP. Without --config: one 4 GiB sparse file
          namespace (DATA_DIR/default.img) as nqn.2026-11.io.weft:default on 127.0.0.1:4420.
  bench   Load a namespace through weft's user-space initiator (nvme-tcp://...), or a local
          file or block device through io_uring with O_DIRECT (PATH), and report IOPS,
          bandwidth and latency percentiles.
  csi     The Kubernetes CSI plugin (driver csi.weft.io) on a Unix socket, over a node's
          API: volumes created (idempotent by name; StorageClass parameters pool, replicas,
          ec, thick, encrypted, blockSize), deleted, listed, published to nodes (their host
          NQNs), expanded, snapshotted (VolumeSnapshot) and cloned (a PVC from a snapshot or
          from another PVC); on a node: connected (every path, multipath), formatted when empty
          (ext4, xfs), mounted, unmounted, disconnected. Each node's host gets bidirectional
          DH-HMAC-CHAP secrets of its own and connects with them (--dhchap none: for nodes
          whose kernel lacks NVMe in-band authentication, CONFIG_NVME_AUTH, e.g. Linux 6.1).

Bench options:
  --target URL|PATH    nvme-tcp://HOST:PORT/NQN (namespace --nsid, default 1) or a file/device
  --rw MODE            read, write, randread (default), randwrite, randrw (--rwmixread N, default 50)
  --bs SIZE            block size, e.g. 4k (default), 128k
  --iodepth N          I/Os in flight per queue (default 1)
  --queues N           I/O queues (remote) or threads (local), default 1
  --runtime D          measured time, e.g. 10s (default), 500ms; --ramp D warms up first
  --rate-iops N        issue at most N I/Os per second per queue, evenly spaced (a load of a
                       fixed rate, as fio's rate_iops; above --iodepth 1, an I/O due while
                       others are in flight waits for one of them to complete)
  --size SIZE          bytes of the target to cover (default all); alone: one pass, no time limit
  --verify             stamp every write (offset, generation, pattern) and check every read of
                       a stamped block; read-only patterns write their region first, write
                       patterns read back everything they wrote at the end
  --hdr-digest, --data-digest   NVMe/TCP digests (remote)
  --poll               busy-poll the remote queues' sockets instead of sleeping (as SPDK's
                       initiator; one CPU per queue stays busy; pair with serve --poll-us)
  --hostnqn NQN        host NQN to connect as (remote; default a random one)
  --dhchap-secret S    DH-HMAC-CHAP secret of the host (remote, when the target asks);
                       --dhchap-ctrl-secret S also authenticates the target
  --tls-psk KEY        the host's TLS PSK (NVMeTLSkey-1:..): every queue in a TLS 1.3 stream
  --json               fio's JSON layout instead of the table (compare: --json FILE keeps
                       both sides and the ratios of every iodepth)
  --plot FILE.svg      compare: latency (mean, p99) against IOPS over the sweep, both sides
  compare              local and remote alternately per iodepth, with remote/local ratios and
                       the latency adder; --sweep iodepth=... runs several depths, --rounds N
                       alternates the sides N times per depth and merges them
  floor                plain TCP request/response on loopback with NVMe/TCP's sizes (72 bytes
                       out, a 4 KiB read's 4144 back) at depth 1 and 32, client and server on
                       different CPUs (and on one CPU for reference): the path's physical floor

Serve options:
  --config FILE        TOML file declaring listeners, subsystems and namespaces (see docs/guide/01-single-node.md)
  --listen ADDR:PORT   listen address, repeatable; replaces the configured ones
  --data-dir DIR       node identity, default files and the pool list (default ./weft-data)
  --api-listen ADDR:PORT  control API address (default 127.0.0.1:9440; config: api_listen)
  --api-tls-cert FILE --api-tls-key FILE  serve the API over TLS (PEM certificate chain and
                       key; config: api_tls_cert, api_tls_key); the CLI then uses
                       --api https://HOST:PORT with --api-ca FILE (or WEFT_API_CA)
  --api-token-file FILE  the API's bearer token (default DATA_DIR/api-token, created with a
                       new random token at the first start; config: api_token_file)
  --kek-file FILE      key-encryption keys of encrypted volumes, one per line (the first wraps
                       new keys; each at least 32 bytes, e.g. `openssl rand -hex 32`; mode 600;
                       config: kek_file). Without it, encrypted volumes stay locked
  --kek-command CMD    the same keys printed by a shell command (a KMS or Vault client, a TPM
                       unseal; config: kek_command); asked again by `weft pool rewrap`
  --cluster URLS       join the cluster whose desired state is in etcd at URLS (comma-
                       separated client URLs; config: [cluster] endpoints); any node's API
                       then shows and changes the whole cluster. Without it: a single node
  --node NAME          this node's name in the cluster (config: [cluster] node)
  --advertise ADDR     the IP address hosts and other nodes reach this node at (default:
                       the listen address; config: [cluster] advertise)
  --zone ZONE          this node's failure domain (config: [cluster] zone)
  --pki DIR            this node's certificates from the cluster's CA (`weft cluster issue`:
                       ca.crt, node.crt, node.key; config: [cluster] pki): its client
                       certificate for etcd, its API served over TLS with it, and the
                       other nodes called and recognised by theirs, trusting that CA only
  --join TOKEN         get this node's key and certificate into --pki DIR with a one-time
                       token (`weft token join`; or WEFT_JOIN_TOKEN, which the process
                       list does not show), from the node at --join-via URL (its API's
                       https URL; that node runs with --ca-key); skipped when DIR holds
                       a certificate already
  --ca-key FILE        the cluster CA's key (`weft cluster init`'s ca.key, mode 0600): this
                       node signs the certificates of nodes joining with a token
  --api-advertise URL  the URL other nodes call this node's API at (default: the advertised
                       address and the API's port; config: [cluster] api_advertise)
  --insecure-store     accept an etcd reached without any credential (no etcd user, no
                       client certificate), on a network nobody else reaches: whoever
                       reaches such an etcd owns the cluster (config: [cluster]
                       insecure_store = true); refused without it
  --reactors N         data plane threads (default: one per CPU)
  --poll-us N          after activity, reactors busy-poll N microseconds before
                       sleeping (default 50: a request that follows within that time is
                       served without a wake-up; idle, nothing spins; not while other
                       threads wait for the reactor's CPU); 0: purely interrupt driven;
                       1000000: polled while busy, for dedicated cores
  --replicated-queues follow|spread
                       where an I/O queue of a replicated volume is served: spread
                       (default): dealt over the reactors like every other queue (more
                       cores for one volume's reads and large writes); follow: on the
                       reactor of the volume's replicator, so a write and its answer
                       stay on one thread (less CPU and latency per small write; the
                       volume's queues share one core; docs/PERFORMANCE.md section 8)
  --log-level LEVEL    error, warn, info (default), debug, trace; also WEFT_LOG
  -h, --help           this text
  -V, --version        version
";

/// How long a reactor spins after activity by default: a QD1 request that
/// follows its reply within this is served without waking the reactor
/// (70 us mean at QD1 interrupt driven, 25-30 us with it, on 2 vCPUs;
/// docs/PERFORMANCE.md), and an idle reactor sleeps 50 us after its last work.
const DEFAULT_POLL_US: u64 = 50;

#[derive(Debug, Default)]
struct ServeArgs {
    config: Option<PathBuf>,
    listen: Vec<SocketAddr>,
    data_dir: Option<PathBuf>,
    reactors: Option<usize>,
    poll_us: Option<u64>,
    replicated_queues: Option<QueuePlacement>,
    log_level: Option<String>,
    api_listen: Option<SocketAddr>,
    api_token_file: Option<PathBuf>,
    api_tls_cert: Option<PathBuf>,
    api_tls_key: Option<PathBuf>,
    cluster: cluster::ClusterArgs,
    /// `--join TOKEN`, `--join-via URL`: the certificate from the cluster.
    join_token: Option<String>,
    join_via: Option<String>,
    /// `--ca-key FILE`: this node signs joins.
    ca_key: Option<PathBuf>,
    /// `--kek-file FILE`, `--kek-command CMD`: encryption keys.
    kek_file: Option<PathBuf>,
    kek_command: Option<String>,
}

enum Command {
    Serve(ServeArgs),
    Bench(bench::BenchArgs),
    Admin(cli::AdminArgs),
    Csi(csi::CsiArgs),
    Pki(pki::PkiArgs),
    /// Everything, or one command's part.
    Help(Option<&'static str>),
    Version,
}

fn main() -> ExitCode {
    match parse_args().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("weft: {message}");
            ExitCode::from(2)
        }
    }
}

fn parse_args() -> Result<Command, String> {
    use lexopt::prelude::*;
    if let Some(topic) = help_asked() {
        return Ok(Command::Help(topic));
    }
    let mut parser = lexopt::Parser::from_env();
    let mut args = ServeArgs::default();
    let mut command = None;
    while let Some(arg) = parser.next().map_err(|e| format!("{e}; see weft --help"))? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help(None)),
            Short('V') | Long("version") => return Ok(Command::Version),
            Value(value) if command.is_none() => {
                let name = value
                    .string()
                    .map_err(|_| "the command is not UTF-8".to_string())?;
                if name == "bench" {
                    return bench::parse(&mut parser).map(Command::Bench);
                }
                if name == "csi" {
                    return csi::parse(&mut parser).map(Command::Csi);
                }
                if name == "cluster" {
                    return pki::parse(&mut parser).map(Command::Pki);
                }
                if help::ADMIN.contains(&name.as_str()) {
                    return cli::parse(&name, &mut parser).map(Command::Admin);
                }
                if name != "serve" {
                    return Err(format!(
                        "unknown command \"{name}\"; the commands are serve, pool, volume, snapshot, host, node, token, cluster, top, bench and csi (see weft --help)"
                    ));
                }
                command = Some(name);
            }
            Long("api-listen") => {
                let text = parser
                    .value()
                    .map_err(|e| e.to_string())?
                    .string()
                    .map_err(|_| "--api-listen is not UTF-8".to_string())?;
                args.api_listen = Some(
                    config::parse_listen(&text)
                        .map_err(|message| format!("--api-listen: {message}"))?,
                );
            }
            Long("api-token-file") => {
                args.api_token_file = Some(parser.value().map_err(|e| e.to_string())?.into())
            }
            Long("api-tls-cert") => {
                args.api_tls_cert = Some(parser.value().map_err(|e| e.to_string())?.into())
            }
            Long("api-tls-key") => {
                args.api_tls_key = Some(parser.value().map_err(|e| e.to_string())?.into())
            }
            Long("cluster") => {
                let text = string_value(&mut parser, "--cluster")?;
                args.cluster.endpoints =
                    Some(text.split(',').map(|url| url.trim().to_string()).collect());
            }
            Long("node") => args.cluster.node = Some(string_value(&mut parser, "--node")?),
            Long("advertise") => {
                let text = string_value(&mut parser, "--advertise")?;
                args.cluster.advertise =
                    Some(cluster::parse_advertise(&text).map_err(|m| format!("--advertise: {m}"))?);
            }
            Long("zone") => args.cluster.zone = Some(string_value(&mut parser, "--zone")?),
            Long("insecure-store") => args.cluster.insecure_store = true,
            Long("pki") => {
                args.cluster.pki = Some(parser.value().map_err(|e| e.to_string())?.into())
            }
            Long("api-advertise") => {
                args.cluster.api_advertise = Some(string_value(&mut parser, "--api-advertise")?)
            }
            Long("join") => args.join_token = Some(string_value(&mut parser, "--join")?),
            Long("join-via") => args.join_via = Some(string_value(&mut parser, "--join-via")?),
            Long("kek-file") => {
                args.kek_file = Some(parser.value().map_err(|e| e.to_string())?.into())
            }
            Long("kek-command") => {
                args.kek_command = Some(string_value(&mut parser, "--kek-command")?)
            }
            Long("ca-key") => args.ca_key = Some(parser.value().map_err(|e| e.to_string())?.into()),
            Long("config") => args.config = Some(parser.value().map_err(|e| e.to_string())?.into()),
            Long("data-dir") => {
                args.data_dir = Some(parser.value().map_err(|e| e.to_string())?.into())
            }
            Long("listen") => {
                let text = parser
                    .value()
                    .map_err(|e| e.to_string())?
                    .string()
                    .map_err(|_| "--listen is not UTF-8".to_string())?;
                args.listen.push(
                    config::parse_listen(&text)
                        .map_err(|message| format!("--listen: {message}"))?,
                );
            }
            Long("reactors") => {
                let text = parser
                    .value()
                    .map_err(|e| e.to_string())?
                    .string()
                    .map_err(|_| "--reactors is not UTF-8".to_string())?;
                let count = text.parse().ok().filter(|n| (1..=256).contains(n));
                args.reactors = Some(count.ok_or_else(|| {
                    format!("--reactors: \"{text}\" is not a number from 1 to 256")
                })?);
            }
            Long("poll-us") => {
                let text = parser
                    .value()
                    .map_err(|e| e.to_string())?
                    .string()
                    .map_err(|_| "--poll-us is not UTF-8".to_string())?;
                args.poll_us = Some(text.parse().ok().filter(|n| *n <= 1_000_000).ok_or_else(
                    || {
                        format!(
                            "--poll-us: \"{text}\" is not a number of microseconds up to 1000000"
                        )
                    },
                )?);
            }
            Long("replicated-queues") => {
                let text = parser
                    .value()
                    .map_err(|e| e.to_string())?
                    .string()
                    .map_err(|_| "--replicated-queues is not UTF-8".to_string())?;
                args.replicated_queues = Some(match text.as_str() {
                    "follow" => QueuePlacement::FollowReplicator,
                    "spread" => QueuePlacement::Spread,
                    _ => {
                        return Err(format!(
                            "--replicated-queues: \"{text}\" is neither follow nor spread"
                        ))
                    }
                });
            }
            Long("log-level") => {
                args.log_level = Some(
                    parser
                        .value()
                        .map_err(|e| e.to_string())?
                        .string()
                        .map_err(|_| "--log-level is not UTF-8".to_string())?,
                )
            }
            other => return Err(format!("{}; see weft --help", other.unexpected())),
        }
    }
    match command {
        Some(_) => Ok(Command::Serve(args)),
        None => Ok(Command::Help(None)),
    }
}

/// `-h` or `--help` anywhere: help on the first command named (every
/// command and subcommand takes it), or on everything.
fn help_asked() -> Option<Option<&'static str>> {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    if !args.iter().any(|arg| arg == "-h" || arg == "--help") {
        return None;
    }
    Some(args.iter().find_map(|arg| {
        help::COMMANDS
            .into_iter()
            .find(|command| arg.to_str() == Some(command))
    }))
}

/// The next option value as text.
fn string_value(parser: &mut lexopt::Parser, option: &str) -> Result<String, String> {
    use lexopt::prelude::*;
    parser
        .value()
        .map_err(|e| e.to_string())?
        .string()
        .map_err(|_| format!("{option} is not UTF-8"))
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Help(None) => {
            out!("{USAGE}");
            Ok(())
        }
        Command::Help(Some(command)) => {
            out!("{}", help::for_command(USAGE, command));
            Ok(())
        }
        Command::Version => {
            outln!("weft {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Serve(args) => serve(args),
        Command::Bench(args) => bench::run(args),
        Command::Admin(args) => cli::run(args),
        Command::Csi(args) => csi::run(args),
        Command::Pki(args) => pki::run(args),
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let level = args
        .log_level
        .clone()
        .or_else(|| std::env::var("WEFT_LOG").ok())
        .unwrap_or_else(|| "info".into());
    logger::init(&level)?;
    // Before any thread starts, so that every thread inherits the mask and the
    // main thread alone receives SIGINT/SIGTERM.
    weft_uring::block_termination_signals().map_err(|e| format!("cannot block signals: {e}"))?;
    let mut config = match &args.config {
        Some(path) => ServeConfig::load(path).map_err(|e| e.to_string())?,
        None => ServeConfig::default_with(
            args.data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("weft-data")),
        ),
    };
    config.cluster = args.cluster.apply(config.cluster.take())?;
    if config.cluster.is_some() && args.config.is_none() {
        // A cluster node serves volumes; a default file namespace of one
        // NQN on every node would look like one subsystem to hosts.
        config.subsystems.clear();
    }
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if !args.listen.is_empty() {
        config.listen = args.listen;
    }
    if let Some(reactors) = args.reactors {
        config.reactors = reactors;
    }
    if let Some(keys) = config::key_source(args.kek_file.clone(), args.kek_command.clone())? {
        config.keys = Some(keys);
    }
    let node = NodeId::load_or_create(&config.data_dir)
        .map_err(|e| format!("node identity in {}: {e}", config.data_dir.display()))?;
    // In every log, so that a damaged identity file can be restored from it.
    log::info!(
        "node id {} ({})",
        identity::hex(&node.0),
        config.data_dir.join(identity::FILE_NAME).display()
    );
    let api_listen = match args.api_listen.or(config.api_listen) {
        Some(address) => address,
        None => config::parse_listen(api::DEFAULT_API_LISTEN)?,
    };
    let token_path = args
        .api_token_file
        .clone()
        .or_else(|| config.api_token_file.clone())
        .unwrap_or_else(|| config.data_dir.join(token::FILE_NAME));
    let api_tls = match (args.api_tls_cert.clone(), args.api_tls_key.clone()) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => config.api_tls.clone(),
        _ => return Err("--api-tls-cert and --api-tls-key go together (PEM files)".into()),
    };
    // The token from the environment keeps it out of the process list.
    let join_token = args
        .join_token
        .clone()
        .or_else(|| std::env::var("WEFT_JOIN_TOKEN").ok());
    if let Some(token) = &join_token {
        let spec = config
            .cluster
            .as_ref()
            .ok_or("--join is for a cluster node: give --cluster, --node and --pki too")?;
        let via = args.join_via.as_deref().ok_or(
            "--join needs --join-via https://NODE:PORT: the API of the node started with --ca-key",
        )?;
        join::join_if_needed(token, via, spec, &token_path)?;
    }
    let identity = match &config.cluster {
        Some(spec) => spec.identity()?,
        None => None,
    };
    let joins = match (&identity, &config.cluster, &args.ca_key) {
        (Some(_), Some(spec), ca_key) => {
            let dir = spec.pki.as_ref().expect("an identity comes from --pki");
            let ca_file = dir.join(pki::CA_CERT);
            let ca_pem = std::fs::read_to_string(&ca_file)
                .map_err(|e| format!("{}: {e}", ca_file.display()))?;
            let signer = ca_key.as_deref().map(join::load_ca_key).transpose()?;
            let used = config.data_dir.join("join-tokens-used.json");
            Some(weft_api::join::Joins::new(ca_pem, signer, used)?)
        }
        (_, _, Some(_)) => {
            return Err("--ca-key is for a cluster node with --pki (it signs the certificates of nodes joining with a token)".into())
        }
        _ => None,
    };
    let api_tls = match (api_tls, &identity) {
        (None, None) => None,
        (Some((cert, key)), None) => Some(weft_http::tls::Server::from_pem_files(&cert, &key)?),
        (None, Some(identity)) => Some(identity.server()),
        (Some(_), Some(_)) => return Err("a node with --pki serves its API with its node certificate (it is how the other nodes know it): drop --api-tls-cert and --api-tls-key, and give clients the cluster's ca.crt (--api-ca)".into()),
    };
    let pair = identity
        .clone()
        .map(|i| Arc::new(cluster::CertificatePair(i)));
    let api_scheme = if api_tls.is_some() { "https" } else { "http" };
    let api_listener = api::bind(api_listen)?;
    let api_bound = api_listener.local_addr().map_err(|e| e.to_string())?;
    let connected = config
        .cluster
        .as_ref()
        .map(|spec| cluster::Connected::connect(spec, &token_path))
        .transpose()?;
    let (api_token, token_created) = token::load_or_create(&token_path)?;
    let member = match connected {
        Some(connected) => {
            let api = (api_scheme, api_bound);
            connected.leave_in_sync_sets_after_power_loss(&config.data_dir)?;
            let joined = connected.join(
                &config.data_dir,
                &node,
                &config.listen,
                api,
                &api_token,
                &token_path,
                pair.as_deref(),
            )?;
            Some(joined)
        }
        None => None,
    };
    // What the discovery log reports: a cluster node's advertised address.
    let reported = match &config.cluster {
        Some(spec) => cluster::advertised(spec, &config.listen)?,
        None => config.listen.clone(),
    };
    let base = weft_node::exports::build_exports(
        &config.subsystems,
        &reported,
        &config.referrals,
        config.limits.protocol,
        &node,
    )?;
    let desired = match &member {
        Some(member) => member.desired_state(),
        None => {
            let store =
                weft_control::EmbeddedStore::open(&config.data_dir).map_err(|e| e.to_string())?;
            weft_control::DesiredState::new(Box::new(store), &identity::hex(&node.0))
        }
    };
    let store = Arc::clone(desired.store());
    // The scoped tokens, for the operator to hand out (never printed),
    // written again whenever one is renewed.
    let mut generations_file = token_path.clone().into_os_string();
    generations_file.push(".generations");
    let scoped_tokens = Arc::new(weft_api::scoped_tokens::ScopedTokens::new(
        Arc::clone(&store),
        generations_file.into(),
    )?);
    let scoped = weft_api::scoped_tokens::write_and_follow(
        Arc::clone(&scoped_tokens),
        api_token.clone(),
        token_path.clone(),
    );
    match &scoped {
        Ok(paths) => log::info!(
            "scoped API tokens: {} (the CSI controller: volume lifecycle), {} (Prometheus, dashboards: reads)",
            paths[0].display(),
            paths[1].display()
        ),
        Err(error) => log::warn!(
            "the scoped API tokens were not written beside {}: {error} (they are derived from it: write them where they can go, see docs/SECURITY.md)",
            token_path.display()
        ),
    }
    let mut manager = Manager::open(desired, node, base, config.limits.manager_queue)?;
    if let Some(keys) = config.keys.clone() {
        manager.use_keys(keys)?;
    }
    let lease = Arc::new(weft_cluster::LeaseClock::default());
    if let Some(member) = &member {
        manager
            .join_cluster(weft_node::manager::ClusterRole {
                node: member.name().to_string(),
                ordinal: member.ordinal(),
                token: api_token.clone(),
                data_dir: config.data_dir.clone(),
                lease: Arc::clone(&lease),
                rebuild_bytes_per_s: member.rebuild_bytes_per_s(),
                pair: pair.map(|p| p as Arc<dyn weft_node::link_keys::PairSecrets>),
            })
            .map_err(|e| format!("checking this node's volume records: {e}"))?;
    }
    let exports = manager.exports();
    let controller_ids = match &member {
        Some(member) => member.controller_ids()?,
        None => weft_proto::target::DYNAMIC_CNTLIDS,
    };
    let plane = Arc::new(
        DataPlane::start(
            exports.clone(),
            &config.listen,
            config.reactors,
            std::time::Duration::from_micros(args.poll_us.unwrap_or(DEFAULT_POLL_US)),
            config.limits.peers,
            controller_ids,
        )
        .map_err(|e| e.to_string())?,
    );
    if let Some(placement) = args.replicated_queues {
        plane.place_replicated_queues(placement);
    }
    let handle = manager.handle();
    let status = manager.status(Arc::clone(&plane));
    let api_cluster = member.as_ref().map(|member| match (identity, joins) {
        (Some(identity), Some(joins)) => member.api().with_identity(identity).with_joins(joins),
        (Some(identity), None) => member.api().with_identity(identity),
        (None, _) => member.api(),
    });
    manager
        .spawn(Arc::clone(&plane))
        .map_err(|e| format!("cannot start the volume manager: {e}"))?;
    let api_address = api::start(
        api_listener,
        api_tls,
        handle.clone(),
        status.clone(),
        api_token.clone(),
        scoped_tokens,
        api::ApiLimits {
            connections: config.limits.api_connections,
            connections_per_address: config.limits.api_connections_per_address,
            head_timeout: config.limits.api_head_timeout,
            request_timeout: config.limits.api_request_timeout,
        },
        api_cluster,
    )?;
    let membership = member.as_ref().map(cluster::Member::describe);
    let running = member
        .map(|member| member.run(handle.clone(), status, lease, Arc::clone(&plane)))
        .transpose()?;
    print_banner(
        &config,
        &exports,
        &plane,
        (api_scheme, api_address),
        (&token_path, token_created),
        membership.as_deref(),
    );
    let signal = weft_uring::wait_for_termination_signal()
        .map_err(|e| format!("waiting for signals: {e}"))?;
    log::info!("signal {signal}: flushing namespaces and pools, exiting");
    // Primaries stop serving before the node leaves its cluster (which lets
    // the controller promote others at once): never two serving at a time.
    if let Err(error) = handle.call(AdminOp::Shutdown) {
        log::error!("shutting down the volumes: {error}");
    }
    if let Some(running) = running {
        running.stop();
    }
    plane.flush_all();
    Ok(())
}

fn print_banner(
    config: &ServeConfig,
    exports: &weft_target::Exports,
    plane: &DataPlane,
    (api_scheme, api_address): (&str, SocketAddr),
    (token_path, new_token): (&std::path::Path, bool),
    membership: Option<&str>,
) {
    // A banner nobody reads (stdout closed) must not stop the node.
    let mut out = std::io::stdout().lock();
    macro_rules! say {
        ($($arg:tt)*) => {{
            let _ = writeln!(out, $($arg)*);
        }};
    }
    say!(
        "weft {} serving NVMe/TCP ({} reactors, data dir {})",
        env!("CARGO_PKG_VERSION"),
        config.reactors,
        config.data_dir.display()
    );
    for address in &plane.listening {
        say!("  listening  {address}  (discovery and I/O)");
    }
    say!("  api        {api_scheme}://{api_address}  (weft pool|volume|snapshot|host ...)");
    if let Some(membership) = membership {
        say!("  cluster    {membership}");
    }
    // Never the token itself: the banner lands in logs.
    say!(
        "  api token  in {}{}",
        token_path.display(),
        if new_token { " (new)" } else { "" }
    );
    for (subsystem, devices) in exports.config.subsystems.iter().zip(&exports.devices) {
        say!(
            "  subsystem  {}  serial {}",
            subsystem.nqn,
            subsystem.serial
        );
        for (namespace, device) in subsystem.namespaces.iter().zip(devices) {
            say!(
                "    ns {:<4}  {}, {}-byte blocks, nguid {}",
                namespace.nsid,
                match &device.backend {
                    Backend::Device(device) => device.describe(),
                    Backend::Volume(volume) => format!("{volume:?}"),
                },
                namespace.block_size,
                identity::hex(&namespace.nguid)
            );
        }
    }
    let spec_note = config
        .subsystems
        .iter()
        .flat_map(|s| &s.namespaces)
        .any(|ns| matches!(ns.backend, BackendSpec::Ram { .. }));
    if spec_note {
        say!("  (ram namespaces lose their content when weft stops)");
    }
    let first = plane.listening[0];
    let host = if first.ip().is_unspecified() {
        "<this host's address>".to_string()
    } else {
        first.ip().to_string()
    };
    say!("\nOn a Linux host (modprobe nvme-tcp):");
    say!("  nvme discover -t tcp -a {host} -s {}", first.port());
    for subsystem in &exports.config.subsystems {
        say!(
            "  nvme connect -t tcp -n {} -a {host} -s {}",
            subsystem.nqn,
            first.port()
        );
    }
}
