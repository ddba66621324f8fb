//! StorageClass parameters: what a volume is made with (`pool`, `replicas`
//! or `ec` (erasure-coded, `"4+2"`), `thick`, `blockSize`, `encrypted`
//! (at rest, with the nodes' keys)), the QoS limits it gets once made (`iopsMax`,
//! `bwMax`, `readIopsMax`, `readBwMax`, `writeIopsMax`, `writeBwMax`: I/O or
//! bytes per second, as `weft volume set` takes them) and the filesystem
//! the node makes on it when the volume capability names none (`fsType`:
//! ext4 or xfs). Any other parameter is refused, so that a typo is not
//! silently a default.

use serde_json::{json, Map, Value};
use std::collections::HashMap;
use tonic::Status;

/// Every parameter taken, for messages.
const PARAMETERS: [&str; 13] = [
    "pool",
    "replicas",
    "ec",
    "thick",
    "encrypted",
    "blockSize",
    "iopsMax",
    "bwMax",
    "readIopsMax",
    "readBwMax",
    "writeIopsMax",
    "writeBwMax",
    "fsType",
];

/// The volume context key carrying `fsType` to the node.
pub(crate) const FS_TYPE_CONTEXT: &str = "fsType";

/// What applies to a volume once it is made.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Settings {
    /// QoS limits, as the API's `PATCH volumes/{volume}/qos` takes them.
    pub(crate) qos: Map<String, Value>,
    /// The filesystem to make when the capability names none.
    pub(crate) fs_type: Option<String>,
}

/// Adds what `parameters` say about the volume to the API's create `body`;
/// returns what applies once it is made.
pub(crate) fn parse(
    parameters: &HashMap<String, String>,
    body: &mut Value,
) -> Result<Settings, Status> {
    let mut settings = Settings::default();
    for (key, value) in parameters {
        let bad = |what: &str| {
            Status::invalid_argument(format!("parameter {key}: {value:?} is not {what}"))
        };
        let number = || value.parse::<u64>().map_err(|_| bad("a whole number"));
        match key.as_str() {
            "pool" => body["pool"] = json!(value),
            "replicas" => {
                let count: u8 = value.parse().map_err(|_| bad("1, 2 or 3"))?;
                body["replicas"] = json!(count);
            }
            // The API checks the layout (and that replicas is not given too).
            "ec" => body["ec"] = json!(value),
            "thick" => {
                body["thick"] = json!(value.parse::<bool>().map_err(|_| bad("true or false"))?)
            }
            "encrypted" => {
                body["encrypted"] =
                    json!(value.parse::<bool>().map_err(|_| bad("true or false"))?)
            }
            "blockSize" => {
                let size: u32 = value.parse().map_err(|_| bad("512 or 4096"))?;
                body["block_size"] = json!(size);
            }
            "iopsMax" | "bwMax" | "readIopsMax" | "readBwMax" | "writeIopsMax" | "writeBwMax" => {
                settings.qos.insert(qos_field(key), json!(number()?));
            }
            "fsType" | "csi.storage.k8s.io/fstype" => match value.as_str() {
                "ext4" | "xfs" => settings.fs_type = Some(value.clone()),
                _ => return Err(bad("ext4 or xfs")),
            },
            _ => {
                return Err(Status::invalid_argument(format!(
                    "unknown parameter {key}; weft takes {}",
                    PARAMETERS.join(", ")
                )))
            }
        }
    }
    Ok(settings)
}

/// `readIopsMax` as the API names it: `read_iops_max`.
fn qos_field(parameter: &str) -> String {
    let mut field = String::new();
    for c in parameter.chars() {
        if c.is_ascii_uppercase() {
            field.push('_');
        }
        field.push(c.to_ascii_lowercase());
    }
    field
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn parsed(pairs: &[(&str, &str)]) -> Result<(Value, Settings), Status> {
        let parameters = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut body = json!({});
        parse(&parameters, &mut body).map(|settings| (body, settings))
    }

    #[test]
    fn parameters_go_to_the_create_body_the_qos_limits_and_the_context() {
        let (body, settings) = parsed(&[
            ("replicas", "2"),
            ("blockSize", "4096"),
            ("readIopsMax", "15000"),
            ("bwMax", "209715200"),
            ("fsType", "xfs"),
        ])
        .unwrap();
        assert_eq!(body, json!({"replicas": 2, "block_size": 4096}));
        assert_eq!(settings.qos["read_iops_max"], 15000);
        assert_eq!(settings.qos["bw_max"], 209_715_200);
        assert_eq!(settings.fs_type.as_deref(), Some("xfs"));
        let (body, _) = parsed(&[("ec", "4+2"), ("encrypted", "true")]).unwrap();
        assert_eq!(body, json!({"ec": "4+2", "encrypted": true}));
        assert!(parsed(&[("encrypted", "yes")]).is_err());
    }

    #[test]
    fn unknown_parameters_and_bad_values_are_refused() {
        let typo = parsed(&[("replica", "2")]).unwrap_err();
        assert_eq!(typo.code(), Code::InvalidArgument);
        assert!(
            typo.message().contains("unknown parameter replica"),
            "{typo}"
        );
        let bad = parsed(&[("iopsMax", "fast")]).unwrap_err();
        assert!(bad.message().contains("not a whole number"), "{bad}");
        assert_eq!(
            parsed(&[("fsType", "btrfs")]).unwrap_err().code(),
            Code::InvalidArgument
        );
    }
}
