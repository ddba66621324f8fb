//! `weft pool|volume|snapshot|host ...`: the admin commands. Each is one
//! call to a running node's API (`--api URL`, `WEFT_API`, default
//! http://127.0.0.1:9440) with its bearer token (`--api-token-file FILE`,
//! `WEFT_API_TOKEN`, or ./weft-data/api-token when present); results print
//! as a table, or as the API's JSON with `-o json`. Errors print the API's
//! message (and its hint when the message alone does not say what to do).

mod nodes;

use crate::config::parse_size_text;
use serde_json::{json, Value};
use std::time::Duration;
use weft_api::views::{HostView, PoolDetail, PoolView, QosView, VolumeView};
use weft_api::DEFAULT_API_LISTEN;
use weft_http as http;
use weft_node::manager::DEFAULT_CHUNK_BYTES;
use weft_node::metrics::Stats;
use weft_storage::human_bytes;

/// A parsed admin command.
#[derive(Debug)]
pub struct AdminArgs {
    api: String,
    /// CA certificates (PEM) for an `https://` API.
    ca_file: Option<std::path::PathBuf>,
    token: Option<String>,
    json: bool,
    method: &'static str,
    path: String,
    body: Option<Value>,
    /// How to print a successful result.
    show: Show,
    /// Said on stderr after a success.
    warning: Option<String>,
    /// Said after the result (a key made here, shown only then).
    notice: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Show {
    Done(&'static str),
    Pools,
    Pool,
    Volumes,
    Volume,
    Hosts,
    Host,
    Nodes,
    Node,
    /// The replicas added and removed.
    ReplicaChange,
    /// A join token, and how a new node uses it.
    JoinToken,
    /// Live statistics every `interval`, `count` times (None: until interrupted).
    Top {
        interval: Duration,
        count: Option<u64>,
    },
}

/// Limits of `weft volume set`: option name and API field.
const QOS_OPTIONS: [(&str, &str); 6] = [
    ("iops-max", "iops_max"),
    ("bw-max", "bw_max"),
    ("read-iops-max", "read_iops_max"),
    ("read-bw-max", "read_bw_max"),
    ("write-iops-max", "write_iops_max"),
    ("write-bw-max", "write_bw_max"),
];

/// Parses `weft <noun> <verb> ...` (the noun already read).
pub fn parse(noun: &str, parser: &mut lexopt::Parser) -> Result<AdminArgs, String> {
    use lexopt::prelude::*;
    let mut words: Vec<String> = Vec::new();
    let mut api = std::env::var("WEFT_API").unwrap_or_else(|_| DEFAULT_API_LISTEN.to_string());
    let mut json_output = false;
    let mut token_file: Option<std::path::PathBuf> = None;
    let mut ca_file = std::env::var_os("WEFT_API_CA").map(std::path::PathBuf::from);
    let mut options: Vec<(String, Option<String>)> = Vec::new();
    while let Some(arg) = parser.next().map_err(|e| format!("{e}; see weft --help"))? {
        match arg {
            Value(value) => words.push(value.string().map_err(|_| "arguments must be UTF-8")?),
            Long("api") => api = text(parser.value())?,
            Long("api-token-file") => token_file = Some(text(parser.value())?.into()),
            Long("api-ca") => ca_file = Some(text(parser.value())?.into()),
            Short('o') | Long("output") => {
                json_output = match text(parser.value())?.as_str() {
                    "json" => true,
                    "table" => false,
                    other => return Err(format!("-o {other}: use json or table")),
                }
            }
            Long(flag @ ("thick" | "force" | "tls" | "encrypt" | "no-write-tier")) => {
                options.push((flag.to_string(), None))
            }
            Long(name) => {
                let name = name.to_string();
                let value = text(parser.value()).map_err(|_| format!("--{name} needs a value"))?;
                options.push((name, Some(value)));
            }
            other => return Err(format!("{}; see weft --help", other.unexpected())),
        }
    }
    let verb = if noun == "top" {
        String::new()
    } else {
        words.first().cloned().unwrap_or_default()
    };
    let operand = |index: usize, what: &str| {
        words
            .get(index)
            .cloned()
            .ok_or_else(|| format!("weft {noun} {verb}: give the {what}; see weft --help"))
    };
    let option = |name: &str| {
        options
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.clone())
    };
    let flag = |name: &str| options.iter().any(|(n, v)| n == name && v.is_none());
    // Every value of a repeatable option (--device).
    let values = |name: &str| -> Vec<String> {
        options
            .iter()
            .filter(|(n, _)| n == name)
            .filter_map(|(_, v)| v.clone())
            .collect()
    };
    let size = |name: &str| -> Result<Option<u64>, String> {
        option(name)
            .map(|text| parse_size_text(&text).map_err(|e| format!("--{name}: {e}")))
            .transpose()
    };
    let known = |allowed: &[&str]| -> Result<(), String> {
        match options.iter().find(|(n, _)| !allowed.contains(&n.as_str())) {
            Some((name, _)) => Err(format!(
                "weft {noun} {verb} does not take --{name}; see weft --help"
            )),
            None => Ok(()),
        }
    };
    // Which node's pool (`?node=`): needed only where two nodes have a pool of that name.
    let on_node = option("node")
        .map(|node| format!("?node={node}"))
        .unwrap_or_default();
    let mut warning = None;
    let mut notice = None;
    let (method, path, body, show) = match (noun, verb.as_str()) {
        ("pool", "create") => {
            known(&[
                "device",
                "allocation-unit",
                "device-size",
                "force",
                "node",
                "encrypt",
                "compression",
                "write-tier",
                "write-tier-size",
            ])?;
            let devices = values("device");
            if devices.is_empty() {
                return Err("weft pool create NAME --device PATH [--device PATH]...: give at least one device".into());
            }
            let unit = size("allocation-unit")?.unwrap_or(u64::from(DEFAULT_CHUNK_BYTES));
            let unit = u32::try_from(unit).map_err(|_| "--allocation-unit: at most 1GiB")?;
            let body = json!({
                "name": operand(1, "pool name")?,
                "devices": devices,
                "allocation_unit_bytes": unit,
                "device_size_bytes": size("device-size")?,
                "encrypt": flag("encrypt"),
                "compression": option("compression"),
                "force": flag("force"),
                "node": option("node"),
                "write_tier": option("write-tier"),
                "write_tier_size_bytes": size("write-tier-size")?,
            });
            ("POST", "pools".to_string(), Some(body), Show::Done("created"))
        }
        ("pool", "set") if flag("no-write-tier") => {
            known(&["no-write-tier", "node"])?;
            let path = format!("pools/{}/write-tier{on_node}", operand(1, "pool name")?);
            ("DELETE", path, None, Show::Done("set: the write tier is destaged and removed; the pool's writes go to its devices"))
        }
        ("pool", "set") => {
            known(&["write-tier", "write-tier-size", "node"])?;
            let Some(device) = option("write-tier") else {
                return Err("weft pool set POOL --write-tier PATH [--write-tier-size SIZE] | --no-write-tier: give the tier's device, or remove the tier".into());
            };
            let body = json!({"device": device, "size_bytes": size("write-tier-size")?});
            let path = format!("pools/{}/write-tier{on_node}", operand(1, "pool name")?);
            ("PUT", path, Some(body), Show::Done("set: the pool's writes go through its write tier from now on"))
        }
        ("pool", "list") => {
            known(&[])?;
            ("GET", "pools".to_string(), None, Show::Pools)
        }
        ("pool", "show") => {
            known(&["node"])?;
            ("GET", format!("pools/{}{on_node}", operand(1, "pool name")?), None, Show::Pool)
        }
        ("pool", "add-device") => {
            known(&["device", "device-size", "node"])?;
            let devices = values("device");
            if devices.is_empty() {
                return Err("weft pool add-device POOL --device PATH [--device PATH]...: give at least one device".into());
            }
            let body = json!({"devices": devices, "device_size_bytes": size("device-size")?});
            let path = format!("pools/{}/devices{on_node}", operand(1, "pool name")?);
            ("POST", path, Some(body), Show::Done("added: the new capacity is usable now"))
        }
        ("pool", "delete") => {
            known(&["node"])?;
            ("DELETE", format!("pools/{}{on_node}", operand(1, "pool name")?), None, Show::Done("deleted"))
        }
        ("pool", "clear-failure") => {
            known(&["node"])?;
            let path = format!("pools/{}/clear-failure{on_node}", operand(1, "pool name")?);
            ("POST", path, None, Show::Done("cleared: the pool is served again from its last committed state"))
        }
        ("pool", "rewrap") => {
            known(&["node"])?;
            let path = format!("pools/{}/rewrap{on_node}", operand(1, "pool name")?);
            ("POST", path, None, Show::Done("rewrapped: every data key the node's keys open is wrapped with its first key-encryption key (`weft volume show` names each volume's)"))
        }
        ("namespace", "clear-failure") => {
            known(&["nsid"])?;
            let nsid = option("nsid").unwrap_or_else(|| "1".into());
            let path = format!("subsystems/{}/namespaces/{nsid}/clear-failure", operand(1, "subsystem NQN")?);
            ("POST", path, None, Show::Done("cleared"))
        }
        ("volume", "create") => {
            known(&["pool", "size", "thick", "block-size", "node", "nqn", "uuid", "nguid", "replicas", "ec", "encrypt", "compression"])?;
            let size_bytes = size("size")?.ok_or("weft volume create NAME --size SIZE [--pool POOL]: give --size, e.g. 100GiB")?;
            let block_size = size("block-size")?.unwrap_or(4096);
            let ec = option("ec");
            if ec.is_some() && option("replicas").is_some() {
                return Err("weft volume create: give --replicas N or --ec K+M, not both (a volume is replicated or erasure-coded)".into());
            }
            let replicas = match option("replicas") {
                None if ec.is_some() => None,
                None => Some(1),
                Some(text) => Some(text.parse::<u32>().map_err(|_| format!("--replicas {text}: give a number of copies, 1 to 3"))?),
            };
            notice = option("nqn").as_deref().and_then(weft_control::nqn_form_note);
            let body = json!({
                "name": operand(1, "volume name")?,
                "pool": option("pool"),
                "node": option("node"),
                "nqn": option("nqn"),
                "uuid": option("uuid"),
                "nguid": option("nguid"),
                "size_bytes": size_bytes,
                "block_size": block_size,
                "thick": flag("thick"),
                "encrypted": flag("encrypt"),
                "compression": option("compression"),
                "replicas": replicas,
                "ec": ec,
            });
            ("POST", "volumes".to_string(), Some(body), Show::Done("created"))
        }
        ("volume", "list") => {
            known(&[])?;
            ("GET", "volumes".to_string(), None, Show::Volumes)
        }
        ("volume", "show") => {
            known(&[])?;
            ("GET", format!("volumes/{}", operand(1, "volume name")?), None, Show::Volume)
        }
        ("volume", "delete") => {
            known(&["force"])?;
            let query = if flag("force") { "?force=true" } else { "" };
            let path = format!("volumes/{}{query}", operand(1, "volume name")?);
            ("DELETE", path, None, Show::Done("deleted"))
        }
        ("volume", "resize") => {
            known(&["size"])?;
            let size_bytes = size("size")?.ok_or("weft volume resize NAME --size SIZE: give --size")?;
            let path = format!("volumes/{}/resize", operand(1, "volume name")?);
            ("POST", path, Some(json!({"size_bytes": size_bytes})), Show::Done("resized"))
        }
        ("volume", "clone") => {
            known(&["node"])?;
            let source = operand(1, "source VOLUME@SNAPSHOT")?;
            let body = json!({"name": operand(2, "new volume name")?, "source": source, "node": option("node")});
            ("POST", "volumes".to_string(), Some(body), Show::Done("cloned"))
        }
        ("volume", "flatten") => {
            known(&[])?;
            let path = format!("volumes/{}/flatten", operand(1, "volume name")?);
            ("POST", path, None, Show::Done("flattened"))
        }
        ("volume", "move-primary") => {
            known(&["to"])?;
            let path = format!("volumes/{}/move-primary", operand(1, "volume name")?);
            let body = option("to").map(|to| json!({"to": to}));
            ("POST", path, body.or(Some(json!({}))), Show::Done("moved"))
        }
        ("volume", "attach" | "detach") => {
            known(&["host"])?;
            let volume = operand(1, "volume name")?;
            let host = option("host").ok_or_else(|| format!("weft volume {verb} VOLUME --host HOST: give --host"))?;
            if verb == "attach" {
                let path = format!("volumes/{volume}/hosts");
                ("POST", path, Some(json!({"host": host})), Show::Done("attached"))
            } else {
                let path = format!("volumes/{volume}/hosts/{host}");
                ("DELETE", path, None, Show::Done("detached"))
            }
        }
        ("volume", "set") if option("replicas").is_some() => {
            known(&["replicas"]).map_err(|_| "weft volume set VOLUME --replicas N: give --replicas alone (limits in a second call)".to_string())?;
            let text = option("replicas").expect("given");
            let count: u64 = text.parse().map_err(|_| format!("--replicas {text}: give a number of copies, 1 to 3"))?;
            let path = format!("volumes/{}/replicas", operand(1, "volume name")?);
            ("PATCH", path, Some(json!({"count": count})), Show::ReplicaChange)
        }
        ("volume", "set") => {
            let names: Vec<&str> = QOS_OPTIONS.iter().map(|(o, _)| *o).collect();
            known(&names)?;
            let mut body = serde_json::Map::new();
            for (name, field) in QOS_OPTIONS {
                if let Some(text) = option(name) {
                    body.insert(field.to_string(), qos_value(name, &text)?);
                }
            }
            if body.is_empty() {
                return Err("weft volume set VOLUME: give --replicas N, or at least one of --iops-max N, --bw-max SIZE (per second), --read-iops-max, --read-bw-max, --write-iops-max, --write-bw-max (\"none\" removes a limit)".into());
            }
            let path = format!("volumes/{}/qos", operand(1, "volume name")?);
            ("PATCH", path, Some(serde_json::Value::Object(body)), Show::Done("limits set"))
        }
        ("top", _) => {
            known(&["interval", "count"])?;
            let interval = match option("interval") {
                Some(text) => crate::bench::parse_duration(&text, "--interval")?,
                None => Duration::from_secs(1),
            };
            let count = option("count")
                .map(|text| text.parse::<u64>().map_err(|_| format!("--count {text}: not a number")))
                .transpose()?;
            ("GET", "stats".to_string(), None, Show::Top { interval, count })
        }
        ("host", "add") => {
            known(&["nqn", "dhchap-secret", "dhchap-ctrl-secret", "dhchap-group", "tls", "tls-psk"])?;
            let nqn = option("nqn").ok_or("weft host add NAME --nqn NQN: give --nqn (the host's /etc/nvme/hostnqn)")?;
            let name = operand(1, "host name")?;
            let tls_psk = match (flag("tls"), option("tls-psk")) {
                (true, Some(_)) => return Err("weft host add: give --tls (a new key) or --tls-psk KEY, not both".into()),
                (true, None) => Some(new_tls_psk()),
                (false, given) => given,
            };
            notice = weft_control::nqn_form_note(&nqn);
            if let Some(psk) = &tls_psk {
                let tls = tls_instructions(&name, &nqn, psk);
                notice = Some(match notice {
                    Some(note) => format!("{tls}\n{note}"),
                    None => tls,
                });
            }
            if option("dhchap-secret").is_none() && tls_psk.is_none() {
                warning = Some(format!(
                    "warning: host {name} has no DH-HMAC-CHAP secret, so its NQN alone identifies it, and an NQN is no secret (the hostnqn file, a Kubernetes node's ID): anyone on the network who presents it connects as this host. Give it one: weft host set {name} --dhchap-secret \"$(nvme gen-dhchap-key --nqn {nqn})\" (and the same secret to nvme connect --dhchap-secret on the host)"
                ));
            }
            let body = json!({
                "name": name,
                "nqn": nqn,
                "dhchap_secret": option("dhchap-secret"),
                "dhchap_ctrl_secret": option("dhchap-ctrl-secret"),
                "dhchap_group": option("dhchap-group").filter(|g| g != "null"),
                "tls_psk": tls_psk,
            });
            ("POST", "hosts".to_string(), Some(body), Show::Done("added"))
        }
        ("host", "set") => {
            known(&["dhchap-secret", "dhchap-ctrl-secret", "dhchap-group", "tls-psk"])?;
            let mut body = serde_json::Map::new();
            for (name, field) in [("dhchap-secret", "dhchap_secret"), ("dhchap-ctrl-secret", "dhchap_ctrl_secret"), ("dhchap-group", "dhchap_group"), ("tls-psk", "tls_psk")] {
                if let Some(mut text) = option(name) {
                    if name == "dhchap-group" && text == "null" {
                        text = "none".into();
                    }
                    if name == "tls-psk" && text == "new" {
                        text = new_tls_psk();
                        notice = Some(tls_instructions(&operand(1, "host name")?, "<the host's NQN>", &text));
                    }
                    let value = if text == "none" { serde_json::Value::Null } else { json!(text) };
                    body.insert(field.to_string(), value);
                }
            }
            if body.is_empty() {
                return Err("weft host set HOST: give --dhchap-secret SECRET, --dhchap-ctrl-secret SECRET, --dhchap-group GROUP and/or --tls-psk KEY|new (\"none\" removes one)".into());
            }
            let path = format!("hosts/{}", operand(1, "host name")?);
            ("PATCH", path, Some(serde_json::Value::Object(body)), Show::Done("secrets set"))
        }
        ("host", "list") => {
            known(&[])?;
            ("GET", "hosts".to_string(), None, Show::Hosts)
        }
        ("host", "show") => {
            known(&[])?;
            ("GET", format!("hosts/{}", operand(1, "host name")?), None, Show::Host)
        }
        ("host", "delete") => {
            known(&[])?;
            ("DELETE", format!("hosts/{}", operand(1, "host name")?), None, Show::Done("deleted"))
        }
        ("node", _) => {
            known(&[])?;
            nodes::command(&verb, operand(1, "node name"))?
        }
        ("token", "join") => {
            known(&["node", "ttl"])?;
            let ttl_s = match option("ttl") {
                Some(text) => Some(crate::bench::parse_duration(&text, "--ttl")?.as_secs().max(1)),
                None => None,
            };
            (
                "POST",
                "cluster/join-tokens".to_string(),
                Some(json!({"node": option("node"), "ttl_s": ttl_s})),
                Show::JoinToken,
            )
        }
        ("token", "renew") => {
            known(&[])?;
            let role = operand(1, "token: csi or read-only")?;
            (
                "POST",
                format!("tokens/{role}/renew"),
                None,
                Show::Done("renewed: every node refuses the old token once it reads the store (this one at once, the others within seconds) and writes the new one beside its admin token (DATA_DIR/api-token.ROLE): hand that file to whoever held the old one"),
            )
        }
        ("snapshot", "create" | "delete") => {
            known(&[])?;
            let target = operand(1, "VOLUME@SNAPSHOT")?;
            let (volume, snapshot) = target
                .split_once('@')
                .ok_or_else(|| format!("{target:?}: name the snapshot as VOLUME@SNAPSHOT, e.g. db1@s1"))?;
            if verb == "create" {
                let path = format!("volumes/{volume}/snapshots");
                ("POST", path, Some(json!({"name": snapshot})), Show::Done("created"))
            } else {
                let path = format!("volumes/{volume}/snapshots/{snapshot}");
                ("DELETE", path, None, Show::Done("deleted"))
            }
        }
        _ => {
            return Err(format!(
                "unknown command `weft {noun} {verb}`; see weft --help for the pool, volume, snapshot, host and token commands"
            ))
        }
    };
    Ok(AdminArgs {
        token: api_token(token_file)?,
        api,
        ca_file,
        json: json_output,
        method,
        path,
        body,
        show,
        warning,
        notice,
    })
}

/// A new NVMe/TCP TLS PSK in the interchange format (hash 01, as `nvme gen-tls-key`).
fn new_tls_psk() -> String {
    weft_proto::tls::psk::ConfiguredPsk::generate(&weft_initiator::OsRandom).to_string()
}

/// What the operator does with host `name`'s new TLS PSK.
fn tls_instructions(name: &str, nqn: &str, psk: &str) -> String {
    format!(
        "host {name} connects only over TLS (NVMe/TCP TLS 1.3) with this PSK, shown only now:\n  \
         {psk}\n\
         On the host (Linux 6.7 or later, ktls-utils' tlshd running), for each volume's NQN:\n  \
         nvme check-tls-key --keydata='{psk}' --hostnqn={nqn} --subsysnqn=NQN --insert\n  \
         nvme connect -t tcp -a ADDRESS -s 4420 -n NQN --hostnqn={nqn} --tls"
    )
}

/// A limit of `weft volume set`: a count or size per second, or "none".
fn qos_value(option: &str, text: &str) -> Result<Value, String> {
    if matches!(text, "none" | "unlimited") {
        return Ok(Value::Null);
    }
    let number = if option.ends_with("bw-max") {
        parse_size_text(text.trim_end_matches("/s"))
    } else {
        text.parse::<u64>()
            .map_err(|_| format!("\"{text}\" is not a whole number"))
    };
    number
        .map(Value::from)
        .map_err(|e| format!("--{option}: {e} (or \"none\" to remove the limit)"))
}

/// The bearer token: from `--api-token-file`, `WEFT_API_TOKEN`, or the
/// default data directory's file when it exists (a node on this machine).
pub(crate) fn api_token(file: Option<std::path::PathBuf>) -> Result<Option<String>, String> {
    let read = |path: &std::path::Path| {
        weft_api::token::read_private(path)
            .map_err(|e| format!("--api-token-file {}", e.describe(path)))
    };
    if let Some(path) = file {
        return read(&path).map(Some);
    }
    if let Ok(token) = std::env::var("WEFT_API_TOKEN") {
        return Ok(Some(token));
    }
    let default = std::path::Path::new("weft-data").join(weft_api::token::FILE_NAME);
    default.exists().then(|| read(&default)).transpose()
}

fn text(value: Result<std::ffi::OsString, lexopt::Error>) -> Result<String, String> {
    value
        .map_err(|e| e.to_string())?
        .into_string()
        .map_err(|_| "arguments must be UTF-8".to_string())
}

/// Runs the command against the API.
pub fn run(args: AdminArgs) -> Result<(), String> {
    if let Show::Top { interval, count } = args.show {
        return top(&args, interval, count);
    }
    let value = request(&args)?;
    if let Some(warning) = &args.warning {
        eprintln!("{warning}");
    }
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&value).expect("valid JSON")
        );
        if let Some(notice) = &args.notice {
            eprintln!("{notice}");
        }
        return Ok(());
    }
    match args.show {
        Show::Done(what) => outln!("{what}"),
        Show::Pools => print_pools(&decode::<Vec<PoolView>>(value)?),
        Show::Pool => print_pool(&decode(value)?),
        Show::Volumes => print_volumes(&decode::<Vec<VolumeView>>(value)?),
        Show::Volume => print_volume(&decode(value)?),
        Show::Hosts => print_hosts(&decode::<Vec<HostView>>(value)?),
        Show::Host => print_hosts(&[decode(value)?]),
        Show::Nodes => nodes::print_list(&decode::<Vec<weft_api::views::NodeView>>(value)?),
        Show::Node => nodes::print_one(&decode(value)?),
        Show::ReplicaChange => print_replica_change(value),
        Show::JoinToken => print_join_token(&value),
        Show::Top { .. } => unreachable!("handled above"),
    }
    if let Some(notice) = &args.notice {
        outln!("{notice}");
    }
    Ok(())
}

/// `weft top`: polls the statistics and prints rates and latency
/// quantiles of each interval, busiest namespace first.
fn top(args: &AdminArgs, interval: Duration, count: Option<u64>) -> Result<(), String> {
    use std::io::IsTerminal;
    let terminal = std::io::stdout().is_terminal() && !args.json;
    let mut before: Stats = decode(request(args)?)?;
    let mut frames = 0;
    while count.is_none_or(|count| frames < count) {
        std::thread::sleep(interval);
        let now: Stats = decode(request(args)?)?;
        if args.json {
            outln!(
                "{}",
                serde_json::to_string(&top_rows(&before, &now)).expect("valid JSON")
            );
        } else {
            if terminal {
                out!("\x1b[H\x1b[2J");
            }
            print_top(&args.api, interval, &top_rows(&before, &now));
        }
        before = now;
        frames += 1;
    }
    Ok(())
}

/// One namespace's rates over an interval.
#[derive(Debug, serde::Serialize)]
struct TopRow {
    name: String,
    read_iops: f64,
    write_iops: f64,
    read_bytes_per_s: f64,
    write_bytes_per_s: f64,
    read_latency_us_p99: Option<u64>,
    write_latency_us_p99: Option<u64>,
    queue_depth: u64,
    hosts: usize,
    limits: String,
}

fn top_rows(before: &Stats, now: &Stats) -> Vec<TopRow> {
    let seconds = (now.time_ns.saturating_sub(before.time_ns) as f64 / 1e9).max(1e-3);
    let mut rows: Vec<TopRow> = now
        .namespaces
        .iter()
        .map(|ns| {
            let earlier = before
                .namespaces
                .iter()
                .find(|b| b.nqn == ns.nqn && b.nsid == ns.nsid);
            let zero = weft_node::metrics::ClassStats::default();
            let (read, write) = earlier.map_or((&zero, &zero), |b| (&b.read, &b.write));
            let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / seconds;
            let l = ns.limits;
            TopRow {
                name: ns
                    .volume
                    .clone()
                    .unwrap_or_else(|| format!("{}/{}", ns.nqn, ns.nsid)),
                read_iops: rate(ns.read.ops, read.ops),
                write_iops: rate(ns.write.ops, write.ops),
                read_bytes_per_s: rate(ns.read.bytes, read.bytes),
                write_bytes_per_s: rate(ns.write.bytes, write.bytes),
                read_latency_us_p99: ns.read.quantile_us_since(read, 0.99),
                write_latency_us_p99: ns.write.quantile_us_since(write, 0.99),
                queue_depth: ns.in_flight,
                hosts: ns.connected_hosts,
                limits: qos_summary(&QosView {
                    iops_max: (l.iops > 0).then_some(l.iops),
                    bw_max: (l.bytes > 0).then_some(l.bytes),
                    read_iops_max: (l.read_iops > 0).then_some(l.read_iops),
                    read_bw_max: (l.read_bytes > 0).then_some(l.read_bytes),
                    write_iops_max: (l.write_iops > 0).then_some(l.write_iops),
                    write_bw_max: (l.write_bytes > 0).then_some(l.write_bytes),
                }),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.read_iops + b.write_iops)
            .total_cmp(&(a.read_iops + a.write_iops))
            .then_with(|| a.name.cmp(&b.name))
    });
    rows
}

fn print_top(api: &str, interval: Duration, rows: &[TopRow]) {
    outln!(
        "weft top: {api}, every {:.1} s (Ctrl-C quits); latency is the target's service time",
        interval.as_secs_f64()
    );
    outln!(
        "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>4} {:>5}  LIMITS",
        "VOLUME / NAMESPACE",
        "R IOPS",
        "W IOPS",
        "R MiB/s",
        "W MiB/s",
        "R p99 us",
        "W p99 us",
        "QD",
        "HOSTS"
    );
    let p99 = |value: Option<u64>| match value {
        Some(u64::MAX) => ">5s".to_string(),
        Some(us) => us.to_string(),
        None => "-".to_string(),
    };
    for row in rows {
        outln!(
            "{:<32} {:>9.0} {:>9.0} {:>9.1} {:>9.1} {:>9} {:>9} {:>4} {:>5}  {}",
            row.name,
            row.read_iops,
            row.write_iops,
            row.read_bytes_per_s / 1048576.0,
            row.write_bytes_per_s / 1048576.0,
            p99(row.read_latency_us_p99),
            p99(row.write_latency_us_p99),
            row.queue_depth,
            row.hosts,
            row.limits
        );
    }
}

/// Sends the command's request; the JSON answer, or the API's error as a message.
fn request(args: &AdminArgs) -> Result<Value, String> {
    let endpoint = http::Endpoint::parse(&args.api, args.ca_file.as_deref())?;
    let address = &endpoint.address;
    let body = args.body.as_ref().map(|b| b.to_string().into_bytes());
    let path = format!("/api/v1/{}", args.path);
    let (status, response) = http::call(&endpoint, args.token.as_deref(), args.method, &path, body.as_deref(), Duration::from_secs(600))
        .map_err(|e| format!("cannot reach the weft API at {address}: {e}; is `weft serve` running there? (set --api or WEFT_API)"))?;
    let value: Value = serde_json::from_slice(&response).map_err(|e| {
        format!("the API at {address} answered {status} with something that is not JSON: {e}")
    })?;
    if !(200..300).contains(&status) {
        // Volume errors say what to do in the message; errors of the API
        // itself need the hint.
        let message = value["message"].as_str().unwrap_or("request failed");
        let hint = value["hint"].as_str().unwrap_or_default();
        return Err(match value["code"].as_str() {
            Some("unauthorized") => format!("{message}: pass --api-token-file FILE or set WEFT_API_TOKEN (the node keeps its token in DATA_DIR/api-token)"),
            Some("no_route" | "method_not_allowed" | "invalid_json" | "store" | "tls_required") => {
                format!("{message} ({hint})")
            }
            _ => message.to_string(),
        });
    }
    Ok(value)
}

fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| format!("unexpected answer from the API: {e}"))
}

fn print_pools(pools: &[PoolView]) {
    let cluster = pools.iter().any(|p| p.node.is_some());
    let node_column = |node: &Option<String>| match cluster {
        true => format!("{:<10} ", node.as_deref().unwrap_or("-")),
        false => String::new(),
    };
    outln!(
        "{}{:<16} {:>10} {:>10} {:>10} {:>11} {:>10} {:>7} {:>5}",
        node_column(&Some("NODE".into())),
        "NAME",
        "CAPACITY",
        "ALLOCATED",
        "FREE",
        "PROVISIONED",
        "OVERCOMMIT",
        "VOLUMES",
        "UNIT"
    );
    for pool in pools {
        let used = pool.allocated_bytes as f64 / pool.capacity_bytes as f64 * 100.0;
        let warning = if used >= 90.0 {
            "  (over 90% allocated)"
        } else if used >= 80.0 {
            "  (over 80% allocated)"
        } else {
            ""
        };
        outln!(
            "{}{:<16} {:>10} {:>10} {:>10} {:>11} {:>9.2}x {:>7} {:>5}{warning}",
            node_column(&pool.node),
            pool.name,
            human_bytes(pool.capacity_bytes),
            human_bytes(pool.allocated_bytes),
            human_bytes(pool.free_bytes),
            human_bytes(pool.provisioned_bytes),
            pool.overcommit,
            pool.volumes,
            human_bytes(u64::from(pool.allocation_unit_bytes)),
        );
        if let Some(c) = &pool.compression {
            outln!(
                "  compressed volumes: {} written, {} stored ({:.2}x), {} of allocation units hold them",
                human_bytes(c.logical_bytes),
                human_bytes(c.stored_bytes),
                c.ratio,
                human_bytes(c.segment_bytes)
            );
        }
        if let Some(failure) = &pool.failure {
            outln!(
                "  FAILED: {failure}; every I/O on its volumes fails until you check its devices and run `weft pool clear-failure {}`",
                pool.name
            );
        }
    }
}

fn print_pool(detail: &PoolDetail) {
    print_pools(std::slice::from_ref(&detail.pool));
    if detail.pool.encrypt {
        outln!("new volumes are encrypted at rest (AES-256-XTS, a data key each)");
    }
    if let Some(compression) = &detail.pool.compress {
        outln!("new volumes of one copy are compressed with {compression} (unless created with --compression)");
    }
    if let Some(tier) = &detail.pool.write_tier {
        outln!(
            "write tier {}: {} of {} hold writes not destaged yet",
            tier.device.display(),
            human_bytes(tier.used_bytes),
            human_bytes(tier.capacity_bytes)
        );
    }
    outln!();
    outln!(
        "{:<40} {:>10} {:>10} {:>10} {:>8}  STATE",
        "DEVICE",
        "SIZE",
        "CAPACITY",
        "ALLOCATED",
        "METADATA"
    );
    for member in &detail.members {
        outln!(
            "{:<40} {:>10} {:>10} {:>10} {:>8}  {}",
            member.path.display(),
            human_bytes(member.size_bytes),
            human_bytes(member.capacity_bytes),
            human_bytes(member.allocated_bytes),
            if member.metadata_copy { "copy" } else { "-" },
            member.state
        );
    }
}

fn print_volumes(volumes: &[VolumeView]) {
    let cluster = volumes.iter().any(|v| v.node.is_some());
    let node_column = |node: &Option<String>| match cluster {
        true => format!("{:<10} ", node.as_deref().unwrap_or("-")),
        false => String::new(),
    };
    outln!(
        "{:<20} {}{:<12} {:>10} {:>10} {:>10} {:<10} {:>9} {:>5}  NQN",
        "NAME",
        node_column(&Some("NODE".into())),
        "POOL",
        "SIZE",
        "RAW",
        "ALLOCATED",
        "TYPE",
        "SNAPSHOTS",
        "HOSTS"
    );
    for v in volumes {
        if matches!(v.state.as_str(), "unavailable" | "missing") {
            outln!(
                "{:<20} {}{:<12} {}: {}",
                v.name,
                node_column(&v.node),
                v.pool,
                v.state,
                v.failure.as_deref().unwrap_or("its node does not answer")
            );
            continue;
        }
        outln!(
            "{:<20} {}{:<12} {:>10} {:>10} {:>10} {:<10} {:>9} {:>5}  {}",
            v.name,
            node_column(&v.node),
            v.pool,
            human_bytes(v.size_bytes),
            human_bytes(raw_bytes(v)),
            human_bytes(v.allocated_bytes),
            volume_type(v),
            v.snapshots.len(),
            v.connected_hosts.len(),
            v.nqn
        );
    }
    // What the volumes take in all: usable against raw, cluster-wide.
    let (usable, raw) = volumes
        .iter()
        .filter(|v| !matches!(v.state.as_str(), "unavailable" | "missing"))
        .fold((0, 0), |(usable, raw), v| {
            (usable + v.size_bytes, raw + raw_bytes(v))
        });
    if usable > 0 {
        outln!(
            "total: {} usable, {} raw ({:.2} bytes of flash per usable byte)",
            human_bytes(usable),
            human_bytes(raw),
            raw as f64 / usable as f64
        );
    }
}

/// How a volume is laid out and whether it is encrypted ("thin", "ec 4+2,enc").
fn volume_type(v: &VolumeView) -> String {
    let layout = match &v.erasure {
        Some(e) => format!("ec {}", e.layout),
        None if v.thick => "thick".into(),
        None => "thin".into(),
    };
    let layout = match &v.compression {
        Some(c) => format!("{layout},{}", c.algorithm),
        None => layout,
    };
    match &v.encryption {
        Some(e) if e.state == "locked" => format!("{layout},locked"),
        Some(_) => format!("{layout},enc"),
        None => layout,
    }
}

/// The flash a volume takes in all, provisioned: every copy of a
/// replicated volume, every shard of an erasure-coded one with its parity.
fn raw_bytes(v: &VolumeView) -> u64 {
    match (&v.erasure, &v.replicas) {
        (Some(e), _) => e.raw_bytes,
        (None, Some(replicas)) => v.size_bytes * replicas.len() as u64,
        (None, None) => v.size_bytes,
    }
}

fn print_hosts(hosts: &[HostView]) {
    outln!(
        "{:<20} {:<60} {:<24} {:<4} VOLUMES",
        "NAME",
        "NQN",
        "DH-HMAC-CHAP",
        "TLS"
    );
    for host in hosts {
        let volumes = if host.volumes.is_empty() {
            "-".to_string()
        } else {
            host.volumes.join(", ")
        };
        let dhchap = match &host.dhchap_group {
            Some(group) => format!("{} {group}", host.dhchap),
            None => host.dhchap.clone(),
        };
        outln!(
            "{:<20} {:<60} {:<24} {:<4} {volumes}",
            host.name,
            host.nqn,
            dhchap,
            if host.tls { "yes" } else { "no" }
        );
    }
}

/// "20000 IOPS, 200 MiB/s" style summary of a volume's limits.
fn qos_summary(qos: &QosView) -> String {
    let iops = |label: &str, limit: Option<u64>| limit.map(|n| format!("{label}{n} IOPS"));
    let bw =
        |label: &str, limit: Option<u64>| limit.map(|n| format!("{label}{}/s", human_bytes(n)));
    let parts: Vec<String> = [
        iops("", qos.iops_max),
        bw("", qos.bw_max),
        iops("read ", qos.read_iops_max),
        bw("read ", qos.read_bw_max),
        iops("write ", qos.write_iops_max),
        bw("write ", qos.write_bw_max),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "unlimited".to_string()
    } else {
        parts.join(", ")
    }
}

/// What `volume set --replicas` did.
fn print_replica_change(value: serde_json::Value) {
    let placed = |list: &serde_json::Value| -> Vec<String> {
        list.as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{} (pool {})",
                    p["node"].as_str().unwrap_or("?"),
                    p["pool"].as_str().unwrap_or("?")
                )
            })
            .collect()
    };
    let added = placed(&value["added"]);
    let removed: Vec<&str> = value["removed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str())
        .collect();
    if added.is_empty() && removed.is_empty() {
        outln!(
            "unchanged: {} replicas",
            value["replicas"].as_array().map_or(0, Vec::len)
        );
    }
    if !added.is_empty() {
        outln!(
            "added on {}: being built in full (`weft volume show` tells the progress)",
            added.join(", ")
        );
    }
    if !removed.is_empty() {
        outln!(
            "removed from {}: their copies are deleted",
            removed.join(", ")
        );
    }
}

fn print_volume(v: &VolumeView) {
    outln!("name        {}", v.name);
    if let Some(node) = &v.node {
        outln!("node        {node}");
    }
    outln!("pool        {}", v.pool);
    outln!("nqn         {}", v.nqn);
    outln!(
        "size        {} ({} bytes, {}-byte blocks)",
        human_bytes(v.size_bytes),
        v.size_bytes,
        v.block_size
    );
    outln!("type        {}", if v.thick { "thick" } else { "thin" });
    if let Some(c) = &v.compression {
        outln!(
            "compression {}: {} written, {} stored ({:.2}x)",
            c.algorithm,
            human_bytes(c.logical_bytes),
            human_bytes(c.stored_bytes),
            c.ratio
        );
    }
    if let Some(e) = &v.encryption {
        match e.state.as_str() {
            "unlocked" => outln!("encryption  {}, data key wrapped by key-encryption key {}", e.cipher, e.kek_id),
            _ => outln!(
                "encryption  {}, LOCKED: this node lacks key-encryption key {}; add it to the node's --kek-file (or --kek-command) and run `weft pool rewrap {}`",
                e.cipher, e.kek_id, v.pool
            ),
        }
    }
    if let Some(e) = &v.erasure {
        outln!(
            "erasure     {} (chunks of {}): takes {} raw, {:.2}x its size, journals included",
            e.layout,
            human_bytes(u64::from(e.chunk_bytes)),
            human_bytes(e.raw_bytes),
            e.raw_per_usable
        );
    }
    match &v.failure {
        Some(failure) if matches!(v.state.as_str(), "unavailable" | "missing") => {
            outln!("state       {}: {failure}", v.state)
        }
        Some(failure) => outln!(
            "state       failed ({failure}): every I/O fails until `weft pool clear-failure {}`",
            v.pool
        ),
        None => outln!("state       {}", v.state),
    }
    outln!("allocated   {}", human_bytes(v.allocated_bytes));
    outln!("nguid       {}", v.nguid);
    outln!("uuid        {}", v.uuid);
    if let Some(origin) = &v.origin {
        outln!("origin      {origin}");
    }
    let list = |items: &[String]| {
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(", ")
        }
    };
    match &v.snapshot_copies {
        Some(copies) if !copies.is_empty() => {
            for copy in copies {
                outln!(
                    "snapshot    {}: {}, on {}",
                    copy.name,
                    copy.state,
                    list(&copy.nodes)
                );
            }
        }
        _ => outln!("snapshots   {}", list(&v.snapshots)),
    }
    outln!("attached    {}", list(&v.hosts));
    outln!("connected   {}", list(&v.connected_hosts));
    outln!("limits      {}", qos_summary(&v.qos));
    for replica in v.replicas.iter().flatten() {
        let progress = replica.rebuild.as_ref().map_or(String::new(), |r| {
            let percent = (r.done_bytes * 100).checked_div(r.total_bytes).unwrap_or(0);
            let eta = r.eta_s.map_or("-".to_string(), |s| format!("{s} s"));
            format!(
                " {percent}% ({} of {}, {}/s, {eta} left)",
                weft_storage::human_bytes(r.done_bytes),
                weft_storage::human_bytes(r.total_bytes),
                weft_storage::human_bytes(r.rate_bytes_per_s)
            )
        });
        let reason = match (&replica.reason, &replica.rebuild) {
            (Some(reason), None) => format!(" ({reason})"),
            _ => String::new(),
        };
        outln!(
            "replica     {} pool {}: {}, {}{progress}{reason}",
            replica.node,
            replica.pool,
            replica.role,
            replica.state
        );
    }
}

/// A join token (shown once: it is a credential) and the command that uses it.
fn print_join_token(value: &Value) {
    let token = value["token"].as_str().unwrap_or_default();
    let node = value["node"].as_str();
    let hours = value["expires_in_s"].as_u64().unwrap_or_default() as f64 / 3600.0;
    outln!(
        "join token (once, for {}, valid {hours:.1} h):",
        node.map_or("any node name".to_string(), |n| format!("node {n}"))
    );
    outln!("  {token}");
    outln!(
        "on the new node (its key and certificate go to DIR; the signing node runs with --ca-key):"
    );
    outln!(
        "  weft serve --cluster https://ETCD:2379 --node {} --pki DIR --join {token} --join-via https://SIGNING_NODE:9440",
        node.unwrap_or("NAME")
    );
}
