//! weft's HTTP API as the plugin calls it: blocking calls on tokio's
//! blocking pool, answers as JSON, and the API's errors kept whole (status
//! and code) so that `errors` maps each to its CSI code once.

use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// An API error: the HTTP status and the API's code and message, or no
/// status when the API could not be reached.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The HTTP status (none: not reached).
    pub status: Option<u16>,
    /// The API's machine-readable code (`not_found`, `exists`, `pool_full`...).
    pub code: String,
    /// What was wrong, as the API says it.
    pub message: String,
}

/// The API of a weft node (or cluster).
#[derive(Clone)]
pub struct Api {
    endpoint: Arc<weft_http::Endpoint>,
    token: Option<Arc<str>>,
}

const TIMEOUT: Duration = Duration::from_secs(120);

impl Api {
    /// The API at `url` (`http://host:port`, `https://...` trusting `ca_file`),
    /// called with bearer `token`.
    pub fn new(
        url: &str,
        ca_file: Option<&std::path::Path>,
        token: Option<String>,
    ) -> Result<Api, String> {
        Ok(Api {
            endpoint: Arc::new(weft_http::Endpoint::parse(url, ca_file)?),
            token: token.map(Arc::from),
        })
    }

    /// The bearer token it calls with, if any.
    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// `method` on `/api/v1/{path}` with `body`; the JSON answer of a 2xx.
    pub async fn call(
        &self,
        method: &'static str,
        path: String,
        body: Option<Value>,
    ) -> Result<Value, ApiError> {
        let api = self.clone();
        let answer =
            tokio::task::spawn_blocking(move || api.call_blocking(method, &path, body.as_ref()))
                .await
                .map_err(|e| unreachable_error(&e.to_string()))?;
        answer
    }

    fn call_blocking(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let body = body.map(|b| b.to_string().into_bytes());
        let path = format!("/api/v1/{path}");
        let (status, answer) = weft_http::call(
            &self.endpoint,
            self.token.as_deref(),
            method,
            &path,
            body.as_deref(),
            TIMEOUT,
        )
        .map_err(|e| {
            unreachable_error(&format!(
                "cannot reach the weft API at {}: {e}",
                self.endpoint.address
            ))
        })?;
        let value: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(value);
        }
        Err(ApiError {
            status: Some(status),
            code: value["code"].as_str().unwrap_or_default().to_string(),
            message: value["message"]
                .as_str()
                .map_or_else(|| format!("the weft API answered {status}"), String::from),
        })
    }
}

fn unreachable_error(message: &str) -> ApiError {
    ApiError {
        status: None,
        code: String::new(),
        message: message.to_string(),
    }
}
