//! `weft pool|volume|snapshot ...`: the admin commands. Each is one call to
//! a running node's API (`--api URL`, `WEFT_API`, default
//! http://127.0.0.1:9440); results print as a table, or as the API's JSON
//! with `-o json`. Errors print the API's message and hint.

use crate::api::DEFAULT_API_LISTEN;
use crate::config::parse_size_text;
use crate::http;
use crate::volumes::{PoolView, VolumeView, DEFAULT_CHUNK_BYTES};
use serde_json::{json, Value};
use std::time::Duration;
use weft_storage::human_bytes;

/// A parsed admin command.
#[derive(Debug)]
pub struct AdminArgs {
    api: String,
    json: bool,
    method: &'static str,
    path: String,
    body: Option<Value>,
    /// How to print a successful result.
    show: Show,
}

#[derive(Debug, Clone, Copy)]
enum Show {
    Done(&'static str),
    Pools,
    Volumes,
    Volume,
}

/// Parses `weft <noun> <verb> ...` (the noun already read).
pub fn parse(noun: &str, parser: &mut lexopt::Parser) -> Result<AdminArgs, String> {
    use lexopt::prelude::*;
    let mut words: Vec<String> = Vec::new();
    let mut api = std::env::var("WEFT_API").unwrap_or_else(|_| DEFAULT_API_LISTEN.to_string());
    let mut json_output = false;
    let mut options: Vec<(String, Option<String>)> = Vec::new();
    while let Some(arg) = parser.next().map_err(|e| format!("{e}; see weft --help"))? {
        match arg {
            Value(value) => words.push(value.string().map_err(|_| "arguments must be UTF-8")?),
            Long("api") => api = text(parser.value())?,
            Short('o') | Long("output") => {
                json_output = match text(parser.value())?.as_str() {
                    "json" => true,
                    "table" => false,
                    other => return Err(format!("-o {other}: use json or table")),
                }
            }
            Long(flag @ ("thick" | "force")) => options.push((flag.to_string(), None)),
            Long(name) => {
                let name = name.to_string();
                let value = text(parser.value()).map_err(|_| format!("--{name} needs a value"))?;
                options.push((name, Some(value)));
            }
            other => return Err(format!("{}; see weft --help", other.unexpected())),
        }
    }
    let verb = words.first().cloned().unwrap_or_default();
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
    let (method, path, body, show) = match (noun, verb.as_str()) {
        ("pool", "create") => {
            known(&["device", "allocation-unit", "device-size", "force"])?;
            let devices: Vec<String> = options
                .iter()
                .filter(|(n, _)| n == "device")
                .filter_map(|(_, v)| v.clone())
                .collect();
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
                "force": flag("force"),
            });
            ("POST", "pools".to_string(), Some(body), Show::Done("created"))
        }
        ("pool", "list") => {
            known(&[])?;
            ("GET", "pools".to_string(), None, Show::Pools)
        }
        ("volume", "create") => {
            known(&["pool", "size", "thick", "block-size"])?;
            let pool = option("pool").ok_or("weft volume create NAME --pool POOL --size SIZE: give --pool")?;
            let size_bytes = size("size")?.ok_or("weft volume create NAME --pool POOL --size SIZE: give --size, e.g. 100GiB")?;
            let block_size = size("block-size")?.unwrap_or(4096);
            let body = json!({
                "name": operand(1, "volume name")?,
                "pool": pool,
                "size_bytes": size_bytes,
                "block_size": block_size,
                "thick": flag("thick"),
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
            known(&[])?;
            let source = operand(1, "source VOLUME@SNAPSHOT")?;
            let body = json!({"name": operand(2, "new volume name")?, "source": source});
            ("POST", "volumes".to_string(), Some(body), Show::Done("cloned"))
        }
        ("volume", "flatten") => {
            known(&[])?;
            let path = format!("volumes/{}/flatten", operand(1, "volume name")?);
            ("POST", path, None, Show::Done("flattened"))
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
                "unknown command `weft {noun} {verb}`; see weft --help for pool, volume and snapshot commands"
            ))
        }
    };
    Ok(AdminArgs {
        api,
        json: json_output,
        method,
        path,
        body,
        show,
    })
}

fn text(value: Result<std::ffi::OsString, lexopt::Error>) -> Result<String, String> {
    value
        .map_err(|e| e.to_string())?
        .into_string()
        .map_err(|_| "arguments must be UTF-8".to_string())
}

/// Runs the command against the API.
pub fn run(args: AdminArgs) -> Result<(), String> {
    let address = args
        .api
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let body = args.body.as_ref().map(|b| b.to_string().into_bytes());
    let path = format!("/api/v1/{}", args.path);
    let (status, response) = http::call(&address, args.method, &path, body.as_deref(), Duration::from_secs(600))
        .map_err(|e| format!("cannot reach the weft API at {address}: {e}; is `weft serve` running there? (set --api or WEFT_API)"))?;
    let value: Value = serde_json::from_slice(&response).map_err(|e| {
        format!("the API at {address} answered {status} with something that is not JSON: {e}")
    })?;
    if !(200..300).contains(&status) {
        // Volume errors say what to do in the message; the hint is for API clients.
        let message = value["message"].as_str().unwrap_or("request failed");
        return Err(message.to_string());
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("valid JSON")
        );
        return Ok(());
    }
    match args.show {
        Show::Done(what) => println!("{what}"),
        Show::Pools => print_pools(&decode::<Vec<PoolView>>(value)?),
        Show::Volumes => print_volumes(&decode::<Vec<VolumeView>>(value)?),
        Show::Volume => print_volume(&decode(value)?),
    }
    Ok(())
}

fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| format!("unexpected answer from the API: {e}"))
}

fn print_pools(pools: &[PoolView]) {
    println!(
        "{:<16} {:>10} {:>10} {:>10} {:>11} {:>10} {:>7} {:>5}",
        "NAME", "CAPACITY", "ALLOCATED", "FREE", "PROVISIONED", "OVERCOMMIT", "VOLUMES", "UNIT"
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
        println!(
            "{:<16} {:>10} {:>10} {:>10} {:>11} {:>9.2}x {:>7} {:>5}{warning}",
            pool.name,
            human_bytes(pool.capacity_bytes),
            human_bytes(pool.allocated_bytes),
            human_bytes(pool.free_bytes),
            human_bytes(pool.provisioned_bytes),
            pool.overcommit,
            pool.volumes,
            human_bytes(u64::from(pool.allocation_unit_bytes)),
        );
    }
}

fn print_volumes(volumes: &[VolumeView]) {
    println!(
        "{:<20} {:<12} {:>10} {:>10} {:<5} {:>9} {:>5}  NQN",
        "NAME", "POOL", "SIZE", "ALLOCATED", "TYPE", "SNAPSHOTS", "HOSTS"
    );
    for v in volumes {
        println!(
            "{:<20} {:<12} {:>10} {:>10} {:<5} {:>9} {:>5}  {}",
            v.name,
            v.pool,
            human_bytes(v.size_bytes),
            human_bytes(v.allocated_bytes),
            if v.thick { "thick" } else { "thin" },
            v.snapshots.len(),
            v.connected_hosts.len(),
            v.nqn
        );
    }
}

fn print_volume(v: &VolumeView) {
    println!("name        {}", v.name);
    println!("pool        {}", v.pool);
    println!("nqn         {}", v.nqn);
    println!(
        "size        {} ({} bytes, {}-byte blocks)",
        human_bytes(v.size_bytes),
        v.size_bytes,
        v.block_size
    );
    println!("type        {}", if v.thick { "thick" } else { "thin" });
    println!("allocated   {}", human_bytes(v.allocated_bytes));
    println!("nguid       {}", v.nguid);
    if let Some(origin) = &v.origin {
        println!("origin      {origin}");
    }
    println!(
        "snapshots   {}",
        if v.snapshots.is_empty() {
            "-".to_string()
        } else {
            v.snapshots.join(", ")
        }
    );
    println!(
        "hosts       {}",
        if v.connected_hosts.is_empty() {
            "-".to_string()
        } else {
            v.connected_hosts.join(", ")
        }
    );
}
