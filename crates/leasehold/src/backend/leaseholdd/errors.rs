//! The server's answers, over gRPC or framed, as [`Error`]s.
//!
//! The server names every refusal with a stable code (`leasehold-code` in
//! gRPC metadata, `code` in a framed `ErrorReply`) and puts the fields a
//! caller acts on beside it (the holder, the fences, the time left). Each
//! code the caller must act on in its own way becomes its own variant:
//!
//! | code | variant | what the caller does |
//! |---|---|---|
//! | `held`, `lock_delayed` | `Held`, `LockDelayed` | try later, or wait |
//! | `stale_fence` | `StaleFence` | nothing to release: it is not held with that token |
//! | `wait_timeout` | `Timeout` | give up, or wait again |
//! | `lease_expired`, `lease_not_found` | `LeaseLost` | stop mutating; take the lock again |
//! | `invalid_argument` | `InvalidArgument` | fix the request |
//! | `unauthenticated`, `permission_denied` | `Unauthenticated`, `PermissionDenied` | fix the token or its role |
//! | `not_leader`, `unavailable` | `Unavailable` | nothing was done: retry (the client has followed the leader it was told of) |
//! | `outcome_unknown` | `OutcomeUnknown` | it may have acted: retry with the same request |
//! | `tls_required` | `TlsRequired` | connect with `https://` |
//! | `resource_exhausted` | `ResourceExhausted` | nothing was done: retry later (renewals are never refused) |
//! | `watch_behind` | `WatchBehind` | list the locks again, then watch again |
//! | `not_found`, `method_not_allowed` | `Unsupported` | the server is older than this client: upgrade it |
//! | `internal`, or a code this client does not know | `Other` | report it |
//!
//! A status without a code was made before the call reached the server (or
//! by this client's own gRPC stack): its gRPC code decides the same way.

use tonic::{Code, Status};

use crate::backend::frames::CallError;
use crate::{Error, Result};

/// What the server is called in errors about it.
const BACKEND: &str = "leaseholdd";

/// What an `Unsupported` says when the server does not know a call.
const OLDER_SERVER: &str = "this call (the server is older than this client: upgrade leaseholdd)";

fn metadata(status: &Status, name: &str) -> Option<String> {
    status
        .metadata()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Maps a gRPC error for an operation on `key` (a prefix, for a watch or a
/// listing).
pub(super) fn error(key: &str, status: Status) -> Error {
    match metadata(&status, "leasehold-code") {
        Some(code) => lock_error(key, Some(&code), status.message().to_string(), |name| {
            metadata(&status, &format!("leasehold-{name}"))
        }),
        None => uncoded(&status),
    }
}

/// A gRPC status that carries no server code: a connection that failed, or
/// a refusal by a gRPC stack (this client's or a proxy's) before the server
/// saw the call.
fn uncoded(status: &Status) -> Error {
    let message = status.message().to_string();
    // A TLS mistake reads the same as over the framed protocol: the same
    // advice, and no retry elsewhere (every node would refuse it alike).
    if let Some(advice) = crate::tls::explain(status) {
        return if advice.contains("use http") {
            Error::InvalidArgument(format!("leaseholdd: {advice}"))
        } else {
            Error::Unauthenticated(format!("leaseholdd: {advice} ({message})"))
        };
    }
    match status.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled => Error::Unavailable(message),
        // tonic's message size limits (a request, or an answer such as a
        // long listing, over them) and a server's own resource limits.
        Code::ResourceExhausted | Code::OutOfRange => Error::ResourceExhausted {
            backend: BACKEND,
            reason: format!("{message}: ask for less at once (a narrower prefix, a smaller page)"),
        },
        Code::Unimplemented => Error::Unsupported {
            backend: BACKEND,
            what: OLDER_SERVER,
        },
        Code::InvalidArgument => Error::InvalidArgument(message),
        Code::Unauthenticated => Error::Unauthenticated(message),
        Code::PermissionDenied => Error::PermissionDenied(message),
        code => Error::Other(format!("leaseholdd: {code:?}: {message}")),
    }
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
        // The endpoints have followed the leader a `not_leader` named for
        // as long as they look for one: what reaches the caller is that no
        // leader took the call, so nothing was done.
        Some("not_leader") | Some("unavailable") => Error::Unavailable(message),
        Some("tls_required") => Error::TlsRequired(message),
        Some("resource_exhausted") => Error::ResourceExhausted {
            backend: BACKEND,
            reason: message,
        },
        Some("watch_behind") => Error::WatchBehind {
            prefix: key.to_string(),
        },
        Some("not_found") | Some("method_not_allowed") => Error::Unsupported {
            backend: BACKEND,
            what: OLDER_SERVER,
        },
        Some("outcome_unknown") => Error::OutcomeUnknown(message),
        Some("unauthenticated") => Error::Unauthenticated(message),
        Some("permission_denied") => Error::PermissionDenied(message),
        // `internal` (the server failed in a way no caller can fix), or a
        // code from a newer server: nothing to act on but to report it.
        Some(code) => Error::Other(format!("leaseholdd ({code}): {message}")),
        None => Error::Other(format!("leaseholdd: {message}")),
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

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_proto::v1 as pb;
    use tonic::metadata::MetadataValue;

    /// A status as the server sends it: its gRPC code, the `leasehold-code`
    /// and the detail fields.
    fn coded(
        code: Code,
        leasehold_code: &'static str,
        details: &[(&'static str, &'static str)],
    ) -> Status {
        let mut status = Status::new(code, format!("the server says {leasehold_code}"));
        let md = status.metadata_mut();
        md.insert("leasehold-code", MetadataValue::from_static(leasehold_code));
        for (name, value) in details {
            let name = format!("leasehold-{name}");
            let name = tonic::metadata::MetadataKey::from_bytes(name.as_bytes()).expect("name");
            md.insert(name, MetadataValue::from_static(value));
        }
        status
    }

    fn framed(code: &str, details: &[(&str, &str)]) -> CallError {
        CallError::Server(pb::ErrorReply {
            code: code.to_string(),
            message: format!("the server says {code}"),
            details: details
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    #[test]
    fn every_code_a_caller_acts_on_is_a_variant_of_its_own() {
        let cases = [
            (
                coded(
                    Code::FailedPrecondition,
                    "held",
                    &[("holder", "b"), ("fence", "7")],
                ),
                Error::Held {
                    key: "k".into(),
                    holder: "b".into(),
                    fence: Some(7),
                },
            ),
            (
                coded(
                    Code::FailedPrecondition,
                    "lock_delayed",
                    &[("delay-left-ms", "250")],
                ),
                Error::LockDelayed {
                    key: "k".into(),
                    left_ms: 250,
                },
            ),
            (
                coded(
                    Code::FailedPrecondition,
                    "stale_fence",
                    &[("presented-fence", "3"), ("current-fence", "9")],
                ),
                Error::StaleFence {
                    presented: 3,
                    current: Some(9),
                },
            ),
            (
                coded(Code::DeadlineExceeded, "wait_timeout", &[]),
                Error::Timeout { key: "k".into() },
            ),
            (
                coded(Code::Unavailable, "tls_required", &[]),
                Error::TlsRequired("the server says tls_required".into()),
            ),
            (
                coded(Code::Aborted, "watch_behind", &[]),
                Error::WatchBehind { prefix: "k".into() },
            ),
            (
                coded(Code::Unimplemented, "not_found", &[]),
                Error::Unsupported {
                    backend: "leaseholdd",
                    what: OLDER_SERVER,
                },
            ),
            (
                coded(
                    Code::Unavailable,
                    "not_leader",
                    &[("leader", "10.0.0.2:7419")],
                ),
                Error::Unavailable("the server says not_leader".into()),
            ),
            (
                coded(Code::Unavailable, "outcome_unknown", &[]),
                Error::OutcomeUnknown("the server says outcome_unknown".into()),
            ),
            (
                coded(Code::Internal, "internal", &[]),
                Error::Other("leaseholdd (internal): the server says internal".into()),
            ),
        ];
        for (status, expected) in cases {
            let shown = format!("{status:?}");
            assert_eq!(error("k", status), expected, "{shown}");
        }
    }

    /// The server's refusal names its limit and what to do; the error says
    /// it once, with nothing repeated after it.
    #[test]
    fn a_refusal_for_a_limit_gives_its_advice_once() {
        let mut refused = Status::resource_exhausted(
            "the node is at its limit of 3 leases (--max-leases; 3 live): revoke leases or raise the limit",
        );
        refused.metadata_mut().insert(
            "leasehold-code",
            MetadataValue::from_static("resource_exhausted"),
        );
        let text = error("k", refused).to_string();
        assert_eq!(
            text,
            "the leaseholdd store refused it for a limit: the node is at its limit of 3 leases (--max-leases; 3 live): revoke leases or raise the limit"
        );
        assert_eq!(text.matches("raise the limit").count(), 1, "{text}");
    }

    #[test]
    fn a_status_without_a_code_is_judged_by_its_grpc_code() {
        let too_large = Status::out_of_range(
            "Error, decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes",
        );
        assert!(matches!(
            error("k", too_large),
            Error::ResourceExhausted {
                backend: "leaseholdd",
                ..
            }
        ));
        assert!(matches!(
            error("k", Status::resource_exhausted("too many streams")),
            Error::ResourceExhausted { .. }
        ));
        assert_eq!(
            error("k", Status::unimplemented("unknown method")),
            Error::Unsupported {
                backend: "leaseholdd",
                what: OLDER_SERVER,
            }
        );
        assert_eq!(
            error("k", Status::unavailable("connection refused")),
            Error::Unavailable("connection refused".into())
        );
        assert!(matches!(
            error("k", Status::data_loss("?")),
            Error::Other(_)
        ));
    }

    #[test]
    fn framed_replies_map_as_grpc_statuses_do() {
        assert_eq!(
            framed("held", &[("holder", "b"), ("fence", "7")]).into_error("k"),
            Error::Held {
                key: "k".into(),
                holder: "b".into(),
                fence: Some(7),
            }
        );
        assert_eq!(
            framed("tls_required", &[]).into_error("k"),
            Error::TlsRequired("the server says tls_required".into())
        );
        assert_eq!(
            framed("watch_behind", &[]).into_error("locks/"),
            Error::WatchBehind {
                prefix: "locks/".into()
            }
        );
        assert!(matches!(
            framed("a_code_from_a_newer_server", &[]).into_error("k"),
            Error::Other(m) if m.contains("a_code_from_a_newer_server")
        ));
        assert_eq!(
            CallError::Unsent("refused".into()).into_error("k"),
            Error::Unavailable("refused".into())
        );
        assert_eq!(
            CallError::Transport("reset".into()).into_error("k"),
            Error::OutcomeUnknown("reset".into())
        );
    }
}
