//! The lock table: leases, locks, FIFO waiters, fencing tokens, checkpoints.

use std::collections::btree_map::Entry;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::auth::{AuthChange, AuthState, Permission, TokenId};
use crate::command::{Checkpoint, Command, Event, Grant, Mode, Response, Stamp, WaitEnd};
use crate::limits;
use crate::{Fence, LeaseId, LockError, RequestId, Time};

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

/// Whose request an id belongs to. Ids are chosen by callers, so two callers
/// may pick the same one; an answer is only ever returned to a retry from the
/// same caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
enum Caller {
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
enum Asked {
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
struct Answer {
    at: Time,
    asked: Asked,
    response: Response,
}

/// Answers to recent request ids. A hash map: with 100k answers remembered, a
/// B-tree lookup missed the cache at every level, and three of them per
/// command (check, insert, evict) were ~10% of the server's CPU at 40k
/// commands/s. The hasher has fixed keys, so the table stays deterministic,
/// and the map is written sorted by key, so equal tables give equal snapshots.
type Answers = HashMap<(Caller, RequestId), Answer, BuildHasherDefault<DefaultHasher>>;

fn serialize_sorted<S: serde::Serializer>(answers: &Answers, s: S) -> Result<S::Ok, S::Error> {
    let mut sorted: Vec<_> = answers.iter().collect();
    sorted.sort_unstable_by_key(|(id, _)| **id);
    s.collect_seq(sorted)
}

fn deserialize_answers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Answers, D::Error> {
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

/// The result of applying one command.
pub type Outcome = Result<Response, LockError>;

/// The whole state of a Leasehold deployment's locks.
///
/// Pure and deterministic: time arrives in each command's [`Stamp`], nothing here
/// reads a clock or does I/O, and the same commands from the same state always
/// give the same state, responses and events. Every field is part of the
/// snapshot but the indexes and counts rebuilt from it on load, so a restored
/// table continues exactly where the original stood.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Restored")]
pub struct LockTable {
    /// Table time: the highest stamp applied. Never goes back.
    now: Time,
    /// The highest leader term seen; a higher one restamps every lease.
    epoch: u64,
    /// The next lease id. Ids are never reused.
    next_lease: LeaseId,
    /// The next fencing token. One sequence for all keys, for the life of the
    /// deployment: it is in the snapshot and moves only forward.
    next_fence: Fence,
    leases: BTreeMap<LeaseId, Lease>,
    /// Ordered so that listing by prefix is a range scan.
    locks: BTreeMap<Arc<str>, Lock>,
    /// Expiry order of leases.
    lease_deadlines: BTreeSet<(Time, LeaseId)>,
    /// Expiry order of queued waits.
    wait_deadlines: BTreeSet<(Time, Arc<str>, LeaseId)>,
    /// When keys leave their lock-delay.
    delay_deadlines: BTreeSet<(Time, Arc<str>)>,
    /// When waits (or grants to waits) that nobody re-attached after a new
    /// leadership are withdrawn: (deadline, key, lease).
    attach_deadlines: BTreeSet<(Time, Arc<str>, LeaseId)>,
    /// Answers to recent requests by caller and id, so a retried request
    /// never acts twice.
    #[serde(serialize_with = "serialize_sorted")]
    answered: Answers,
    answered_order: VecDeque<(Time, Caller, RequestId)>,
    /// Roles, tokens and the audit trail.
    auth: AuthState,
    /// Held lock sets, by their one token: the keys held with it.
    sets: BTreeMap<Fence, Set>,
    /// How many keys have at least one holder, kept as holds come and go so
    /// that reading it costs nothing at a million locks (`/metrics` reads it
    /// on every scrape). Not in the snapshot: counted again on load.
    #[serde(skip)]
    held_keys: usize,
}

/// A lock set's keys, sorted, each once.
type Set = Arc<[Arc<str>]>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lease {
    holder: Arc<str>,
    ttl_ms: u64,
    deadline: Time,
    /// The token that granted it, if auth was on; only that token may use it.
    owner: Option<TokenId>,
    /// Keys this lease holds. An index over `locks`, sharing its keys; not
    /// in the snapshot (serde would not share the `Arc`s), rebuilt on load.
    #[serde(skip)]
    held: BTreeSet<Arc<str>>,
    /// Keys this lease is queued for. Rebuilt on load like `held`.
    #[serde(skip)]
    waiting: BTreeSet<Arc<str>>,
}

/// A table as read from a snapshot, before its indexes are rebuilt.
#[derive(Deserialize)]
struct Restored {
    now: Time,
    epoch: u64,
    next_lease: LeaseId,
    next_fence: Fence,
    leases: BTreeMap<LeaseId, Lease>,
    locks: BTreeMap<Arc<str>, Lock>,
    lease_deadlines: BTreeSet<(Time, LeaseId)>,
    wait_deadlines: BTreeSet<(Time, Arc<str>, LeaseId)>,
    delay_deadlines: BTreeSet<(Time, Arc<str>)>,
    attach_deadlines: BTreeSet<(Time, Arc<str>, LeaseId)>,
    #[serde(deserialize_with = "deserialize_answers")]
    answered: Answers,
    answered_order: VecDeque<(Time, Caller, RequestId)>,
    auth: AuthState,
    sets: BTreeMap<Fence, Set>,
}

impl From<Restored> for LockTable {
    fn from(r: Restored) -> Self {
        let mut leases = r.leases;
        let mut held_keys = 0;
        for (key, lock) in &r.locks {
            held_keys += usize::from(lock.holder.is_some());
            for h in lock.holders() {
                if let Some(lease) = leases.get_mut(&h.lease) {
                    lease.held.insert(key.clone());
                }
            }
            for w in lock.waiters() {
                if let Some(lease) = leases.get_mut(&w.lease) {
                    lease.waiting.insert(key.clone());
                }
            }
        }
        LockTable {
            now: r.now,
            epoch: r.epoch,
            next_lease: r.next_lease,
            next_fence: r.next_fence,
            leases,
            locks: r.locks,
            lease_deadlines: r.lease_deadlines,
            wait_deadlines: r.wait_deadlines,
            delay_deadlines: r.delay_deadlines,
            attach_deadlines: r.attach_deadlines,
            answered: r.answered,
            answered_order: r.answered_order,
            auth: r.auth,
            sets: r.sets,
            held_keys,
        }
    }
}

/// One key's state. Most locks are just held, so what only some have (a
/// queue, a checkpoint, a lock-delay, holders beyond the first) lives behind
/// one pointer: a held lock costs a few dozen bytes, which matters at a
/// million locks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
struct Lock {
    /// The first holder; the others (readers, a semaphore's permits) are in
    /// `extra.more`. `None` means nobody holds the key.
    holder: Option<Holding>,
    extra: Option<Box<LockExtra>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
struct LockExtra {
    /// Holders after the first, in the order they were granted; empty unless
    /// `holder` is set.
    more: Vec<Holding>,
    waiters: VecDeque<Waiter>,
    checkpoint: Option<Checkpoint>,
    /// Set after an expiry with a lock-delay: nobody may take the key before then.
    delayed_until: Option<Time>,
}

static NO_WAITERS: VecDeque<Waiter> = VecDeque::new();

impl Lock {
    /// Every holder, the first first.
    fn holders(&self) -> impl Iterator<Item = &Holding> {
        let more = self.extra.as_ref().map_or(&[][..], |e| &e.more[..]);
        self.holder.iter().chain(more)
    }

    fn holder_count(&self) -> usize {
        self.holders().count()
    }

    fn holding_of(&self, lease: LeaseId) -> Option<&Holding> {
        self.holders().find(|h| h.lease == lease)
    }

    fn holding_mut(&mut self, lease: LeaseId) -> Option<&mut Holding> {
        if self.holder.as_ref().is_some_and(|h| h.lease == lease) {
            return self.holder.as_mut();
        }
        self.extra
            .as_mut()
            .and_then(|e| e.more.iter_mut().find(|h| h.lease == lease))
    }

    /// Whether a hold in `mode` may join the holders now (queue and
    /// lock-delay aside).
    fn admits(&self, mode: Mode) -> bool {
        mode.joins(self.holders().map(|h| h.mode), self.holder_count())
    }

    /// Adds a holder after the others.
    fn add_holding(&mut self, holding: Holding) {
        if self.holder.is_none() {
            self.holder = Some(holding);
        } else {
            self.extra_mut().more.push(holding);
        }
    }

    /// Takes `lease`'s hold out; the next holder in grant order becomes the first.
    fn take_holding(&mut self, lease: LeaseId) -> Option<Holding> {
        if self.holder.as_ref().is_some_and(|h| h.lease == lease) {
            let taken = self.holder.take();
            if let Some(extra) = self.extra.as_mut().filter(|e| !e.more.is_empty()) {
                self.holder = Some(extra.more.remove(0));
            }
            self.shrink();
            return taken;
        }
        let extra = self.extra.as_mut()?;
        let at = extra.more.iter().position(|h| h.lease == lease)?;
        let taken = extra.more.remove(at);
        self.shrink();
        Some(taken)
    }

    /// The semaphore size of whoever holds or waits for the key, if they
    /// disagree with `mode` (a semaphore asked for as a lock, or with
    /// another number of permits).
    fn conflict(&self, mode: Mode) -> Option<Mode> {
        self.holders()
            .map(|h| h.mode)
            .chain(self.waiters().iter().map(|w| w.mode))
            .find(|m| m.permits() != mode.permits())
    }

    fn is_empty(&self) -> bool {
        self.holder.is_none() && self.extra.is_none()
    }

    fn waiters(&self) -> &VecDeque<Waiter> {
        self.extra.as_ref().map_or(&NO_WAITERS, |e| &e.waiters)
    }

    fn checkpoint(&self) -> Option<&Checkpoint> {
        self.extra.as_ref().and_then(|e| e.checkpoint.as_ref())
    }

    fn delayed_until(&self) -> Option<Time> {
        self.extra.as_ref().and_then(|e| e.delayed_until)
    }

    fn extra_mut(&mut self) -> &mut LockExtra {
        self.extra.get_or_insert_with(Default::default)
    }

    /// Drops the extra part once it holds nothing.
    fn shrink(&mut self) {
        if self.extra.as_ref().is_some_and(|e| {
            e.more.is_empty()
                && e.waiters.is_empty()
                && e.checkpoint.is_none()
                && e.delayed_until.is_none()
        }) {
            self.extra = None;
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Holding {
    lease: LeaseId,
    fence: Fence,
    mode: Mode,
    lock_delay_ms: u64,
    /// Set when the grant came from the queue, with the wait's request id, so a
    /// cancelled wait can take back a grant its caller never saw.
    from_wait: Option<RequestId>,
    /// Granted to a wait whose caller has not come back since a new
    /// leadership: released at this time unless it does.
    attach_by: Option<Time>,
    /// The wait's attempt number when it was granted, moved on by every
    /// attempt that comes back for the grant (see [`Waiter::attempt`]).
    attempt: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Waiter {
    lease: LeaseId,
    mode: Mode,
    /// A lock set's wait: it is in every one of these keys' queues, and is
    /// granted all of them at once.
    set: Option<Set>,
    deadline: Time,
    lock_delay_ms: u64,
    request_id: RequestId,
    /// Since a new leadership, nobody has come back for this wait: it is
    /// withdrawn at this time unless its caller does.
    attach_by: Option<Time>,
    /// Which attempt of the caller's waiting call the wait belongs to: 1 when
    /// queued, one more each time the same acquire comes again (a retry,
    /// perhaps through another node). Withdrawing a wait names its attempt,
    /// so an attempt its caller abandoned cannot withdraw the wait, or take
    /// back the grant, a later attempt is answering.
    attempt: u64,
}

/// What an acquire asks for, beside its lease and key.
#[derive(Debug, Clone, Copy)]
struct Ask {
    wait_ms: u64,
    lock_delay_ms: u64,
    request_id: RequestId,
    mode: Mode,
}

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

impl Default for LockTable {
    fn default() -> Self {
        Self::new()
    }
}

impl LockTable {
    /// An empty table. Lease ids and fencing tokens start at 1.
    pub fn new() -> Self {
        LockTable {
            now: 0,
            epoch: 0,
            next_lease: 1,
            next_fence: 1,
            leases: BTreeMap::new(),
            locks: BTreeMap::new(),
            lease_deadlines: BTreeSet::new(),
            wait_deadlines: BTreeSet::new(),
            delay_deadlines: BTreeSet::new(),
            attach_deadlines: BTreeSet::new(),
            answered: Answers::default(),
            answered_order: VecDeque::new(),
            auth: AuthState::default(),
            sets: BTreeMap::new(),
            held_keys: 0,
        }
    }

    /// Table time: the highest stamp applied so far.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The highest leader term applied so far.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The token the next grant will get. Every token handed out so far is lower.
    pub fn next_fence(&self) -> Fence {
        self.next_fence
    }

    /// Number of live leases.
    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// Number of held locks (keys with at least one holder). Kept as the
    /// table changes: constant time.
    pub fn held_count(&self) -> usize {
        self.held_keys
    }

    /// Number of acquires waiting in a key's queue: one wait deadline each.
    /// Constant time.
    pub fn waiter_count(&self) -> usize {
        self.wait_deadlines.len()
    }

    /// The earliest time at which something is due (a lease expiry, a wait
    /// timeout, the end of a lock-delay), so the leader knows when to tick.
    pub fn next_deadline(&self) -> Option<Time> {
        [
            self.lease_deadlines.first().map(|d| d.0),
            self.wait_deadlines.first().map(|d| d.0),
            self.delay_deadlines.first().map(|d| d.0),
            self.attach_deadlines.first().map(|d| d.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// About how many keys applying `commands` at `stamp` would touch: one
    /// for each command, the keys and waits of every lease they end (by
    /// expiry or revoke), one for each wait, lock-delay and re-attach
    /// window that runs out, and every lease and key when a newer epoch
    /// restamps the table. Ending a lease that holds a million keys is a
    /// single command; a server uses this to run such a command where it
    /// holds up nothing else. Costs about one step per lease or wait due.
    pub fn work<'a>(&self, stamp: Stamp, commands: impl IntoIterator<Item = &'a Command>) -> usize {
        let lease_keys = |id: &LeaseId| {
            self.leases
                .get(id)
                .map_or(0, |l| l.held.len() + l.waiting.len())
        };
        let mut keys = 0;
        if stamp.epoch > self.epoch {
            keys += self.leases.len() + self.locks.len();
        }
        keys += self
            .lease_deadlines
            .iter()
            .take_while(|(deadline, _)| *deadline <= stamp.now)
            .map(|(_, id)| lease_keys(id))
            .sum::<usize>();
        let due = |deadline: Time| deadline <= stamp.now;
        keys += self.wait_deadlines.iter().take_while(|d| due(d.0)).count();
        keys += self.delay_deadlines.iter().take_while(|d| due(d.0)).count();
        keys += self
            .attach_deadlines
            .iter()
            .take_while(|d| due(d.0))
            .count();
        for mut command in commands {
            while let Command::As { command: inner, .. } = command {
                command = inner;
            }
            keys += 1;
            if let Command::Revoke { lease } = command {
                keys += lease_keys(lease);
            }
        }
        keys
    }

    /// Applies one command at the stamped time.
    ///
    /// First the stamp is taken in (a newer epoch restamps all leases, then
    /// everything due by `stamp.now` expires), then the command runs. A refused
    /// command changes nothing beyond what the passing of time did.
    pub fn apply(&mut self, stamp: Stamp, command: Command, events: &mut Vec<Event>) -> Outcome {
        let now = self.now.max(stamp.now);
        if stamp.epoch > self.epoch {
            self.epoch = stamp.epoch;
            self.restamp(now);
        }
        self.advance(now, events);
        self.run(command, None, events)
    }

    /// Runs a command for `token` (`None`: for the server itself, or with
    /// auth off), which it was checked against.
    fn run(
        &mut self,
        command: Command,
        token: Option<TokenId>,
        events: &mut Vec<Event>,
    ) -> Outcome {
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

    /// Applies a change to auth and tells of it with its audit entry.
    fn change_auth(
        &mut self,
        token: Option<TokenId>,
        certificate: Option<&str>,
        at_unix_ms: u64,
        change: AuthChange,
        events: &mut Vec<Event>,
    ) -> Result<Response, LockError> {
        let created = self.auth.apply_as(token, certificate, at_unix_ms, change)?;
        if let Some(audit) = self.auth.audit().back() {
            events.push(Event::AuthChanged {
                audit: audit.clone(),
            });
        }
        Ok(Response::AuthChanged { token: created })
    }

    // ---- auth ----

    /// Roles, tokens and the audit trail.
    pub fn auth(&self) -> &AuthState {
        &self.auth
    }

    /// Refuses `command` unless `token` may run it: its role's permission on
    /// the key, and for a command on a lease, that the lease is the token's
    /// own (or the token has admin on every key; revoking another's lease
    /// needs admin on every key that lease holds or waits for). A lease
    /// alone touches no key: granting one needs only a live token. Auth
    /// changes are checked by [`AuthState::apply`]. With auth off, anything goes.
    pub fn authorize(&self, token: Option<TokenId>, command: &Command) -> Result<(), LockError> {
        if matches!(command, Command::As { .. }) {
            return Err(LockError::invalid(
                "command",
                "a command on behalf of a token cannot be nested",
            ));
        }
        // Auth changes are checked by `AuthState::apply`, which answers a
        // repeated enable without a token.
        let auth = matches!(
            command,
            Command::Auth { .. } | Command::AuthWithCertificate { .. }
        );
        if !self.auth.enabled() || auth {
            return Ok(());
        }
        let t = token;
        self.auth.highest(t)?;
        let own = |lease: LeaseId| -> Result<(), LockError> {
            match self.leases.get(&lease) {
                Some(l) if l.owner != t && self.auth.permission(t, "")? < Permission::Admin => {
                    Err(LockError::NotOwner { lease })
                }
                // A lease that is gone gets the command's own error.
                _ => Ok(()),
            }
        };
        match command {
            Command::Grant { .. }
            | Command::Tick
            | Command::Auth { .. }
            | Command::AuthWithCertificate { .. } => Ok(()),
            Command::KeepAlive { lease } | Command::CancelWait { lease, .. } => own(*lease),
            Command::Revoke { lease } => {
                if own(*lease).is_ok() {
                    return Ok(());
                }
                let Some(l) = self.leases.get(lease) else {
                    return Ok(());
                };
                if l.held.is_empty() && l.waiting.is_empty() {
                    return self.auth.check(t, "", Permission::Admin);
                }
                l.held
                    .iter()
                    .chain(&l.waiting)
                    .try_for_each(|key| self.auth.check(t, key, Permission::Admin))
            }
            Command::Acquire { lease, key, .. } => {
                self.auth.check(t, key, Permission::Lock)?;
                own(*lease)
            }
            Command::AcquireSet { lease, keys, .. } => {
                for key in keys {
                    self.auth.check(t, key, Permission::Lock)?;
                }
                own(*lease)
            }
            Command::GrantAndAcquire { key, .. }
            | Command::Release { key, .. }
            | Command::SaveCheckpoint { key, .. } => self.auth.check(t, key, Permission::Lock),
            Command::As { .. } => Ok(()),
        }
    }

    // ---- time ----

    /// A new leader gives every live lease its full TTL again, and gives every
    /// queued wait [`REATTACH_MS`] for its caller to come back: the calls that
    /// were waiting were connections to the old leader, and are gone.
    fn restamp(&mut self, now: Time) {
        self.lease_deadlines.clear();
        for (id, lease) in self.leases.iter_mut() {
            lease.deadline = now.saturating_add(lease.ttl_ms);
            self.lease_deadlines.insert((lease.deadline, *id));
        }
        let until = now.saturating_add(REATTACH_MS);
        self.attach_deadlines.clear();
        for (key, lock) in self.locks.iter_mut() {
            if let Some(h) = lock.holder.as_mut().filter(|h| h.attach_by.is_some()) {
                h.attach_by = Some(until);
                self.attach_deadlines.insert((until, key.clone(), h.lease));
            }
            if let Some(extra) = lock.extra.as_mut() {
                for h in extra.more.iter_mut().filter(|h| h.attach_by.is_some()) {
                    h.attach_by = Some(until);
                    self.attach_deadlines.insert((until, key.clone(), h.lease));
                }
                for w in extra.waiters.iter_mut() {
                    w.attach_by = Some(until);
                    self.attach_deadlines.insert((until, key.clone(), w.lease));
                }
            }
        }
    }

    fn advance(&mut self, now: Time, events: &mut Vec<Event>) {
        self.now = now;
        while let Some(&(deadline, id)) = self.lease_deadlines.first() {
            if deadline > now {
                break;
            }
            self.end_lease(id, true, events);
            events.push(Event::LeaseExpired { lease: id });
        }
        while let Some((deadline, key, lease)) = self.wait_deadlines.first().cloned() {
            if deadline > now {
                break;
            }
            // Those behind it may be admitted now (readers behind a writer).
            self.withdraw(&key, lease, WaitEnd::TimedOut, true, events);
        }
        while let Some((deadline, key)) = self.delay_deadlines.first().cloned() {
            if deadline > now {
                break;
            }
            self.delay_deadlines.pop_first();
            if let Some(lock) = self.locks.get_mut(&key) {
                lock.extra_mut().delayed_until = None;
                lock.shrink();
            }
            self.advance_queue(&key, events);
        }
        while let Some((deadline, key, lease)) = self.attach_deadlines.first().cloned() {
            if deadline > now {
                break;
            }
            self.abandon(&key, lease, events);
        }
        while let Some(&(at, caller, id)) = self.answered_order.front() {
            if at.saturating_add(DEDUPE_WINDOW_MS) > now
                && self.answered_order.len() <= DEDUPE_CAPACITY
            {
                break;
            }
            self.answered_order.pop_front();
            if self.answered.get(&(caller, id)).is_some_and(|a| a.at == at) {
                self.answered.remove(&(caller, id));
            }
        }
    }

    /// Nobody came back for `lease`'s wait on `key` after a new leadership:
    /// withdraw the wait, or take back the grant it turned into.
    fn abandon(&mut self, key: &Arc<str>, lease: LeaseId, events: &mut Vec<Event>) {
        let Some(lock) = self.locks.get(key) else {
            self.attach_deadlines
                .retain(|(_, k, l)| !(k == key && *l == lease));
            return;
        };
        if let Some(h) = lock.holding_of(lease).filter(|h| h.attach_by.is_some()) {
            let (fence, request_id) = (h.fence, h.from_wait.unwrap_or(0));
            // Clears the deadline entry with the holding.
            let _ = self.release(key, fence, events);
            self.forget(Caller::Lease(lease), request_id);
        } else if self.withdraw(key, lease, WaitEnd::Abandoned, true, events) {
        } else {
            self.attach_deadlines
                .retain(|(_, k, l)| !(k == key && *l == lease));
        }
    }

    // ---- leases ----

    fn grant(&mut self, ttl_ms: u64, holder: String, owner: Option<TokenId>) -> Outcome {
        limits::validate_ttl(ttl_ms)?;
        limits::validate_holder(&holder)?;
        let id = self.next_lease;
        self.next_lease += 1;
        let deadline = self.now.saturating_add(ttl_ms);
        self.leases.insert(
            id,
            Lease {
                holder: holder.into(),
                ttl_ms,
                deadline,
                owner,
                held: BTreeSet::new(),
                waiting: BTreeSet::new(),
            },
        );
        self.lease_deadlines.insert((deadline, id));
        Ok(Response::LeaseGranted { lease: id, ttl_ms })
    }

    fn grant_once(
        &mut self,
        ttl_ms: u64,
        holder: String,
        request_id: RequestId,
        owner: Option<TokenId>,
    ) -> Outcome {
        limits::validate_ttl(ttl_ms)?;
        limits::validate_holder(&holder)?;
        let holder: Arc<str> = holder.into();
        let asked = Asked::Grant {
            ttl_ms,
            holder: holder.clone(),
        };
        let caller = owner.map_or(Caller::Granting, Caller::GrantingAs);
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            return Ok(first);
        }
        let response = self.grant(ttl_ms, holder.to_string(), owner)?;
        self.remember(caller, request_id, asked, response.clone());
        Ok(response)
    }

    #[allow(clippy::too_many_arguments)]
    fn grant_and_acquire(
        &mut self,
        ttl_ms: u64,
        holder: String,
        key: &str,
        (wait_ms, lock_delay_ms): (u64, u64),
        request_id: RequestId,
        mode: Mode,
        owner: Option<TokenId>,
        events: &mut Vec<Event>,
    ) -> Outcome {
        limits::validate_ttl(ttl_ms)?;
        limits::validate_holder(&holder)?;
        limits::validate_key(key)?;
        limits::validate_wait(wait_ms, lock_delay_ms)?;
        limits::validate_mode(mode)?;
        let holder: Arc<str> = holder.into();
        let asked = Asked::GrantAndAcquire {
            ttl_ms,
            holder: holder.clone(),
            key: key.into(),
            mode,
        };
        let caller = owner.map_or(Caller::Granting, Caller::GrantingAs);
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            // The retry goes on as the same acquire under the lease the first
            // answer made: the grant it got, or its place in the queue.
            let lease = match first {
                Response::Acquired(g) => g.lease,
                Response::Queued { lease, .. } => lease,
                other => return Ok(other),
            };
            return self.acquire_once(
                lease,
                key,
                (wait_ms, lock_delay_ms),
                request_id,
                mode,
                events,
            );
        }
        // Refuse before granting, so a refusal leaves no lease behind.
        if let Some(lock) = self.locks.get(key) {
            self.check_kind(key, lock, mode)?;
            if wait_ms == 0 && !Self::free(lock, mode) {
                return Err(self.busy_error(key, lock));
            }
        }
        let Response::LeaseGranted { lease, .. } = self.grant(ttl_ms, holder.to_string(), owner)?
        else {
            return Err(LockError::invalid("lease", "not granted"));
        };
        let response = self.acquire_once(
            lease,
            key,
            (wait_ms, lock_delay_ms),
            request_id,
            mode,
            events,
        )?;
        self.remember(caller, request_id, asked, response.clone());
        Ok(response)
    }

    fn live_lease(&self, id: LeaseId) -> Result<&Lease, LockError> {
        self.leases.get(&id).ok_or_else(|| self.no_lease(id))
    }

    /// Why lease `id` is not live: it ended (expired or revoked: one answer,
    /// whatever asks), or it was never handed out.
    pub fn no_lease(&self, id: LeaseId) -> LockError {
        if id != 0 && id < self.next_lease {
            LockError::LeaseExpired { lease: id }
        } else {
            LockError::LeaseNotFound { lease: id }
        }
    }

    fn keep_alive(&mut self, id: LeaseId) -> Outcome {
        self.live_lease(id)?;
        let now = self.now;
        let Some(lease) = self.leases.get_mut(&id) else {
            return Err(LockError::LeaseNotFound { lease: id });
        };
        self.lease_deadlines.remove(&(lease.deadline, id));
        lease.deadline = now.saturating_add(lease.ttl_ms);
        self.lease_deadlines.insert((lease.deadline, id));
        Ok(Response::Renewed {
            ttl_ms: lease.ttl_ms,
        })
    }

    fn revoke(&mut self, id: LeaseId, events: &mut Vec<Event>) -> Outcome {
        self.live_lease(id)?;
        let released = self.end_lease(id, false, events);
        Ok(Response::Revoked { released })
    }

    /// Ends a lease: withdraws its waits, frees its keys (with lock-delay when it
    /// expired), and hands each freed key to the next in line. Returns the
    /// keys it released when it was revoked (an expiry's go unreported).
    ///
    /// A lease may hold a million keys, and every replica frees them in one
    /// step on the thread that also answers heartbeats, so the common key
    /// (nobody waiting, no lock-delay) costs one walk down `locks`: found,
    /// freed and removed through the one entry, with no second look-up to
    /// hand it on and no copy of its name.
    fn end_lease(&mut self, id: LeaseId, expired: bool, events: &mut Vec<Event>) -> Vec<String> {
        let Some(lease) = self.leases.remove(&id) else {
            return Vec::new();
        };
        self.lease_deadlines.remove(&(lease.deadline, id));
        for key in &lease.waiting {
            self.withdraw(key, id, WaitEnd::LeaseGone, false, events);
        }
        // An event for each key and wait, and one for the lease itself (an
        // expiry's, pushed by the caller). Grown by doubling instead, a
        // million of them were copied into fresh pages again and again:
        // most of the step's time, where the kernel zeroes new memory slowly.
        events.reserve(lease.held.len() + lease.waiting.len() + 1);
        let mut released = Vec::with_capacity(if expired { 0 } else { lease.held.len() });
        // Freed keys someone else still holds, waits for or may not take
        // yet (lock-delay): the queue decides what happens to them next.
        let mut handed_on = Vec::new();
        for key in &lease.held {
            let Entry::Occupied(mut entry) = self.locks.entry(key.clone()) else {
                continue;
            };
            let lock = entry.get_mut();
            let Some(holding) = lock.take_holding(id) else {
                continue;
            };
            if lock.holder.is_none() {
                self.held_keys = self.held_keys.saturating_sub(1);
            }
            // Every key of a set this lease held is released here too.
            if !self.sets.is_empty() {
                self.sets.remove(&holding.fence);
            }
            if let Some(t) = holding.attach_by {
                self.attach_deadlines.remove(&(t, key.clone(), id));
            }
            let (key, fence, holder) = (key.clone(), holding.fence, lease.holder.clone());
            if expired {
                #[cfg(feature = "planted-bugs")]
                let delay = !crate::planted::is(crate::planted::TableBug::NoLockDelay);
                #[cfg(not(feature = "planted-bugs"))]
                let delay = true;
                if delay && holding.lock_delay_ms > 0 {
                    let until = self.now.saturating_add(holding.lock_delay_ms);
                    lock.extra_mut().delayed_until = Some(until);
                    self.delay_deadlines.insert((until, key.clone()));
                }
                events.push(Event::Expired {
                    key: key.clone(),
                    fence,
                    lease: id,
                    holder,
                });
            } else {
                released.push(key.to_string());
                events.push(Event::Released {
                    key: key.clone(),
                    fence,
                    lease: id,
                    holder,
                });
            }
            if lock.is_empty() {
                entry.remove();
            } else {
                handed_on.push(key);
            }
        }
        for key in lease.waiting.iter().chain(&handed_on) {
            self.advance_queue(key, events);
        }
        released
    }

    // ---- locks ----

    /// Whether a newcomer in `mode` may take the key now: nobody waits for
    /// it, it is not in lock-delay, and its holders admit the mode (none for
    /// an exclusive hold, only readers for a reader, fewer than its permits
    /// for a semaphore).
    fn free(lock: &Lock, mode: Mode) -> bool {
        lock.delayed_until().is_none() && lock.waiters().is_empty() && lock.admits(mode)
    }

    /// Refuses `mode` on a key held or waited for as another kind.
    fn check_kind(&self, key: &str, lock: &Lock, mode: Mode) -> Result<(), LockError> {
        let Some(is) = lock.conflict(mode) else {
            return Ok(());
        };
        let kind = |m: Mode| match m.permits() {
            Some(n) => format!("a semaphore of {n} permits"),
            None => "a lock".to_string(),
        };
        Err(LockError::invalid(
            "permits",
            format!(
                "{key:?} is {} while anyone holds or waits for it; asked for it as {}",
                kind(is),
                kind(mode)
            ),
        ))
    }

    fn acquire_once(
        &mut self,
        lease_id: LeaseId,
        key: &str,
        (wait_ms, lock_delay_ms): (u64, u64),
        request_id: RequestId,
        mode: Mode,
        events: &mut Vec<Event>,
    ) -> Outcome {
        limits::validate_key(key)?;
        limits::validate_wait(wait_ms, lock_delay_ms)?;
        limits::validate_mode(mode)?;
        // A retry after the lease ended is told so, not handed a dead grant.
        self.live_lease(lease_id)?;
        let ask = Ask {
            wait_ms,
            lock_delay_ms,
            request_id,
            mode,
        };
        if request_id == 0 {
            return self.acquire(lease_id, key, ask, events);
        }
        let caller = Caller::Lease(lease_id);
        let asked = Asked::Acquire {
            key: key.into(),
            mode,
        };
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            self.reattach(key, lease_id);
            return Ok(first);
        }
        let response = self.acquire(lease_id, key, ask, events)?;
        // A queued answer is not final: the grant is remembered when it comes.
        if let Response::Acquired(_) = &response {
            self.remember(caller, request_id, asked, response.clone());
        }
        Ok(response)
    }

    /// The caller of `lease`'s wait (or of the grant it turned into) on `key`
    /// came back: it is no longer withdrawn after a new leadership, and this
    /// is its newest attempt. Returns the attempt's number (0: no wait).
    fn reattach(&mut self, key: &str, lease_id: LeaseId) -> u64 {
        let Some(key) = self.locks.get_key_value(key).map(|(k, _)| k.clone()) else {
            return 0;
        };
        let Some(lock) = self.locks.get_mut(&key) else {
            return 0;
        };
        let mut cleared = None;
        let mut attempt = 0;
        if let Some(h) = lock.holding_mut(lease_id) {
            cleared = h.attach_by.take();
            if h.from_wait.is_some() {
                h.attempt += 1;
                attempt = h.attempt;
            }
        }
        if let Some(extra) = lock.extra.as_mut() {
            if let Some(w) = extra.waiters.iter_mut().find(|w| w.lease == lease_id) {
                cleared = cleared.or(w.attach_by.take());
                w.attempt += 1;
                attempt = w.attempt;
            }
        }
        if let Some(t) = cleared {
            self.attach_deadlines.remove(&(t, key, lease_id));
        }
        attempt
    }

    fn acquire(
        &mut self,
        lease_id: LeaseId,
        key: &str,
        ask: Ask,
        events: &mut Vec<Event>,
    ) -> Outcome {
        // Validated by `acquire_once`, its only caller.
        let lease = self.live_lease(lease_id)?;
        let lock = self.locks.get(key);
        if let Some(lock) = lock {
            self.check_kind(key, lock, ask.mode)?;
        }
        if lease.held.contains(key) {
            // Acquiring what you already hold is answered with the hold you
            // have; asking for it in another mode (a reader asking to write)
            // would wait for itself.
            let holding = lock.and_then(|l| l.holding_of(lease_id));
            if let Some(h) = holding.filter(|h| h.mode != ask.mode) {
                return Err(LockError::invalid(
                    "mode",
                    format!(
                        "lease {lease_id} already holds {key:?} as {}; release it before asking for it as {}",
                        h.mode.name(),
                        ask.mode.name()
                    ),
                ));
            }
            let fence = holding.map_or(0, |h| h.fence);
            let checkpoint = lock.and_then(|l| l.checkpoint().cloned());
            self.reattach(key, lease_id);
            return Ok(Response::Acquired(Grant {
                lease: lease_id,
                fence,
                checkpoint,
            }));
        }
        if lease.waiting.contains(key) {
            let waiting = lock.and_then(|l| {
                l.waiters()
                    .iter()
                    .enumerate()
                    .find(|(_, w)| w.lease == lease_id)
            });
            if let Some((_, w)) = waiting.filter(|(_, w)| w.set.is_some()) {
                return Err(LockError::invalid(
                    "key",
                    format!(
                        "lease {lease_id} waits for {key:?} as part of the set {:?}",
                        w.set.as_deref().unwrap_or_default()
                    ),
                ));
            }
            if let Some((_, w)) = waiting.filter(|(_, w)| w.mode != ask.mode) {
                return Err(LockError::invalid(
                    "mode",
                    format!(
                        "lease {lease_id} already waits for {key:?} as {}",
                        w.mode.name()
                    ),
                ));
            }
            let position = waiting.map_or(0, |(at, _)| at);
            // Asking again for a wait is coming back for it.
            let attempt = self.reattach(key, lease_id);
            return Ok(Response::Queued {
                lease: lease_id,
                position,
                attempt,
            });
        }
        let now = self.now;
        match lock {
            None => {}
            Some(lock) if Self::free(lock, ask.mode) => {}
            Some(lock) => {
                if ask.wait_ms == 0 {
                    return Err(self.busy_error(key, lock));
                }
                let deadline = now.saturating_add(ask.wait_ms);
                let (key, position) = match self.locks.get_key_value(key) {
                    Some((k, l)) => (k.clone(), l.waiters().len()),
                    None => return Err(LockError::invalid("key", "vanished")),
                };
                if let Some(lock) = self.locks.get_mut(&key) {
                    let waiter = Waiter {
                        lease: lease_id,
                        mode: ask.mode,
                        set: None,
                        deadline,
                        lock_delay_ms: ask.lock_delay_ms,
                        request_id: ask.request_id,
                        attach_by: None,
                        attempt: 1,
                    };
                    #[cfg(feature = "planted-bugs")]
                    if crate::planted::is(crate::planted::TableBug::LifoQueue) {
                        lock.extra_mut().waiters.push_front(waiter);
                    } else {
                        lock.extra_mut().waiters.push_back(waiter);
                    }
                    #[cfg(not(feature = "planted-bugs"))]
                    lock.extra_mut().waiters.push_back(waiter);
                }
                self.wait_deadlines
                    .insert((deadline, key.clone(), lease_id));
                if let Some(lease) = self.leases.get_mut(&lease_id) {
                    lease.waiting.insert(key);
                }
                return Ok(Response::Queued {
                    lease: lease_id,
                    position,
                    attempt: 1,
                });
            }
        }
        let key: Arc<str> = match self.locks.get_key_value(key) {
            Some((k, _)) => k.clone(),
            None => Arc::from(key),
        };
        let holding = Holding {
            lease: lease_id,
            fence: 0,
            mode: ask.mode,
            lock_delay_ms: ask.lock_delay_ms,
            from_wait: None,
            attach_by: None,
            attempt: 0,
        };
        let grant = self.grant_lock(&key, holding, events);
        Ok(Response::Acquired(grant))
    }

    fn busy_error(&self, key: &str, lock: &Lock) -> LockError {
        let name = |lease: LeaseId| {
            self.leases
                .get(&lease)
                .map_or_else(String::new, |l| l.holder.to_string())
        };
        // Free, but a lock set waits first in line for it (and for keys
        // that are not free yet): the set is next.
        if let (None, None, Some(w)) = (&lock.holder, lock.delayed_until(), lock.waiters().front())
        {
            return LockError::Held {
                key: key.to_string(),
                holder: format!("{} (next in line, for a lock set)", name(w.lease)),
                lease: w.lease,
                fence: 0,
            };
        }
        match &lock.holder {
            Some(h) => LockError::Held {
                key: key.to_string(),
                holder: self
                    .leases
                    .get(&h.lease)
                    .map_or_else(String::new, |l| l.holder.to_string()),
                lease: h.lease,
                fence: h.fence,
            },
            None => LockError::LockDelayed {
                key: key.to_string(),
                left_ms: lock
                    .delayed_until()
                    .map_or(0, |t| t.saturating_sub(self.now)),
            },
        }
    }

    /// Adds `holding` (its fence not yet set) to a key that admits it, with
    /// a fresh token.
    fn grant_lock(
        &mut self,
        key: &Arc<str>,
        mut holding: Holding,
        events: &mut Vec<Event>,
    ) -> Grant {
        let fence = self.next_fence;
        self.next_fence += 1;
        holding.fence = fence;
        let lease_id = holding.lease;
        let lock = self.locks.entry(key.clone()).or_default();
        self.held_keys += usize::from(lock.holder.is_none());
        lock.add_holding(holding);
        let checkpoint = lock.checkpoint().cloned();
        let holder = match self.leases.get_mut(&lease_id) {
            Some(lease) => {
                lease.held.insert(key.clone());
                lease.holder.clone()
            }
            None => Arc::from(""),
        };
        events.push(Event::Acquired {
            key: key.clone(),
            fence,
            lease: lease_id,
            holder,
            checkpoint: checkpoint.clone(),
        });
        Grant {
            lease: lease_id,
            fence,
            checkpoint,
        }
    }

    /// Hands a key to those first in its queue that its holders admit, in
    /// the same step that freed it: one writer, or every reader up to the
    /// next writer, or waiters up to a semaphore's permits.
    fn advance_queue(&mut self, key: &Arc<str>, events: &mut Vec<Event>) {
        loop {
            let Some(lock) = self.locks.get_mut(key) else {
                return;
            };
            if lock.delayed_until().is_some() {
                return;
            }
            // A set's wait first in line is granted every key at once, when
            // it is first on all of them and all are free; until then it
            // holds this key's line.
            if let Some((lease, set)) = lock
                .waiters()
                .front()
                .and_then(|w| Some((w.lease, w.set.clone()?)))
            {
                if !self.set_ready(&set, lease) {
                    return;
                }
                self.grant_set_from_queue(&set, lease, events);
                continue;
            }
            // Every queued waiter is live: waits leave the queue when they
            // time out or their lease ends.
            let admitted = lock.waiters().front().is_some_and(|w| lock.admits(w.mode));
            let next = if admitted {
                lock.extra.as_mut().and_then(|e| e.waiters.pop_front())
            } else {
                None
            };
            lock.shrink();
            let Some(waiter) = next else {
                self.drop_if_empty(key);
                return;
            };
            self.wait_deadlines
                .remove(&(waiter.deadline, key.clone(), waiter.lease));
            if let Some(lease) = self.leases.get_mut(&waiter.lease) {
                lease.waiting.remove(key);
            }
            // A waiter nobody has come back for since a new leadership keeps
            // its attach deadline (and its entry) on the grant.
            let holding = Holding {
                lease: waiter.lease,
                fence: 0,
                mode: waiter.mode,
                lock_delay_ms: waiter.lock_delay_ms,
                from_wait: Some(waiter.request_id),
                attach_by: waiter.attach_by,
                attempt: waiter.attempt,
            };
            let grant = self.grant_lock(key, holding, events);
            self.remember(
                Caller::Lease(waiter.lease),
                waiter.request_id,
                Asked::Acquire {
                    key: key.clone(),
                    mode: waiter.mode,
                },
                Response::Acquired(grant),
            );
        }
    }

    // ---- lock sets ----

    fn acquire_set_once(
        &mut self,
        lease_id: LeaseId,
        keys: &[String],
        (wait_ms, lock_delay_ms): (u64, u64),
        request_id: RequestId,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let keys = limits::validate_set(keys)?;
        limits::validate_wait(wait_ms, lock_delay_ms)?;
        self.live_lease(lease_id)?;
        // The table's own keys where it has them, so a set shares them.
        let set: Set = keys
            .iter()
            .map(|k| {
                self.locks
                    .get_key_value(k.as_str())
                    .map_or_else(|| Arc::from(k.as_str()), |(k, _)| k.clone())
            })
            .collect();
        let asked = Asked::AcquireSet { keys: set.clone() };
        let caller = Caller::Lease(lease_id);
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            for key in set.iter() {
                self.reattach(key, lease_id);
            }
            return Ok(first);
        }
        let response =
            self.acquire_set(lease_id, set, (wait_ms, lock_delay_ms), request_id, events)?;
        if let Response::Acquired(_) = &response {
            self.remember(caller, request_id, asked, response.clone());
        }
        Ok(response)
    }

    fn acquire_set(
        &mut self,
        lease_id: LeaseId,
        set: Set,
        (wait_ms, lock_delay_ms): (u64, u64),
        request_id: RequestId,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let Some(first) = set.first().cloned() else {
            return Err(LockError::invalid("keys", "a lock set needs a key"));
        };
        let lease = self.live_lease(lease_id)?;
        // Asking again for a set this lease holds, or waits for, is answered
        // with it; a key it holds or waits for otherwise is refused (it
        // would wait for itself).
        let held_as_set = self
            .locks
            .get(&first)
            .and_then(|l| l.holding_of(lease_id))
            .map(|h| h.fence)
            .filter(|fence| self.sets.get(fence) == Some(&set));
        if let Some(fence) = held_as_set {
            for key in set.iter() {
                self.reattach(key, lease_id);
            }
            return Ok(Response::Acquired(Grant {
                lease: lease_id,
                fence,
                checkpoint: None,
            }));
        }
        let waits_as_set = set.iter().all(|k| {
            self.locks.get(k).is_some_and(|l| {
                l.waiters()
                    .iter()
                    .any(|w| w.lease == lease_id && w.set.as_ref() == Some(&set))
            })
        });
        if waits_as_set {
            // Every key's wait moves on together, so they share the number.
            let mut attempt = 0;
            for key in set.iter() {
                attempt = self.reattach(key, lease_id);
            }
            let position = self.locks.get(&first).map_or(0, |l| {
                l.waiters()
                    .iter()
                    .position(|w| w.lease == lease_id)
                    .unwrap_or(0)
            });
            return Ok(Response::Queued {
                lease: lease_id,
                position,
                attempt,
            });
        }
        if let Some(key) = set
            .iter()
            .find(|k| lease.held.contains(&***k) || lease.waiting.contains(&***k))
        {
            return Err(LockError::invalid(
                "keys",
                format!("lease {lease_id} already holds or waits for {key:?}"),
            ));
        }
        let mut busy = None;
        for key in set.iter() {
            if let Some(lock) = self.locks.get(key) {
                self.check_kind(key, lock, Mode::Exclusive)?;
                if busy.is_none() && !Self::free(lock, Mode::Exclusive) {
                    busy = Some(self.busy_error(key, lock));
                }
            }
        }
        let Some(busy) = busy else {
            let grant = self.grant_set(&set, lease_id, lock_delay_ms, |_| None, None, events);
            return Ok(Response::Acquired(grant));
        };
        if wait_ms == 0 {
            return Err(busy);
        }
        let deadline = self.now.saturating_add(wait_ms);
        let mut position = 0;
        for (i, key) in set.iter().enumerate() {
            let lock = self.locks.entry(key.clone()).or_default();
            if i == 0 {
                position = lock.waiters().len();
            }
            lock.extra_mut().waiters.push_back(Waiter {
                lease: lease_id,
                mode: Mode::Exclusive,
                set: Some(set.clone()),
                deadline,
                lock_delay_ms,
                request_id,
                attach_by: None,
                attempt: 1,
            });
            self.wait_deadlines
                .insert((deadline, key.clone(), lease_id));
            if let Some(lease) = self.leases.get_mut(&lease_id) {
                lease.waiting.insert(key.clone());
            }
        }
        Ok(Response::Queued {
            lease: lease_id,
            position,
            attempt: 1,
        })
    }

    /// Whether `lease`'s set wait is first in line on every key of `set`,
    /// and every key is free (no holder, no lock-delay).
    fn set_ready(&self, set: &Set, lease: LeaseId) -> bool {
        set.iter().all(|k| {
            self.locks.get(k).is_some_and(|l| {
                l.holder.is_none()
                    && l.delayed_until().is_none()
                    && l.waiters().front().is_some_and(|w| w.lease == lease)
            })
        })
    }

    /// Takes a ready set wait out of every queue and grants it.
    fn grant_set_from_queue(&mut self, set: &Set, lease_id: LeaseId, events: &mut Vec<Event>) {
        let mut attach = Vec::with_capacity(set.len());
        let (mut lock_delay_ms, mut request_id, mut attempt) = (0, 0, 0);
        for key in set.iter() {
            let Some(waiter) = self
                .locks
                .get_mut(key)
                .and_then(|l| l.extra.as_mut())
                .and_then(|e| e.waiters.pop_front())
            else {
                continue;
            };
            self.wait_deadlines
                .remove(&(waiter.deadline, key.clone(), lease_id));
            if let Some(lease) = self.leases.get_mut(&lease_id) {
                lease.waiting.remove(key);
            }
            (lock_delay_ms, request_id, attempt) =
                (waiter.lock_delay_ms, waiter.request_id, waiter.attempt);
            attach.push(waiter.attach_by);
        }
        let grant = self.grant_set(
            set,
            lease_id,
            lock_delay_ms,
            |i| attach.get(i).copied().flatten(),
            Some((request_id, attempt)),
            events,
        );
        self.remember(
            Caller::Lease(lease_id),
            request_id,
            Asked::AcquireSet { keys: set.clone() },
            Response::Acquired(grant),
        );
    }

    /// Gives every key of a set (each free) to a lease, with one fresh token.
    /// `attach_by(i)` is the attach deadline carried over to the i-th key.
    fn grant_set(
        &mut self,
        set: &Set,
        lease_id: LeaseId,
        lock_delay_ms: u64,
        attach_by: impl Fn(usize) -> Option<Time>,
        from_wait: Option<(RequestId, u64)>,
        events: &mut Vec<Event>,
    ) -> Grant {
        let fence = self.next_fence;
        self.next_fence += 1;
        let holder = self
            .leases
            .get(&lease_id)
            .map_or_else(|| Arc::from(""), |l| l.holder.clone());
        for (i, key) in set.iter().enumerate() {
            let lock = self.locks.entry(key.clone()).or_default();
            self.held_keys += usize::from(lock.holder.is_none());
            lock.add_holding(Holding {
                lease: lease_id,
                fence,
                mode: Mode::Exclusive,
                lock_delay_ms,
                from_wait: from_wait.map(|(id, _)| id),
                attach_by: attach_by(i),
                attempt: from_wait.map_or(0, |(_, attempt)| attempt),
            });
            lock.shrink();
            let checkpoint = lock.checkpoint().cloned();
            if let Some(lease) = self.leases.get_mut(&lease_id) {
                lease.held.insert(key.clone());
            }
            events.push(Event::Acquired {
                key: key.clone(),
                fence,
                lease: lease_id,
                holder: holder.clone(),
                checkpoint,
            });
        }
        self.sets.insert(fence, set.clone());
        Grant {
            lease: lease_id,
            fence,
            checkpoint: None,
        }
    }

    /// Ends `lease_id`'s wait for `key` (for every key of its set, if it is a
    /// set's), telling why; with `advance`, hands each key to whoever is next.
    /// False if it was not waiting.
    fn withdraw(
        &mut self,
        key: &Arc<str>,
        lease_id: LeaseId,
        reason: WaitEnd,
        advance: bool,
        events: &mut Vec<Event>,
    ) -> bool {
        let Some(waiter) = self.take_waiter(key, lease_id) else {
            return false;
        };
        let mut keys = vec![key.clone()];
        for other in waiter.set.iter().flat_map(|s| s.iter()) {
            if other != key && self.take_waiter(other, lease_id).is_some() {
                keys.push(other.clone());
            }
        }
        for k in &keys {
            events.push(Event::WaitEnded {
                key: k.clone(),
                lease: lease_id,
                reason,
            });
        }
        for k in &keys {
            if advance {
                self.advance_queue(k, events);
            } else {
                self.drop_if_empty(k);
            }
        }
        true
    }

    /// Takes a lease's wait out of one key's queue.
    fn take_waiter(&mut self, key: &Arc<str>, lease_id: LeaseId) -> Option<Waiter> {
        let lock = self.locks.get_mut(key)?;
        let at = lock.waiters().iter().position(|w| w.lease == lease_id)?;
        let waiter = lock.extra_mut().waiters.remove(at)?;
        lock.shrink();
        self.wait_deadlines
            .remove(&(waiter.deadline, key.clone(), lease_id));
        if let Some(t) = waiter.attach_by {
            self.attach_deadlines.remove(&(t, key.clone(), lease_id));
        }
        if let Some(lease) = self.leases.get_mut(&lease_id) {
            lease.waiting.remove(key);
        }
        Some(waiter)
    }

    fn drop_if_empty(&mut self, key: &Arc<str>) {
        if self.locks.get(key).is_some_and(Lock::is_empty) {
            self.locks.remove(key);
        }
    }

    fn cancel_wait(
        &mut self,
        lease_id: LeaseId,
        key: &str,
        request_id: RequestId,
        attempt: u64,
        events: &mut Vec<Event>,
    ) -> Outcome {
        limits::validate_key(key)?;
        let Some((key, lock)) = self.locks.get_key_value(key) else {
            return Ok(Response::WaitCancelled);
        };
        let key = key.clone();
        // Only the attempt the wait now belongs to withdraws it (0: any).
        let its_attempt = |a: u64| attempt == 0 || attempt == a;
        let granted_to_this_wait = lock
            .holding_of(lease_id)
            .filter(|h| h.from_wait == Some(request_id))
            .map(|h| (h.fence, h.attempt));
        if let Some((fence, granted_in)) = granted_to_this_wait {
            if its_attempt(granted_in) {
                self.release(&key, fence, events)?;
                // A retry of this wait must not be answered with the grant taken back.
                self.forget(Caller::Lease(lease_id), request_id);
            }
        } else if lock
            .waiters()
            .iter()
            .any(|w| w.lease == lease_id && its_attempt(w.attempt))
        {
            self.withdraw(&key, lease_id, WaitEnd::Cancelled, true, events);
        }
        Ok(Response::WaitCancelled)
    }

    fn held_by<'a>(
        &'a self,
        key: &str,
        fence: Fence,
    ) -> Result<(&'a Arc<str>, &'a Holding), LockError> {
        limits::validate_key(key)?;
        let found = self.locks.get_key_value(key);
        if let Some((k, h)) =
            found.and_then(|(k, l)| Some((k, l.holders().find(|h| h.fence == fence)?)))
        {
            return Ok((k, h));
        }
        Err(LockError::StaleFence {
            key: key.to_string(),
            presented: fence,
            current: found.and_then(|(_, l)| l.holder.as_ref()).map(|h| h.fence),
        })
    }

    fn release(&mut self, key: &str, fence: Fence, events: &mut Vec<Event>) -> Outcome {
        self.held_by(key, fence)?;
        // A set is released together, by any of its keys.
        let keys: Vec<Arc<str>> = match self.sets.remove(&fence) {
            Some(set) => set.to_vec(),
            None => vec![Arc::from(key)],
        };
        for k in &keys {
            self.release_one(k, fence, events)?;
        }
        for k in &keys {
            self.advance_queue(k, events);
        }
        Ok(Response::Released)
    }

    /// Frees one key held with `fence`, without handing it on.
    fn release_one(&mut self, key: &str, fence: Fence, events: &mut Vec<Event>) -> Outcome {
        let (key, holding) = self.held_by(key, fence)?;
        let (key, lease_id, attach_by) = (key.clone(), holding.lease, holding.attach_by);
        if let Some(t) = attach_by {
            self.attach_deadlines.remove(&(t, key.clone(), lease_id));
        }
        let holder = match self.leases.get_mut(&lease_id) {
            Some(lease) => {
                lease.held.remove(&key);
                lease.holder.clone()
            }
            None => Arc::from(""),
        };
        if let Some(lock) = self.locks.get_mut(&key) {
            if lock.take_holding(lease_id).is_some() && lock.holder.is_none() {
                self.held_keys = self.held_keys.saturating_sub(1);
            }
        }
        events.push(Event::Released {
            key: key.clone(),
            fence,
            lease: lease_id,
            holder,
        });
        Ok(Response::Released)
    }

    fn save_checkpoint(
        &mut self,
        key: &str,
        fence: Fence,
        data: Vec<u8>,
        events: &mut Vec<Event>,
    ) -> Outcome {
        limits::validate_checkpoint(&data)?;
        let (key, holding) = self.held_by(key, fence)?;
        let (key, lease) = (key.clone(), holding.lease);
        let data: Arc<[u8]> = data.into();
        if let Some(lock) = self.locks.get_mut(&key) {
            lock.extra_mut().checkpoint = (!data.is_empty()).then(|| Checkpoint {
                data: data.clone(),
                fence,
            });
            lock.shrink();
        }
        let holder = self
            .leases
            .get(&lease)
            .map_or_else(|| Arc::from(""), |l| l.holder.clone());
        events.push(Event::CheckpointSaved {
            key,
            fence,
            lease,
            holder,
            data,
        });
        Ok(Response::CheckpointSaved)
    }

    // ---- retries ----

    fn release_once(
        &mut self,
        key: &str,
        fence: Fence,
        request_id: RequestId,
        events: &mut Vec<Event>,
    ) -> Outcome {
        limits::validate_key(key)?;
        if request_id == 0 {
            return self.release(key, fence, events);
        }
        let caller = Caller::Hold(fence);
        let asked = Asked::Release { key: key.into() };
        if let Some(first) = self.recall(caller, request_id, &asked)? {
            return Ok(first);
        }
        let response = self.release(key, fence, events)?;
        self.remember(caller, request_id, asked, response.clone());
        Ok(response)
    }

    /// The first answer to this caller's request `request_id`, if it was
    /// answered; an error if the id named another request.
    fn recall(
        &self,
        caller: Caller,
        request_id: RequestId,
        asked: &Asked,
    ) -> Result<Option<Response>, LockError> {
        if request_id == 0 {
            return Ok(None);
        }
        match self.answered.get(&(caller, request_id)) {
            None => Ok(None),
            Some(first) if first.asked == *asked => Ok(Some(first.response.clone())),
            Some(first) => Err(reused_id(request_id, &first.asked)),
        }
    }

    /// Keeps an answer for retries. Only what changed something is
    /// remembered: a refusal changed nothing, so a retry is judged afresh.
    fn remember(
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
            at: self.now,
            asked,
            response,
        };
        self.answered.insert((caller, request_id), answer);
        self.answered_order
            .push_back((self.now, caller, request_id));
    }

    fn forget(&mut self, caller: Caller, request_id: RequestId) {
        if request_id != 0 {
            self.answered.remove(&(caller, request_id));
        }
    }

    // ---- reading ----

    /// One lock, as seen at time `now`.
    pub fn lock(&self, key: &str, now: Time) -> Option<LockView> {
        self.locks
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
        self.locks
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
        self.leases
            .get(&id)
            .map(|l| view_lease(id, l, now, usize::MAX))
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
        self.leases
            .range((Bound::Excluded(start_after), Bound::Unbounded))
            .filter(|(_, l)| visible(l.owner))
            .take(limit)
            .map(|(id, l)| view_lease(*id, l, now, max_keys))
            .collect()
    }

    fn view_lock(&self, key: &str, lock: &Lock, now: Time) -> LockView {
        let name = |lease: LeaseId| {
            self.leases
                .get(&lease)
                .map_or_else(String::new, |l| l.holder.to_string())
        };
        let view = |h: &Holding| HolderView {
            lease: h.lease,
            holder: name(h.lease),
            fence: h.fence,
            ttl_left_ms: self
                .leases
                .get(&h.lease)
                .map_or(0, |l| l.deadline.saturating_sub(now)),
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

    /// Checks the table's internal consistency; used by tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (key, lock) in &self.locks {
            if lock.is_empty() {
                return Err(format!("empty lock entry {key:?} kept"));
            }
            if lock.holder.is_none() && lock.holder_count() > 0 {
                return Err(format!("{key:?} has holders but no first holder"));
            }
            let mut leases_here = BTreeSet::new();
            for h in lock.holders() {
                let lease = self
                    .leases
                    .get(&h.lease)
                    .ok_or(format!("{key:?} held by dead lease {}", h.lease))?;
                if !lease.held.contains(key) {
                    return Err(format!("lease {} does not know it holds {key:?}", h.lease));
                }
                if !leases_here.insert(h.lease) {
                    return Err(format!("lease {} holds {key:?} twice", h.lease));
                }
                if h.fence >= self.next_fence {
                    return Err(format!(
                        "{key:?} has fence {} >= next {}",
                        h.fence, self.next_fence
                    ));
                }
            }
            let modes: Vec<Mode> = lock.holders().map(|h| h.mode).collect();
            let fits = match modes.first() {
                None => true,
                Some(Mode::Exclusive) => modes.len() == 1,
                Some(Mode::Shared) => modes.iter().all(|m| *m == Mode::Shared),
                Some(first @ Mode::Permit { permits }) => {
                    modes.iter().all(|m| m == first) && modes.len() <= *permits as usize
                }
            };
            if !fits {
                return Err(format!(
                    "{key:?} has holders that exclude each other: {modes:?}"
                ));
            }
            if let Some(w) = lock.waiters().front() {
                let ready = match &w.set {
                    Some(set) => self.set_ready(set, w.lease),
                    None => lock.admits(w.mode) && lock.delayed_until().is_none(),
                };
                if ready {
                    return Err(format!("{key:?} keeps a waiter it could grant"));
                }
            }
            if lock.extra.is_some()
                && lock.holder_count() < 2
                && lock.waiters().is_empty()
                && lock.checkpoint().is_none()
                && lock.delayed_until().is_none()
            {
                return Err(format!("{key:?} keeps an empty extra part"));
            }
            for w in lock.waiters() {
                let lease = self
                    .leases
                    .get(&w.lease)
                    .ok_or(format!("{key:?} has dead waiter {}", w.lease))?;
                if !lease.waiting.contains(key) {
                    return Err(format!(
                        "lease {} does not know it waits for {key:?}",
                        w.lease
                    ));
                }
                if !self
                    .wait_deadlines
                    .contains(&(w.deadline, key.clone(), w.lease))
                {
                    return Err(format!(
                        "wait of {} on {key:?} has no deadline entry",
                        w.lease
                    ));
                }
            }
        }
        for (id, lease) in &self.leases {
            if lease.deadline <= self.now {
                return Err(format!("lease {id} is past its deadline but live"));
            }
            if !self.lease_deadlines.contains(&(lease.deadline, *id)) {
                return Err(format!("lease {id} has no deadline entry"));
            }
            for key in &lease.held {
                let holds = self
                    .locks
                    .get(key)
                    .is_some_and(|l| l.holding_of(*id).is_some());
                if !holds {
                    return Err(format!("lease {id} thinks it holds {key:?}"));
                }
            }
        }
        let mut detached = 0;
        for (key, lock) in &self.locks {
            let holder = lock.holders().filter_map(|h| Some((h.attach_by?, h.lease)));
            let waiters = lock
                .waiters()
                .iter()
                .filter_map(|w| Some((w.attach_by?, w.lease)));
            for (t, lease) in holder.chain(waiters) {
                detached += 1;
                if !self.attach_deadlines.contains(&(t, key.clone(), lease)) {
                    return Err(format!(
                        "detached {lease} on {key:?} has no attach deadline"
                    ));
                }
            }
        }
        if self.attach_deadlines.len() != detached {
            return Err("stray attach deadlines".into());
        }
        for (fence, set) in &self.sets {
            let mut leases = BTreeSet::new();
            for key in set.iter() {
                let holding = self
                    .locks
                    .get(key)
                    .and_then(|l| l.holders().find(|h| h.fence == *fence))
                    .ok_or(format!("set {fence} is not held on {key:?}"))?;
                leases.insert(holding.lease);
            }
            if leases.len() != 1 {
                return Err(format!("set {fence} is held by several leases"));
            }
        }
        if self.lease_deadlines.len() != self.leases.len() {
            return Err("stray lease deadlines".into());
        }
        let waits: usize = self.locks.values().map(|l| l.waiters().len()).sum();
        if self.wait_deadlines.len() != waits {
            return Err("stray wait deadlines".into());
        }
        let held = self.locks.values().filter(|l| l.holder.is_some()).count();
        if self.held_keys != held {
            return Err(format!(
                "{} keys counted as held, {held} held",
                self.held_keys
            ));
        }
        Ok(())
    }
}

fn view_lease(id: LeaseId, lease: &Lease, now: Time, max_keys: usize) -> LeaseView {
    LeaseView {
        lease: id,
        holder: lease.holder.to_string(),
        ttl_ms: lease.ttl_ms,
        ttl_left_ms: lease.deadline.saturating_sub(now),
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
