//! `leasehold status` and `leasehold watch`.

use anyhow::Context;
use futures::StreamExt;
use leasehold::Client;
use serde_json::json;

/// `leasehold status`: the keys held or waited for (with `all`, free
/// keys too, as the dashboard's "show free keys" does).
pub async fn status(
    client: &Client,
    prefix: &str,
    as_json: bool,
    all: bool,
) -> anyhow::Result<i32> {
    let mut locks = client.status(prefix).await.context("list locks")?;
    if !all {
        locks.retain(|l| !l.holders.is_empty() || l.waiters > 0);
    }
    // A lock set is several keys held with one token.
    let mut by_fence = std::collections::HashMap::new();
    for fence in locks.iter().filter_map(|l| l.fence) {
        *by_fence.entry(fence).or_insert(0usize) += 1;
    }
    let in_set = |l: &leasehold::LockStatus| l.fence.is_some_and(|f| by_fence[&f] > 1);
    if as_json {
        let rows: Vec<_> = locks
            .iter()
            .map(|l| {
                let holders: Vec<_> = l
                    .holders
                    .iter()
                    .map(|(holder, fence)| json!({"holder": holder, "fence": fence}))
                    .collect();
                json!({"key": l.key, "holder": l.holder, "fence": l.fence, "lease": l.lease, "ttl_left_ms": l.ttl_left_ms,
                       "waiters": l.waiters, "holders": holders, "permits": l.permits,
                       "shared": l.shared, "set": in_set(l)})
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(0);
    }
    if locks.is_empty() {
        println!("no locks held");
        return Ok(0);
    }
    let key_width = locks.iter().map(|l| l.key.len()).max().unwrap_or(0).max(3);
    let holder_width = locks
        .iter()
        .map(|l| l.holder.len())
        .max()
        .unwrap_or(0)
        .max(6);
    println!(
        "{:key_width$}  {:holder_width$}  {:>8}  {:>9}  {:>7}  {:>9}",
        "KEY", "HOLDER", "FENCE", "TTL LEFT", "WAITERS", "HOLDS"
    );
    for l in &locks {
        let fence = l.fence.map_or_else(|| "-".to_string(), |f| f.to_string());
        let ttl = if l.fence.is_some() {
            super::human_ms(l.ttl_left_ms)
        } else {
            "-".to_string()
        };
        let holder = if l.fence.is_some() {
            l.holder.as_str()
        } else {
            "(free)"
        };
        // Readers and semaphores have several holders: the first is shown,
        // with how many hold (of how many permits); a set's keys say so.
        let holds = match (l.holders.len(), l.permits) {
            (n, 0) if l.shared => format!("{n} read"),
            (_, 0) if in_set(l) => "set".to_string(),
            (n, 0) => n.to_string(),
            (n, permits) => format!("{n}/{permits}"),
        };
        println!(
            "{:key_width$}  {holder:holder_width$}  {fence:>8}  {ttl:>9}  {:>7}  {holds:>9}",
            l.key, l.waiters
        );
    }
    Ok(0)
}

/// `leasehold leader NAME [--watch]`: the leader's value and token, then
/// (with --watch) each change.
pub async fn leader(
    client: &Client,
    name: &str,
    watch: bool,
    as_json: bool,
) -> anyhow::Result<i32> {
    let election = client.election(name);
    let print = |leader: Option<leasehold::Leader>| match (leader, as_json) {
        (Some(l), true) => println!(
            "{}",
            json!({"name": name, "value": String::from_utf8_lossy(&l.value), "fence": l.fence, "holder": l.holder})
        ),
        (None, true) => println!("{}", json!({"name": name, "value": null})),
        (Some(l), false) => println!("{}  fence={}", String::from_utf8_lossy(&l.value), l.fence),
        (None, false) => println!("(none)"),
    };
    if !watch {
        let leader = election.leader().await.context("read the leader")?;
        let found = leader.is_some();
        print(leader);
        return Ok(if found { 0 } else { 1 });
    }
    let mut changes = election.observe().await.context("observe")?;
    while let Some(change) = changes.next().await {
        print(change.context("observe")?);
    }
    Ok(0)
}

pub async fn watch(
    client: &Client,
    prefix: &str,
    as_json: bool,
    after: Option<(u64, u32)>,
) -> anyhow::Result<i32> {
    let mut events = match after {
        Some((index, seq)) => client.watch_after(prefix, index, seq).await,
        None => client.watch(prefix).await,
    }
    .context("watch")?;
    while let Some(event) = events.next().await {
        let e = event.context("watch stream")?;
        if as_json {
            println!(
                "{}",
                json!({"kind": e.kind, "key": e.key, "fence": e.fence, "holder": e.holder, "index": e.index, "seq": e.seq})
            );
        } else {
            println!(
                "{:<8}  {}  fence={}  holder={}",
                e.kind, e.key, e.fence, e.holder
            );
        }
    }
    Ok(0)
}
