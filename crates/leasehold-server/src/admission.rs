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
//! `--max-waiters`) and on what one token owns (`--max-leases-per-token`,
//! `--max-locks-per-token`, `--max-waiters-per-token`) are checked on the
//! leader against what it has applied, before the command is proposed:
//! requests in flight at that moment may pass a limit by one batch at most.
//! What a request would add is the table's own answer (`LockTable::growth`):
//! a retry of a request it already answered, or an acquire of a key its
//! lease already holds or waits for (a caller re-attaching after a leader
//! change), adds nothing and is never refused by a size limit. The rate
//! limit (`--rate-limit`) is a token bucket per access token, refilled at
//! that many requests a second with a burst of as many; a refusal for it is
//! held back until the bucket has room again (between 200 ms and 1 s), so a
//! client flooding the node gets its refusals slowly and the node's time
//! goes to everyone else's renewals. At most a quarter of a framed
//! connection's places hold such refusals at once (the rest go out at
//! once), so the flood never fills the connection its own renewals use. `--role-quota` sets a role's own limits
//! per token, in place of the four per-token flags, for every token of that
//! role. With auth off there is no caller to tell apart, and only the limits
//! on the whole table apply.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use leasehold_core::auth::TokenId;
use leasehold_core::{Growth, Owned};
use parking_lot::Mutex;
use tokio::sync::Semaphore;

/// The limits; `None` is no limit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quotas {
    /// Live leases, in all.
    pub max_leases: Option<usize>,
    /// Keys held, in all.
    pub max_locks: Option<usize>,
    /// Acquires waiting in queues, in all.
    pub max_waiters: Option<usize>,
    /// The limits on each access token (`--max-leases-per-token`,
    /// `--max-locks-per-token`, `--max-waiters-per-token`, `--rate-limit`).
    pub per_token: TokenQuota,
    /// A role's own limits on each of its tokens, in place of `per_token`.
    pub per_role: BTreeMap<String, TokenQuota>,
}

/// The limits on one access token; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenQuota {
    /// Live leases it owns.
    pub leases: Option<usize>,
    /// Keys its leases hold.
    pub locks: Option<usize>,
    /// Waits of its leases in queues.
    pub waiters: Option<usize>,
    /// Creating requests a second.
    pub rate: Option<u32>,
}

impl TokenQuota {
    /// Parses `--role-quota`'s `ROLE=leases:N,locks:N,waiters:N,rate:M`
    /// (any of them); a limit of 0 is refused.
    pub fn parse(text: &str) -> Result<(String, TokenQuota), String> {
        let usage = "give ROLE=leases:N,locks:N,waiters:N,rate:M (any of them, each at least 1)";
        let (role, limits) = text
            .split_once('=')
            .filter(|(role, _)| !role.is_empty())
            .ok_or_else(|| format!("`{text}`: {usage}"))?;
        let mut quota = TokenQuota::default();
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
                "locks" => quota.locks = Some(n as usize),
                "waiters" => quota.waiters = Some(n as usize),
                "rate" => quota.rate = Some(n),
                _ => return Err(format!("`{name}` in `{text}` is not a limit: {usage}")),
            }
        }
        Ok((role.to_string(), quota))
    }
}

/// The table's size now: leases, keys held, waits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Live leases.
    pub leases: usize,
    /// Keys held.
    pub locks: usize,
    /// Waits queued.
    pub waiters: usize,
    /// What the caller's token owns (nothing without one).
    pub token: Owned,
}

/// How a refusal names one kind of limit, on the node and per token.
struct Named {
    /// What is counted.
    what: &'static str,
    /// What its use is, after the number.
    state: &'static str,
    node_flag: &'static str,
    node_next: &'static str,
    token_flag: &'static str,
    token_next: &'static str,
}

impl Named {
    const LEASES: Named = Named {
        what: "leases",
        state: "live",
        node_flag: "--max-leases",
        node_next: "revoke leases or raise the limit",
        token_flag: "--max-leases-per-token",
        token_next: "revoke its leases or raise the limit",
    };
    const LOCKS: Named = Named {
        what: "held keys",
        state: "held",
        node_flag: "--max-locks",
        node_next: "release locks or raise the limit",
        token_flag: "--max-locks-per-token",
        token_next: "release its locks or raise the limit",
    };
    const WAITERS: Named = Named {
        what: "queued acquires",
        state: "waiting",
        node_flag: "--max-waiters",
        node_next: "retry without waiting, or later",
        token_flag: "--max-waiters-per-token",
        token_next: "retry without waiting, or later",
    };
}

/// Why a request was refused: one line naming the limit and the use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The line.
    pub message: String,
    /// For a token past its rate: when its bucket has room again.
    pub retry_after: Option<Duration>,
}

impl Refused {
    fn full(message: String) -> Refused {
        Refused {
            message,
            retry_after: None,
        }
    }
}

/// The quotas of one node, and each token's bucket.
#[derive(Debug)]
pub struct Admission {
    quotas: Quotas,
    buckets: Mutex<HashMap<TokenId, Bucket>>,
    held_back: Semaphore,
}

impl Default for Admission {
    fn default() -> Admission {
        Admission::new(Quotas::default())
    }
}

/// How long a refusal for a token past its rate is held back, at least and
/// at most (see [`Admission::hold_back`]).
pub const HOLD_BACK: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(1));

/// How many refusals are held back at once at most; past it, they go out
/// at once.
const MAX_HELD_BACK: usize = 10_000;

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
            held_back: Semaphore::new(MAX_HELD_BACK),
        }
    }

    /// Holds back a refusal for a token past its rate until its bucket has
    /// room again (within [`HOLD_BACK`]), then returns it. A client that
    /// sends as fast as it can then gets its refusals a few a second per
    /// connection, not as fast as the node can write them, and leaves the
    /// node's time to others' renewals. A refusal of any other kind goes
    /// out at once, and so does this one when too many are held already:
    /// on the node, or on the caller's connection (`connection`, the places
    /// of a connection that carries many calls at once, so that held-back
    /// refusals never fill it and a renewal sent behind them is still read).
    pub async fn hold_back(&self, refused: &Refused, connection: Option<&Semaphore>) {
        let Some(wait) = refused.retry_after else {
            return;
        };
        let Ok(_held) = self.held_back.try_acquire() else {
            return;
        };
        let _mine = match connection.map(Semaphore::try_acquire) {
            Some(Err(_)) => return,
            Some(Ok(place)) => Some(place),
            None => None,
        };
        tokio::time::sleep(wait.clamp(HOLD_BACK.0, HOLD_BACK.1)).await;
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
        let (mine, role_flag) = match role.and_then(|role| Some((role, q.per_role.get(role)?))) {
            Some((role, quota)) => (*quota, Some(format!("--role-quota {role}"))),
            None => (q.per_token, None),
        };
        let flag = |own: &str| role_flag.clone().unwrap_or_else(|| own.to_string());
        // Each limit: what it is, its use now, what the request adds, and
        // how a refusal names it (the flag, the use, what to do).
        let node = [
            (q.max_leases, usage.leases, growth.leases, Named::LEASES),
            (q.max_locks, usage.locks, growth.keys, Named::LOCKS),
            (q.max_waiters, usage.waiters, growth.waits, Named::WAITERS),
        ];
        for (limit, now, adds, named) in node {
            if let Some(limit) = limit.filter(|&l| adds > 0 && now + adds > l) {
                return Err(Refused::full(format!(
                    "the node is at its limit of {limit} {} ({}; {now} {}): {}",
                    named.what, named.node_flag, named.state, named.node_next
                )));
            }
        }
        let Some(token) = token else {
            return Ok(());
        };
        // The rate first: a token at a size limit that keeps asking is
        // slowed like any other.
        if let Some(rate) = mine.rate {
            self.take(token, rate, Instant::now())
                .map_err(|retry_after| Refused {
                    message: format!(
                        "token {token} made more than {rate} creating requests a second ({}): \
                         slow down; keepalives, releases and revokes are not limited",
                        flag("--rate-limit")
                    ),
                    retry_after: Some(retry_after),
                })?;
        }
        let has = usage.token;
        let own = [
            (mine.leases, has.leases, growth.leases, Named::LEASES),
            (mine.locks, has.keys, growth.keys, Named::LOCKS),
            (mine.waiters, has.waits, growth.waits, Named::WAITERS),
        ];
        for (limit, now, adds, named) in own {
            if let Some(limit) = limit.filter(|&l| adds > 0 && now + adds > l) {
                return Err(Refused::full(format!(
                    "token {token} is at its limit of {limit} {} ({}; {now} {}): {}",
                    named.what,
                    flag(named.token_flag),
                    named.state,
                    named.token_next
                )));
            }
        }
        Ok(())
    }

    /// Takes one from `token`'s bucket, refilled at `rate` a second; if it
    /// is empty, says how long until it has one again.
    fn take(&self, token: TokenId, rate: u32, now: Instant) -> Result<(), Duration> {
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
            return Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate));
        }
        bucket.tokens -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(leases: usize, locks: usize, waiters: usize) -> Usage {
        Usage {
            leases,
            locks,
            waiters,
            token: Owned::default(),
        }
    }

    fn owning(leases: usize, keys: usize, waits: usize) -> Usage {
        Usage {
            token: Owned {
                leases,
                keys,
                waits,
            },
            ..Usage::default()
        }
    }

    const LEASE: Growth = Growth {
        leases: 1,
        keys: 0,
        waits: 0,
        owner: None,
    };
    const KEY: Growth = Growth {
        leases: 0,
        keys: 1,
        waits: 0,
        owner: None,
    };
    const WAIT: Growth = Growth {
        leases: 0,
        keys: 1,
        waits: 1,
        owner: None,
    };

    #[test]
    fn each_limit_refuses_only_what_would_pass_it_and_names_itself() {
        let a = Admission::new(Quotas {
            max_leases: Some(2),
            max_locks: Some(3),
            max_waiters: Some(1),
            ..Quotas::default()
        });
        assert!(a.admit(None, None, LEASE, usage(1, 0, 0)).is_ok());
        let refused = a.admit(None, None, LEASE, usage(2, 0, 0)).unwrap_err();
        assert!(
            refused.message.contains("--max-leases") && refused.message.contains("2 live"),
            "{refused:?}"
        );
        assert_eq!(refused.retry_after, None);
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
            .message
            .contains("--max-locks"));
        assert!(a
            .admit(None, None, WAIT, usage(0, 0, 1))
            .unwrap_err()
            .message
            .contains("--max-waiters"));
    }

    #[test]
    fn a_token_at_one_of_its_limits_is_refused_and_others_are_not() {
        let a = Admission::new(Quotas {
            per_token: TokenQuota {
                leases: Some(2),
                locks: Some(3),
                waiters: Some(1),
                rate: None,
            },
            ..Quotas::default()
        });
        assert!(a.admit(Some(1), None, LEASE, owning(1, 0, 0)).is_ok());
        let refused = a.admit(Some(1), None, LEASE, owning(2, 0, 0)).unwrap_err();
        assert!(
            refused.message.contains("--max-leases-per-token")
                && refused.message.contains("2 live"),
            "{refused:?}"
        );
        // An acquire on a lease it has creates no lease.
        assert!(a.admit(Some(1), None, KEY, owning(2, 2, 0)).is_ok());
        let refused = a.admit(Some(1), None, KEY, owning(2, 3, 0)).unwrap_err();
        assert!(
            refused.message.contains("--max-locks-per-token") && refused.message.contains("3 held"),
            "{refused:?}"
        );
        let refused = a.admit(Some(1), None, WAIT, owning(0, 0, 1)).unwrap_err();
        assert!(
            refused.message.contains("--max-waiters-per-token"),
            "{refused:?}"
        );
        // Without a token (auth off) only the node's limits apply.
        assert!(a.admit(None, None, LEASE, owning(9, 9, 9)).is_ok());
    }

    #[test]
    fn a_roles_quota_takes_the_place_of_the_per_token_flags() {
        let (role, quota) = TokenQuota::parse("batch=leases:1,locks:5,rate:2").unwrap();
        let a = Admission::new(Quotas {
            per_token: TokenQuota {
                leases: Some(100),
                ..TokenQuota::default()
            },
            per_role: BTreeMap::from([(role, quota)]),
            ..Quotas::default()
        });
        let refused = a
            .admit(Some(1), Some("batch"), LEASE, owning(1, 0, 0))
            .unwrap_err();
        assert!(
            refused.message.contains("--role-quota batch"),
            "{refused:?}"
        );
        // Another role's tokens keep the flag's limit.
        assert!(a
            .admit(Some(2), Some("web"), LEASE, owning(50, 0, 0))
            .is_ok());
        // The role's rate: a burst of 2 (the refused grant took one of
        // them), then refused, saying when to come back.
        let keep = Growth::default();
        assert!(a
            .admit(Some(1), Some("batch"), keep, owning(0, 0, 0))
            .is_ok());
        let refused = a
            .admit(Some(1), Some("batch"), keep, owning(0, 0, 0))
            .unwrap_err();
        assert!(refused.message.contains("more than 2"), "{refused:?}");
        assert!(refused
            .retry_after
            .is_some_and(|d| d > Duration::ZERO && d <= Duration::from_millis(500)));
    }

    #[test]
    fn a_role_quota_is_parsed_or_refused_with_its_form() {
        assert_eq!(
            TokenQuota::parse("web=rate:50,waiters:3").unwrap(),
            (
                "web".to_string(),
                TokenQuota {
                    rate: Some(50),
                    waiters: Some(3),
                    ..TokenQuota::default()
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
            let err = TokenQuota::parse(bad).unwrap_err();
            assert!(
                err.contains("ROLE=leases:N,locks:N,waiters:N,rate:M"),
                "{bad}: {err}"
            );
        }
    }

    #[tokio::test]
    async fn a_connection_holds_back_at_most_its_places() {
        use futures::FutureExt;
        let a = Admission::default();
        let refused = Refused {
            message: "slow down".into(),
            retry_after: Some(Duration::from_millis(500)),
        };
        let connection = Semaphore::new(1);
        let mut held = Box::pin(a.hold_back(&refused, Some(&connection)));
        assert!(futures::poll!(held.as_mut()).is_pending(), "held back");
        assert_eq!(connection.available_permits(), 0);
        assert!(
            a.hold_back(&refused, Some(&connection))
                .now_or_never()
                .is_some(),
            "with the connection's places taken, a refusal goes out at once"
        );
        drop(held);
        assert_eq!(connection.available_permits(), 1, "the place is given back");
        let other = Refused {
            retry_after: None,
            ..refused.clone()
        };
        assert!(
            a.hold_back(&other, Some(&connection))
                .now_or_never()
                .is_some(),
            "a refusal not for the rate goes out at once"
        );
        assert!(
            a.hold_back(&refused, None).now_or_never().is_none(),
            "without a connection's bound, only the node's applies"
        );
    }

    #[test]
    fn the_rate_limit_is_a_bucket_per_token() {
        let a = Admission::default();
        let start = Instant::now();
        for _ in 0..10 {
            a.take(1, 10, start).expect("within the burst");
        }
        let wait = a.take(1, 10, start).expect_err("past the burst");
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        a.take(2, 10, start)
            .expect("another token has its own bucket");
        a.take(1, 10, start + Duration::from_millis(150))
            .expect("refilled at ten a second");
    }
}
