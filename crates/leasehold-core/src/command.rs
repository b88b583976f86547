//! What goes into the table (commands) and what comes out (responses, events).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::auth::{AuditEntry, AuthChange, TokenId};
use crate::{Fence, LeaseId, RequestId, Time};

/// The leader's stamp on a command: its clock and its term.
///
/// The table never reads a clock; the leader stamps its monotonic time into each
/// log entry, so every replica computes the same state. A command from a newer
/// `epoch` (a new leader, or a restarted single node) first gives every live
/// lease its full TTL again, so no lease expires early because leadership moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// Milliseconds on the leader's clock. The table clamps it so time never goes back.
    pub now: Time,
    /// The leader's term.
    pub epoch: u64,
}

/// How a hold shares its key with other holds.
///
/// A key's holders are one [`Exclusive`](Mode::Exclusive) hold, or any number
/// of [`Shared`](Mode::Shared) ones (a read/write lock: exclusive is the
/// writer), or up to `permits` [`Permit`](Mode::Permit) holds (a counting
/// semaphore). Every hold has its own fencing token. A key is a semaphore or
/// not while anyone holds or waits for it: asking for it with another number
/// of permits (or as a lock while it is a semaphore) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Mode {
    /// The only holder: a mutex, or a read/write lock's writer.
    #[default]
    Exclusive,
    /// One of any number of readers, never beside a writer. A waiting writer
    /// stops new readers, so writers never starve.
    Shared,
    /// One of at most `permits` holders of a counting semaphore.
    Permit {
        /// How many may hold the key at once (1 ..= [`MAX_PERMITS`](crate::limits::MAX_PERMITS)).
        permits: u32,
    },
}

impl Mode {
    /// The semaphore size this mode asks for (`None` for a lock).
    pub fn permits(self) -> Option<u32> {
        match self {
            Mode::Permit { permits } => Some(permits),
            Mode::Exclusive | Mode::Shared => None,
        }
    }

    /// A short name: `exclusive`, `shared` or `permit`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Permit { .. } => "permit",
        }
    }

    /// Whether a hold in this mode may join `holders` (the key's holders now).
    pub fn joins(self, holders: impl IntoIterator<Item = Mode>, count: usize) -> bool {
        let mut holders = holders.into_iter();
        let Some(first) = holders.next() else {
            return true;
        };
        match (first, self) {
            (Mode::Shared, Mode::Shared) => true,
            (Mode::Permit { permits: n }, Mode::Permit { permits: m }) => {
                n == m && count < n as usize
            }
            _ => false,
        }
    }
}

/// A change to the lock table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Creates a lease with this TTL for this holder.
    Grant {
        /// Time to live in milliseconds.
        ttl_ms: u64,
        /// Who holds it; shown to others on contention.
        holder: String,
        /// Client request id for safe retries (0 for none). A request that
        /// creates its lease has no caller to scope its id to yet: the id
        /// alone names the caller, so pick it at random.
        request_id: RequestId,
    },
    /// Renews a live lease to its full TTL.
    KeepAlive {
        /// The lease.
        lease: LeaseId,
    },
    /// Ends a lease and cleanly releases its locks.
    Revoke {
        /// The lease.
        lease: LeaseId,
    },
    /// Takes a key under a lease, or queues for it when `wait_ms > 0`.
    Acquire {
        /// The lease the lock hangs off.
        lease: LeaseId,
        /// The key.
        key: String,
        /// 0: answer at once. Otherwise queue for up to this long.
        wait_ms: u64,
        /// Lock-delay after an expiry of this hold (0 for none).
        lock_delay_ms: u64,
        /// Client request id for safe retries (0 for none).
        request_id: RequestId,
        /// How the hold shares the key.
        mode: Mode,
    },
    /// Creates a lease for one lock and takes (or queues for) the key under
    /// it, in one step: a refusal leaves no lease behind, and a retry with the
    /// same request id answers with the same lease.
    GrantAndAcquire {
        /// Time to live of the new lease, in milliseconds.
        ttl_ms: u64,
        /// Who holds it.
        holder: String,
        /// The key.
        key: String,
        /// 0: answer at once. Otherwise queue for up to this long.
        wait_ms: u64,
        /// Lock-delay after an expiry of this hold (0 for none).
        lock_delay_ms: u64,
        /// Client request id for safe retries (0 for none); like a grant's,
        /// the id alone names the caller.
        request_id: RequestId,
        /// How the hold shares the key.
        mode: Mode,
    },
    /// Withdraws a wait whose caller went away. If the wait was granted in the
    /// meantime, the grant is released, since nobody will ever learn of it.
    CancelWait {
        /// The waiting lease.
        lease: LeaseId,
        /// The key.
        key: String,
        /// The request id of the wait (0 for none).
        request_id: RequestId,
        /// The attempt that gives up, as its [`Response::Queued`] numbered
        /// it: a wait (or its grant) that a later attempt came back for is
        /// left alone. 0: whichever attempt the wait belongs to.
        attempt: u64,
    },
    /// Releases a key held with this fencing token.
    Release {
        /// The key.
        key: String,
        /// The token the caller holds.
        fence: Fence,
        /// Client request id for safe retries (0 for none).
        request_id: RequestId,
    },
    /// Stores a checkpoint with a held key, fenced by the holder's token.
    SaveCheckpoint {
        /// The key.
        key: String,
        /// The token the caller holds.
        fence: Fence,
        /// The bytes; empty clears the checkpoint.
        data: Vec<u8>,
    },
    /// Carries time only: expires what is due.
    Tick,
    /// A command on behalf of a token: applied only if the token is live and
    /// its role allows it (checked when it applies, so a token revoked a
    /// moment earlier is refused), and a lease it grants belongs to it.
    As {
        /// The token; `None` for a caller without one, which is refused
        /// unless auth is off.
        token: Option<TokenId>,
        /// The command.
        command: Box<Command>,
    },
    /// A change to auth, made at `at_unix_ms` on the proposing leader's
    /// wall clock (for the audit trail).
    Auth {
        /// The change.
        change: AuthChange,
        /// Unix milliseconds.
        at_unix_ms: u64,
    },
    /// Takes every key of a set under a lease, all or nothing, with one
    /// fencing token for the whole set; or, when `wait_ms > 0`, waits in every
    /// key's queue at once. The set is granted when it is first in line on
    /// every key and every key is free; since a set joins all its queues in
    /// one step, every two waiters are in the same order on every key they
    /// share, so sets never wait for each other in a cycle. A release of any
    /// of its keys (by the set's token) releases them all.
    AcquireSet {
        /// The lease the locks hang off.
        lease: LeaseId,
        /// The keys (1 ..= [`MAX_SET_KEYS`](crate::limits::MAX_SET_KEYS); the
        /// order does not matter, duplicates count once).
        keys: Vec<String>,
        /// 0: answer at once. Otherwise queue for up to this long.
        wait_ms: u64,
        /// Lock-delay after an expiry of this hold (0 for none).
        lock_delay_ms: u64,
        /// Client request id for safe retries (0 for none).
        request_id: RequestId,
    },
    /// [`Command::Auth`] made by a caller who showed a client certificate:
    /// the audit trail names its subject beside the token. (A variant of
    /// its own, after the others, so entries written before it read the
    /// same.)
    AuthWithCertificate {
        /// The change.
        change: AuthChange,
        /// Unix milliseconds.
        at_unix_ms: u64,
        /// The certificate's subject, e.g. `CN=alice` (at most
        /// [`MAX_SUBJECT_LEN`](crate::limits::MAX_SUBJECT_LEN) bytes are kept).
        subject: String,
    },
}

impl Command {
    /// Checks the command's input against the limits ([`crate::limits`]):
    /// the one list of what each command may carry. The server calls it
    /// before it proposes anything, so bad input costs no disk write, and
    /// the table again as it applies, so it is safe whatever proposes to
    /// it. What needs the table's state (a live lease, the holder of a
    /// key, the caller's permissions) the table checks itself.
    pub fn validate(&self) -> Result<(), crate::LockError> {
        use crate::limits;
        match self {
            Command::Grant { ttl_ms, holder, .. } => {
                limits::validate_ttl(*ttl_ms)?;
                limits::validate_holder(holder)
            }
            Command::Acquire {
                key,
                wait_ms,
                lock_delay_ms,
                mode,
                ..
            } => {
                limits::validate_key(key)?;
                limits::validate_wait(*wait_ms, *lock_delay_ms)?;
                limits::validate_mode(*mode)
            }
            Command::GrantAndAcquire {
                ttl_ms,
                holder,
                key,
                wait_ms,
                lock_delay_ms,
                mode,
                ..
            } => {
                limits::validate_ttl(*ttl_ms)?;
                limits::validate_holder(holder)?;
                limits::validate_key(key)?;
                limits::validate_wait(*wait_ms, *lock_delay_ms)?;
                limits::validate_mode(*mode)
            }
            Command::AcquireSet {
                keys,
                wait_ms,
                lock_delay_ms,
                ..
            } => {
                limits::validate_set(keys)?;
                limits::validate_wait(*wait_ms, *lock_delay_ms)
            }
            Command::CancelWait { key, .. } | Command::Release { key, .. } => {
                limits::validate_key(key)
            }
            Command::SaveCheckpoint { key, data, .. } => {
                limits::validate_key(key)?;
                limits::validate_checkpoint(data)
            }
            Command::As { command, .. } => command.validate(),
            // Nothing to check, or checked by the auth state as it applies.
            Command::KeepAlive { .. }
            | Command::Revoke { .. }
            | Command::Tick
            | Command::Auth { .. }
            | Command::AuthWithCertificate { .. } => Ok(()),
        }
    }
}

/// Bytes a holder saved with its lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The saved bytes.
    pub data: Arc<[u8]>,
    /// The fencing token of the holder that saved them.
    pub fence: Fence,
}

/// A successful acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The lease the hold hangs off.
    pub lease: LeaseId,
    /// The fencing token of this hold.
    pub fence: Fence,
    /// What the previous holder saved, if anything.
    pub checkpoint: Option<Checkpoint>,
}

/// The answer to a command that succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// A lease was created.
    LeaseGranted {
        /// Its id.
        lease: LeaseId,
        /// Its TTL.
        ttl_ms: u64,
    },
    /// A lease was renewed to its full TTL.
    Renewed {
        /// The TTL it now has.
        ttl_ms: u64,
        /// How many keys it holds: a holder that counts fewer than it
        /// took learns that one was released by its token elsewhere.
        #[serde(default)]
        key_count: u64,
    },
    /// A lease ended; these keys were released.
    Revoked {
        /// The released keys.
        released: Vec<String>,
    },
    /// The lock was granted.
    Acquired(Grant),
    /// The caller is queued; a later [`Event::Acquired`] or [`Event::WaitEnded`] tells the outcome.
    Queued {
        /// The waiting lease.
        lease: LeaseId,
        /// Zero-based position in the queue.
        position: usize,
        /// This attempt's number for the wait: 1 when it joined the queue,
        /// one more for each time the same acquire came again. Withdrawing
        /// the wait names it ([`Command::CancelWait`]).
        attempt: u64,
    },
    /// The lock was released.
    Released,
    /// The checkpoint was stored.
    CheckpointSaved,
    /// The wait (or the grant it turned into) was withdrawn.
    WaitCancelled,
    /// Time advanced.
    Ticked,
    /// Auth changed; a change that made a token names it.
    AuthChanged {
        /// The token created, if any.
        token: Option<TokenId>,
    },
}

/// Why a queued wait ended without a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitEnd {
    /// Its wait time ran out.
    TimedOut,
    /// Its lease expired or was revoked.
    LeaseGone,
    /// Its caller withdrew it.
    Cancelled,
    /// A new leadership began and its caller did not come back for it in
    /// time (see [`REATTACH_MS`](crate::REATTACH_MS)).
    Abandoned,
}

/// Something that happened in the table, for watchers and waiting callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A key was granted (at once or from its queue).
    Acquired {
        /// The key.
        key: Arc<str>,
        /// The new token.
        fence: Fence,
        /// The holding lease.
        lease: LeaseId,
        /// The holder's name.
        holder: Arc<str>,
        /// What the previous holder saved.
        checkpoint: Option<Checkpoint>,
    },
    /// A key was released by its holder (or its lease was revoked).
    Released {
        /// The key.
        key: Arc<str>,
        /// The token that held it.
        fence: Fence,
        /// The lease that held it.
        lease: LeaseId,
        /// The holder's name.
        holder: Arc<str>,
    },
    /// A key was freed because its lease expired.
    Expired {
        /// The key.
        key: Arc<str>,
        /// The token that held it.
        fence: Fence,
        /// The lease that held it.
        lease: LeaseId,
        /// The holder's name.
        holder: Arc<str>,
    },
    /// A holder saved a checkpoint with its key (an election's leader
    /// proclaiming its value, for one).
    CheckpointSaved {
        /// The key.
        key: Arc<str>,
        /// The token of the hold that saved it.
        fence: Fence,
        /// The lease of that hold.
        lease: LeaseId,
        /// The holder's name.
        holder: Arc<str>,
        /// The bytes (empty: cleared).
        data: Arc<[u8]>,
    },
    /// A queued wait ended without a grant.
    WaitEnded {
        /// The key.
        key: Arc<str>,
        /// The waiting lease.
        lease: LeaseId,
        /// Why.
        reason: WaitEnd,
    },
    /// A lease expired.
    LeaseExpired {
        /// The lease.
        lease: LeaseId,
    },
    /// Auth changed (roles, tokens, on or off): what a node checked before
    /// may no longer hold.
    AuthChanged {
        /// The change, as the audit trail has it.
        audit: AuditEntry,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockError, LockTable};

    /// The one check refuses what the table refuses, with the same error,
    /// and inside a command on behalf of a token too; the table is unchanged.
    #[test]
    fn validate_is_the_tables_own_check() {
        let long = "k".repeat(crate::limits::MAX_KEY_LEN + 1);
        let bad = [
            Command::Grant {
                ttl_ms: 0,
                holder: "h".into(),
                request_id: 0,
            },
            Command::Acquire {
                lease: 1,
                key: long.clone(),
                wait_ms: 0,
                lock_delay_ms: 0,
                request_id: 0,
                mode: Mode::Exclusive,
            },
            Command::SaveCheckpoint {
                key: "k".into(),
                fence: 1,
                data: vec![0; crate::limits::MAX_CHECKPOINT_LEN + 1],
            },
            Command::As {
                token: None,
                command: Box::new(Command::Release {
                    key: long,
                    fence: 1,
                    request_id: 0,
                }),
            },
        ];
        let mut table = LockTable::new();
        let stamp = Stamp { now: 0, epoch: 1 };
        // Time and the leadership's epoch advance whatever the command.
        table.apply(stamp, Command::Tick, &mut Vec::new()).unwrap();
        for command in bad {
            let checked = command.validate();
            assert!(
                matches!(checked, Err(LockError::Invalid { .. })),
                "{command:?}: {checked:?}"
            );
            let before = table.clone();
            let applied = table.apply(stamp, command.clone(), &mut Vec::new());
            assert_eq!(applied.err(), checked.err(), "{command:?}");
            assert_eq!(table, before, "{command:?} changed the table");
        }
    }
}
