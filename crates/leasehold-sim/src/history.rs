//! Everything a run records, in the order it happened, on the world's clock.

use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use leasehold_core::{Fence, LeaseId};

/// Microseconds since the run began, on the world's clock (no host's).
pub type Micros = u64;

/// One recorded happening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A client sent an acquire (the first send; retries reuse its id).
    AcquireSent {
        /// The client.
        client: usize,
        /// The key.
        key: String,
    },
    /// A client received a grant.
    Granted {
        /// The client.
        client: usize,
        /// The key.
        key: String,
        /// The token.
        fence: Fence,
        /// The lease it holds the key with.
        lease: LeaseId,
        /// When the acquire was first sent.
        sent: Micros,
        /// The checkpoint the grant carried: its token and bytes.
        checkpoint: Option<(Fence, Vec<u8>)>,
    },
    /// A call that gives a lease a full TTL, its grant or a renewal, was
    /// acknowledged: the server may not end the lease sooner than a TTL after
    /// `sent` (less what its clock may drift).
    Renewed {
        /// The client.
        client: usize,
        /// The lease.
        lease: LeaseId,
        /// When the call was first sent (a retry sends the same one).
        sent: Micros,
    },
    /// A client sent a checkpoint save (a retry sends the same bytes).
    CheckpointSent {
        /// The client.
        client: usize,
        /// The key.
        key: String,
        /// The holder's token.
        fence: Fence,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A client's checkpoint save was acknowledged.
    CheckpointSaved {
        /// The client.
        client: usize,
        /// The key.
        key: String,
        /// The holder's token.
        fence: Fence,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A client stopped believing it holds a key: at the end of its
    /// belief (`until`), the earliest of its deadline, its release and its
    /// noticing the loss.
    HoldEnded {
        /// The client.
        client: usize,
        /// The key.
        key: String,
        /// The token of the hold.
        fence: Fence,
        /// When the belief ended.
        until: Micros,
        /// Which of the three ended it.
        why: &'static str,
    },
    /// A write reached the fenced resource.
    Wrote {
        /// The client.
        client: usize,
        /// The key (the resource).
        key: String,
        /// The token presented.
        fence: Fence,
        /// Whether the gate admitted it.
        admitted: bool,
        /// When the write was handed to the gate: it took effect somewhere
        /// between this and the record's time (a process frozen after the
        /// gate answered records it only when it thaws).
        sent: Micros,
    },
    /// A client sent a release (a retry sends the same one).
    ReleaseSent {
        /// The client.
        client: usize,
        /// The key.
        key: String,
        /// The token to release.
        fence: Fence,
    },
    /// A client's release was acknowledged.
    Released {
        /// The client.
        client: usize,
        /// The key.
        key: String,
        /// The token released.
        fence: Fence,
    },
    /// A client read who holds a key (a describe sent at `sent`, answered now).
    Observed {
        /// The client.
        client: usize,
        /// The key.
        key: String,
        /// The holder's token, if held.
        holder: Option<Fence>,
        /// When the read was sent.
        sent: Micros,
        /// The node that answered.
        node: String,
    },
    /// A client's call got a final answer.
    Answer {
        /// The client.
        client: usize,
        /// Which call.
        op: &'static str,
        /// `ok` or the error's code.
        code: String,
    },
    /// A fault began or ended.
    Fault {
        /// What kind.
        kind: &'static str,
        /// Which hosts, and for how long.
        detail: String,
    },
    /// A fault ended.
    Healed {
        /// Which one.
        detail: String,
    },
    /// A supervised host's software exited with an error, and was started
    /// again.
    Exited {
        /// The host.
        host: String,
        /// The error.
        why: String,
    },
    /// A task of a host panicked.
    Panic {
        /// The message.
        message: String,
    },
}

/// An event and when it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When.
    pub at: Micros,
    /// What.
    pub event: Event,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>6}.{:03} ms {:?}",
            self.at / 1000,
            self.at % 1000,
            self.event
        )
    }
}

/// The world's clock and the log of a run, shared by every host.
#[derive(Clone, Default)]
pub struct History {
    now: Arc<AtomicU64>,
    records: Arc<Mutex<Vec<Record>>>,
    pauses: Arc<Mutex<Vec<(String, Micros)>>>,
}

impl History {
    /// The world's time now.
    pub fn now(&self) -> Micros {
        self.now.load(Ordering::Relaxed)
    }

    /// Moves the world's clock (the world alone does).
    pub(crate) fn set_now(&self, now: Micros) {
        self.now.store(now, Ordering::Relaxed);
    }

    /// Records `event` as happening now.
    pub fn record(&self, event: Event) {
        let at = self.now();
        self.records.lock().push(Record { at, event });
    }

    /// Asks the world to freeze `host`'s process for `span` after this
    /// tick (a stop-the-world pause: a client cannot freeze itself).
    pub fn request_pause(&self, host: &str, span: Micros) {
        self.pauses.lock().push((host.to_string(), span));
    }

    /// The pauses asked for since the last call.
    pub(crate) fn take_pauses(&self) -> Vec<(String, Micros)> {
        std::mem::take(&mut *self.pauses.lock())
    }

    /// Everything recorded so far.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().clone()
    }
}
