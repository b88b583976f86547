//! Who may do what: roles with permissions on key prefixes, bearer tokens
//! stored as hashes, and an audit trail of every change to them.
//!
//! Auth is part of the replicated state, so every node agrees on it and a
//! restart keeps it. Until it is enabled, anyone may do anything (the local
//! single node with no setup). Once enabled, every request names a token,
//! and what its role grants on the key is what it may do; nothing else.
//!
//! A token is `lh_<id>_<secret>`: the id finds its entry, and the SHA-256 of
//! the secret must match the hash stored there. The secret itself is never
//! stored, logged or replicated; whoever created the token saw it once.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::LockError;

/// A token's id: its public name, in lists, audits and revocations.
pub type TokenId = u64;

/// The SHA-256 of a token's secret.
pub type TokenHash = [u8; 32];

/// The role `enable` creates: admin on every key.
pub const ROOT_ROLE: &str = "root";

/// Audit entries kept in the replicated state; the oldest go first.
pub const AUDIT_CAPACITY: usize = 1_000;

/// Roles, at most.
pub const MAX_ROLES: usize = 1_000;
/// Rules per role, at most.
pub const MAX_RULES: usize = 100;
/// Live tokens, at most.
pub const MAX_TOKENS: usize = 100_000;
/// The longest role or token name, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// What a role may do under a prefix. Each level includes the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Nothing: a rule with it carves a subtree out of a wider grant.
    None,
    /// Describe, list and watch locks.
    Read,
    /// Acquire, release and checkpoint locks, and keep alive and revoke the
    /// token's own leases.
    Lock,
    /// Revoke others' leases under the prefix; on the empty prefix (every
    /// key) also membership and auth changes.
    Admin,
}

impl Permission {
    /// Its name on the wire and in the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Permission::None => "none",
            Permission::Read => "read",
            Permission::Lock => "lock",
            Permission::Admin => "admin",
        }
    }

    /// The permission named `name`.
    pub fn parse(name: &str) -> Result<Permission, LockError> {
        match name {
            "none" | "deny" => Ok(Permission::None),
            "read" => Ok(Permission::Read),
            "lock" => Ok(Permission::Lock),
            "admin" => Ok(Permission::Admin),
            other => Err(LockError::invalid(
                "permission",
                format!("{other:?} is not one of none, read, lock, admin"),
            )),
        }
    }
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One line of a role: this permission on keys that start with `prefix`.
/// A rule with another field is refused (as a request body is), not read
/// as if the field were not there. (Self-describing formats only: the
/// table's binary encoding is unchanged.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The key prefix; empty means every key.
    pub prefix: String,
    /// What the role may do under it.
    pub permission: Permission,
}

/// A named set of rules. For a key, the rule with the longest prefix of it
/// decides; a key no rule covers gets nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Role {
    /// The rules, sorted by prefix, one per prefix.
    pub rules: Vec<Rule>,
}

impl Role {
    /// What this role may do on `key`.
    pub fn permission(&self, key: &str) -> Permission {
        self.rules
            .iter()
            .filter(|r| key.starts_with(r.prefix.as_str()))
            .max_by_key(|r| r.prefix.len())
            .map_or(Permission::None, |r| r.permission)
    }

    /// The most this role may do anywhere.
    pub fn highest(&self) -> Permission {
        self.rules
            .iter()
            .map(|r| r.permission)
            .max()
            .unwrap_or(Permission::None)
    }
}

/// A token as the state keeps it: its hash, never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenEntry {
    /// A name for people (e.g. `billing-workers`).
    pub name: String,
    /// The role it acts as.
    pub role: String,
    /// SHA-256 of its secret.
    pub hash: TokenHash,
    /// Wall-clock milliseconds since the Unix epoch when it was made.
    pub created_unix_ms: u64,
}

/// One change to auth, for the audit trail: who made it, when, and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Increases by one with each entry, for the life of the deployment.
    pub seq: u64,
    /// Wall-clock milliseconds since the Unix epoch, on the leader that
    /// proposed it.
    pub at_unix_ms: u64,
    /// The token that made it (`name (id N)`), or `anonymous` while auth
    /// was off.
    pub who: String,
    /// What changed, e.g. `token 4 "ci" revoked`.
    pub what: String,
}

/// A change to auth. Each is an admin operation and is audited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthChange {
    /// Turns auth on, creating the `root` role (admin on every key) if it
    /// does not exist and a token named `root` with this hash.
    Enable {
        /// The root token's hash.
        root_hash: TokenHash,
    },
    /// Turns auth off: everyone may do everything again.
    Disable,
    /// Creates a role or replaces its rules.
    SetRole {
        /// Its name.
        name: String,
        /// Its rules.
        rules: Vec<Rule>,
    },
    /// Deletes a role no token uses.
    DeleteRole {
        /// Its name.
        name: String,
    },
    /// Creates a token with this hash.
    CreateToken {
        /// A name for people.
        name: String,
        /// The role it acts as; must exist.
        role: String,
        /// SHA-256 of its secret.
        hash: TokenHash,
    },
    /// Revokes a token: it is refused from the moment this applies.
    RevokeToken {
        /// Its id.
        id: TokenId,
    },
}

/// The auth part of the replicated state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AuthState {
    enabled: bool,
    roles: BTreeMap<String, Role>,
    tokens: BTreeMap<TokenId, TokenEntry>,
    next_token: TokenId,
    audit: VecDeque<AuditEntry>,
    next_audit: u64,
}

/// A token listed, without its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenView {
    /// Its id.
    pub id: TokenId,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: String,
    /// When it was made (Unix ms).
    pub created_unix_ms: u64,
}

/// The SHA-256 of a token's secret.
pub fn hash_secret(secret: &str) -> TokenHash {
    Sha256::digest(secret.as_bytes()).into()
}

/// The token string for `id` and `secret`.
pub fn token_string(id: TokenId, secret: &str) -> String {
    format!("lh_{id}_{secret}")
}

fn unauthenticated(reason: &str) -> LockError {
    LockError::Unauthenticated {
        reason: reason.to_string(),
    }
}

/// Equal bytes, compared in time that does not depend on where they differ.
fn same_hash(a: &TokenHash, b: &TokenHash) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn validate_name(field: &'static str, name: &str) -> Result<(), LockError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(LockError::invalid(
            field,
            format!("must be 1 to {MAX_NAME_LEN} bytes"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(LockError::invalid(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

impl AuthState {
    /// Whether auth is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The token a bearer string names, if it is live and its secret is right.
    pub fn authenticate(&self, bearer: &str) -> Result<TokenId, LockError> {
        let malformed = || unauthenticated("the token is not of the form lh_<id>_<secret>");
        let rest = bearer.strip_prefix("lh_").ok_or_else(malformed)?;
        let (id, secret) = rest.split_once('_').ok_or_else(malformed)?;
        let id: TokenId = id.parse().map_err(|_| malformed())?;
        let entry = self
            .tokens
            .get(&id)
            .ok_or_else(|| unauthenticated("the token was revoked or never existed"))?;
        if !same_hash(&entry.hash, &hash_secret(secret)) {
            return Err(unauthenticated("the token was revoked or never existed"));
        }
        Ok(id)
    }

    /// What `token` may do on `key`. Without auth, everything.
    pub fn permission(&self, token: Option<TokenId>, key: &str) -> Result<Permission, LockError> {
        if !self.enabled {
            return Ok(Permission::Admin);
        }
        Ok(self.role_of(token)?.permission(key))
    }

    /// The most `token` may do on any key. Without auth, everything.
    pub fn highest(&self, token: Option<TokenId>) -> Result<Permission, LockError> {
        if !self.enabled {
            return Ok(Permission::Admin);
        }
        Ok(self.role_of(token)?.highest())
    }

    fn role_of(&self, token: Option<TokenId>) -> Result<&Role, LockError> {
        static NO_ROLE: Role = Role { rules: Vec::new() };
        let token = token.ok_or_else(|| unauthenticated("auth is enabled: present a token"))?;
        let entry = self
            .tokens
            .get(&token)
            .ok_or_else(|| unauthenticated("the token was revoked or never existed"))?;
        Ok(self.roles.get(&entry.role).unwrap_or(&NO_ROLE))
    }

    /// Refuses unless `token` has at least `needed` on `key`.
    pub fn check(
        &self,
        token: Option<TokenId>,
        key: &str,
        needed: Permission,
    ) -> Result<(), LockError> {
        if self.permission(token, key)? >= needed {
            Ok(())
        } else {
            Err(LockError::PermissionDenied {
                key: key.to_string(),
                needed,
            })
        }
    }

    /// The role of a live token.
    pub fn token_role(&self, token: TokenId) -> Option<&Role> {
        self.tokens
            .get(&token)
            .and_then(|t| self.roles.get(&t.role))
    }

    /// The name of a live token's role.
    pub fn role_name(&self, token: TokenId) -> Option<&str> {
        self.tokens.get(&token).map(|t| t.role.as_str())
    }

    /// The roles, by name.
    pub fn roles(&self) -> &BTreeMap<String, Role> {
        &self.roles
    }

    /// The live tokens, by id, without their hashes.
    pub fn tokens(&self) -> Vec<TokenView> {
        self.tokens
            .iter()
            .map(|(id, t)| TokenView {
                id: *id,
                name: t.name.clone(),
                role: t.role.clone(),
                created_unix_ms: t.created_unix_ms,
            })
            .collect()
    }

    /// The audit trail, oldest first.
    pub fn audit(&self) -> &VecDeque<AuditEntry> {
        &self.audit
    }

    /// Who `token` is, for the audit trail: `"name" (token N)`, or
    /// `anonymous`.
    pub fn who(&self, token: Option<TokenId>) -> String {
        match token.and_then(|id| self.tokens.get(&id).map(|t| (id, t))) {
            Some((id, t)) => format!("{:?} (token {id})", t.name),
            None => "anonymous".to_string(),
        }
    }

    /// Applies a change made by `token` at `at_unix_ms`. Once auth is on,
    /// only a token with admin on every key may make one. A refused change
    /// changes nothing. Returns the id of a token it created.
    pub fn apply(
        &mut self,
        token: Option<TokenId>,
        at_unix_ms: u64,
        change: AuthChange,
    ) -> Result<Option<TokenId>, LockError> {
        self.apply_as(token, None, at_unix_ms, change)
    }

    /// [`apply`](Self::apply), by a caller who also showed a client
    /// certificate with this subject: the audit trail names both.
    pub fn apply_as(
        &mut self,
        token: Option<TokenId>,
        certificate: Option<&str>,
        at_unix_ms: u64,
        change: AuthChange,
    ) -> Result<Option<TokenId>, LockError> {
        // A retried enable (same root secret) is answered with the root
        // token it made; whoever knows that secret made it.
        if let AuthChange::Enable { root_hash } = &change {
            if let Some(id) = self
                .token_with(root_hash, "root", ROOT_ROLE)
                .filter(|_| self.enabled)
            {
                return Ok(Some(id));
            }
        }
        if self.enabled {
            self.check(token, "", Permission::Admin)?;
        }
        // A retried token creation (same secret, name and role) is answered
        // with the token it made, and changes nothing.
        if let AuthChange::CreateToken { name, role, hash } = &change {
            if let Some(id) = self.token_with(hash, name, role) {
                return Ok(Some(id));
            }
        }
        let who = match (certificate, token) {
            (None, _) => self.who(token),
            (Some(subject), None) => format!("certificate {:?}", cut(subject)),
            (Some(subject), Some(_)) => {
                format!("{}, certificate {:?}", self.who(token), cut(subject))
            }
        };
        let mut next = self.clone_without_audit();
        let (created, what) = next.change(at_unix_ms, change)?;
        if next.enabled && !next.has_admin() {
            return Err(LockError::invalid(
                "auth",
                "this change would leave no token with admin on every key, and nobody could change auth again",
            ));
        }
        next.audit = std::mem::take(&mut self.audit);
        *self = next;
        if self.audit.len() == AUDIT_CAPACITY {
            self.audit.pop_front();
        }
        self.audit.push_back(AuditEntry {
            seq: self.next_audit,
            at_unix_ms,
            who,
            what,
        });
        self.next_audit += 1;
        Ok(created)
    }

    /// The live token with this hash, name and role.
    fn token_with(&self, hash: &TokenHash, name: &str, role: &str) -> Option<TokenId> {
        self.tokens
            .iter()
            .find(|(_, t)| same_hash(&t.hash, hash) && t.name == name && t.role == role)
            .map(|(id, _)| *id)
    }

    /// A copy to change and keep only if the change is allowed; the audit
    /// trail (the only big part) is moved over afterwards, not copied.
    fn clone_without_audit(&self) -> AuthState {
        AuthState {
            enabled: self.enabled,
            roles: self.roles.clone(),
            tokens: self.tokens.clone(),
            next_token: self.next_token,
            audit: VecDeque::new(),
            next_audit: self.next_audit,
        }
    }

    fn has_admin(&self) -> bool {
        self.tokens.values().any(|t| {
            self.roles
                .get(&t.role)
                .is_some_and(|r| r.permission("") == Permission::Admin)
        })
    }

    fn new_token(&mut self, name: String, role: String, hash: TokenHash, at: u64) -> TokenId {
        self.next_token = self.next_token.max(1);
        let id = self.next_token;
        self.next_token += 1;
        self.tokens.insert(
            id,
            TokenEntry {
                name,
                role,
                hash,
                created_unix_ms: at,
            },
        );
        id
    }

    fn change(
        &mut self,
        at_unix_ms: u64,
        change: AuthChange,
    ) -> Result<(Option<TokenId>, String), LockError> {
        match change {
            AuthChange::Enable { root_hash } => {
                if self.enabled {
                    return Err(LockError::invalid("auth", "auth is already enabled"));
                }
                let admin = vec![Rule {
                    prefix: String::new(),
                    permission: Permission::Admin,
                }];
                self.roles
                    .insert(ROOT_ROLE.to_string(), Role { rules: admin });
                let id = self.new_token("root".into(), ROOT_ROLE.into(), root_hash, at_unix_ms);
                self.enabled = true;
                Ok((Some(id), format!("auth enabled; root token {id} created")))
            }
            AuthChange::Disable => {
                if !self.enabled {
                    return Err(LockError::invalid("auth", "auth is not enabled"));
                }
                self.enabled = false;
                Ok((None, "auth disabled".to_string()))
            }
            AuthChange::SetRole { name, mut rules } => {
                validate_name("role", &name)?;
                if rules.len() > MAX_RULES {
                    return Err(LockError::invalid(
                        "rules",
                        format!("{} rules; a role has at most {MAX_RULES}", rules.len()),
                    ));
                }
                for rule in &rules {
                    crate::limits::validate_prefix(&rule.prefix)?;
                }
                rules.sort_by(|a, b| a.prefix.cmp(&b.prefix));
                if let Some(w) = rules.windows(2).find(|w| w[0].prefix == w[1].prefix) {
                    return Err(LockError::invalid(
                        "rules",
                        format!("prefix {:?} appears twice", w[0].prefix),
                    ));
                }
                if !self.roles.contains_key(&name) && self.roles.len() >= MAX_ROLES {
                    return Err(LockError::invalid(
                        "role",
                        format!("there are {MAX_ROLES} roles already"),
                    ));
                }
                let what = format!(
                    "role {name:?} set to [{}]",
                    rules
                        .iter()
                        .map(|r| format!("{} {:?}", r.permission, r.prefix))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                self.roles.insert(name, Role { rules });
                Ok((None, what))
            }
            AuthChange::DeleteRole { name } => {
                if self.roles.remove(&name).is_none() {
                    return Err(LockError::invalid(
                        "role",
                        format!("{name:?} does not exist"),
                    ));
                }
                if let Some((id, _)) = self.tokens.iter().find(|(_, t)| t.role == name) {
                    return Err(LockError::invalid(
                        "role",
                        format!("{name:?} is used by token {id}; revoke its tokens first"),
                    ));
                }
                Ok((None, format!("role {name:?} deleted")))
            }
            AuthChange::CreateToken { name, role, hash } => {
                validate_name("name", &name)?;
                if !self.roles.contains_key(&role) {
                    return Err(LockError::invalid(
                        "role",
                        format!("{role:?} does not exist; create it with `auth role set`"),
                    ));
                }
                if self.tokens.len() >= MAX_TOKENS {
                    return Err(LockError::invalid(
                        "token",
                        format!("there are {MAX_TOKENS} tokens already"),
                    ));
                }
                if self.tokens.values().any(|t| same_hash(&t.hash, &hash)) {
                    return Err(LockError::invalid(
                        "secret",
                        "another token has this secret; choose a new one",
                    ));
                }
                let what = format!("{name:?} created for role {role:?}");
                let id = self.new_token(name, role, hash, at_unix_ms);
                Ok((Some(id), format!("token {id} {what}")))
            }
            AuthChange::RevokeToken { id } => match self.tokens.remove(&id) {
                Some(t) => Ok((None, format!("token {id} {:?} revoked", t.name))),
                None => Err(LockError::invalid(
                    "token",
                    format!("token {id} does not exist"),
                )),
            },
        }
    }
}

/// A certificate subject held to [`MAX_SUBJECT_LEN`](crate::limits::MAX_SUBJECT_LEN).
fn cut(subject: &str) -> String {
    let max = crate::limits::MAX_SUBJECT_LEN;
    if subject.len() <= max {
        return subject.to_string();
    }
    let mut end = max;
    while !subject.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &subject[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[(&str, Permission)]) -> Vec<Rule> {
        list.iter()
            .map(|(p, permission)| Rule {
                prefix: p.to_string(),
                permission: *permission,
            })
            .collect()
    }

    #[test]
    fn the_longest_prefix_decides_and_nothing_is_allowed_by_default() {
        let role = Role {
            rules: rules(&[
                ("jobs/", Permission::Lock),
                ("jobs/secret/", Permission::None),
                ("", Permission::Read),
            ]),
        };
        assert_eq!(role.permission("jobs/a"), Permission::Lock);
        assert_eq!(role.permission("jobs/secret/a"), Permission::None);
        assert_eq!(role.permission("payments/x"), Permission::Read);
        assert_eq!(Role::default().permission("x"), Permission::None);
    }

    /// A change made with a client certificate names its subject in the
    /// audit trail, beside the token if there is one; an overlong subject
    /// is cut.
    #[test]
    fn the_audit_trail_names_a_client_certificate() {
        let mut auth = AuthState::default();
        let enable = AuthChange::Enable {
            root_hash: hash_secret("r"),
        };
        let root = auth.apply_as(None, Some("CN=alice"), 1, enable).unwrap();
        assert_eq!(
            auth.audit().back().unwrap().who,
            r#"certificate "CN=alice""#
        );
        let create = AuthChange::CreateToken {
            name: "ci".into(),
            role: ROOT_ROLE.into(),
            hash: hash_secret("c"),
        };
        let long = format!("CN={}", "é".repeat(300));
        auth.apply_as(root, Some(&long), 2, create).unwrap();
        let who = &auth.audit().back().unwrap().who;
        assert!(
            who.starts_with(r#""root" (token 1), certificate "CN=éé"#),
            "{who}"
        );
        assert!(who.len() < 300 + crate::limits::MAX_SUBJECT_LEN, "{who}");
    }

    #[test]
    fn a_retried_enable_or_token_creation_answers_the_same_token_and_changes_nothing() {
        let mut auth = AuthState::default();
        let enable = || AuthChange::Enable {
            root_hash: hash_secret("r"),
        };
        let root = auth.apply(None, 1, enable()).unwrap();
        let once = auth.clone();
        // The retry of an enable whose answer was lost: no token needed.
        assert_eq!(auth.apply(None, 2, enable()), Ok(root));
        assert_eq!(auth, once);
        // Another secret is refused: auth is already on.
        let other = AuthChange::Enable {
            root_hash: hash_secret("x"),
        };
        assert!(auth.apply(None, 3, other).is_err());
        let create = || AuthChange::CreateToken {
            name: "t".into(),
            role: ROOT_ROLE.into(),
            hash: hash_secret("t"),
        };
        let made = auth.apply(root, 4, create()).unwrap();
        let twice = auth.clone();
        assert_eq!(auth.apply(root, 5, create()), Ok(made));
        assert_eq!(auth, twice);
        // The same secret under another name is refused.
        let clash = AuthChange::CreateToken {
            name: "u".into(),
            role: ROOT_ROLE.into(),
            hash: hash_secret("t"),
        };
        assert!(auth.apply(root, 6, clash).is_err());
        assert_eq!(auth, twice);
    }

    #[test]
    fn tokens_are_checked_by_hash_and_refused_once_revoked() {
        let mut auth = AuthState::default();
        let root = auth
            .apply(
                None,
                1,
                AuthChange::Enable {
                    root_hash: hash_secret("s3cret"),
                },
            )
            .unwrap()
            .unwrap();
        let bearer = token_string(root, "s3cret");
        assert_eq!(auth.authenticate(&bearer), Ok(root));
        assert!(auth.authenticate(&token_string(root, "guess")).is_err());
        assert!(auth.authenticate("Bearer nonsense").is_err());
        let jobs = vec![Rule {
            prefix: "jobs/".into(),
            permission: Permission::Lock,
        }];
        auth.apply(
            Some(root),
            2,
            AuthChange::SetRole {
                name: "jobs".into(),
                rules: jobs,
            },
        )
        .unwrap();
        let worker = auth
            .apply(
                Some(root),
                3,
                AuthChange::CreateToken {
                    name: "w".into(),
                    role: "jobs".into(),
                    hash: hash_secret("w"),
                },
            )
            .unwrap()
            .unwrap();
        // The worker may not change auth, and the refusal changes nothing.
        let before = auth.clone();
        let refused = auth.apply(Some(worker), 4, AuthChange::RevokeToken { id: root });
        assert_eq!(
            refused,
            Err(LockError::PermissionDenied {
                key: String::new(),
                needed: Permission::Admin
            })
        );
        assert_eq!(auth, before);
        auth.apply(Some(root), 5, AuthChange::RevokeToken { id: worker })
            .unwrap();
        assert!(auth.authenticate(&token_string(worker, "w")).is_err());
        assert!(auth
            .check(Some(worker), "jobs/a", Permission::Read)
            .is_err());
        // Revoking the last admin would lock everyone out.
        assert!(auth
            .apply(Some(root), 6, AuthChange::RevokeToken { id: root })
            .is_err());
        let whats: Vec<_> = auth.audit().iter().map(|a| a.what.as_str()).collect();
        assert_eq!(whats.len(), 4, "{whats:?}");
        assert!(auth
            .audit()
            .iter()
            .skip(1)
            .all(|a| a.who == format!("\"root\" (token {root})")));
    }
}
