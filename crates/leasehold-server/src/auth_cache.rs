//! Who a bearer token is, remembered between calls until auth changes.
//!
//! Looking a token up means taking the applied state's lock (which the apply
//! path holds while it applies a batch) and hashing the secret; at tens of
//! thousands of calls a second that was a tenth of the throughput. The
//! answer only changes when auth does, so it is kept here under the auth
//! version, which the state machine moves on every auth change and on every
//! snapshot it installs.
//!
//! This is the pre-check before a command is proposed. The table checks
//! every command again when it applies, so an answer that is a few
//! microseconds stale (between a change applying and the version moving)
//! never lets a revoked token act.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use leasehold_core::auth::TokenId;
use leasehold_core::LockError;

/// Entries kept at most; past it the cache starts over.
const CAPACITY: usize = 10_000;

/// Whether auth is on, and each bearer's answer, as of one auth version.
#[derive(Default)]
pub struct AuthCache {
    version: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The version these answers are of; `None` before the first.
    version: Option<u64>,
    enabled: bool,
    tokens: HashMap<Arc<str>, Result<TokenId, LockError>>,
}

/// What the cache knows about a call.
pub enum Known {
    /// Auth is off.
    Off,
    /// Auth is on; this bearer's answer.
    Token(Result<TokenId, LockError>),
    /// Auth is on and this bearer was not looked up yet (or there is none).
    Unknown,
}

impl AuthCache {
    /// Auth changed: every answer so far is void.
    pub fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The version to look up and remember under.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    fn inner(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// What is known at `version` about `bearer`.
    pub fn get(&self, version: u64, bearer: Option<&Arc<str>>) -> Option<Known> {
        let inner = self.inner();
        if inner.version != Some(version) {
            return None;
        }
        if !inner.enabled {
            return Some(Known::Off);
        }
        Some(match bearer.and_then(|b| inner.tokens.get(b)) {
            Some(answer) => Known::Token(answer.clone()),
            None => Known::Unknown,
        })
    }

    /// Remembers, at `version`, whether auth is on and `bearer`'s answer.
    pub fn put(
        &self,
        version: u64,
        enabled: bool,
        bearer: Option<(&Arc<str>, Result<TokenId, LockError>)>,
    ) {
        let mut inner = self.inner();
        if inner.version != Some(version) {
            if inner.version.is_some_and(|v| v > version) {
                return;
            }
            *inner = Inner {
                version: Some(version),
                enabled,
                tokens: HashMap::new(),
            };
        }
        if let Some((bearer, answer)) = bearer {
            if inner.tokens.len() >= CAPACITY {
                inner.tokens.clear();
            }
            inner.tokens.insert(bearer.clone(), answer);
        }
    }
}
