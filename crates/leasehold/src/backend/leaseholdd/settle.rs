//! Calls sent again with the same request id: at once while nobody took
//! them or their answer was lost, and in the background once the caller has
//! been told the outcome is open.

use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::frame::Op;
use leasehold_proto::v1 as pb;

use super::errors::{error, unsettled};
use super::retry::call_again;
use super::session::Claim;
use crate::backend::endpoints::{Endpoints, Rpc};
use crate::Fence;

/// Pause between background attempts to settle a call.
const SETTLE_PAUSE: Duration = Duration::from_millis(500);

/// Sends `request` (a release) again in the background, with the same
/// request id, until its outcome is known or the session's lease is over
/// (which frees the key anyway). The claim on the key is kept meanwhile, so
/// this client does not take the key again on the same session before it is
/// released: a later acquire of it goes out under a lease of its own and
/// waits its turn.
pub(super) fn settle_release(
    endpoints: Arc<Endpoints>,
    claim: Arc<Claim>,
    request: pb::ReleaseRequest,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        while claim.session.liveness.is_live() {
            tokio::time::sleep(SETTLE_PAUSE).await;
            let result = endpoints
                .call::<pb::ReleaseResponse>(Op::Release, &request)
                .await
                .map_err(|e| e.into_error(&request.key));
            if !unsettled(&result) {
                tracing::debug!(key = %request.key, ?result, "a release whose answer was lost is settled");
                return;
            }
        }
    });
}

/// Asks again in the background, with the same request id, for an acquire
/// on a shared session whose outcome was left open (the caller was told
/// so), until the answer is known; a grant it turns out to have made is
/// released. The claim on the key is kept meanwhile (see [`settle_release`]).
pub(super) fn settle_acquire(
    endpoints: Arc<Endpoints>,
    claim: Arc<Claim>,
    mut request: pb::AcquireRequest,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    // Re-attach, and let the server withdraw the wait at once if it is
    // still queued.
    request.wait_ms = request.wait_ms.min(1);
    runtime.spawn(async move {
        while claim.session.liveness.is_live() {
            tokio::time::sleep(SETTLE_PAUSE).await;
            let call = |mut rpc: Rpc| {
                let request = request.clone();
                async move { rpc.acquire(request).await }
            };
            let result = endpoints
                .grpc(call)
                .await
                .map_err(|s| error(&request.key, s));
            match result {
                Ok(granted) => {
                    let release = release_request(&request.key, granted.fence);
                    let result = call_again::<pb::ReleaseResponse>(
                        &endpoints,
                        Op::Release,
                        &release,
                        &request.key,
                    )
                    .await;
                    if unsettled(&result) {
                        settle_release(endpoints, claim, release);
                    }
                    return;
                }
                result if unsettled(&result) => {}
                _ => return,
            }
        }
    });
}

/// A release of `key` held with `fence`, with a request id of its own so
/// it can be sent again.
pub(super) fn release_request(key: &str, fence: Fence) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        key: key.to_string(),
        fence,
        request_id: rand::random::<u64>() | 1,
    }
}
