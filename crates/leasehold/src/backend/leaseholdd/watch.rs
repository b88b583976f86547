//! A watch that outlives the node it streams from.
//!
//! Every node applies every entry and makes the same events, each at the
//! same position (the log index of its entry, and its ordinal there), so a
//! watch can go on from any node after the last event it delivered:
//!
//! 1. **Resume, never restart.** A stream that breaks (the node was killed,
//!    stopped, cut off, or closed the stream) is opened again on the next
//!    endpoint after the position of the last event delivered. Nothing is
//!    lost and nothing repeats.
//! 2. **Or say so.** A node that no longer has every event after that
//!    position answers `watch_behind`, which ends the stream with
//!    [`crate::Error::WatchBehind`]: the caller lists again and watches from now.
//! 3. **Bounded.** Reopening tries the endpoints in turn, with a pause
//!    growing to a second, for [`RESUME_FOR`]; past that the stream ends with
//!    the last error (`Unavailable`): no endpoint could be reached.
//! 4. **Only what is safe to resume is resumed.** A refusal with a code
//!    (`permission_denied`, `unauthenticated`, `invalid_argument`,
//!    `watch_behind`) ends the stream with it: asking another node changes
//!    nothing.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use leasehold_proto::v1 as pb;
use tonic::Streaming;

use super::errors::error;
use crate::backend::endpoints::{Endpoints, Route, FAILOVER_WAIT};
use crate::backend::LockEvent;
use crate::Result;

/// How long a broken watch looks for a node to resume on.
pub(super) const RESUME_FOR: Duration = Duration::from_secs(30);

/// The pause before the `n`th attempt to reopen: 50 ms, doubling, at most 1 s.
fn pause(n: u32) -> Duration {
    Duration::from_millis(50u64.saturating_mul(1 << n.min(5)).min(1000))
}

/// Where a watch stands.
struct Watching {
    endpoints: Arc<Endpoints>,
    prefix: String,
    /// The position of the last event delivered.
    after: Option<(u64, u32)>,
    /// The stream and the endpoint it comes from; `None` while reopening.
    stream: Option<(Streaming<pb::LockEvent>, Arc<Route>)>,
}

/// Whether a broken stream may go on elsewhere: it broke in transport (no
/// code from the server), or the node said it cannot serve now.
fn resumable(status: &tonic::Status) -> bool {
    match status
        .metadata()
        .get("leasehold-code")
        .and_then(|v| v.to_str().ok())
    {
        // A TLS refusal has no code either, and is the same at every node.
        None => crate::tls::explain(status).is_none(),
        Some(code) => matches!(code, "unavailable" | "not_leader"),
    }
}

/// Opens a stream of events under `prefix` after `after` at the current
/// endpoint. (Not a method: a `&Watching` held across the call would need
/// the stream it owns to be `Sync`.)
async fn open(
    endpoints: &Endpoints,
    prefix: String,
    after: Option<(u64, u32)>,
) -> std::result::Result<(Streaming<pb::LockEvent>, Arc<Route>), tonic::Status> {
    let route = endpoints.route();
    let request = pb::WatchRequest {
        prefix,
        after_index: after.map(|(index, _)| index),
        after_seq: after.map(|(_, seq)| seq),
    };
    let stream = route.rpc.clone().watch(request).await?.into_inner();
    Ok((stream, route))
}

impl Watching {
    /// Opens the stream on the first endpoint that takes it, for up to
    /// `within`.
    async fn reopen(&mut self, within: Duration) -> Result<()> {
        let give_up = tokio::time::Instant::now() + within;
        let mut attempt = 0;
        loop {
            let endpoints = self.endpoints.clone();
            match open(&endpoints, self.prefix.clone(), self.after).await {
                Ok(opened) => {
                    self.stream = Some(opened);
                    return Ok(());
                }
                Err(status) => {
                    // A TLS mistake is the same at every node: said at once.
                    let status = endpoints.explained(&endpoints.route(), status).await;
                    if !resumable(&status) || tokio::time::Instant::now() >= give_up {
                        return Err(error(&self.prefix, status));
                    }
                    endpoints.failed(&endpoints.route()).await;
                    tokio::time::sleep(pause(attempt)).await;
                    attempt += 1;
                }
            }
        }
    }

    /// The next event; `None` once the stream has ended for good (after an
    /// error was delivered).
    async fn next(&mut self) -> Result<LockEvent> {
        loop {
            if self.stream.is_none() {
                self.reopen(RESUME_FOR).await?;
            }
            let Some((stream, route)) = self.stream.as_mut() else {
                continue;
            };
            match stream.next().await {
                Some(Ok(e)) => {
                    // A server from before positions sends 0: resume from now.
                    if e.index > 0 {
                        self.after = Some((e.index, e.seq));
                    }
                    return Ok(event(e));
                }
                Some(Err(status)) if resumable(&status) => {
                    let route = route.clone();
                    self.stream = None;
                    self.endpoints.failed(&route).await;
                }
                Some(Err(status)) => return Err(error(&self.prefix, status)),
                // The node closed the stream (it is stopping): go on elsewhere.
                None => {
                    let route = route.clone();
                    self.stream = None;
                    self.endpoints.failed(&route).await;
                }
            }
        }
    }
}

fn event(e: pb::LockEvent) -> LockEvent {
    LockEvent {
        kind: match pb::lock_event::Kind::try_from(e.kind) {
            Ok(pb::lock_event::Kind::Acquired) => "acquired",
            Ok(pb::lock_event::Kind::Released) => "released",
            Ok(pb::lock_event::Kind::Expired) => "expired",
            Ok(pb::lock_event::Kind::Checkpoint) => "checkpoint",
            _ => "unknown",
        }
        .to_string(),
        key: e.key,
        fence: e.fence,
        holder: e.holder,
        data: e.data,
        index: e.index,
        seq: e.seq,
    }
}

/// Lock events under `prefix` from now on (or after the position `after`),
/// resumed across the loss of the node streaming them. The first open looks for a node as any call does
/// (for up to [`FAILOVER_WAIT`]); a refusal is returned at once.
pub(super) async fn watch(
    endpoints: Arc<Endpoints>,
    prefix: &str,
    after: Option<(u64, u32)>,
) -> Result<BoxStream<'static, Result<LockEvent>>> {
    let mut watching = Watching {
        endpoints,
        prefix: prefix.to_string(),
        after,
        stream: None,
    };
    watching.reopen(FAILOVER_WAIT).await?;
    Ok(futures::stream::unfold(Some(watching), |state| async move {
        let mut watching = state?;
        match watching.next().await {
            Ok(event) => Some((Ok(event), Some(watching))),
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopening_backs_off_to_a_second() {
        let pauses: Vec<u64> = (0..8).map(|n| pause(n).as_millis() as u64).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn only_transport_breaks_and_unavailable_nodes_are_resumed() {
        let coded = |code: &str| {
            let mut s = tonic::Status::unavailable("x");
            s.metadata_mut()
                .insert("leasehold-code", code.parse().expect("ascii"));
            s
        };
        assert!(resumable(&tonic::Status::unknown("h2 protocol error")));
        assert!(resumable(&tonic::Status::unavailable("connection refused")));
        assert!(resumable(&coded("unavailable")));
        assert!(resumable(&coded("not_leader")));
        for code in [
            "watch_behind",
            "permission_denied",
            "unauthenticated",
            "invalid_argument",
        ] {
            assert!(!resumable(&coded(code)), "{code}");
        }
    }
}
