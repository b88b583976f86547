//! The server's answers, over gRPC or framed, as [`Error`]s.

use tonic::{Code, Status};

use crate::backend::frames::CallError;
use crate::{Error, Result};

fn metadata(status: &Status, name: &str) -> Option<String> {
    status
        .metadata()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    ) && metadata(status, "leasehold-code").is_none()
        || metadata(status, "leasehold-code").as_deref() == Some("unavailable")
}

/// Maps a gRPC error for an operation on `key`.
pub(super) fn error(key: &str, status: Status) -> Error {
    if metadata(&status, "leasehold-code").is_none() && is_transient(&status) {
        return Error::Unavailable(status.message().to_string());
    }
    lock_error(
        key,
        metadata(&status, "leasehold-code").as_deref(),
        status.message().to_string(),
        |name| metadata(&status, &format!("leasehold-{name}")),
    )
}

/// Maps the server's error code (and its detail fields, by their gRPC
/// metadata names) to ours; both transports carry the same ones.
fn lock_error(
    key: &str,
    code: Option<&str>,
    message: String,
    field: impl Fn(&str) -> Option<String>,
) -> Error {
    let fence = |name| field(name).and_then(|v| v.parse().ok());
    match code {
        Some("held") => Error::Held {
            key: key.to_string(),
            holder: field("holder").unwrap_or_default(),
            fence: fence("fence"),
        },
        Some("lock_delayed") => Error::lock_delayed(
            key,
            field("delay-left-ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or_default(),
        ),
        Some("stale_fence") => Error::StaleFence {
            presented: fence("presented-fence").unwrap_or(0),
            current: fence("current-fence"),
        },
        Some("wait_timeout") => Error::Timeout {
            key: key.to_string(),
        },
        Some("lease_expired") | Some("lease_not_found") => Error::LeaseLost {
            key: key.to_string(),
            reason: message,
        },
        Some("invalid_argument") => Error::InvalidArgument(message),
        Some("not_leader") | Some("unavailable") | Some("tls_required") => {
            Error::Unavailable(message)
        }
        Some("outcome_unknown") => Error::OutcomeUnknown(message),
        Some("unauthenticated") => Error::Unauthenticated(message),
        Some("permission_denied") => Error::PermissionDenied(message),
        _ => Error::Other(message),
    }
}

impl CallError {
    pub(super) fn into_error(self, key: &str) -> Error {
        match self {
            CallError::Unsent(m) => Error::Unavailable(m),
            CallError::Transport(m) => Error::OutcomeUnknown(m),
            CallError::Server(reply) => lock_error(
                key,
                Some(reply.code.as_str()).filter(|c| !c.is_empty()),
                reply.message,
                |name| reply.details.get(name).cloned(),
            ),
        }
    }
}

/// Whether an error leaves the outcome of a call open: nobody took it, or
/// its answer was lost.
pub(super) fn unsettled<T>(result: &Result<T>) -> bool {
    matches!(
        result,
        Err(Error::Unavailable(_) | Error::OutcomeUnknown(_))
    )
}
