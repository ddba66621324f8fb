//! The plugin's errors, and the one place API errors become the gRPC codes
//! the CSI spec names for each case.

use crate::api::ApiError;
use tonic::{Code, Status};

/// Why the plugin could not start.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// The endpoint is not a Unix socket path.
    #[error("endpoint {0:?}: give unix:///path/to/csi.sock")]
    Endpoint(String),
    /// The socket could not be made.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket's path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("the CSI server failed: {0}")]
    Serve(String),
}

/// An API error as the CSI caller sees it.
pub(crate) fn status(error: &ApiError) -> Status {
    let code = match (error.status, error.code.as_str()) {
        (None, _) | (Some(503), _) => Code::Unavailable,
        (Some(404), _) => Code::NotFound,
        (Some(409), _) => Code::AlreadyExists,
        (Some(507), _) | (_, "pool_full") => Code::ResourceExhausted,
        (Some(400), _) => Code::InvalidArgument,
        (Some(401 | 403), _) => Code::Unauthenticated,
        _ => Code::Internal,
    };
    Status::new(code, error.message.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_take_the_codes_the_spec_names() {
        let error = |status: Option<u16>, code: &str| ApiError {
            status,
            code: code.into(),
            message: "m".into(),
        };
        assert_eq!(
            status(&error(Some(404), "not_found")).code(),
            Code::NotFound
        );
        assert_eq!(
            status(&error(Some(409), "exists")).code(),
            Code::AlreadyExists
        );
        assert_eq!(
            status(&error(Some(507), "pool_full")).code(),
            Code::ResourceExhausted
        );
        assert_eq!(status(&error(None, "")).code(), Code::Unavailable);
        assert_eq!(status(&error(Some(500), "internal")).code(), Code::Internal);
    }
}
