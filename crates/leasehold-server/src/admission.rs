//! Admission control: limits on what callers may create, and on how fast.
//!
//! Only requests that create something are counted and refused: a grant,
//! an acquire (it may make a lease, a hold or a wait) and a checkpoint.
//! Keepalives, releases and revokes are never refused here, and expiries
//! are the table's own: a node at its limits still lets every holder renew
//! and leave, and that is how room comes back. Refusals are
//! `resource_exhausted` (HTTP 429), naming the limit and the current use.
//!
//! The limits on the table's size (`--max-leases`, `--max-locks`,
//! `--max-waiters`) and on a token's leases (`--max-leases-per-token`) are
//! checked on the leader against what it has applied, before the command
//! is proposed: requests in flight at that moment may pass a limit by one
//! batch at most. What a request would add is the table's own answer
//! (`LockTable::growth`): a retry of a request it already answered, or an
//! acquire of a key its lease already holds or waits for (a caller
//! re-attaching after a leader change), adds nothing and is never refused
//! by a size limit. The rate limit (`--rate-limit`) is a token bucket per
//! access token, refilled at that many requests a second with a burst of as
//! many. `--role-quota` sets a role's own limits per token, in place of the
//! two per-token flags, for every token of that role. With auth off there
//! is no caller to tell apart, and only the limits on the whole table
//! apply.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use leasehold_core::auth::TokenId;
use leasehold_core::Growth;
use parking_lot::Mutex;

/// The limits; `None` is no limit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quotas {
    /// Live leases, in all.
    pub max_leases: Option<usize>,
    /// Keys held, in all.
    pub max_locks: Option<usize>,
    /// Acquires waiting in queues, in all.
    pub max_waiters: Option<usize>,
    /// Live leases, per access token.
    pub max_leases_per_token: Option<usize>,
    /// Creating requests a second, per access token.
    pub rate_per_token: Option<u32>,
    /// The per-token limits of a role's tokens, in place of the two above.
    pub per_role: BTreeMap<String, RoleQuota>,
}

/// The limits on each token of one role (`--role-quota`); `None` is no
/// limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoleQuota {
    /// Live leases, per token.
    pub leases: Option<usize>,
    /// Creating requests a second, per token.
    pub rate: Option<u32>,
}

impl RoleQuota {
    /// Parses `ROLE=leases:N,rate:M` (either or both); a limit of 0 is
    /// refused.
    pub fn parse(text: &str) -> Result<(String, RoleQuota), String> {
        let usage = "give ROLE=leases:N,rate:M (either or both, each at least 1)";
        let (role, limits) = text
            .split_once('=')
            .filter(|(role, _)| !role.is_empty())
            .ok_or_else(|| format!("`{text}`: {usage}"))?;
        let mut quota = RoleQuota::default();
        for limit in limits.split(',') {
            let (name, n) = limit
                .split_once(':')
                .ok_or_else(|| format!("`{limit}` in `{text}`: {usage}"))?;
            let n: u32 = n
                .trim()
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("`{limit}` in `{text}`: {usage}"))?;
            match name.trim() {
                "leases" => quota.leases = Some(n as usize),
                "rate" => quota.rate = Some(n),
                _ => return Err(format!("`{name}` in `{text}` is not a limit: {usage}")),
            }
        }
        Ok((role.to_string(), quota))
    }
}

/// The table's size now: leases, keys held, waits.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// Live leases.
    pub leases: usize,
    /// Keys held.
    pub locks: usize,
    /// Waits queued.
    pub waiters: usize,
    /// Live leases of the caller's token (0 without one).
    pub token_leases: usize,
}

/// Why a request was refused: one line naming the limit and the use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// The quotas of one node, and each token's bucket.
#[derive(Debug, Default)]
pub struct Admission {
    quotas: Quotas,
    buckets: Mutex<HashMap<TokenId, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Buckets of tokens unheard for this long are dropped.
const IDLE_BUCKET_SECS: f64 = 60.0;

impl Admission {
    /// Admission under `quotas`.
    pub fn new(quotas: Quotas) -> Admission {
        Admission {
            quotas,
            buckets: Mutex::default(),
        }
    }

    /// The limits.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Whether a request of `token` (of the role `role`) that would grow the
    /// table by `growth` may go on, with the table at `usage`.
    pub fn admit(
        &self,
        token: Option<TokenId>,
        role: Option<&str>,
        growth: Growth,
        usage: Usage,
    ) -> Result<(), Refused> {
        let q = &self.quotas;
        let (per_token_leases, rate, flags) =
            match role.and_then(|role| Some((role, q.per_role.get(role)?))) {
                Some((role, quota)) => (quota.leases, quota.rate, format!("--role-quota {role}")),
                None => (q.max_leases_per_token, q.rate_per_token, String::new()),
            };
        let flag = |own: &str| {
            if flags.is_empty() {
                own.to_string()
            } else {
                flags.clone()
            }
        };
        let over = |limit: Option<usize>, now: usize, adds: usize| {
            limit.is_some_and(|l| adds > 0 && now + adds > l)
        };
        if over(q.max_leases, usage.leases, growth.leases) {
            return Err(Refused(format!(
                "the node is at its limit of {} leases (--max-leases; {} live): revoke leases \
                 or raise the limit",
                q.max_leases.unwrap_or(0),
                usage.leases
            )));
        }
        if over(q.max_locks, usage.locks, growth.keys) {
            return Err(Refused(format!(
                "the node is at its limit of {} held keys (--max-locks; {} held): release locks \
                 or raise the limit",
                q.max_locks.unwrap_or(0),
                usage.locks
            )));
        }
        if over(q.max_waiters, usage.waiters, growth.waits) {
            return Err(Refused(format!(
                "the node is at its limit of {} queued acquires (--max-waiters; {} waiting): \
                 retry without waiting, or later",
                q.max_waiters.unwrap_or(0),
                usage.waiters
            )));
        }
        if let Some(token) = token {
            if over(per_token_leases, usage.token_leases, growth.leases) {
                return Err(Refused(format!(
                    "token {token} is at its limit of {} leases ({}; {} live): revoke its \
                     leases or raise the limit",
                    per_token_leases.unwrap_or(0),
                    flag("--max-leases-per-token"),
                    usage.token_leases
                )));
            }
        }
        match (rate, token) {
            (Some(rate), Some(token)) => self.take(token, rate, Instant::now()).map_err(|()| {
                Refused(format!(
                    "token {token} made more than {rate} creating requests a second ({}): \
                         slow down; keepalives, releases and revokes are not limited",
                    flag("--rate-limit")
                ))
            }),
            _ => Ok(()),
        }
    }

    /// Takes one from `token`'s bucket, refilled at `rate` a second.
    fn take(&self, token: TokenId, rate: u32, now: Instant) -> Result<(), ()> {
        let rate = f64::from(rate);
        let mut buckets = self.buckets.lock();
        if buckets.len() > 10_000 {
            buckets.retain(|_, b| now.duration_since(b.at).as_secs_f64() < IDLE_BUCKET_SECS);
        }
        let bucket = buckets.entry(token).or_insert(Bucket {
            tokens: rate,
            at: now,
        });
        let elapsed = now.duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Err(());
        }
        bucket.tokens -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn usage(leases: usize, locks: usize, waiters: usize) -> Usage {
        Usage {
            leases,
            locks,
            waiters,
            token_leases: leases,
        }
    }

    #[test]
    fn each_limit_refuses_only_what_would_pass_it_and_names_itself() {
        let a = Admission::new(Quotas {
            max_leases: Some(2),
            max_locks: Some(3),
            max_waiters: Some(1),
            max_leases_per_token: None,
            rate_per_token: None,
            per_role: BTreeMap::new(),
        });
        let lease = Growth {
            leases: 1,
            ..Growth::default()
        };
        assert!(a.admit(None, None, lease, usage(1, 0, 0)).is_ok());
        let refused = a.admit(None, None, lease, usage(2, 0, 0)).unwrap_err();
        assert!(
            refused.0.contains("--max-leases") && refused.0.contains("2 live"),
            "{refused:?}"
        );
        // Nothing new: never refused, however full.
        assert!(a
            .admit(None, None, Growth::default(), usage(9, 9, 9))
            .is_ok());
        let set = Growth {
            keys: 2,
            ..Growth::default()
        };
        assert!(a.admit(None, None, set, usage(0, 1, 0)).is_ok());
        assert!(a
            .admit(None, None, set, usage(0, 2, 0))
            .unwrap_err()
            .0
            .contains("--max-locks"));
        let wait = Growth {
            waits: 1,
            ..Growth::default()
        };
        assert!(a
            .admit(None, None, wait, usage(0, 0, 1))
            .unwrap_err()
            .0
            .contains("--max-waiters"));
    }

    #[test]
    fn a_token_at_its_lease_limit_is_refused_and_others_are_not() {
        let a = Admission::new(Quotas {
            max_leases_per_token: Some(2),
            ..Quotas::default()
        });
        let lease = Growth {
            leases: 1,
            ..Growth::default()
        };
        let at = |token_leases| Usage {
            leases: 100,
            locks: 0,
            waiters: 0,
            token_leases,
        };
        assert!(a.admit(Some(1), None, lease, at(1)).is_ok());
        let refused = a.admit(Some(1), None, lease, at(2)).unwrap_err();
        assert!(
            refused.0.contains("--max-leases-per-token") && refused.0.contains("2 live"),
            "{refused:?}"
        );
        // An acquire on a lease it has creates no lease: never refused here.
        let hold = Growth {
            keys: 1,
            ..Growth::default()
        };
        assert!(a.admit(Some(1), None, hold, at(2)).is_ok());
    }

    #[test]
    fn a_roles_quota_takes_the_place_of_the_per_token_flags() {
        let (role, quota) = RoleQuota::parse("batch=leases:1,rate:2").unwrap();
        let a = Admission::new(Quotas {
            max_leases_per_token: Some(100),
            per_role: BTreeMap::from([(role, quota)]),
            ..Quotas::default()
        });
        let lease = Growth {
            leases: 1,
            ..Growth::default()
        };
        let at = |token_leases| Usage {
            leases: 0,
            locks: 0,
            waiters: 0,
            token_leases,
        };
        let refused = a.admit(Some(1), Some("batch"), lease, at(1)).unwrap_err();
        assert!(refused.0.contains("--role-quota batch"), "{refused:?}");
        // Another role's tokens keep the flag's limit.
        assert!(a.admit(Some(2), Some("web"), lease, at(50)).is_ok());
        // The role's rate: a burst of 2, then refused.
        let keep = Growth::default();
        assert!(a.admit(Some(1), Some("batch"), keep, at(0)).is_ok());
        assert!(a.admit(Some(1), Some("batch"), keep, at(0)).is_ok());
        let refused = a.admit(Some(1), Some("batch"), keep, at(0)).unwrap_err();
        assert!(refused.0.contains("more than 2"), "{refused:?}");
    }

    #[test]
    fn a_role_quota_is_parsed_or_refused_with_its_form() {
        assert_eq!(
            RoleQuota::parse("web=rate:50").unwrap(),
            (
                "web".to_string(),
                RoleQuota {
                    leases: None,
                    rate: Some(50)
                }
            )
        );
        for bad in [
            "web",
            "=rate:5",
            "web=rate:0",
            "web=rate",
            "web=size:5",
            "web=rate:x",
        ] {
            let err = RoleQuota::parse(bad).unwrap_err();
            assert!(err.contains("ROLE=leases:N,rate:M"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_rate_limit_is_a_bucket_per_token() {
        let a = Admission::new(Quotas {
            rate_per_token: Some(10),
            ..Quotas::default()
        });
        let start = Instant::now();
        for _ in 0..10 {
            a.take(1, 10, start).expect("within the burst");
        }
        assert!(a.take(1, 10, start).is_err(), "past the burst");
        a.take(2, 10, start)
            .expect("another token has its own bucket");
        a.take(1, 10, start + Duration::from_millis(150))
            .expect("refilled at ten a second");
    }
}
