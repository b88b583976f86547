//! Auth: turning it on and off, roles, tokens and the audit trail. Every
//! change is a log entry the table checks when it applies.

use leasehold_core::auth::{self, AuditEntry, AuthChange, Permission, Rule, TokenId, TokenView};
use leasehold_core::Command;

use super::proposals::ChangeAuth;
use super::{ApiError, LockService};

impl LockService {
    /// Proposes a change to auth on behalf of the caller (anyone while auth
    /// is off; then admin on every key). Returns the token it created.
    async fn change_auth(&self, change: AuthChange) -> Result<Option<TokenId>, ApiError> {
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        // A repeated enable needs no token: the table answers it if it
        // names the root token's secret, and refuses it otherwise.
        let enable = matches!(change, AuthChange::Enable { .. });
        let token = match self.caller_here().await {
            Err(_) if enable && self.consensus.read_local(|t| t.auth().enabled()).await => None,
            caller => caller?,
        };
        let change = match &self.certificate {
            Some(subject) => Command::AuthWithCertificate {
                change,
                at_unix_ms,
                subject: subject.to_string(),
            },
            None => Command::Auth { change, at_unix_ms },
        };
        let command = Command::As {
            token,
            command: Box::new(change),
        };
        self.measured(
            "auth",
            async move { self.propose(ChangeAuth(command)).await },
        )
        .await
    }

    /// Turns auth on; returns the root token (admin on every key), which is
    /// shown this once and stored only as a hash. With `secret` (chosen by
    /// the caller), a retry whose first answer was lost is answered with the
    /// same token.
    pub async fn enable_auth(&self, secret: Option<String>) -> Result<NewToken, ApiError> {
        let secret = secret_or_new(secret)?;
        let root_hash = auth::hash_secret(&secret);
        let id = self
            .change_auth(AuthChange::Enable { root_hash })
            .await?
            .ok_or_else(|| ApiError::Internal("no root token was made".into()))?;
        Ok(NewToken {
            id,
            token: auth::token_string(id, &secret),
        })
    }

    /// Turns auth off.
    pub async fn disable_auth(&self) -> Result<(), ApiError> {
        self.change_auth(AuthChange::Disable).await.map(drop)
    }

    /// Creates a role or replaces its rules.
    pub async fn set_role(&self, name: String, rules: Vec<Rule>) -> Result<(), ApiError> {
        self.change_auth(AuthChange::SetRole { name, rules })
            .await
            .map(drop)
    }

    /// Deletes a role that no token uses.
    pub async fn delete_role(&self, name: String) -> Result<(), ApiError> {
        self.change_auth(AuthChange::DeleteRole { name })
            .await
            .map(drop)
    }

    /// Creates a token for `role`; its secret is shown this once. With
    /// `secret` (chosen by the caller), a retry is answered with the token
    /// the first attempt made.
    pub async fn create_token(
        &self,
        name: String,
        role: String,
        secret: Option<String>,
    ) -> Result<NewToken, ApiError> {
        let secret = secret_or_new(secret)?;
        let hash = auth::hash_secret(&secret);
        let id = self
            .change_auth(AuthChange::CreateToken { name, role, hash })
            .await?
            .ok_or_else(|| ApiError::Internal("no token was made".into()))?;
        Ok(NewToken {
            id,
            token: auth::token_string(id, &secret),
        })
    }

    /// Revokes a token: every node refuses it once the revocation applies there.
    pub async fn revoke_token(&self, id: TokenId) -> Result<(), ApiError> {
        self.change_auth(AuthChange::RevokeToken { id })
            .await
            .map(drop)
    }

    /// Auth as it stands: on or off, roles, tokens (never their secrets or
    /// hashes), the audit trail. With auth on, for admin on every key.
    pub async fn auth_state(&self) -> Result<AuthView, ApiError> {
        self.read_as(|t, who, _| {
            let auth = t.auth();
            auth.check(who, "", Permission::Admin)?;
            Ok(AuthView {
                enabled: auth.enabled(),
                roles: auth
                    .roles()
                    .iter()
                    .map(|(name, role)| RoleView {
                        name: name.clone(),
                        rules: role.rules.clone(),
                    })
                    .collect(),
                tokens: auth.tokens(),
                audit: auth.audit().iter().cloned().collect(),
                caller: who,
            })
        })
        .await
    }
}

/// A caller's secret for a new token, checked, or 32 random bytes in hex.
fn secret_or_new(secret: Option<String>) -> Result<String, ApiError> {
    let Some(secret) = secret else {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        return Ok(bytes.iter().map(|b| format!("{b:02x}")).collect());
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if !(32..=256).contains(&secret.len()) || !secret.chars().all(allowed) {
        return Err(ApiError::invalid(
            "secret",
            "must be 32 to 256 characters of A-Z, a-z, 0-9, - and _ (e.g. 32 random bytes in hex)",
        ));
    }
    Ok(secret)
}

/// A token just made: its id and the whole token, shown once.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NewToken {
    /// The id, to revoke it by.
    pub id: TokenId,
    /// `lh_<id>_<secret>`, to present as `Authorization: Bearer <token>`.
    pub token: String,
}

/// A role and its rules.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RoleView {
    /// Its name.
    pub name: String,
    /// Its rules, by prefix.
    pub rules: Vec<Rule>,
}

/// Auth as `auth_state` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuthView {
    /// Whether auth is on.
    pub enabled: bool,
    /// The roles.
    pub roles: Vec<RoleView>,
    /// The live tokens.
    pub tokens: Vec<TokenView>,
    /// The audit trail, oldest first (the last [`auth::AUDIT_CAPACITY`]).
    pub audit: Vec<AuditEntry>,
    /// The caller's token, if auth is on.
    pub caller: Option<TokenId>,
}
