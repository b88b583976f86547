//! Typed proposals: each command the service proposes, with the answer the
//! table gives it, so a proposal returns the answer type its command
//! produces (as openraft's `client_write` returns the state machine's
//! answer). The table's [`Response`] is taken apart here, in one place; a
//! response a command never gets is an internal error, reported as such.

use leasehold_core::auth::TokenId;
use leasehold_core::{Command, Fence, Grant, LeaseId, RequestId, Response};

/// A command and the answer the table gives it.
pub(super) trait Proposal {
    /// What the table answers when the command takes effect.
    type Answer;
    /// The command that goes into the log.
    fn into_command(self) -> Command;
    /// The answer in the table's response, or the response back if this
    /// command never gets it.
    fn answer(response: Response) -> Result<Self::Answer, Response>;
}

/// A new lease: its id and TTL.
pub(super) struct NewLease {
    pub ttl_ms: u64,
    pub holder: String,
    pub request_id: RequestId,
}

impl Proposal for NewLease {
    type Answer = (LeaseId, u64);
    fn into_command(self) -> Command {
        Command::Grant {
            ttl_ms: self.ttl_ms,
            holder: self.holder,
            request_id: self.request_id,
        }
    }
    fn answer(response: Response) -> Result<(LeaseId, u64), Response> {
        match response {
            Response::LeaseGranted { lease, ttl_ms } => Ok((lease, ttl_ms)),
            other => Err(other),
        }
    }
}

/// A keepalive: the TTL the lease now has, and how many keys it holds.
pub(super) struct Renew(pub LeaseId);

impl Proposal for Renew {
    type Answer = (u64, u64);
    fn into_command(self) -> Command {
        Command::KeepAlive { lease: self.0 }
    }
    fn answer(response: Response) -> Result<(u64, u64), Response> {
        match response {
            Response::Renewed { ttl_ms, key_count } => Ok((ttl_ms, key_count)),
            other => Err(other),
        }
    }
}

/// Ending a lease: the keys it released.
pub(super) struct Revoke(pub LeaseId);

impl Proposal for Revoke {
    type Answer = Vec<String>;
    fn into_command(self) -> Command {
        Command::Revoke { lease: self.0 }
    }
    fn answer(response: Response) -> Result<Vec<String>, Response> {
        match response {
            Response::Revoked { released } => Ok(released),
            other => Err(other),
        }
    }
}

/// An acquire that answers at once (`wait_ms` 0): the grant, or a refusal.
pub(super) struct Take(pub Command);

impl Proposal for Take {
    type Answer = Grant;
    fn into_command(self) -> Command {
        self.0
    }
    fn answer(response: Response) -> Result<Grant, Response> {
        match response {
            Response::Acquired(grant) => Ok(grant),
            other => Err(other),
        }
    }
}

/// An acquire that may wait in the key's queue.
pub(super) struct Queue(pub Command);

/// What an acquire that may wait is answered.
pub(super) enum Joined {
    /// The key was free: granted at once.
    Granted(Grant),
    /// Queued as `lease`, in this attempt of the wait.
    Queued { lease: LeaseId, attempt: u64 },
}

impl Proposal for Queue {
    type Answer = Joined;
    fn into_command(self) -> Command {
        self.0
    }
    fn answer(response: Response) -> Result<Joined, Response> {
        match response {
            Response::Acquired(grant) => Ok(Joined::Granted(grant)),
            Response::Queued { lease, attempt, .. } => Ok(Joined::Queued { lease, attempt }),
            other => Err(other),
        }
    }
}

/// A release by the token that holds the key.
pub(super) struct Release {
    pub key: String,
    pub fence: Fence,
    pub request_id: RequestId,
}

impl Proposal for Release {
    type Answer = ();
    fn into_command(self) -> Command {
        Command::Release {
            key: self.key,
            fence: self.fence,
            request_id: self.request_id,
        }
    }
    fn answer(response: Response) -> Result<(), Response> {
        match response {
            Response::Released => Ok(()),
            other => Err(other),
        }
    }
}

/// A checkpoint saved with a held lock.
pub(super) struct Save {
    pub key: String,
    pub fence: Fence,
    pub data: Vec<u8>,
}

impl Proposal for Save {
    type Answer = ();
    fn into_command(self) -> Command {
        Command::SaveCheckpoint {
            key: self.key,
            fence: self.fence,
            data: self.data,
        }
    }
    fn answer(response: Response) -> Result<(), Response> {
        match response {
            Response::CheckpointSaved => Ok(()),
            other => Err(other),
        }
    }
}

/// Withdrawing a wait ([`Command::CancelWait`]).
pub(super) struct Withdraw(pub Command);

impl Proposal for Withdraw {
    type Answer = ();
    fn into_command(self) -> Command {
        self.0
    }
    fn answer(response: Response) -> Result<(), Response> {
        match response {
            Response::WaitCancelled => Ok(()),
            other => Err(other),
        }
    }
}

/// A change to auth: the token it made, if any.
pub(super) struct ChangeAuth(pub Command);

impl Proposal for ChangeAuth {
    type Answer = Option<TokenId>;
    fn into_command(self) -> Command {
        self.0
    }
    fn answer(response: Response) -> Result<Option<TokenId>, Response> {
        match response {
            Response::AuthChanged { token } => Ok(token),
            other => Err(other),
        }
    }
}
