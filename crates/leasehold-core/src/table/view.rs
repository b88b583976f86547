//! Reading the table: counts and deadlines for the server and its metrics,
//! what a step would cost, and the views of locks and leases that `describe`
//! and `list` show. Nothing here changes the table.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::auth::TokenId;
use crate::command::{Checkpoint, Command, Mode, Stamp};
use crate::{Fence, LeaseId, Time};

use super::answers::Caller;
use super::lock::{Holding, Lease, Lock};
use super::LockTable;

/// A lock as seen by `describe` and `list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockView {
    /// The key.
    pub key: String,
    /// The current holder, if any (the first of them, for a key with several).
    pub holder: Option<HolderView>,
    /// Every holder, in the order they were granted: one for a lock or a
    /// writer, any number of readers, up to `permits` for a semaphore.
    pub holders: Vec<HolderView>,
    /// A semaphore's size (0 for a lock).
    pub permits: u32,
    /// The queue, first in line first.
    pub waiters: Vec<WaiterView>,
    /// Whether a checkpoint is stored.
    pub has_checkpoint: bool,
    /// The checkpoint itself (not in JSON views: `has_checkpoint` says it is there).
    #[serde(skip)]
    pub checkpoint: Option<Checkpoint>,
    /// Lock-delay left after an expiry.
    pub delay_left_ms: u64,
}

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HolderView {
    /// The holding lease.
    pub lease: LeaseId,
    /// The holder's name.
    pub holder: String,
    /// Its fencing token.
    pub fence: Fence,
    /// Milliseconds until its lease expires unless renewed.
    pub ttl_left_ms: u64,
    /// How it holds: `exclusive`, `shared` or `permit`.
    pub mode: &'static str,
}

/// Someone in a lock's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaiterView {
    /// The waiting lease.
    pub lease: LeaseId,
    /// Its holder name.
    pub holder: String,
    /// Milliseconds of waiting left.
    pub wait_left_ms: u64,
    /// What it waits for: `exclusive`, `shared` or `permit`.
    pub mode: &'static str,
}

/// A lease as seen by `describe` and `list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseView {
    /// The lease id.
    pub lease: LeaseId,
    /// The holder's name.
    pub holder: String,
    /// Its TTL.
    pub ttl_ms: u64,
    /// Milliseconds until it expires unless renewed.
    pub ttl_left_ms: u64,
    /// The keys it holds (in a list, only the first few; see
    /// [`LockTable::leases`]).
    pub keys: Vec<String>,
    /// How many keys it holds.
    pub key_count: usize,
    /// The keys it is queued for (in a list, only the first few, as
    /// with `keys`).
    pub waiting_for: Vec<String>,
    /// How many keys it is queued for.
    pub waiting_count: usize,
    /// The token that granted it, if auth was on.
    pub owner: Option<TokenId>,
}

/// What a command would add to the table at most ([`LockTable::growth`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Growth {
    /// New leases.
    pub leases: usize,
    /// Keys newly held.
    pub keys: usize,
    /// New waits in queues.
    pub waits: usize,
    /// The token the command runs as, which owns what it creates.
    pub owner: Option<TokenId>,
}

/// What one token owns: its live leases, and the keys they hold and wait
/// for ([`LockTable::owned_by`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owned {
    /// Live leases it granted.
    pub leases: usize,
    /// Keys its leases hold (a key two of them share counts twice).
    pub keys: usize,
    /// Waits of its leases in queues.
    pub waits: usize,
}

impl Owned {
    /// Changes `owner`'s count in `owned` by `change`, dropping a count that
    /// falls to nothing. Nothing for a lease without an owner (auth off).
    pub(super) fn count(
        owned: &mut BTreeMap<TokenId, Owned>,
        owner: Option<TokenId>,
        change: impl FnOnce(&mut Owned),
    ) {
        let Some(owner) = owner else { return };
        let entry = owned.entry(owner).or_default();
        change(entry);
        if *entry == Owned::default() {
            owned.remove(&owner);
        }
    }
}

impl Growth {
    /// Whether it adds nothing.
    pub fn is_none(&self) -> bool {
        self.leases == 0 && self.keys == 0 && self.waits == 0
    }
}

impl LockTable {
    /// Table time: the highest stamp applied so far.
    pub fn now(&self) -> Time {
        self.state.now
    }

    /// The highest leader term applied so far.
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// The token the next grant will get. Every token handed out so far is lower.
    pub fn next_fence(&self) -> Fence {
        self.state.next_fence
    }

    /// The id the next lease will get. Every lease id handed out so far is
    /// lower.
    pub fn next_lease(&self) -> LeaseId {
        self.state.next_lease
    }

    /// Number of live leases.
    pub fn lease_count(&self) -> usize {
        self.state.leases.len()
    }

    /// Number of held locks (keys with at least one holder). Kept as the
    /// table changes: constant time.
    pub fn held_count(&self) -> usize {
        self.held_keys
    }

    /// Number of acquires waiting in a key's queue: one wait deadline each.
    /// Constant time.
    pub fn waiter_count(&self) -> usize {
        self.state.deadlines.wait_count()
    }

    /// The earliest time at which something is due (a lease expiry, a wait
    /// timeout, the end of a lock-delay or of a re-attach window), so the
    /// leader knows when to tick.
    pub fn next_deadline(&self) -> Option<Time> {
        self.state.deadlines.next()
    }

    /// About how many keys applying `commands` at `stamp` would touch: one
    /// for each command, the keys and waits of every lease they end (by
    /// expiry or revoke), one for each wait, lock-delay and re-attach
    /// window that runs out, and every queued wait, re-attach window and
    /// lease due when a newer epoch restamps the table. Ending a lease that holds a million keys is a
    /// single command; a server uses this to run such a command where it
    /// holds up nothing else. Costs about one step per lease or wait due.
    pub fn work<'a>(&self, stamp: Stamp, commands: impl IntoIterator<Item = &'a Command>) -> usize {
        let lease_keys = |id: LeaseId| {
            self.state
                .leases
                .get(&id)
                .map_or(0, |l| l.held.len() + l.waiting.len())
        };
        let mut keys = 0;
        if stamp.epoch > self.state.epoch {
            // Every lease due by then is moved to a TTL from the takeover
            // (after a long outage, all of them): a step each.
            keys +=
                self.state.deadlines.restamp_work() + self.state.deadlines.leases_due(stamp.now);
        }
        keys += self.state.deadlines.work_due(stamp.now, lease_keys);
        for mut command in commands {
            while let Command::As { command: inner, .. } = command {
                command = inner;
            }
            keys += 1;
            if let Command::Revoke { lease } = command {
                keys += lease_keys(*lease);
            }
        }
        keys
    }

    /// At most how much applying `command` now would grow the table, for
    /// quotas checked before it is proposed. A retry of a request already
    /// answered grows nothing, nor does asking again for a key the lease
    /// holds or waits for (a caller re-attaching after a leader change);
    /// releases, renewals, revokes and checkpoints grow nothing either. An
    /// acquire that may wait counts both the hold and the wait, since which
    /// it becomes is known only when it applies. `owner` is the token the
    /// command runs as, unless it is wrapped in [`Command::As`].
    pub fn growth(&self, command: &Command, owner: Option<TokenId>) -> Growth {
        let mut owner = owner;
        let mut command = command;
        while let Command::As {
            token,
            command: inner,
        } = command
        {
            owner = token.or(owner);
            command = inner;
        }
        let granting = owner.map_or(Caller::Granting, Caller::GrantingAs);
        let has = |lease: LeaseId, key: &str| {
            self.state
                .leases
                .get(&lease)
                .is_some_and(|l| l.held.contains(key) || l.waiting.contains(key))
        };
        let mut growth = Growth {
            owner,
            ..Growth::default()
        };
        match command {
            Command::Grant { request_id, .. } if !self.answered(granting, *request_id) => {
                growth.leases = 1;
            }
            Command::GrantAndAcquire {
                request_id,
                wait_ms,
                ..
            } if !self.answered(granting, *request_id) => {
                growth.leases = 1;
                growth.keys = 1;
                growth.waits = usize::from(*wait_ms > 0);
            }
            Command::Acquire {
                lease,
                key,
                wait_ms,
                request_id,
                ..
            } if !self.answered(Caller::Lease(*lease), *request_id) && !has(*lease, key) => {
                growth.keys = 1;
                growth.waits = usize::from(*wait_ms > 0);
            }
            Command::AcquireSet {
                lease,
                keys,
                wait_ms,
                request_id,
                ..
            } if !self.answered(Caller::Lease(*lease), *request_id) => {
                let new: std::collections::BTreeSet<&str> = keys
                    .iter()
                    .map(String::as_str)
                    .filter(|k| !has(*lease, k))
                    .collect();
                growth.keys = new.len();
                // A set that waits waits in the queue of each of its keys.
                growth.waits = if *wait_ms > 0 { new.len() } else { 0 };
            }
            _ => {}
        }
        growth
    }

    /// What `token` owns: its live leases and their keys and waits.
    /// Logarithmic in the number of tokens.
    pub fn owned_by(&self, token: TokenId) -> Owned {
        self.owned.get(&token).copied().unwrap_or_default()
    }

    // ---- reading ----

    /// One lock, as seen at time `now`.
    pub fn lock(&self, key: &str, now: Time) -> Option<LockView> {
        self.state
            .locks
            .get_key_value(key)
            .map(|(k, l)| self.view_lock(k, l, now))
    }

    /// Locks whose key starts with `prefix`, in key order, after the key
    /// `start_after` if one is given (a cursor: the last key of the page
    /// before), at most `limit`.
    pub fn locks(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        now: Time,
    ) -> Vec<LockView> {
        self.locks_where(prefix, start_after, limit, now, false, |_| true)
    }

    /// [`locks`](Self::locks), of only the keys `visible` keeps; with
    /// `held_only`, of only the keys held or waited for (not those that
    /// only keep a checkpoint, an election's value, or a lock-delay).
    pub fn locks_where(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        now: Time,
        held_only: bool,
        visible: impl Fn(&str) -> bool,
    ) -> Vec<LockView> {
        use std::ops::Bound;
        let from = match start_after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.state
            .locks
            .range::<str, _>((from, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(_, l)| !held_only || l.holder.is_some() || !l.waiters().is_empty())
            .filter(|(k, _)| visible(k))
            .take(limit)
            .map(|(k, l)| self.view_lock(k, l, now))
            .collect()
    }

    /// One lease, as seen at time `now`.
    pub fn lease(&self, id: LeaseId, now: Time) -> Option<LeaseView> {
        self.state
            .leases
            .get(&id)
            .map(|l| view_lease(id, l, self.expiry(l), now, usize::MAX))
    }

    /// Leases in id order, after the id `start_after` (a cursor: the last id
    /// of the page before; 0 for the first page), at most `limit`, each with
    /// at most `max_keys` of its keys (and the count of all of them), so a
    /// page costs the same whether a lease holds ten keys or a million.
    pub fn leases(
        &self,
        start_after: LeaseId,
        limit: usize,
        max_keys: usize,
        now: Time,
    ) -> Vec<LeaseView> {
        self.leases_where(start_after, limit, max_keys, now, |_| true)
    }

    /// [`leases`](Self::leases), of only those `visible` keeps (it is given
    /// each lease's owner).
    pub fn leases_where(
        &self,
        start_after: LeaseId,
        limit: usize,
        max_keys: usize,
        now: Time,
        visible: impl Fn(Option<TokenId>) -> bool,
    ) -> Vec<LeaseView> {
        use std::ops::Bound;
        self.state
            .leases
            .range((Bound::Excluded(start_after), Bound::Unbounded))
            .filter(|(_, l)| visible(l.owner))
            .take(limit)
            .map(|(id, l)| view_lease(*id, l, self.expiry(l), now, max_keys))
            .collect()
    }

    fn view_lock(&self, key: &str, lock: &Lock, now: Time) -> LockView {
        let name = |lease: LeaseId| self.holder_name(lease).to_string();
        let view = |h: &Holding| HolderView {
            lease: h.lease,
            holder: name(h.lease),
            fence: h.fence,
            ttl_left_ms: self
                .state
                .leases
                .get(&h.lease)
                .map_or(0, |l| self.expiry(l).saturating_sub(now)),
            mode: h.mode.name(),
        };
        let permits = lock
            .holders()
            .map(|h| h.mode)
            .chain(lock.waiters().iter().map(|w| w.mode))
            .find_map(Mode::permits)
            .unwrap_or(0);
        LockView {
            key: key.to_string(),
            holder: lock.holder.as_ref().map(view),
            holders: lock.holders().map(view).collect(),
            permits,
            waiters: lock
                .waiters()
                .iter()
                .map(|w| WaiterView {
                    lease: w.lease,
                    holder: name(w.lease),
                    wait_left_ms: w.deadline.saturating_sub(now),
                    mode: w.mode.name(),
                })
                .collect(),
            has_checkpoint: lock.checkpoint().is_some(),
            checkpoint: lock.checkpoint().cloned(),
            delay_left_ms: lock.delayed_until().map_or(0, |t| t.saturating_sub(now)),
        }
    }
}

fn view_lease(id: LeaseId, lease: &Lease, expiry: Time, now: Time, max_keys: usize) -> LeaseView {
    LeaseView {
        lease: id,
        holder: lease.holder.to_string(),
        ttl_ms: lease.ttl_ms,
        ttl_left_ms: expiry.saturating_sub(now),
        keys: lease
            .held
            .iter()
            .take(max_keys)
            .map(|k| k.to_string())
            .collect(),
        key_count: lease.held.len(),
        waiting_for: lease
            .waiting
            .iter()
            .take(max_keys)
            .map(|k| k.to_string())
            .collect(),
        waiting_count: lease.waiting.len(),
        owner: lease.owner,
    }
}
