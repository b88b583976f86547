//! The lock table: leases, locks, FIFO waiters, fencing tokens, checkpoints.
//!
//! # Layout
//!
//! The table is split by the data each part walks over; the rules that call
//! one another stay together in `rules.rs`.
//!
//! - `mod.rs`: the [`LockTable`] (its persisted state and the counts kept
//!   beside it), the public constants, and [`LockTable::apply`], which takes
//!   in a stamp and hands each command to its rule.
//! - `state.rs`: the persisted state, `TableState`, which is the snapshot,
//!   and the indexes and counts rebuilt from it on load.
//! - `lock.rs`: the data the rules walk over, each type keeping its own
//!   invariants: one key's `Lock` (its holders, its queue, its checkpoint and
//!   lock-delay), a `Holding`, a `Waiter`, a `Lease`, a lock set's keys.
//! - `keys.rs`: the keys a lease holds or waits for, kept without an
//!   allocation of their own while there is at most one.
//! - `deadlines.rs`: `Deadlines`, when lease expiries, wait timeouts,
//!   lock-delays and re-attach windows fall due; and the taking in of a
//!   stamp (a new leadership's restamp, then what is due), which calls down
//!   into `rules.rs`.
//! - `rules.rs`: the rules that change the table (time, leases, locks, and
//!   lock sets as their queues grant them), with an index of them at its top.
//! - `sets.rs`: asking for a lock set; it calls down into `rules.rs`.
//! - `lookup.rs`: what the rules look up before they act (a live lease, the
//!   hold a token names, why a key is busy); nothing there changes the table.
//! - `answers.rs`: the request-id cache, so a retried request never acts twice.
//! - `authorize.rs`: who may run which command, and changes to auth.
//! - `view.rs`: the read-only views and counts (`describe`, `list`, metrics)
//!   and what a step would cost.
//! - `invariants.rs`: the consistency check the tests run after every step.

mod answers;
mod authorize;
mod deadlines;
mod invariants;
mod keys;
mod leases;
mod lock;
mod lookup;
mod rules;
mod sets;
mod state;
mod view;

use std::collections::BTreeMap;

use crate::auth::TokenId;
use crate::command::{Command, Event, Response, Stamp};
use crate::{Fence, LeaseId, LockError, Time};

use state::TableState;

pub use view::{Growth, HolderView, LeaseView, LockView, Owned, WaiterView};

/// How long (table time) the answer to a request id is kept for retries.
pub const DEDUPE_WINDOW_MS: Time = 60_000;
/// At most this many answers are kept for retries; the oldest go first. At
/// ~150 bytes each, about 15 MB at the most.
pub const DEDUPE_CAPACITY: usize = 100_000;
/// After a new leadership (a leader change, or a restarted single node), how
/// long a queued waiter's caller has to come back (retry its acquire with the
/// same lease and request id) before its wait is withdrawn. The waiting call
/// itself died with the old leader's connection; a waiter nobody re-attaches
/// is a ghost that would otherwise be granted the key and hold it for a whole
/// TTL. A grant made to a waiter in this window is taken back if its caller
/// does not come for it in time.
pub const REATTACH_MS: Time = 5_000;

/// The result of applying one command.
pub type Outcome = Result<Response, LockError>;

/// The whole state of a Leasehold deployment's locks.
///
/// Pure and deterministic: time arrives in each command's [`Stamp`], nothing here
/// reads a clock or does I/O, and the same commands from the same state always
/// give the same state, responses and events. The snapshot is the persisted
/// state alone (see `state.rs`); the indexes and counts beside it are rebuilt
/// from it on load, so a restored table continues exactly where the original
/// stood. Two tables are equal when everything they would act on is: a lease
/// still waiting for a takeover's restamp compares by the deadline in effect
/// (see `Restamp`, in `deadlines.rs`).
#[derive(Debug, Clone)]
pub struct LockTable {
    /// Everything the snapshot holds.
    state: TableState,
    /// How many keys have at least one holder, kept as holds come and go so
    /// that reading it costs nothing at a million locks (`/metrics` reads it
    /// on every scrape). Not in the snapshot: counted again on load.
    held_keys: usize,
    /// What each token owns (its live leases, and the keys they hold and
    /// wait for), kept like `held_keys`: a quota per token reads it on
    /// every grant and acquire. Not in the snapshot: counted again on load.
    owned: BTreeMap<TokenId, Owned>,
    /// The latest takeover's restamp, while some lease may still carry a
    /// deadline from before it. Not in the snapshot: the snapshot writes
    /// every deadline as it is in effect, so a loaded table has none.
    restamped: Option<deadlines::Restamp>,
}

/// How far a restore moves the token and lease id sequences: to the first
/// multiple of 2^48 at least 2^48 above the next one, so the old cluster
/// could have granted 2^48 more after the backup (at 100,000 grants a
/// second, 89 years of grants) and still be below the new one.
pub const RESTORE_STRIDE: u64 = 1 << 48;

impl Default for LockTable {
    fn default() -> Self {
        Self::new()
    }
}

impl LockTable {
    /// An empty table. Lease ids and fencing tokens start at 1.
    pub fn new() -> Self {
        LockTable::rebuilt(TableState::empty())
    }

    /// Applies one command at the stamped time.
    ///
    /// First the stamp is taken in (a newer epoch restamps all leases, then
    /// everything due by `stamp.now` expires), then the command runs. A refused
    /// command changes nothing beyond what the passing of time did.
    pub fn apply(&mut self, stamp: Stamp, command: Command, events: &mut Vec<Event>) -> Outcome {
        let now = self.state.now.max(stamp.now);
        if stamp.epoch > self.state.epoch {
            self.state.epoch = stamp.epoch;
            self.restamp(now);
        }
        self.advance(now, events);
        self.run(command, None, events)
    }

    /// Makes this table (a backup's) the start of a new cluster, for a
    /// restore: the fencing token and lease id sequences move up by at least
    /// [`RESTORE_STRIDE`], to a multiple of it (and each to at least
    /// `fence_floor`), above every token and lease id the old cluster could
    /// have handed out after the backup unless it handed out 2^48 of them;
    /// and the epoch goes back to 0, so the new cluster's first leader gives
    /// every restored lease a full TTL to renew in. Returns the next token
    /// and lease id; fails, changing nothing, if a sequence would leave less
    /// than [`RESTORE_STRIDE`] of room below `u64::MAX`.
    pub fn prepare_for_new_cluster(
        &mut self,
        fence_floor: Fence,
    ) -> Result<(Fence, LeaseId), LockError> {
        let room = u64::MAX - RESTORE_STRIDE;
        let next_stride = |n: u64| {
            (n / RESTORE_STRIDE)
                .checked_add(2)
                .and_then(|k| k.checked_mul(RESTORE_STRIDE))
                .filter(|&at| at <= room)
        };
        let exhausted = || {
            LockError::invalid(
                "backup",
                "its token or lease id sequence is within 2^48 of 2^64, too close to the end \
                 to move up: it cannot be restored; restore an older backup, or start a new \
                 cluster",
            )
        };
        if fence_floor > room {
            return Err(LockError::invalid(
                "fence_floor",
                format!("is {fence_floor}; it must leave 2^48 tokens of room, so at most {room}"),
            ));
        }
        let fence = next_stride(self.state.next_fence)
            .ok_or_else(exhausted)?
            .max(fence_floor);
        // The floor holds for lease ids too: a second restore of one backup
        // must not hand out the lease ids the first restored cluster did.
        let lease = next_stride(self.state.next_lease)
            .ok_or_else(exhausted)?
            .max(fence_floor);
        self.state.next_fence = fence;
        self.state.next_lease = lease;
        self.state.epoch = 0;
        Ok((fence, lease))
    }

    /// Runs a command for `token` (`None`: for the server itself, or with
    /// auth off), which it was checked against.
    fn run(
        &mut self,
        command: Command,
        token: Option<TokenId>,
        events: &mut Vec<Event>,
    ) -> Outcome {
        // A command on behalf of a token is checked once its token may
        // run it (below), as before.
        if !matches!(command, Command::As { .. }) {
            command.validate()?;
        }
        match command {
            Command::Grant {
                ttl_ms,
                holder,
                request_id,
            } => self.grant_once(ttl_ms, holder, request_id, token),
            Command::KeepAlive { lease } => self.keep_alive(lease),
            Command::Revoke { lease } => self.revoke(lease, events),
            Command::Acquire {
                lease,
                key,
                wait_ms,
                lock_delay_ms,
                request_id,
                mode,
            } => self.acquire_once(
                lease,
                &key,
                (wait_ms, lock_delay_ms),
                request_id,
                mode,
                events,
            ),
            Command::GrantAndAcquire {
                ttl_ms,
                holder,
                key,
                wait_ms,
                lock_delay_ms,
                request_id,
                mode,
            } => self.grant_and_acquire(
                ttl_ms,
                holder,
                &key,
                (wait_ms, lock_delay_ms),
                request_id,
                mode,
                token,
                events,
            ),
            Command::CancelWait {
                lease,
                key,
                request_id,
                attempt,
            } => self.cancel_wait(lease, &key, request_id, attempt, events),
            Command::Release {
                key,
                fence,
                request_id,
            } => self.release_once(&key, fence, request_id, events),
            Command::SaveCheckpoint { key, fence, data } => {
                self.save_checkpoint(&key, fence, data, events)
            }
            Command::Tick => Ok(Response::Ticked),
            Command::AcquireSet {
                lease,
                keys,
                wait_ms,
                lock_delay_ms,
                request_id,
            } => self.acquire_set_once(lease, &keys, (wait_ms, lock_delay_ms), request_id, events),
            Command::As { token: t, command } => {
                self.authorize(t, &command)?;
                self.run(*command, t, events)
            }
            Command::Auth { change, at_unix_ms } => {
                self.change_auth(token, None, at_unix_ms, change, events)
            }
            Command::AuthWithCertificate {
                change,
                at_unix_ms,
                subject,
            } => self.change_auth(token, Some(&subject), at_unix_ms, change, events),
        }
    }
}
