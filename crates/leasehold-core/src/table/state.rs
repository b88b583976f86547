//! The snapshot: the part of the table that is persisted, and the indexes
//! and counts rebuilt from it on load.
//!
//! A [`LockTable`] is written as its [`TableState`] and nothing else, and read
//! back as one, from which [`LockTable::rebuilt`] derives the rest. A field
//! added to `TableState` is therefore read and restored with no other change,
//! and written so once it is added to `Restamped` too (how a table whose
//! takeover restamp is pending writes itself); a field that is derived
//! belongs beside it in `LockTable` (or is `#[serde(skip)]`) and is filled
//! in by `rebuilt`.
//!
//! The format is bincode 1 of `TableState`: its fields one after another, in
//! the order they are declared, with nothing around them. Reordering fields,
//! or changing how one is written, changes the format that snapshots already
//! on disk were written in; `tests/snapshot_format.rs` pins it.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::auth::{AuthState, TokenId};
use crate::{Fence, LeaseId, RequestId, Time};

use super::answers::{deserialize_answers, serialize_sorted, Answers, Caller};
use super::deadlines::{Deadlines, DeadlinesAt};
use super::lock::{Lease, Lock, Set};
use super::{LockTable, Owned};

/// What of the table is persisted: everything the rules decide on, apart from
/// the indexes and counts derived from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct TableState {
    /// Table time: the highest stamp applied. Never goes back.
    pub(super) now: Time,
    /// The highest leader term seen; a higher one restamps every lease.
    pub(super) epoch: u64,
    /// The next lease id. Ids are never reused.
    pub(super) next_lease: LeaseId,
    /// The next fencing token. One sequence for all keys, for the life of the
    /// deployment: it is in the snapshot and moves only forward.
    pub(super) next_fence: Fence,
    /// Live leases. Each one's `held` and `waiting` keys are an index, not
    /// persisted: rebuilt from `locks` on load.
    pub(super) leases: BTreeMap<LeaseId, Lease>,
    /// Ordered so that listing by prefix is a range scan.
    #[serde(deserialize_with = "deserialize_packed")]
    pub(super) locks: BTreeMap<Arc<str>, Lock>,
    /// When lease expiries, wait timeouts, lock-delays and re-attach windows
    /// fall due.
    pub(super) deadlines: Deadlines,
    /// Answers to recent requests by caller and id, so a retried request
    /// never acts twice. Written sorted by key, so equal tables give equal
    /// snapshots.
    #[serde(
        serialize_with = "serialize_sorted",
        deserialize_with = "deserialize_answers"
    )]
    pub(super) answered: Answers,
    /// The same answers in the order they were given, to forget the oldest first.
    pub(super) answered_order: VecDeque<(Time, Caller, RequestId)>,
    /// Roles, tokens and the audit trail.
    pub(super) auth: AuthState,
    /// Held lock sets, by their one token: the keys held with it.
    pub(super) sets: BTreeMap<Fence, Set>,
}

impl TableState {
    /// The state of a table nothing has happened to. Lease ids and fencing
    /// tokens start at 1.
    pub(super) fn empty() -> Self {
        TableState {
            now: 0,
            epoch: 0,
            next_lease: 1,
            next_fence: 1,
            leases: BTreeMap::new(),
            locks: BTreeMap::new(),
            deadlines: Deadlines::default(),
            answered: Answers::default(),
            answered_order: VecDeque::new(),
            auth: AuthState::default(),
            sets: BTreeMap::new(),
        }
    }

    /// Takes the next fencing token, higher than every one handed out before.
    pub(super) fn new_fence(&mut self) -> Fence {
        let fence = self.next_fence;
        self.next_fence += 1;
        fence
    }
}

impl LockTable {
    /// The table that stands on `state`, with the indexes and counts derived
    /// from it: the keys each lease holds and waits for, and how many keys
    /// are held, and what each token owns. Whatever those indexes held in
    /// `state` is replaced.
    pub(super) fn rebuilt(mut state: TableState) -> Self {
        let mut held_keys = 0;
        // Each lease's keys, gathered in key order and then built into their
        // sets in one pass each (full nodes; see `deserialize_packed`).
        let mut held: BTreeMap<LeaseId, Vec<Arc<str>>> = BTreeMap::new();
        let mut waiting: BTreeMap<LeaseId, Vec<Arc<str>>> = BTreeMap::new();
        for (key, lock) in &state.locks {
            held_keys += usize::from(lock.holder.is_some());
            for h in lock.holders() {
                held.entry(h.lease).or_default().push(key.clone());
            }
            for w in lock.waiters() {
                waiting.entry(w.lease).or_default().push(key.clone());
            }
        }
        let mut owned: BTreeMap<TokenId, Owned> = BTreeMap::new();
        for (id, lease) in &mut state.leases {
            lease.held = held.remove(id).unwrap_or_default().into_iter().collect();
            lease.waiting = waiting.remove(id).unwrap_or_default().into_iter().collect();
            Owned::count(&mut owned, lease.owner, |o| {
                o.leases += 1;
                o.keys += lease.held.len();
                o.waits += lease.waiting.len();
            });
        }
        LockTable {
            state,
            held_keys,
            owned,
            restamped: None,
        }
    }
}

/// Reads a map written as serde writes a `BTreeMap` and builds it from all
/// its entries at once. They come sorted, so every node of the tree comes out
/// full; inserted one at a time, in order, each would be left a little over
/// half full (at a million locks, some 60 MB more).
fn deserialize_packed<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
{
    struct Entries<K, V>(PhantomData<(K, V)>);

    impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Visitor<'de> for Entries<K, V> {
        type Value = BTreeMap<K, V>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            // The length read is only a start: a damaged one must not
            // reserve more than a million entries.
            let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1 << 20));
            while let Some(entry) = map.next_entry()? {
                entries.push(entry);
            }
            Ok(entries.into_iter().collect())
        }
    }

    d.deserialize_map(Entries(PhantomData))
}

/// A table is written as its persisted state alone, each lease with the
/// deadline in effect: a pending restamp is written as if it had been
/// applied to every lease (`Restamp`, in `deadlines.rs`).
impl Serialize for LockTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.restamped.is_none() {
            return self.state.serialize(serializer);
        }
        // Every field named, so that one added to `TableState` and not
        // written here does not compile.
        let TableState {
            now,
            epoch,
            next_lease,
            next_fence,
            leases,
            locks,
            deadlines,
            answered,
            answered_order,
            auth,
            sets,
        } = &self.state;
        // The leases the restamp moves: all of them just after a takeover,
        // only those nobody renewed since a little later.
        let (mut moved, mut moved_ids) = (Vec::new(), Vec::new());
        for (id, lease) in leases {
            let expiry = self.expiry(lease);
            if expiry != lease.deadline {
                moved.push((expiry, *id));
                moved_ids.push(*id);
            }
        }
        if moved.is_empty() {
            return self.state.serialize(serializer);
        }
        moved.sort_unstable();
        Restamped {
            now: *now,
            epoch: *epoch,
            next_lease: *next_lease,
            next_fence: *next_fence,
            leases: LeasesAt(self),
            locks,
            deadlines: deadlines.with_moved(&moved, &moved_ids),
            answered,
            answered_order,
            auth,
            sets,
        }
        .serialize(serializer)
    }
}

/// [`TableState`] as it is written while a restamp is pending: the same
/// fields, in the same order, written the same way, but for the leases'
/// deadlines. A field added to `TableState` is added here too (the
/// compiler asks for it in `serialize` above); the property test
/// `a_snapshot_after_any_step_acts_as_its_table` compares the two encodings.
#[derive(Serialize)]
#[serde(rename = "TableState")]
struct Restamped<'a> {
    now: Time,
    epoch: u64,
    next_lease: LeaseId,
    next_fence: Fence,
    leases: LeasesAt<'a>,
    locks: &'a BTreeMap<Arc<str>, Lock>,
    deadlines: DeadlinesAt<'a>,
    #[serde(serialize_with = "serialize_sorted")]
    answered: &'a Answers,
    answered_order: &'a VecDeque<(Time, Caller, RequestId)>,
    auth: &'a AuthState,
    sets: &'a BTreeMap<Fence, Set>,
}

/// A table's leases, each written with the deadline in effect.
struct LeasesAt<'a>(&'a LockTable);

impl Serialize for LeasesAt<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let table = self.0;
        serializer.collect_map(table.state.leases.iter().map(|(id, lease)| {
            let at = Lease::new(
                lease.holder.clone(),
                lease.ttl_ms,
                table.expiry(lease),
                lease.owner,
            );
            (*id, at)
        }))
    }
}

/// Two tables are equal when everything they act on is: their persisted
/// states with every lease at the deadline in effect, and the counts kept
/// beside them.
impl PartialEq for LockTable {
    fn eq(&self, other: &Self) -> bool {
        fn settled(table: &LockTable) -> Cow<'_, LockTable> {
            if table.restamped.is_none() {
                return Cow::Borrowed(table);
            }
            let mut table = table.clone();
            table.settle();
            Cow::Owned(table)
        }
        let (a, b) = (settled(self), settled(other));
        // Every field named, so that one added to `LockTable` is compared.
        let LockTable {
            state,
            held_keys,
            owned,
            restamped: _,
        } = &*a;
        (state, held_keys, owned) == (&b.state, &b.held_keys, &b.owned)
    }
}

impl Eq for LockTable {}

/// A table is read as its persisted state, then its indexes are rebuilt.
impl<'de> Deserialize<'de> for LockTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        TableState::deserialize(deserializer).map(LockTable::rebuilt)
    }
}
