//! Auth in the table: the check that a token may run a command, and changes
//! to roles and tokens, each told of with its audit entry.

use crate::auth::{AuthChange, AuthState, Permission, TokenId};
use crate::command::{Command, Event, Response};
use crate::{LeaseId, LockError};

use super::LockTable;

impl LockTable {
    // ---- auth ----

    /// Roles, tokens and the audit trail.
    pub fn auth(&self) -> &AuthState {
        &self.state.auth
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
        if !self.state.auth.enabled() || auth {
            return Ok(());
        }
        let t = token;
        self.state.auth.highest(t)?;
        let own = |lease: LeaseId| -> Result<(), LockError> {
            match self.state.leases.get(&lease) {
                Some(l)
                    if l.owner != t && self.state.auth.permission(t, "")? < Permission::Admin =>
                {
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
                let Some(l) = self.state.leases.get(lease) else {
                    return Ok(());
                };
                if l.held.is_empty() && l.waiting.is_empty() {
                    return self.state.auth.check(t, "", Permission::Admin);
                }
                l.held
                    .iter()
                    .chain(&l.waiting)
                    .try_for_each(|key| self.state.auth.check(t, key, Permission::Admin))
            }
            Command::Acquire { lease, key, .. } => {
                self.state.auth.check(t, key, Permission::Lock)?;
                own(*lease)
            }
            Command::AcquireSet { lease, keys, .. } => {
                for key in keys {
                    self.state.auth.check(t, key, Permission::Lock)?;
                }
                own(*lease)
            }
            Command::GrantAndAcquire { key, .. }
            | Command::Release { key, .. }
            | Command::SaveCheckpoint { key, .. } => {
                self.state.auth.check(t, key, Permission::Lock)
            }
            Command::As { .. } => Ok(()),
        }
    }

    /// Applies a change to auth and tells of it with its audit entry.
    pub(super) fn change_auth(
        &mut self,
        token: Option<TokenId>,
        certificate: Option<&str>,
        at_unix_ms: u64,
        change: AuthChange,
        events: &mut Vec<Event>,
    ) -> Result<Response, LockError> {
        let created = self
            .state
            .auth
            .apply_as(token, certificate, at_unix_ms, change)?;
        if let Some(audit) = self.state.auth.audit().back() {
            events.push(Event::AuthChanged {
                audit: audit.clone(),
            });
        }
        Ok(Response::AuthChanged { token: created })
    }
}
