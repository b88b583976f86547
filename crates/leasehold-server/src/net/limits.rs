//! How many connections may be open, and how long one may take or idle.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::service::LockService;

/// Connection limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// Time to send the first byte, and an HTTP/1 request's headers.
    pub header_timeout: Duration,
    /// A connection with nothing in flight for this long is closed.
    pub idle_timeout: Duration,
}

impl Limits {
    /// What the framed protocol needs of them.
    pub(super) fn frames(&self) -> crate::api::frames::Timeouts {
        crate::api::frames::Timeouts {
            header: self.header_timeout,
            idle: self.idle_timeout,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// How long a connection closed for being idle, or for a shutdown, has to
/// finish its polite close before it is dropped. Nothing is in flight on an
/// idle one, so the close is only the peer's acknowledgement.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Counts open connections against the cap.
#[derive(Clone)]
pub struct Gate {
    open: Arc<AtomicUsize>,
    /// Set while the cap is reached, so it is logged once per episode.
    full: Arc<AtomicBool>,
    max: usize,
}

/// One admitted connection; frees its place when dropped.
pub struct Admitted {
    gate: Gate,
    service: LockService,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let left = self.gate.open.fetch_sub(1, Ordering::SeqCst) - 1;
        self.service.context().metrics.connections.dec();
        if left < self.gate.max / 10 * 9 && self.gate.full.swap(false, Ordering::SeqCst) {
            tracing::info!(open = left, "connections below the cap again");
        }
    }
}

impl Gate {
    /// A cap of `max` open connections.
    pub fn new(max: usize) -> Gate {
        Gate {
            open: Arc::new(AtomicUsize::new(0)),
            full: Arc::new(AtomicBool::new(false)),
            max: max.max(1),
        }
    }

    /// A place for one more connection, or `None` at the cap.
    pub fn admit(&self, service: &LockService) -> Option<Admitted> {
        let metrics = &service.context().metrics;
        let admitted = self
            .open
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            metrics.refused.inc();
            if !self.full.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    max_connections = self.max,
                    "connection cap reached: closing new connections until some close (raise --max-connections, or find the client that opens so many)"
                );
            }
            return None;
        }
        metrics.connections.inc();
        Some(Admitted {
            gate: self.clone(),
            service: service.clone(),
        })
    }
}

/// Raises this process's soft limit on open files to its hard limit, and
/// returns the limit in force.
pub fn raise_fd_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write and read only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    Some(limit.rlim_cur)
}
