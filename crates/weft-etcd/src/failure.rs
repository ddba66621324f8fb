//! What an etcd client error means for weft: [`Failure`] sorts the errors
//! of etcd-client (gRPC statuses with etcd's messages, transport errors)
//! into the few cases the store treats differently, and [`Context`] turns
//! them into [`StoreError`]s that say what to check. It does not retry
//! anything.

use tonic::Code;
use weft_control::StoreError;

/// An etcd error, sorted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Failure {
    /// No member answered (connection refused or broken, no leader, timed
    /// out): worth retrying later.
    #[error("{0}")]
    Unreachable(String),
    /// The lease named by the request does not exist (any more).
    #[error("requested lease not found")]
    LeaseNotFound,
    /// The revision asked for has been compacted away.
    #[error("required revision has been compacted")]
    Compacted,
    /// The revision asked for is newer than the store's.
    #[error("required revision is a future revision")]
    FutureRevision,
    /// Wrong user name or password.
    #[error("authentication failed")]
    AuthenticationFailed,
    /// Authentication is enabled and no user was configured.
    #[error("authentication required")]
    AuthenticationRequired,
    /// The user may not touch these keys.
    #[error("permission denied")]
    PermissionDenied,
    /// The TLS handshake failed on a certificate (not worth retrying).
    #[error("{0}")]
    Tls(String),
    /// Anything else etcd refused, in its words.
    #[error("{0}")]
    Refused(String),
}

impl From<etcd_client::Error> for Failure {
    fn from(error: etcd_client::Error) -> Failure {
        match error {
            etcd_client::Error::GRpcStatus(status) => {
                let failure = Failure::of_status(status.code(), status.message());
                match (failure, std::error::Error::source(&status)) {
                    // tonic's "tcp connect error" says why only in its sources.
                    (Failure::Unreachable(cause), Some(source)) => {
                        Failure::unreachable(with_root_cause(cause, source))
                    }
                    (failure, _) => failure,
                }
            }
            etcd_client::Error::TransportError(error) => {
                Failure::unreachable(with_root_cause(error.to_string(), &error))
            }
            etcd_client::Error::IoError(error) => Failure::Unreachable(error.to_string()),
            other => Failure::Refused(other.to_string()),
        }
    }
}

impl Failure {
    /// A failure to reach a member, unless it was its certificate.
    fn unreachable(cause: String) -> Failure {
        if cause.to_lowercase().contains("certificate") {
            Failure::Tls(cause)
        } else {
            Failure::Unreachable(cause)
        }
    }

    /// Sorts a gRPC status by its code and etcd's message (etcd's error
    /// values are only distinguished by their text).
    pub(crate) fn of_status(code: Code, message: &str) -> Failure {
        let etcd = message.trim_start_matches("etcdserver: ");
        match code {
            Code::OutOfRange if etcd.contains("has been compacted") => Failure::Compacted,
            Code::OutOfRange if etcd.contains("future revision") => Failure::FutureRevision,
            Code::NotFound if etcd.contains("lease not found") => Failure::LeaseNotFound,
            Code::PermissionDenied => Failure::PermissionDenied,
            Code::InvalidArgument if etcd.contains("authentication failed") => {
                Failure::AuthenticationFailed
            }
            Code::InvalidArgument if etcd.contains("user name is empty") => {
                Failure::AuthenticationRequired
            }
            Code::Unauthenticated => Failure::AuthenticationFailed,
            // Broken connections surface as Unknown or Internal (h2
            // errors), the rest are etcd's own "no leader", "request timed
            // out" and tonic's connection errors.
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown
            | Code::Internal => Failure::Unreachable(if etcd.is_empty() {
                format!("{code:?}")
            } else {
                etcd.to_string()
            }),
            _ => Failure::Refused(etcd.to_string()),
        }
    }
}

/// `text` followed by the innermost source of `error`: the useful part of
/// a transport error ("Connection refused"), under layers that repeat "tcp
/// connect error".
fn with_root_cause(text: String, error: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost = error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    let root = innermost.to_string();
    if text.contains(&root) {
        text
    } else {
        format!("{text}: {root}")
    }
}

/// What a store's messages name.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    /// The endpoints, comma-separated.
    pub endpoints: String,
    /// The key prefix.
    pub prefix: String,
    /// The etcd user, if any.
    pub user: Option<String>,
}

impl Context {
    /// Where the store lives, for [`weft_control::Store::location`].
    pub(crate) fn location(&self) -> String {
        format!("etcd {}", self.endpoints)
    }

    /// The store is unreachable because of `cause`.
    pub(crate) fn unreachable(&self, cause: &str) -> StoreError {
        StoreError::Unavailable {
            location: self.location(),
            message: format!(
                "the cluster store is unreachable (etcd endpoints {}): {cause}",
                self.endpoints
            ),
        }
    }

    /// The error for `failure` where no case needs special handling.
    pub(crate) fn error(&self, failure: Failure) -> StoreError {
        let message = match failure {
            Failure::Unreachable(cause) => return self.unreachable(&cause),
            Failure::AuthenticationFailed => match &self.user {
                Some(user) => format!(
                    "etcd refused user {user:?}: authentication failed, wrong user name or password"
                ),
                None => "etcd refused the request: authentication failed".to_string(),
            },
            Failure::AuthenticationRequired => {
                "etcd requires a user and password (its authentication is enabled); configure them"
                    .to_string()
            }
            Failure::Tls(cause) => format!(
                "TLS with etcd at {} failed: {cause}; check the CA and client certificates",
                self.endpoints
            ),
            Failure::PermissionDenied => format!(
                "etcd user {:?} may not read or write the keys under {}: permission denied",
                self.user.as_deref().unwrap_or(""),
                self.prefix
            ),
            other => format!("etcd refused the request: {other}"),
        };
        StoreError::Unavailable {
            location: self.location(),
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_are_sorted_by_code_and_message() {
        let cases = [
            (
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
                Failure::Compacted,
            ),
            (
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
                Failure::FutureRevision,
            ),
            (
                Code::NotFound,
                "etcdserver: requested lease not found",
                Failure::LeaseNotFound,
            ),
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
                Failure::AuthenticationFailed,
            ),
            (
                Code::InvalidArgument,
                "etcdserver: user name is empty",
                Failure::AuthenticationRequired,
            ),
            (
                Code::PermissionDenied,
                "etcdserver: permission denied",
                Failure::PermissionDenied,
            ),
            (
                Code::Unavailable,
                "etcdserver: no leader",
                Failure::Unreachable("no leader".into()),
            ),
            (
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
                Failure::Refused("too many operations in txn request".into()),
            ),
        ];
        for (code, message, expected) in cases {
            assert_eq!(Failure::of_status(code, message), expected, "{message}");
        }
    }

    #[test]
    fn messages_name_the_endpoints_and_the_user() {
        let context = Context {
            endpoints: "http://127.0.0.1:1,http://127.0.0.1:2".into(),
            prefix: "/weft/".into(),
            user: Some("weft".into()),
        };
        let error = context.error(Failure::Unreachable("connection refused".into()));
        let text = error.to_string();
        assert!(text.contains("the cluster store is unreachable"), "{text}");
        assert!(
            text.contains("http://127.0.0.1:1,http://127.0.0.1:2"),
            "{text}"
        );
        assert!(text.contains("connection refused"), "{text}");
        let text = context.error(Failure::AuthenticationFailed).to_string();
        assert!(text.contains("refused user \"weft\""), "{text}");
        let text = context.error(Failure::PermissionDenied).to_string();
        assert!(text.contains("/weft/"), "{text}");
    }
}
