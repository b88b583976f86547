//! One client's renewals, sent together.
//!
//! Every lease the client holds renews on its own schedule (its keeper, at
//! TTL/3), and asks here a little before its time ([`early`]), saying by
//! when it must go. A call leaves when the first renewal waiting is due,
//! and takes every renewal waiting with it, as one `KeepAliveMany` (a lone
//! one as a `KeepAlive`). Each call goes on its own, so one that hangs on
//! a node cut off from its majority holds up no renewal behind it. No
//! renewal leaves later than its time, and a process renewing thousands of
//! leases sends a few calls a second instead of thousands.
//!
//! What a renewal promises does not change. Its keeper counts the deadline
//! from when it asked here, before any wait, so the wait comes off the
//! lease's budget, never on top of it; each lease is answered on its own
//! (renewed, or why not); a failure of the whole call (no answer, not the
//! leader) is each lease's transient failure, retried by its keeper until
//! its deadline.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::limits::MAX_RENEWALS_PER_CALL;
use leasehold_proto::frame::Op;
use leasehold_proto::v1 as pb;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::backend::endpoints::Endpoints;
use crate::backend::frames::CallError;
#[cfg(doc)]
use crate::keeper::early;

type Answer = Result<pb::KeepAliveResponse, CallError>;

/// A client's renewals: those waiting for the call on its way, and whether
/// the server takes many in one call.
pub(super) struct Renewals {
    endpoints: Arc<Endpoints>,
    state: Mutex<State>,
    /// A renewal came in while the sender slept until the first one's time.
    arrived: Notify,
}

#[derive(Default)]
struct State {
    waiting: Vec<Waiting>,
    /// A task is sending: what is waiting goes with its next call.
    sending: bool,
    /// The earliest `by` waiting (or earlier: a renewal dropped by its
    /// keeper may have set it); `None` when nothing waits.
    first: Option<Instant>,
    /// The server answered that it does not know `KeepAliveMany` (a build
    /// from before it): one call per lease from then on.
    one_by_one: bool,
}

struct Waiting {
    lease: u64,
    /// When it must go.
    by: Instant,
    /// How long its keeper waits for an answer from one node.
    attempt: Duration,
    answer: oneshot::Sender<Answer>,
}

impl Renewals {
    pub(super) fn new(endpoints: Arc<Endpoints>) -> Renewals {
        Renewals {
            endpoints,
            state: Mutex::new(State::default()),
            arrived: Notify::new(),
        }
    }

    /// Renews `lease` by `by`, together with whatever else is waiting then.
    /// A call that no node answers within `attempt` fails, and the next
    /// goes to another node.
    pub(super) async fn renew(
        self: &Arc<Self>,
        lease: u64,
        by: Instant,
        attempt: Duration,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let (start, sooner) = {
            let mut state = self.state.lock();
            state.waiting.push(Waiting {
                lease,
                by,
                attempt,
                answer,
            });
            let sooner = state.first.is_none_or(|first| by < first);
            if sooner {
                state.first = Some(by);
            }
            (!std::mem::replace(&mut state.sending, true), sooner)
        };
        if start {
            tokio::spawn(self.clone().send_while_waiting());
        } else if sooner {
            self.arrived.notify_one();
        }
        answered
            .await
            .unwrap_or_else(|_| Err(CallError::Transport("the renewal was dropped".into())))
    }

    /// Sends what is waiting when the first renewal waiting is due, until
    /// nothing is waiting. Each call goes on its own: one that hangs holds
    /// up no renewal behind it.
    async fn send_while_waiting(self: Arc<Self>) {
        loop {
            let next = {
                let mut state = self.state.lock();
                match state.first {
                    Some(first) if first > Instant::now() => Err(first),
                    _ => {
                        // A renewal whose keeper stopped waiting (its
                        // deadline passed, or it was stopped) is not sent.
                        state.waiting.retain(|w| !w.answer.is_closed());
                        if state.waiting.is_empty() {
                            state.sending = false;
                            state.first = None;
                            return;
                        }
                        let n = state.waiting.len().min(MAX_RENEWALS_PER_CALL);
                        let batch: Vec<Waiting> = state.waiting.drain(..n).collect();
                        state.first = state.waiting.iter().map(|w| w.by).min();
                        Ok((batch, state.one_by_one))
                    }
                }
            };
            match next {
                Ok((batch, one_by_one)) => {
                    tokio::spawn(self.clone().send(batch, one_by_one));
                }
                Err(first) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(first) => {}
                        () = self.arrived.notified() => {}
                    }
                }
            }
        }
    }

    /// One call: `batch`'s renewals together, or each alone.
    async fn send(self: Arc<Self>, batch: Vec<Waiting>, one_by_one: bool) {
        // The shortest wait of the batch: its keepers stop waiting then.
        let attempt = batch
            .iter()
            .map(|w| w.attempt)
            .min()
            .unwrap_or(Duration::MAX);
        if batch.len() == 1 || one_by_one {
            let calls = batch.into_iter().map(|w| self.one(w, attempt));
            futures::future::join_all(calls).await;
        } else {
            self.many(batch, attempt).await;
        }
    }

    /// One lease in a call of its own.
    async fn one(&self, waiting: Waiting, attempt: Duration) {
        let request = pb::KeepAliveRequest {
            lease_id: waiting.lease,
        };
        let call = self
            .endpoints
            .call::<pb::KeepAliveResponse>(Op::KeepAlive, &request);
        let answer = self.within(attempt, call).await;
        let _ = waiting.answer.send(answer);
    }

    /// Many leases in one call, each answered from its own part of the reply.
    async fn many(&self, batch: Vec<Waiting>, attempt: Duration) {
        let request = pb::KeepAliveManyRequest {
            lease_ids: batch.iter().map(|w| w.lease).collect(),
        };
        let call = self
            .endpoints
            .call::<pb::KeepAliveManyResponse>(Op::KeepAliveMany, &request);
        match self.within(attempt, call).await {
            Ok(reply) => {
                let mut answers: HashMap<u64, Answer> = reply
                    .renewals
                    .into_iter()
                    .map(|r| (r.lease_id, renewal_answer(r)))
                    .collect();
                for w in batch {
                    let answer = match answers.get_mut(&w.lease) {
                        Some(Ok(renewed)) => Ok(*renewed),
                        Some(Err(e)) => Err(e.clone()),
                        None => Err(CallError::Transport(format!(
                            "the server's answer left lease {} out",
                            w.lease
                        ))),
                    };
                    let _ = w.answer.send(answer);
                }
            }
            Err(CallError::Server(reply)) if unknown_operation(&reply) => {
                self.state.lock().one_by_one = true;
                let calls = batch.into_iter().map(|w| self.one(w, attempt));
                futures::future::join_all(calls).await;
            }
            Err(e) => {
                for w in batch {
                    let _ = w.answer.send(Err(e.clone()));
                }
            }
        }
    }

    /// `call`, given up after `attempt` (the next call then goes to another
    /// node).
    async fn within<R>(
        &self,
        attempt: Duration,
        call: impl std::future::Future<Output = Result<R, CallError>>,
    ) -> Result<R, CallError> {
        let route = self.endpoints.route();
        match tokio::time::timeout(attempt, call).await {
            Ok(answer) => answer,
            Err(_) => {
                self.endpoints.failed(&route).await;
                Err(CallError::Transport(format!(
                    "no answer from {} within {attempt:?}",
                    route.addr
                )))
            }
        }
    }
}

/// One lease's part of a `KeepAliveMany` reply.
fn renewal_answer(renewal: pb::LeaseRenewal) -> Answer {
    match (renewal.renewed, renewal.error) {
        (Some(renewed), None) => Ok(renewed),
        (_, Some(refused)) => Err(CallError::Server(refused)),
        (None, None) => Err(CallError::Transport(format!(
            "the server's answer for lease {} says neither renewed nor why not",
            renewal.lease_id
        ))),
    }
}

/// Whether a refusal says the server does not know the operation: a build
/// from before `KeepAliveMany`.
fn unknown_operation(reply: &pb::ErrorReply) -> bool {
    reply.code == "invalid_argument" && reply.message.starts_with("invalid op:")
}
