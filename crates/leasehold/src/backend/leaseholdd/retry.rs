//! Sending a call again: how often, and how long to pause in between.

use std::time::Duration;

use leasehold_proto::frame::Op;

use crate::backend::endpoints::Endpoints;
use crate::{Error, Result};

/// Attempts for an idempotent request when the server cannot be reached.
pub(super) const ATTEMPTS: usize = 3;

/// Pause before retry `attempt` (1-based) of a request the server did not
/// answer: 50 ms more each time, at most a second.
pub(super) fn backoff(attempt: usize) -> Duration {
    Duration::from_millis((50 * attempt as u64).min(1_000))
}

/// Sends a framed call that is safe to send again (it carries a request id,
/// or acting twice is acting once) up to [`ATTEMPTS`] times while no node
/// could take it or its answer was lost.
pub(super) async fn call_again<R: prost::Message + Default>(
    endpoints: &Endpoints,
    op: Op,
    request: &impl prost::Message,
    key: &str,
) -> Result<R> {
    let mut attempt = 0;
    loop {
        match endpoints
            .call::<R>(op, request)
            .await
            .map_err(|e| e.into_error(key))
        {
            Err(Error::Unavailable(_) | Error::OutcomeUnknown(_)) if attempt + 1 < ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(backoff(attempt)).await;
            }
            result => return result,
        }
    }
}
