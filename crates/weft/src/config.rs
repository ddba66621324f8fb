//! The serve configuration: the TOML file format, its defaults (used when no
//! file is given), and validation with errors that name the file, the field
//! and what is expected. weft-node turns the subsystems it declares into the
//! data plane's exports.

use crate::limits::{LimitsFile, NodeLimits};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use weft_node::exports::{BackendSpec, NamespaceSpec, SubsystemSpec};

/// NQN of the subsystem served by default.
pub const DEFAULT_NQN: &str = "nqn.2026-11.io.weft:default";
/// Default listen address (NVMe/TCP's IANA port, discovery and I/O together).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4420";
/// Size of the default namespace's sparse file.
pub const DEFAULT_SIZE_BYTES: u64 = 4 << 30;

/// A configuration error: where, and what is expected.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {field}: {message}")]
pub struct ConfigError {
    origin: String,
    field: String,
    message: String,
}

impl ConfigError {
    pub(crate) fn new(
        origin: &str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            origin: origin.to_string(),
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    data_dir: Option<PathBuf>,
    listen: Option<Vec<String>>,
    #[serde(default)]
    referrals: Vec<String>,
    api_listen: Option<String>,
    api_token_file: Option<PathBuf>,
    api_tls_cert: Option<PathBuf>,
    api_tls_key: Option<PathBuf>,
    kek_file: Option<PathBuf>,
    kek_command: Option<String>,
    reactors: Option<usize>,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    subsystem: Vec<SubsystemFile>,
    cluster: Option<crate::cluster::ClusterFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubsystemFile {
    nqn: String,
    model: Option<String>,
    #[serde(default)]
    namespace: Vec<NamespaceFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceFile {
    nsid: Option<u32>,
    backend: Backend,
    path: Option<PathBuf>,
    size: Option<SizeText>,
    block_size: Option<u32>,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Backend {
    File,
    Ram,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeText {
    Bytes(u64),
    Text(String),
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// Where the node identity and default files live.
    pub data_dir: PathBuf,
    /// Listen addresses.
    pub listen: Vec<SocketAddr>,
    /// Other targets' discovery controllers, listed as referrals.
    pub referrals: Vec<SocketAddr>,
    /// Control API address (None: the default).
    pub api_listen: Option<SocketAddr>,
    /// The API's bearer token file (None: DATA_DIR/api-token).
    pub api_token_file: Option<PathBuf>,
    /// TLS for the API: certificate chain and key PEM files (None: plain HTTP).
    pub api_tls: Option<(PathBuf, PathBuf)>,
    /// Where the key-encryption keys of encrypted volumes come from.
    pub keys: Option<weft_node::keys::KeySource>,
    /// Reactor threads.
    pub reactors: usize,
    /// What network peers may hold.
    pub limits: NodeLimits,
    /// Subsystems.
    pub subsystems: Vec<SubsystemSpec>,
    /// The cluster this node is a member of (None: a single node).
    pub cluster: Option<crate::cluster::ClusterSpec>,
}

impl ServeConfig {
    /// The configuration used without a file: one file-backed namespace.
    pub fn default_with(data_dir: PathBuf) -> ServeConfig {
        let path = data_dir.join("default.img");
        ServeConfig {
            listen: vec![DEFAULT_LISTEN.parse().expect("valid default address")],
            referrals: Vec::new(),
            api_listen: None,
            api_token_file: None,
            api_tls: None,
            keys: None,
            reactors: default_reactors(),
            limits: NodeLimits::default(),
            subsystems: vec![SubsystemSpec {
                nqn: DEFAULT_NQN.to_string(),
                model: "weft".to_string(),
                namespaces: vec![NamespaceSpec {
                    nsid: 1,
                    backend: BackendSpec::File {
                        path,
                        size_bytes: Some(DEFAULT_SIZE_BYTES),
                    },
                    block_size: 4096,
                }],
            }],
            data_dir,
            cluster: None,
        }
    }

    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<ServeConfig, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| {
            ConfigError::new(&origin, "file", format!("cannot read it: {error}"))
        })?;
        ServeConfig::parse(&text, &origin)
    }

    /// Parses and validates configuration text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<ServeConfig, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|error| {
            let message = error.message().to_string();
            let location = error
                .span()
                .map(|span| line_of(text, span.start))
                .map_or(String::from("syntax"), |line| format!("line {line}"));
            ConfigError::new(origin, location, message)
        })?;
        validate(file, origin)
    }
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte.min(text.len())].matches('\n').count() + 1
}

fn default_reactors() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn validate(file: ConfigFile, origin: &str) -> Result<ServeConfig, ConfigError> {
    let data_dir = file.data_dir.unwrap_or_else(|| PathBuf::from("weft-data"));
    let listen_text = file
        .listen
        .unwrap_or_else(|| vec![DEFAULT_LISTEN.to_string()]);
    let listen = listen_text
        .iter()
        .enumerate()
        .map(|(index, text)| {
            parse_listen(text)
                .map_err(|message| ConfigError::new(origin, format!("listen[{index}]"), message))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if listen.is_empty() {
        return Err(ConfigError::new(
            origin,
            "listen",
            "at least one address is needed, e.g. [\"127.0.0.1:4420\"]",
        ));
    }
    let referrals = file
        .referrals
        .iter()
        .enumerate()
        .map(|(index, text)| {
            parse_listen(text)
                .map_err(|message| ConfigError::new(origin, format!("referrals[{index}]"), message))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let api_listen = file
        .api_listen
        .as_deref()
        .map(|text| {
            parse_listen(text).map_err(|message| ConfigError::new(origin, "api_listen", message))
        })
        .transpose()?;
    let api_tls = match (file.api_tls_cert, file.api_tls_key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(ConfigError::new(
                origin,
                "api_tls_cert",
                "TLS needs both api_tls_cert and api_tls_key (PEM files)",
            ))
        }
    };
    let limits = file.limits.validate(origin)?;
    let reactors = file.reactors.unwrap_or_else(default_reactors);
    if !(1..=256).contains(&reactors) {
        return Err(ConfigError::new(
            origin,
            "reactors",
            format!("{reactors} is not between 1 and 256"),
        ));
    }
    let cluster = file
        .cluster
        .map(|cluster| cluster.validate(origin))
        .transpose()?;
    if file.subsystem.is_empty() && cluster.is_none() {
        return Err(ConfigError::new(
            origin,
            "subsystem",
            "no [[subsystem]] is declared; declare at least one with a [[subsystem.namespace]]",
        ));
    }
    let mut subsystems = Vec::new();
    for (index, subsystem) in file.subsystem.into_iter().enumerate() {
        let field = format!("subsystem[{index}]");
        let spec = validate_subsystem(subsystem, origin, &field)?;
        if subsystems.iter().any(|s: &SubsystemSpec| s.nqn == spec.nqn) {
            return Err(ConfigError::new(
                origin,
                format!("{field}.nqn"),
                format!("{} is declared twice", spec.nqn),
            ));
        }
        subsystems.push(spec);
    }
    Ok(ServeConfig {
        data_dir,
        listen,
        referrals,
        api_listen,
        api_token_file: file.api_token_file,
        api_tls,
        keys: key_source(file.kek_file, file.kek_command)
            .map_err(|message| ConfigError::new(origin, "kek_file", message))?,
        reactors,
        limits,
        subsystems,
        cluster,
    })
}

/// The key source a file or command line names (at most one of the two).
pub fn key_source(
    file: Option<PathBuf>,
    command: Option<String>,
) -> Result<Option<weft_node::keys::KeySource>, String> {
    use weft_node::keys::KeySource;
    match (file, command) {
        (Some(_), Some(_)) => Err("give a key file or a key command, not both".into()),
        (Some(path), None) => Ok(Some(KeySource::File(path))),
        (None, Some(command)) => Ok(Some(KeySource::Command(command))),
        (None, None) => Ok(None),
    }
}

/// Parses an `ADDRESS:PORT` listen address.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        format!("\"{text}\" is not an address with a port, e.g. 127.0.0.1:4420 or [::1]:4420")
    })
}

fn validate_subsystem(
    subsystem: SubsystemFile,
    origin: &str,
    field: &str,
) -> Result<SubsystemSpec, ConfigError> {
    check_nqn(&subsystem.nqn)
        .map_err(|message| ConfigError::new(origin, format!("{field}.nqn"), message))?;
    if subsystem.namespace.is_empty() {
        return Err(ConfigError::new(
            origin,
            format!("{field}.namespace"),
            "a subsystem needs at least one [[subsystem.namespace]]",
        ));
    }
    let mut namespaces: Vec<NamespaceSpec> = Vec::new();
    for (index, namespace) in subsystem.namespace.into_iter().enumerate() {
        let field = format!("{field}.namespace[{index}]");
        let nsid = namespace.nsid.unwrap_or(index as u32 + 1);
        if nsid == 0 || nsid == u32::MAX {
            return Err(ConfigError::new(
                origin,
                format!("{field}.nsid"),
                format!("{nsid} is reserved; use 1 to 4294967294"),
            ));
        }
        if namespaces.iter().any(|ns| ns.nsid == nsid) {
            return Err(ConfigError::new(
                origin,
                format!("{field}.nsid"),
                format!("namespace {nsid} is declared twice in this subsystem"),
            ));
        }
        let block_size = namespace.block_size.unwrap_or(4096);
        if !matches!(block_size, 512 | 4096) {
            return Err(ConfigError::new(
                origin,
                format!("{field}.block_size"),
                format!("{block_size} is not supported; use 512 or 4096"),
            ));
        }
        let size_bytes = namespace
            .size
            .map(|size| {
                parse_size(&size)
                    .map_err(|message| ConfigError::new(origin, format!("{field}.size"), message))
            })
            .transpose()?;
        let backend = match (namespace.backend, namespace.path, size_bytes) {
            (Backend::File, Some(path), size_bytes) => BackendSpec::File { path, size_bytes },
            (Backend::File, None, _) => {
                return Err(ConfigError::new(
                    origin,
                    format!("{field}.path"),
                    "backend \"file\" needs path = \"/path/to/file-or-device\"",
                ))
            }
            (Backend::Ram, None, Some(size_bytes)) => BackendSpec::Ram { size_bytes },
            (Backend::Ram, None, None) => {
                return Err(ConfigError::new(
                    origin,
                    format!("{field}.size"),
                    "backend \"ram\" needs a size, e.g. size = \"1GiB\"",
                ))
            }
            (Backend::Ram, Some(_), _) => {
                return Err(ConfigError::new(
                    origin,
                    format!("{field}.path"),
                    "backend \"ram\" takes no path",
                ))
            }
        };
        if let BackendSpec::File {
            size_bytes: Some(size),
            ..
        }
        | BackendSpec::Ram { size_bytes: size } = &backend
        {
            if *size == 0 || size % u64::from(block_size) != 0 {
                return Err(ConfigError::new(
                    origin,
                    format!("{field}.size"),
                    format!(
                        "{size} bytes is not a positive multiple of the block size {block_size}"
                    ),
                ));
            }
        }
        namespaces.push(NamespaceSpec {
            nsid,
            backend,
            block_size,
        });
    }
    namespaces.sort_by_key(|ns| ns.nsid);
    Ok(SubsystemSpec {
        nqn: subsystem.nqn,
        model: subsystem.model.unwrap_or_else(|| "weft".to_string()),
        namespaces,
    })
}

fn check_nqn(nqn: &str) -> Result<(), String> {
    weft_control::check_nqn(nqn).map_err(|why| format!("subsystem {nqn:?}: {why}"))?;
    if let Some(note) = weft_control::nqn_form_note(nqn) {
        log::warn!("{note}");
    }
    if nqn == weft_proto::target::DISCOVERY_NQN {
        return Err("the discovery NQN is served automatically; choose another name".to_string());
    }
    Ok(())
}

fn parse_size(size: &SizeText) -> Result<u64, String> {
    match size {
        SizeText::Bytes(bytes) => Ok(*bytes),
        SizeText::Text(text) => parse_size_text(text),
    }
}

/// Parses sizes like `4096`, `512MiB`, `4GiB`, `1T`, `4k`, `128k` (binary
/// units, any case; the config, the admin commands and `weft bench` share it).
pub fn parse_size_text(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier: u64 = match unit.trim_end_matches('b').trim_end_matches('i') {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => {
            return Err(format!(
                "\"{text}\" is not a size: use bytes or a number with KiB, MiB, GiB or TiB"
            ))
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| {
            format!("\"{text}\" is not a size: use bytes or a number with KiB, MiB, GiB or TiB")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
data_dir = "/tmp/weft-test"
listen = ["127.0.0.1:4420", "[::1]:4421"]
reactors = 2

[[subsystem]]
nqn = "nqn.2026-11.io.weft:a"

[[subsystem.namespace]]
backend = "file"
path = "/tmp/weft-test/a.img"
size = "512MiB"

[[subsystem.namespace]]
nsid = 5
backend = "ram"
size = "64MiB"
block_size = 512
"#;

    #[test]
    fn parses_a_full_file() {
        let config = ServeConfig::parse(FULL, "weft.toml").unwrap();
        assert_eq!(config.listen.len(), 2);
        assert_eq!(config.reactors, 2);
        let namespaces = &config.subsystems[0].namespaces;
        assert_eq!(namespaces[0].nsid, 1);
        assert_eq!(
            namespaces[0].backend,
            BackendSpec::File {
                path: "/tmp/weft-test/a.img".into(),
                size_bytes: Some(512 << 20)
            }
        );
        assert_eq!(
            namespaces[1].backend,
            BackendSpec::Ram {
                size_bytes: 64 << 20
            }
        );
        assert_eq!(namespaces[1].block_size, 512);
    }

    fn error_of(text: &str) -> String {
        ServeConfig::parse(text, "weft.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn errors_name_file_field_and_expectation() {
        let bad_size = FULL.replace("\"64MiB\"", "\"64 lots\"");
        assert_eq!(error_of(&bad_size), "weft.toml: subsystem[0].namespace[1].size: \"64 lots\" is not a size: use bytes or a number with KiB, MiB, GiB or TiB");
        let bad_nqn = FULL.replace("nqn.2026-11.io.weft:a", "weft a");
        let message = error_of(&bad_nqn);
        assert!(
            message.starts_with(
                "weft.toml: subsystem[0].nqn: subsystem \"weft a\": ' ' is not allowed in an NQN"
            ),
            "{message}"
        );
        // Any name Linux nvmet accepts (blktests names its subsystems so).
        let nvmet_name = FULL.replace("nqn.2026-11.io.weft:a", "blktests-subsystem-1");
        assert!(ServeConfig::parse(&nvmet_name, "weft.toml").is_ok());
        let unknown = FULL.replace("reactors = 2", "reactor = 2");
        let message = error_of(&unknown);
        assert!(
            message.starts_with("weft.toml: line 4: unknown field `reactor`"),
            "{message}"
        );
        let no_path = FULL.replace("path = \"/tmp/weft-test/a.img\"\n", "");
        assert!(error_of(&no_path).contains("namespace[0].path: backend \"file\" needs path"));
        let bad_listen = FULL.replace("[::1]:4421", "localhost");
        assert!(error_of(&bad_listen)
            .starts_with("weft.toml: listen[1]: \"localhost\" is not an address with a port"));
        let duplicate = FULL.replace("nsid = 5", "nsid = 1");
        assert!(error_of(&duplicate).contains("namespace 1 is declared twice"));
        let odd = FULL.replace("\"64MiB\"", "1000");
        assert!(error_of(&odd).contains("not a positive multiple of the block size 512"));
    }

    #[test]
    fn default_serves_one_file_namespace() {
        let config = ServeConfig::default_with("weft-data".into());
        assert_eq!(config.subsystems[0].nqn, DEFAULT_NQN);
        assert_eq!(config.listen[0].to_string(), DEFAULT_LISTEN);
    }
}
