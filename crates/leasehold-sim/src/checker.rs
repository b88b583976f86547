//! The checker: what must hold of every history, faults or not.
//!
//! Per run (fences are one sequence for the whole deployment):
//! - **unique fences**: no token is granted twice;
//! - **fences follow real time**: a grant whose acquire was first sent after
//!   another grant was received carries a higher token (so no acknowledged
//!   grant is lost across a crash: a lost one would let its token, or a
//!   lower one, be granted again);
//! - **the resource**: the gate never admits a token lower than one it
//!   admitted before for that resource;
//! - **exclusion**: per key, the intervals in which clients believe they hold
//!   it (grant received to the earliest of deadline, release sent and loss
//!   noticed) never overlap. Client clocks drift within
//!   [`MAX_DRIFT`](crate::MAX_DRIFT), which the client's margin on its
//!   deadline covers, so no slack is given here;
//! - **reads see acknowledged writes**: a read of who holds a key, sent
//!   after a release of token F was acknowledged, does not show F holding
//!   it (no acknowledged release is lost, across crashes too), and one sent
//!   after a grant of token G on that key was received shows no token below
//!   G (reads are linearizable: no stale follower or deposed leader answers);
//! - **no acknowledged checkpoint is lost**: a grant carries the checkpoint
//!   of the highest token below its own whose save was acknowledged (the
//!   last such save, or one that token sent after it whose answer was lost),
//!   or a later one that some lower token sent; never an older one, never
//!   none, never bytes nobody sent, across crashes too;
//! - **no panic** in any host;
//! - **progress**: once the faults heal, some call succeeds within
//!   [`HEAL_BOUND`]; the longest time without any successful call is
//!   reported.

use std::collections::BTreeMap;

use crate::history::{Event, Micros, Record};

/// After the last fault heals, a call must succeed within this long.
pub const HEAL_BOUND: Micros = 10_000_000;

/// What a run broke, and how available it was.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Each broken property, one line each.
    pub violations: Vec<String>,
    /// The longest stretch without a successful call.
    pub longest_unavailable: Micros,
}

struct Hold {
    client: usize,
    fence: u64,
    from: Micros,
    until: Micros,
}

/// Checks `records`; `healed` is when the last fault ended.
pub fn check(records: &[Record], healed: Micros) -> Verdict {
    let mut violations = Vec::new();
    fences(records, &mut violations);
    resource(records, &mut violations);
    exclusion(records, &mut violations);
    reads(records, &mut violations);
    checkpoints(records, &mut violations);
    for r in records {
        if let Event::Panic { message } = &r.event {
            violations.push(format!("a host panicked at {} µs: {message}", r.at));
        }
    }
    let longest_unavailable = progress(records, healed, &mut violations);
    Verdict {
        violations,
        longest_unavailable,
    }
}

fn checkpoints(records: &[Record], violations: &mut Vec<String>) {
    // Per (key, token): every save sent, in order, with when; and the
    // index (into those) of the last one acknowledged.
    type Saves<'a> = BTreeMap<(&'a str, u64), (Vec<&'a [u8]>, Option<usize>)>;
    let mut saves: Saves = BTreeMap::new();
    for r in records {
        match &r.event {
            Event::CheckpointSent {
                key, fence, data, ..
            } => saves
                .entry((key.as_str(), *fence))
                .or_default()
                .0
                .push(data.as_slice()),
            Event::CheckpointSaved {
                key, fence, data, ..
            } => {
                let entry = saves.entry((key.as_str(), *fence)).or_default();
                // The last send of these bytes (a save is answered before
                // the next is sent).
                entry.1 = entry.0.iter().rposition(|d| *d == data.as_slice());
            }
            _ => {}
        }
    }
    for r in records {
        let Event::Granted {
            key,
            fence,
            checkpoint,
            ..
        } = &r.event
        else {
            continue;
        };
        let key = key.as_str();
        let below = saves.range((key, 0)..(key, *fence));
        // The highest token below this grant's with an acknowledged save.
        let acked = below
            .filter_map(|((_, f), (sent, last))| last.map(|i| (*f, sent, i)))
            .next_back();
        let shown = |c: &Option<(u64, Vec<u8>)>| match c {
            Some((f, d)) => format!("fence {f}'s {:?}", String::from_utf8_lossy(d)),
            None => "none".to_string(),
        };
        let fine = match (checkpoint, acked) {
            (None, None) => true,
            (None, Some(_)) => false,
            (Some((f, data)), acked) => {
                let sent = saves.get(&(key, *f));
                let was_sent = |from: usize| {
                    sent.is_some_and(|(list, _)| list[from..].contains(&data.as_slice()))
                };
                *f < *fence
                    && match acked {
                        None => was_sent(0),
                        Some((af, _, _)) if *f > af => was_sent(0),
                        Some((af, _, i)) if *f == af => was_sent(i),
                        Some(_) => false,
                    }
            }
        };
        if !fine {
            let expected = acked.map(|(f, sent, i)| (f, sent[i].to_vec()));
            violations.push(format!(
                "checkpoint lost: grant of {key:?} with fence {fence} at {} µs carried {}, but the last acknowledged save below it was {}",
                r.at,
                shown(checkpoint),
                shown(&expected)
            ));
        }
    }
}

fn reads(records: &[Record], violations: &mut Vec<String>) {
    // Per key: when each release was acknowledged, and each grant received.
    let mut released: BTreeMap<(&str, u64), Micros> = BTreeMap::new();
    let mut granted: BTreeMap<&str, Vec<(Micros, u64)>> = BTreeMap::new();
    for r in records {
        match &r.event {
            Event::Released { key, fence, .. } => {
                released.entry((key.as_str(), *fence)).or_insert(r.at);
            }
            Event::Granted { key, fence, .. } => {
                granted
                    .entry(key.as_str())
                    .or_default()
                    .push((r.at, *fence));
            }
            _ => {}
        }
    }
    for r in records {
        let Event::Observed {
            client,
            key,
            holder: Some(seen),
            sent,
            node,
        } = &r.event
        else {
            continue;
        };
        if let Some(at) = released
            .get(&(key.as_str(), *seen))
            .filter(|at| **at < *sent)
        {
            violations.push(format!(
                "c{client}'s read of {key} sent at {sent} µs, answered by {node}, shows fence {seen} holding it, though its release was acknowledged at {at} µs"
            ));
        }
        let newer = granted
            .get(key.as_str())
            .into_iter()
            .flatten()
            .find(|(at, fence)| *at < *sent && *fence > *seen);
        if let Some((at, fence)) = newer {
            violations.push(format!(
                "c{client}'s read of {key} sent at {sent} µs, answered by {node}, shows fence {seen} holding it, though fence {fence} was granted at {at} µs: a stale read"
            ));
        }
    }
}

fn fences(records: &[Record], violations: &mut Vec<String>) {
    // (received, sent, fence, client, key), in the order received.
    let grants: Vec<(Micros, Micros, u64, usize, &str)> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::Granted {
                client,
                key,
                fence,
                sent,
                ..
            } => Some((r.at, *sent, *fence, *client, key.as_str())),
            _ => None,
        })
        .collect();
    let mut seen: BTreeMap<u64, (usize, &str)> = BTreeMap::new();
    for &(at, _, fence, client, key) in &grants {
        if let Some((c, k)) = seen.insert(fence, (client, key)) {
            violations.push(format!(
                "fence {fence} granted twice: to client {c} for {k:?}, and at {at} µs to client {client} for {key:?}"
            ));
        }
    }
    // The highest fence received up to each point, for the real-time order.
    let mut highest = Vec::with_capacity(grants.len());
    let mut max = (0u64, 0usize);
    for (i, g) in grants.iter().enumerate() {
        if g.2 > max.0 {
            max = (g.2, i);
        }
        highest.push(max);
    }
    for &(at, sent, fence, client, key) in &grants {
        // Grants received strictly before this acquire was sent.
        let before = grants.partition_point(|g| g.0 < sent);
        if before == 0 {
            continue;
        }
        let (top, i) = highest[before - 1];
        if top >= fence {
            let earlier = grants[i];
            violations.push(format!(
                "fence went back: client {client} sent for {key:?} at {sent} µs and got fence {fence} at {at} µs, but fence {top} had been granted to client {} for {:?} at {} µs",
                earlier.3, earlier.4, earlier.0
            ));
        }
    }
}

/// The resource never admits a lower fence after a higher one. A write
/// takes effect somewhere between being sent to the gate and its record, so
/// an admitted write is out of order when it was sent after a write with a
/// higher fence had been admitted and recorded. (A write recorded late, by a
/// process frozen after the gate answered, may have been admitted earlier.)
fn resource(records: &[Record], violations: &mut Vec<String>) {
    // Per key, the admitted writes in record order: when recorded, and the
    // highest fence admitted up to then.
    let mut admitted: BTreeMap<&str, Vec<(Micros, u64)>> = BTreeMap::new();
    for r in records {
        let Event::Wrote {
            client,
            key,
            fence,
            admitted: true,
            sent,
        } = &r.event
        else {
            continue;
        };
        let writes = admitted.entry(key).or_default();
        let before = writes.partition_point(|&(at, _)| at <= *sent);
        if let Some(&(at, top)) = before.checked_sub(1).map(|i| &writes[i]) {
            if top > *fence {
                violations.push(format!(
                    "the resource {key:?} admitted fence {fence} from client {client} (sent at {sent} µs, recorded at {} µs) after fence {top} (recorded by {at} µs)",
                    r.at
                ));
            }
        }
        let top = writes.last().map_or(*fence, |&(_, top)| top.max(*fence));
        writes.push((r.at, top));
    }
}

fn exclusion(records: &[Record], violations: &mut Vec<String>) {
    let end = records.last().map_or(0, |r| r.at);
    let mut open: BTreeMap<(usize, &str, u64), Micros> = BTreeMap::new();
    let mut holds: BTreeMap<&str, Vec<Hold>> = BTreeMap::new();
    for r in records {
        match &r.event {
            Event::Granted {
                client, key, fence, ..
            } => {
                open.insert((*client, key, *fence), r.at);
            }
            Event::HoldEnded {
                client,
                key,
                fence,
                until,
                ..
            } => {
                if let Some(from) = open.remove(&(*client, key.as_str(), *fence)) {
                    holds.entry(key).or_default().push(Hold {
                        client: *client,
                        fence: *fence,
                        from,
                        until: *until,
                    });
                }
            }
            _ => {}
        }
    }
    for ((client, key, fence), from) in open {
        holds.entry(key).or_default().push(Hold {
            client,
            fence,
            from,
            until: end,
        });
    }
    for (key, mut list) in holds {
        list.retain(|h| h.until > h.from);
        list.sort_by_key(|h| (h.from, h.until));
        let mut latest: Option<&Hold> = None;
        for h in &list {
            if let Some(prev) = latest {
                if h.from < prev.until {
                    violations.push(format!(
                        "two holders of {key:?}: client {} (fence {}) believed it held from {} to {} µs, client {} (fence {}) from {} µs",
                        prev.client, prev.fence, prev.from, prev.until, h.client, h.fence, h.from
                    ));
                }
            }
            if latest.is_none_or(|p| h.until > p.until) {
                latest = Some(h);
            }
        }
    }
}

fn progress(records: &[Record], healed: Micros, violations: &mut Vec<String>) -> Micros {
    let oks: Vec<Micros> = records
        .iter()
        .filter(|r| matches!(&r.event, Event::Answer { code, .. } if code == "ok"))
        .map(|r| r.at)
        .collect();
    let mut longest = oks.first().copied().unwrap_or(0);
    for w in oks.windows(2) {
        longest = longest.max(w[1] - w[0]);
    }
    match oks.iter().find(|&&t| t >= healed) {
        Some(&t) if t - healed <= HEAL_BOUND => {}
        Some(&t) => violations.push(format!(
            "no call succeeded for {} ms after the faults healed at {} µs",
            (t - healed) / 1000,
            healed
        )),
        None => violations.push(format!(
            "no call succeeded after the faults healed at {healed} µs"
        )),
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrote(at: Micros, sent: Micros, client: usize, fence: u64) -> Record {
        Record {
            at,
            event: Event::Wrote {
                client,
                key: "k".into(),
                fence,
                admitted: true,
                sent,
            },
        }
    }

    fn resource_violations(records: &[Record]) -> Vec<String> {
        let mut violations = Vec::new();
        resource(records, &mut violations);
        violations
    }

    #[test]
    fn a_lower_fence_sent_after_a_higher_one_was_admitted_is_a_violation() {
        let records = [wrote(10, 10, 1, 5), wrote(20, 15, 2, 4)];
        let found = resource_violations(&records);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("admitted fence 4"), "{found:?}");
        // Recorded in the same step, in that order (the simulation's case).
        assert_eq!(
            resource_violations(&[wrote(10, 10, 1, 5), wrote(10, 10, 2, 4)]).len(),
            1
        );
    }

    #[test]
    fn a_write_recorded_late_may_have_been_admitted_before_the_higher_fence() {
        // Client 1 hands fence 4 to the gate at 5 and is frozen before it
        // records the answer; fence 5 is admitted meanwhile.
        let records = [wrote(10, 8, 2, 5), wrote(30, 5, 1, 4)];
        assert!(resource_violations(&records).is_empty());
    }
}
