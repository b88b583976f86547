//! Two checks over the clients' history together with what the server
//! logged ([`Served`], from the applied log), beside the hand-written
//! invariants in [`checker`](crate::checker):
//!
//! - **Leases live their TTL.** The server never ends a lease sooner than
//!   its TTL after a grant or renewal it acknowledged, on any node, across
//!   any leader change. A lease expiry first applied at world time `t` must
//!   have `t >= sent + ttl / (1 + MAX_DRIFT) - 1 ms` for every acknowledged
//!   call sent at `sent` that gave the lease a full TTL: the table counts the
//!   TTL on the leader's clock, which runs at most [`MAX_DRIFT`] fast, in
//!   whole milliseconds.
//! - **Each lock's history is linearizable**, checked with Wing-Gong-Lowe
//!   (`todc-utils`) against a lock that is free or held by one token: a grant
//!   needs it free and a token above every earlier grant's, an end needs the
//!   token to hold it, and a read sees who holds it. As etcd's robustness
//!   model treats lease grants and revokes, expiries and revocations are
//!   events the server logged; the clients' history bounds when each took
//!   effect. Each operation's interval:
//!   - a grant: from its acquire's send (for a grant no client heard of, the
//!     owning client's last send of an acquire of that key) to the first
//!     apply of the entry that made it;
//!   - the end of a hold by release, revocation or abandonment: from the
//!     release's send (with none sent, from the grant's start) to the first
//!     apply of its entry;
//!   - the end of a hold by expiry: from the earliest moment the lease rule
//!     above lets its lease expire (the apply itself, if that came sooner:
//!     the lease rule reports that), to the first apply of its entry;
//!   - a read of who holds the key: from its send to its answer.
//!
//! A client's grant that no node applied, or that a node applied before
//! the client sent its acquire, is a violation of its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Fence, LeaseId};
use todc_utils::linearizability::history::{Action, History};
use todc_utils::linearizability::WGLChecker;
use todc_utils::specifications::Specification;

use crate::applied::{Served, ServedAt};
use crate::history::{Event, Micros, Record};
use crate::MAX_DRIFT;

/// What the two checks covered, and what broke.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// Keys whose histories were checked.
    pub keys: u64,
    /// Operations in those histories.
    pub operations: u64,
    /// Lease expiries held to the lease rule: those of leases whose grant
    /// a client heard (of the others, nothing was promised to anyone).
    pub expiries: u64,
    /// Each broken property, one line each.
    pub violations: Vec<String>,
}

/// An operation on one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Grant(Fence),
    End(Fence),
    Read(Option<Fence>),
}

/// A lock's state: who holds it, and the highest token it was granted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Lock {
    holder: Option<Fence>,
    top: Fence,
}

struct LockSpec;

impl Specification for LockSpec {
    type State = Lock;
    type Operation = Op;

    fn init() -> Lock {
        Lock {
            holder: None,
            top: 0,
        }
    }

    fn apply(op: &Op, lock: &Lock) -> (bool, Lock) {
        match *op {
            Op::Grant(fence) if lock.holder.is_none() && fence > lock.top => (
                true,
                Lock {
                    holder: Some(fence),
                    top: fence,
                },
            ),
            Op::End(fence) if lock.holder == Some(fence) => (
                true,
                Lock {
                    holder: None,
                    top: lock.top,
                },
            ),
            Op::Read(holder) if lock.holder == holder => (true, *lock),
            _ => (false, *lock),
        }
    }
}

/// An operation and the stretch of world time in which it took effect.
#[derive(Debug, Clone, Copy)]
struct Timed {
    call: Micros,
    ret: Micros,
    op: Op,
}

/// What the clients' history says about leases, acquires and releases.
#[derive(Default)]
struct Clients<'a> {
    /// Which client each lease was granted to.
    owner: HashMap<LeaseId, usize>,
    /// The latest send of an acknowledged grant or renewal of each lease.
    renewed: HashMap<LeaseId, Micros>,
    /// Each client's sends of an acquire, per key, in order.
    acquires: HashMap<(usize, &'a str), Vec<Micros>>,
    /// Grants clients received: acquire sent, grant received, by whom.
    granted: HashMap<(&'a str, Fence), (Micros, Micros, usize)>,
    /// When the release of each hold was first sent.
    release_sent: HashMap<(&'a str, Fence), Micros>,
    /// Reads: key, holder seen, sent, answered.
    reads: Vec<(&'a str, Option<Fence>, Micros, Micros)>,
}

impl<'a> Clients<'a> {
    fn new(records: &'a [Record]) -> Clients<'a> {
        let mut clients = Clients::default();
        for r in records {
            match &r.event {
                Event::Renewed {
                    client,
                    lease,
                    sent,
                } => {
                    clients.owner.entry(*lease).or_insert(*client);
                    let latest = clients.renewed.entry(*lease).or_insert(*sent);
                    *latest = (*latest).max(*sent);
                }
                Event::AcquireSent { client, key } => clients
                    .acquires
                    .entry((*client, key.as_str()))
                    .or_default()
                    .push(r.at),
                Event::Granted {
                    client,
                    key,
                    fence,
                    sent,
                    ..
                } => {
                    clients
                        .granted
                        .insert((key.as_str(), *fence), (*sent, r.at, *client));
                }
                Event::ReleaseSent { key, fence, .. } => {
                    clients
                        .release_sent
                        .entry((key.as_str(), *fence))
                        .or_insert(r.at);
                }
                Event::Observed {
                    key, holder, sent, ..
                } => clients.reads.push((key.as_str(), *holder, *sent, r.at)),
                _ => {}
            }
        }
        clients
    }

    /// The earliest world time at which the server may expire `lease`.
    fn expires_no_sooner(&self, lease: LeaseId, ttl: Duration) -> Option<Micros> {
        let full = ttl.as_micros() as f64 / (1.0 + MAX_DRIFT);
        let sent = self.renewed.get(&lease)?;
        Some((sent + full as Micros).saturating_sub(1_000))
    }

    /// The last acquire of `key` the client owning `lease` sent by `at`.
    fn acquire_before(&self, lease: LeaseId, key: &str, at: Micros) -> Option<Micros> {
        let client = self.owner.get(&lease)?;
        let sends = self.acquires.get(&(*client, key))?;
        sends.iter().rev().find(|&&s| s <= at).copied()
    }
}

/// Checks the lease rule and each lock's linearizability. `served` is what
/// the nodes applied, in log order, with no index missing; `ttl` the TTL
/// every lease was granted with.
pub fn check(records: &[Record], served: &[ServedAt], ttl: Duration) -> Checked {
    let clients = Clients::new(records);
    let mut checked = Checked::default();
    let mut locks: BTreeMap<Arc<str>, Vec<Timed>> = BTreeMap::new();
    // When each grant's interval starts, for the end of its hold.
    let mut grant_from: HashMap<(Arc<str>, Fence), Micros> = HashMap::new();
    for s in served {
        match &s.what {
            Served::Granted { key, fence, lease } => {
                let call = match clients.granted.get(&(&**key, *fence)) {
                    Some(&(sent, _, client)) => {
                        if sent > s.at {
                            checked.violations.push(format!(
                                "c{client}'s acquire of {key:?} sent at {sent} µs was answered with fence {fence}, which a node applied at {} µs (log index {}), before it was sent",
                                s.at, s.index
                            ));
                        }
                        sent
                    }
                    None => clients.acquire_before(*lease, key, s.at).unwrap_or(0),
                };
                grant_from.insert((key.clone(), *fence), call);
                locks.entry(key.clone()).or_default().push(Timed {
                    call: call.min(s.at),
                    ret: s.at,
                    op: Op::Grant(*fence),
                });
            }
            Served::Ended {
                key,
                fence,
                lease,
                expired,
            } => {
                let granted = grant_from.get(&(key.clone(), *fence)).copied();
                let from = if *expired {
                    clients.expires_no_sooner(*lease, ttl)
                } else {
                    clients.release_sent.get(&(&**key, *fence)).copied()
                };
                let call = from.into_iter().chain(granted).max().unwrap_or(0);
                locks.entry(key.clone()).or_default().push(Timed {
                    call: call.min(s.at),
                    ret: s.at,
                    op: Op::End(*fence),
                });
            }
            Served::LeaseExpired { lease } => {
                let Some(no_sooner) = clients.expires_no_sooner(*lease, ttl) else {
                    continue;
                };
                checked.expiries += 1;
                if s.at < no_sooner {
                    let client = clients.owner.get(lease).copied().unwrap_or(usize::MAX);
                    checked.violations.push(format!(
                        "lease {lease} of c{client} expired at {} µs (log index {}), {} ms before its TTL ran out after the grant or renewal sent at {} µs",
                        s.at,
                        s.index,
                        (no_sooner - s.at) / 1000,
                        clients.renewed.get(lease).copied().unwrap_or(0)
                    ));
                }
            }
        }
    }
    for ((key, fence), (_, at, client)) in &clients.granted {
        if !grant_from.contains_key(&(Arc::from(*key), *fence)) {
            checked.violations.push(format!(
                "c{client} was granted {key:?} with fence {fence} at {at} µs, but no node applied that grant"
            ));
        }
    }
    for &(key, holder, sent, answered) in &clients.reads {
        locks.entry(Arc::from(key)).or_default().push(Timed {
            call: sent,
            ret: answered,
            op: Op::Read(holder),
        });
    }
    for (key, ops) in locks {
        checked.keys += 1;
        checked.operations += ops.len() as u64;
        if !linearizable(&ops) {
            let (from, to) = ops
                .iter()
                .fold((Micros::MAX, 0), |(a, b), t| (a.min(t.call), b.max(t.ret)));
            checked.violations.push(format!(
                "the history of {key:?} is not linearizable: no order of its {} grants, ends and reads between {from} and {to} µs fits a lock",
                ops.len()
            ));
        }
    }
    checked
}

/// Whether some order of `ops`, each placed within its interval, is a
/// history of one lock.
fn linearizable(ops: &[Timed]) -> bool {
    if ops.is_empty() {
        return true;
    }
    // Each operation is its own process. At equal times calls come first,
    // so operations that touch are taken as concurrent.
    let mut actions: Vec<(Micros, bool, usize, Op)> = Vec::with_capacity(ops.len() * 2);
    for (i, t) in ops.iter().enumerate() {
        actions.push((t.call, false, i, t.op));
        actions.push((t.ret, true, i, t.op));
    }
    actions.sort_by_key(|&(at, is_ret, i, _)| (at, is_ret, i));
    let actions = actions
        .into_iter()
        .map(|(_, is_ret, i, op)| {
            let action = if is_ret {
                Action::Response(op)
            } else {
                Action::Call(op)
            };
            (i, action)
        })
        .collect();
    WGLChecker::<LockSpec>::is_linearizable(History::from_actions(actions))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(call: Micros, ret: Micros, op: Op) -> Timed {
        Timed { call, ret, op }
    }

    #[test]
    fn overlapping_operations_may_take_effect_in_either_order() {
        // A read of the holder overlaps the grant that made it holder.
        let ops = [
            op(0, 10, Op::Grant(1)),
            op(5, 8, Op::Read(Some(1))),
            op(12, 20, Op::End(1)),
            op(15, 18, Op::Read(None)),
            op(25, 30, Op::Grant(2)),
        ];
        assert!(linearizable(&ops));
    }

    #[test]
    fn a_read_of_the_key_free_while_it_is_surely_held_is_caught() {
        let ops = [
            op(0, 10, Op::Grant(1)),
            op(12, 14, Op::Read(None)),
            op(20, 30, Op::End(1)),
        ];
        assert!(!linearizable(&ops));
    }

    #[test]
    fn a_second_grant_before_the_first_hold_can_have_ended_is_caught() {
        // The expiry of fence 1 may not take effect before 50.
        let ops = [
            op(0, 10, Op::Grant(1)),
            op(50, 60, Op::End(1)),
            op(20, 30, Op::Grant(2)),
        ];
        assert!(!linearizable(&ops));
    }

    #[test]
    fn a_token_below_an_earlier_grant_is_caught() {
        let ops = [
            op(0, 10, Op::Grant(5)),
            op(11, 12, Op::End(5)),
            op(20, 30, Op::Grant(4)),
        ];
        assert!(!linearizable(&ops));
    }

    #[test]
    fn an_expiry_before_the_ttl_after_an_acknowledged_renewal_is_caught() {
        let ttl = Duration::from_millis(600);
        let records = [Record {
            at: 3_000,
            event: Event::Renewed {
                client: 0,
                lease: 7,
                sent: 1_000,
            },
        }];
        let expiry = |at| ServedAt {
            at,
            index: 9,
            what: Served::LeaseExpired { lease: 7 },
        };
        // No sooner than 588 ms (600 ms on a clock 2% fast) less 1 ms after
        // the send.
        assert!(check(&records, &[expiry(589_000)], ttl)
            .violations
            .is_empty());
        let early = check(&records, &[expiry(500_000)], ttl);
        assert_eq!(early.violations.len(), 1, "{:?}", early.violations);
        assert!(early.violations[0].contains("lease 7 of c0 expired"));
    }
}
