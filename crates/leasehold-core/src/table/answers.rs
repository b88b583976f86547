//! The request-id cache: the first answer to each caller's request id, kept
//! for `DEDUPE_WINDOW_MS` (at most `DEDUPE_CAPACITY` of them), so a retried
//! request gets that answer instead of acting twice.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::auth::TokenId;
use crate::command::{Mode, Response};
use crate::{Fence, LeaseId, LockError, RequestId, Time};

use super::{LockTable, DEDUPE_CAPACITY, DEDUPE_WINDOW_MS};

/// Whose request an id belongs to. Ids are chosen by callers, so two callers
/// may pick the same one; an answer is only ever returned to a retry from the
/// same caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(super) enum Caller {
    /// A request that creates its own lease (`Grant`, `GrantAndAcquire`): the
    /// id is all that names the caller.
    Granting,
    /// An acquire under this lease.
    Lease(LeaseId),
    /// A release by the holder of this fencing token (a token names exactly
    /// one hold, so exactly one caller).
    Hold(Fence),
    /// A request that creates its own lease, on behalf of this token.
    GrantingAs(TokenId),
}

/// What a remembered request asked for, to tell a retry from another request
/// that reused the id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Asked {
    Grant {
        ttl_ms: u64,
        holder: Arc<str>,
    },
    GrantAndAcquire {
        ttl_ms: u64,
        holder: Arc<str>,
        key: Arc<str>,
        mode: Mode,
    },
    Acquire {
        key: Arc<str>,
        mode: Mode,
    },
    AcquireSet {
        keys: Arc<[Arc<str>]>,
    },
    Release {
        key: Arc<str>,
    },
}

impl std::fmt::Display for Asked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Asked::Grant { ttl_ms, holder } => {
                write!(f, "a grant of a {ttl_ms} ms lease for {holder:?}")
            }
            Asked::GrantAndAcquire {
                ttl_ms,
                holder,
                key,
                mode,
            } => write!(
                f,
                "an acquire ({}) of {key:?} on a new {ttl_ms} ms lease for {holder:?}",
                mode.name()
            ),
            Asked::Acquire { key, mode } => {
                write!(f, "an acquire ({}) of {key:?}", mode.name())
            }
            Asked::AcquireSet { keys } => write!(f, "an acquire of the set {keys:?}"),
            Asked::Release { key } => write!(f, "a release of {key:?}"),
        }
    }
}

/// The first answer to a request, kept for its retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Answer {
    pub(super) at: Time,
    asked: Asked,
    response: Response,
}

/// Answers to recent request ids. A hash map: with 100k answers remembered, a
/// B-tree lookup missed the cache at every level, and three of them per
/// command (check, insert, evict) were ~10% of the server's CPU at 40k
/// commands/s. The hasher has fixed keys, so the table stays deterministic,
/// and the map is written sorted by key, so equal tables give equal snapshots.
pub(super) type Answers = HashMap<(Caller, RequestId), Answer, BuildHasherDefault<DefaultHasher>>;

pub(super) fn serialize_sorted<S: serde::Serializer>(
    answers: &Answers,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut sorted: Vec<_> = answers.iter().collect();
    sorted.sort_unstable_by_key(|(id, _)| **id);
    s.collect_seq(sorted)
}

pub(super) fn deserialize_answers<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Answers, D::Error> {
    let pairs: Vec<((Caller, RequestId), Answer)> = Vec::deserialize(d)?;
    Ok(pairs.into_iter().collect())
}

fn reused_id(request_id: RequestId, first: &Asked) -> LockError {
    LockError::invalid(
        "request_id",
        format!(
            "{request_id} already named {first} from this caller; a retry must repeat its request exactly, and a new request needs a new id"
        ),
    )
}

impl LockTable {
    /// The first answer to this caller's request `request_id`, if it was
    /// answered; an error if the id named another request.
    pub(super) fn recall(
        &self,
        caller: Caller,
        request_id: RequestId,
        asked: &Asked,
    ) -> Result<Option<Response>, LockError> {
        if request_id == 0 {
            return Ok(None);
        }
        match self.state.answered.get(&(caller, request_id)) {
            None => Ok(None),
            Some(first) if first.asked == *asked => Ok(Some(first.response.clone())),
            Some(first) => Err(reused_id(request_id, &first.asked)),
        }
    }

    /// Whether this caller's request `request_id` was answered and kept.
    pub(super) fn answered(&self, caller: Caller, request_id: RequestId) -> bool {
        request_id != 0 && self.state.answered.contains_key(&(caller, request_id))
    }

    /// Keeps an answer for retries. Only what changed something is
    /// remembered: a refusal changed nothing, so a retry is judged afresh.
    pub(super) fn remember(
        &mut self,
        caller: Caller,
        request_id: RequestId,
        asked: Asked,
        response: Response,
    ) {
        if request_id == 0 {
            return;
        }
        let answer = Answer {
            at: self.state.now,
            asked,
            response,
        };
        self.state.answered.insert((caller, request_id), answer);
        self.state
            .answered_order
            .push_back((self.state.now, caller, request_id));
    }

    /// Forgets the answers given more than [`DEDUPE_WINDOW_MS`] before
    /// `now`, and the oldest beyond [`DEDUPE_CAPACITY`]: a retry that late
    /// is judged afresh.
    pub(super) fn forget_old_answers(&mut self, now: Time) {
        let state = &mut self.state;
        while let Some(&(at, caller, id)) = state.answered_order.front() {
            if at.saturating_add(DEDUPE_WINDOW_MS) > now
                && state.answered_order.len() <= DEDUPE_CAPACITY
            {
                break;
            }
            state.answered_order.pop_front();
            // A newer answer under the same id stays.
            if state
                .answered
                .get(&(caller, id))
                .is_some_and(|a| a.at == at)
            {
                state.answered.remove(&(caller, id));
            }
        }
    }

    pub(super) fn forget(&mut self, caller: Caller, request_id: RequestId) {
        if request_id != 0 {
            self.state.answered.remove(&(caller, request_id));
        }
    }
}
