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
}

/// Parses `weft csi --endpoint unix:///csi/csi.sock --mode controller [--api URL]
/// [--api-token-file FILE] [--api-ca FILE]`.
pub fn parse(parser: &mut lexopt::Parser) -> Result<CsiArgs, String> {
    use lexopt::prelude::*;
    let mut endpoint = None;
    let mut mode = None;
    let mut api =
        std::env::var("WEFT_API").unwrap_or_else(|_| weft_api::DEFAULT_API_LISTEN.to_string());
    let mut token_file = None;
    let mut ca_file = std::env::var_os("WEFT_API_CA").map(PathBuf::from);
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
            other => return Err(format!("{}; see weft --help", other.unexpected())),
        }
    }
    Ok(CsiArgs {
        endpoint: endpoint.ok_or("weft csi needs --endpoint unix:///path/to/csi.sock")?,
        mode: mode.ok_or("weft csi needs --mode controller")?,
        api,
        token_file,
        ca_file,
    })
}

/// Serves until the process ends.
pub fn run(args: CsiArgs) -> Result<(), String> {
    let token = crate::cli::api_token(args.token_file)?;
    let api = weft_csi::api::Api::new(&args.api, args.ca_file.as_deref(), token)?;
    let options = weft_csi::Options {
        endpoint: args.endpoint,
        mode: args.mode,
        api,
    };
    weft_csi::serve(options).map_err(|e| e.to_string())
}
