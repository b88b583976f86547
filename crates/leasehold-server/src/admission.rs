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
//! `--max-waiters`) are checked on the leader against what it has applied,
//! before the command is proposed: requests in flight at that moment may
//! pass it by one batch at most. The rate limit (`--rate-limit`) is a token
//! bucket per access token, refilled at that many requests a second with a
//! burst of as many; with auth off there is no caller to tell apart, and
//! only the size limits apply.

use std::collections::HashMap;
use std::time::Instant;

use leasehold_core::auth::TokenId;
use parking_lot::Mutex;

/// The limits; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Quotas {
    /// Live leases, in all.
    pub max_leases: Option<usize>,
    /// Keys held, in all.
    pub max_locks: Option<usize>,
    /// Acquires waiting in queues, in all.
    pub max_waiters: Option<usize>,
    /// Creating requests a second, per access token.
    pub rate_per_token: Option<u32>,
}

/// What a request would create, for [`Admission::admit`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Creates {
    /// A lease.
    pub lease: bool,
    /// Holds on this many keys.
    pub locks: usize,
    /// A wait in a queue.
    pub wait: bool,
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
    pub fn quotas(&self) -> Quotas {
        self.quotas
    }

    /// Whether a request of `token` that creates `creates` may go on, with
    /// the table at `usage`.
    pub fn admit(
        &self,
        token: Option<TokenId>,
        creates: Creates,
        usage: Usage,
    ) -> Result<(), Refused> {
        let q = &self.quotas;
        let over = |limit: Option<usize>, now: usize, adds: usize| {
            limit.is_some_and(|l| adds > 0 && now + adds > l)
        };
        if over(q.max_leases, usage.leases, usize::from(creates.lease)) {
            return Err(Refused(format!(
                "the node is at its limit of {} leases (--max-leases; {} live): revoke leases \
                 or raise the limit",
                q.max_leases.unwrap_or(0),
                usage.leases
            )));
        }
        if over(q.max_locks, usage.locks, creates.locks) {
            return Err(Refused(format!(
                "the node is at its limit of {} held keys (--max-locks; {} held): release locks \
                 or raise the limit",
                q.max_locks.unwrap_or(0),
                usage.locks
            )));
        }
        if over(q.max_waiters, usage.waiters, usize::from(creates.wait)) {
            return Err(Refused(format!(
                "the node is at its limit of {} queued acquires (--max-waiters; {} waiting): \
                 retry without waiting, or later",
                q.max_waiters.unwrap_or(0),
                usage.waiters
            )));
        }
        match (q.rate_per_token, token) {
            (Some(rate), Some(token)) => self.take(token, rate, Instant::now()),
            _ => Ok(()),
        }
    }

    /// Takes one from `token`'s bucket, refilled at `rate` a second.
    fn take(&self, token: TokenId, rate: u32, now: Instant) -> Result<(), Refused> {
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
            return Err(Refused(format!(
                "token {token} made more than {rate} creating requests a second \
                 (--rate-limit): slow down; keepalives, releases and revokes are not limited"
            )));
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
        }
    }

    #[test]
    fn each_limit_refuses_only_what_would_pass_it_and_names_itself() {
        let a = Admission::new(Quotas {
            max_leases: Some(2),
            max_locks: Some(3),
            max_waiters: Some(1),
            rate_per_token: None,
        });
        let lease = Creates {
            lease: true,
            ..Creates::default()
        };
        assert!(a.admit(None, lease, usage(1, 0, 0)).is_ok());
        let refused = a.admit(None, lease, usage(2, 0, 0)).unwrap_err();
        assert!(
            refused.0.contains("--max-leases") && refused.0.contains("2 live"),
            "{refused:?}"
        );
        // Nothing new: never refused, however full.
        assert!(a.admit(None, Creates::default(), usage(9, 9, 9)).is_ok());
        let set = Creates {
            locks: 2,
            ..Creates::default()
        };
        assert!(a.admit(None, set, usage(0, 1, 0)).is_ok());
        assert!(a
            .admit(None, set, usage(0, 2, 0))
            .unwrap_err()
            .0
            .contains("--max-locks"));
        let wait = Creates {
            wait: true,
            ..Creates::default()
        };
        assert!(a
            .admit(None, wait, usage(0, 0, 1))
            .unwrap_err()
            .0
            .contains("--max-waiters"));
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
