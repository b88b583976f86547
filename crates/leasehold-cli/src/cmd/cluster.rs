//! `leasehold cluster status|add|remove`: a leaseholdd cluster's membership,
//! over the HTTP admin API (`/v1/cluster`), at the leader.

use anyhow::{bail, Context};
use serde_json::Value;

/// `host:port` of each endpoint of `--endpoint http://a,b,c`.
pub(super) fn addrs(endpoint: &str) -> anyhow::Result<Vec<String>> {
    let addrs: Vec<String> = endpoint
        .split(',')
        .map(|p| {
            p.trim()
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string()
        })
        .filter(|p| !p.is_empty())
        .collect();
    if addrs.is_empty() || endpoint.contains("://") && !endpoint.starts_with("http://") {
        bail!("cluster commands need leaseholdd endpoints: --endpoint http://HOST:PORT[,HOST:PORT...]");
    }
    Ok(addrs)
}

/// Sends a request to the first endpoint that answers, and on to the leader
/// it names.
async fn at_leader(
    endpoint: &str,
    request: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> anyhow::Result<(u16, Value)> {
    let http = reqwest::Client::new();
    let mut errors = Vec::new();
    let mut targets = addrs(endpoint)?;
    let mut hops = 0;
    while let Some(addr) = targets.first().cloned() {
        targets.remove(0);
        let response = match request(&http, &addr).send().await {
            Ok(r) => r,
            Err(e) => {
                errors.push(format!("{addr}: {e}"));
                continue;
            }
        };
        let status = response.status().as_u16();
        let body: Value = response
            .json()
            .await
            .with_context(|| format!("read the answer of {addr}"))?;
        if body["error"]["code"] == "not_leader" && hops < 3 {
            if let Some(leader) = body["error"]["leader"].as_str() {
                hops += 1;
                targets.insert(0, leader.to_string());
                continue;
            }
        }
        return Ok((status, body));
    }
    bail!("no endpoint answered: {}", errors.join("; "))
}

fn answer((status, body): (u16, Value)) -> anyhow::Result<Value> {
    if status == 200 {
        return Ok(body);
    }
    let message = body["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| body.to_string());
    bail!("{message}")
}

/// The address of the node that leads (the only node, for a single one).
pub(super) async fn leader(endpoint: &str) -> anyhow::Result<String> {
    let view = answer(at_leader(endpoint, |h, a| h.get(format!("http://{a}/v1/cluster"))).await?)?;
    match view["leader_addr"].as_str() {
        Some(leader) => Ok(leader.to_string()),
        None => bail!("no node leads now"),
    }
}

/// `leasehold cluster status`.
pub async fn status(endpoint: &str, json: bool) -> anyhow::Result<i32> {
    // The leader's view: it knows every member's lag.
    let first = answer(at_leader(endpoint, |h, a| h.get(format!("http://{a}/v1/cluster"))).await?)?;
    let view = match first["leader_addr"].as_str() {
        Some(leader) if first["role"] != "leader" => {
            answer(at_leader(leader, |h, a| h.get(format!("http://{a}/v1/cluster"))).await?)
                .unwrap_or(first)
        }
        _ => first,
    };
    if json {
        println!("{view}");
        return Ok(0);
    }
    println!(
        "leader {} at {} · term {} · last log index {} · committed {}",
        view["leader"],
        view["leader_addr"].as_str().unwrap_or("-"),
        view["term"],
        view["last_log_index"],
        view["commit_index"]
    );
    println!(
        "{:<6} {:<24} {:<8} {:>12} {:>8}",
        "ID", "ADDRESS", "ROLE", "MATCHED", "LAG"
    );
    for m in view["members"].as_array().into_iter().flatten() {
        let role = if m["id"] == view["leader"] {
            "leader"
        } else if m["voter"] == true {
            "voter"
        } else {
            "learner"
        };
        let show = |v: &Value| v.as_u64().map_or("-".to_string(), |n| n.to_string());
        println!(
            "{:<6} {:<24} {:<8} {:>12} {:>8}",
            m["id"],
            m["addr"].as_str().unwrap_or(""),
            role,
            show(&m["matched_index"]),
            show(&m["lag"])
        );
    }
    Ok(0)
}

/// `leasehold cluster add ID ADDR`.
pub async fn add(endpoint: &str, id: u64, addr: &str) -> anyhow::Result<i32> {
    let body = serde_json::json!({ "id": id, "addr": addr });
    answer(
        at_leader(endpoint, |h, a| {
            h.post(format!("http://{a}/v1/cluster/members")).json(&body)
        })
        .await?,
    )?;
    println!("node {id} at {addr} caught up and is a voter");
    Ok(0)
}

/// `leasehold cluster remove ID`.
pub async fn remove(endpoint: &str, id: u64) -> anyhow::Result<i32> {
    answer(
        at_leader(endpoint, |h, a| {
            h.delete(format!("http://{a}/v1/cluster/members/{id}"))
        })
        .await?,
    )?;
    println!("node {id} removed");
    Ok(0)
}
