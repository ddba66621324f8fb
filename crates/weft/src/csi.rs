//! `weft csi`: the Kubernetes CSI plugin (`weft_csi`), serving on a Unix
//! socket and calling a weft node's API with its token.

use std::path::PathBuf;

/// What `weft csi` was given.
pub struct CsiArgs {
    endpoint: String,
    mode: weft_csi::Mode,
    api: String,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    node_secrets: bool,
    node: NodeArgs,
}

/// What `weft csi` was given for the node service.
struct NodeArgs {
    discovery: Option<String>,
    host_nqn: Option<String>,
    state_dir: PathBuf,
    node_name: Option<String>,
    zone: Option<String>,
}

/// Parses `weft csi --endpoint unix:///csi/csi.sock --mode controller|node|all
/// [--api URL] [--api-token-file FILE] [--api-ca FILE] [--discovery ADDR:PORT]
/// [--host-nqn NQN] [--state-dir DIR] [--node-name NAME] [--zone ZONE]
/// [--dhchap per-node|none]`.
pub fn parse(parser: &mut lexopt::Parser) -> Result<CsiArgs, String> {
    use lexopt::prelude::*;
    let mut endpoint = None;
    let mut mode = None;
    let mut api =
        std::env::var("WEFT_API").unwrap_or_else(|_| weft_api::DEFAULT_API_LISTEN.to_string());
    let mut token_file = None;
    let mut ca_file = std::env::var_os("WEFT_API_CA").map(PathBuf::from);
    let mut discovery = None;
    let mut host_nqn = None;
    let mut state_dir = PathBuf::from(STATE_DIR);
    let mut node_name = None;
    let mut zone = None;
    let mut node_secrets = true;
    let text = |value: Result<std::ffi::OsString, lexopt::Error>, flag: &str| {
        value
            .map_err(|e| e.to_string())?
            .into_string()
            .map_err(|_| format!("{flag} is not UTF-8"))
    };
    while let Some(arg) = parser.next().map_err(|e| format!("{e}; see weft --help"))? {
        match arg {
            Long("endpoint") => endpoint = Some(text(parser.value(), "--endpoint")?),
            Long("mode") => mode = Some(text(parser.value(), "--mode")?.parse()?),
            Long("api") => api = text(parser.value(), "--api")?,
            Long("api-token-file") => {
                token_file = Some(text(parser.value(), "--api-token-file")?.into())
            }
            Long("api-ca") => ca_file = Some(text(parser.value(), "--api-ca")?.into()),
            Long("discovery") => discovery = Some(text(parser.value(), "--discovery")?),
            Long("host-nqn") => host_nqn = Some(text(parser.value(), "--host-nqn")?),
            Long("state-dir") => state_dir = text(parser.value(), "--state-dir")?.into(),
            Long("node-name") => node_name = Some(text(parser.value(), "--node-name")?),
            Long("zone") => zone = Some(text(parser.value(), "--zone")?),
            Long("dhchap") => {
                node_secrets = match text(parser.value(), "--dhchap")?.as_str() {
                    "per-node" => true,
                    "none" => false,
                    other => return Err(format!("--dhchap: \"{other}\" is not per-node or none (none: for nodes whose kernel has no NVMe in-band authentication, CONFIG_NVME_AUTH)")),
                }
            }
            other => return Err(format!("{}; see weft --help", other.unexpected())),
        }
    }
    Ok(CsiArgs {
        endpoint: endpoint.ok_or("weft csi needs --endpoint unix:///path/to/csi.sock")?,
        mode: mode.ok_or("weft csi needs --mode controller, node or all")?,
        api,
        token_file,
        ca_file,
        node_secrets,
        node: NodeArgs {
            discovery,
            host_nqn,
            state_dir,
            node_name,
            zone,
        },
    })
}

/// Where the node service notes staged volumes by default.
const STATE_DIR: &str = "/var/lib/weft-csi";
/// The host's name (the node's default `weft.io/node` segment).
const HOST_NAME_FILE: &str = "/proc/sys/kernel/hostname";
/// Where Linux keeps the host's NQN (nvme-cli writes it).
const HOST_NQN_FILE: &str = "/etc/nvme/hostnqn";

/// Serves until the process ends.
pub fn run(args: CsiArgs) -> Result<(), String> {
    crate::logger::init(&std::env::var("WEFT_LOG").unwrap_or_else(|_| "info".into()))?;
    let token = crate::cli::api_token(args.token_file)?;
    let api = weft_csi::api::Api::new(&args.api, args.ca_file.as_deref(), token)?;
    let node = match args.mode {
        weft_csi::Mode::Controller => None,
        weft_csi::Mode::Node | weft_csi::Mode::All => Some(node_options(args.node, &args.api)?),
    };
    let options = weft_csi::Options {
        endpoint: args.endpoint,
        mode: args.mode,
        api,
        node_secrets: args.node_secrets,
        node,
    };
    weft_csi::serve(options).map_err(|e| e.to_string())
}

/// The node service's settings: the host NQN from `--host-nqn` or
/// /etc/nvme/hostnqn; discovery at `--discovery`, else the API's host on
/// NVMe/TCP's port 4420; the node's name from `--node-name`, else its
/// host name.
fn node_options(args: NodeArgs, api: &str) -> Result<weft_csi::NodeOptions, String> {
    let NodeArgs {
        discovery,
        host_nqn,
        state_dir,
        node_name,
        zone,
    } = args;
    let node_name = match node_name {
        Some(name) => name,
        None => std::fs::read_to_string(HOST_NAME_FILE)
            .map(|text| text.trim().to_string())
            .map_err(|e| format!("{HOST_NAME_FILE}: {e}; give --node-name"))?,
    };
    let host_nqn = match host_nqn {
        Some(nqn) => nqn,
        None => std::fs::read_to_string(HOST_NQN_FILE)
            .map(|text| text.trim().to_string())
            .map_err(|e| {
                format!("{HOST_NQN_FILE}: {e}; give --host-nqn (nvme gen-hostnqn makes one)")
            })?,
    };
    // The node's id is its host NQN: the controller tells node ids from
    // other names by the specification's form.
    if weft_control::nqn_form_note(&host_nqn).is_some() {
        return Err(format!(
            "the node's host NQN {host_nqn:?} is not in the NVMe specification's form (nqn.YYYY-MM.domain:name), which a CSI node's id must be; give --host-nqn \"$(nvme gen-hostnqn)\" or fix {HOST_NQN_FILE}"
        ));
    }
    let discovery = discovery.unwrap_or_else(|| {
        let host = api.split("://").last().unwrap_or(api);
        let host = host.rsplit_once(':').map_or(host, |(host, _)| host);
        format!("{host}:4420")
    });
    Ok(weft_csi::NodeOptions {
        host_nqn,
        discovery,
        state_dir,
        node_name,
        zone,
    })
}
