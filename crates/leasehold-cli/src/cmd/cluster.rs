//! `leasehold cluster status|add|remove`: a leaseholdd cluster's membership,
//! over the HTTP admin API (`/v1/cluster`), at the leader.

use anyhow::{bail, Context};
use leasehold::TlsOptions;
use serde_json::Value;

/// Where leaseholdd is: `--endpoint` and the TLS files for `https://`.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://a,b,c` or `https://a,b,c`.
    pub url: String,
    /// The CA and client certificate, for `https://`.
    pub tls: TlsOptions,
    /// The access token, sent as `Authorization: Bearer`.
    pub token: Option<String>,
}

impl Target {
    /// `http` or `https`.
    pub(super) fn scheme(&self) -> &'static str {
        if self.url.trim_start().starts_with("https://") {
            "https"
        } else {
            "http"
        }
    }

    /// The same deployment, at one of its nodes.
    fn at(&self, addr: &str) -> Target {
        Target {
            url: format!("{}://{addr}", self.scheme()),
            tls: self.tls.clone(),
            token: self.token.clone(),
        }
    }

    /// An HTTP client that trusts the CA and shows the client certificate.
    pub(super) fn http(&self) -> anyhow::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder().use_rustls_tls();
        if let Some(ca) = &self.tls.ca {
            let pem = std::fs::read(ca).with_context(|| format!("read {}", ca.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("{}: not PEM certificates", ca.display()))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &self.tls.identity {
            let mut pem =
                std::fs::read(cert).with_context(|| format!("read {}", cert.display()))?;
            pem.extend(std::fs::read(key).with_context(|| format!("read {}", key.display()))?);
            builder = builder
                .identity(reqwest::Identity::from_pem(&pem).context("client certificate and key")?);
        }
        builder.build().context("HTTP client")
    }
}

/// `host:port` of each endpoint of `--endpoint http://a,b,c` (or https://).
pub(super) fn addrs(endpoint: &str) -> anyhow::Result<Vec<String>> {
    let addrs: Vec<String> = endpoint
        .split(',')
        .map(|p| {
            p.trim()
                .trim_start_matches("http://")
                .trim_start_matches("https://")
                .trim_end_matches('/')
                .to_string()
        })
        .filter(|p| !p.is_empty())
        .collect();
    let leaseholdd = endpoint.starts_with("http://") || endpoint.starts_with("https://");
    if addrs.is_empty() || endpoint.contains("://") && !leaseholdd {
        bail!("cluster commands need leaseholdd endpoints: --endpoint http://HOST:PORT[,HOST:PORT...]");
    }
    Ok(addrs)
}

/// Sends a request to the first endpoint that answers, and on to the leader
/// it names. `request` gets the base URL of a node (`https://host:port`).
pub(super) async fn at_leader(
    target: &Target,
    request: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> anyhow::Result<(u16, Value)> {
    let http = target.http()?;
    let scheme = target.scheme();
    let mut errors = Vec::new();
    let mut targets = addrs(&target.url)?;
    let mut hops = 0;
    while let Some(addr) = targets.first().cloned() {
        targets.remove(0);
        let mut call = request(&http, &format!("{scheme}://{addr}"));
        if let Some(token) = &target.token {
            call = call.bearer_auth(token);
        }
        let response = match call.send().await {
            Ok(r) => r,
            // Every node would refuse the same certificate: say so at once.
            Err(e) => {
                let advice = match leasehold::explain_tls(&e) {
                    Some(advice) => Some(advice),
                    // hyper may report a refused certificate as a closed
                    // connection: a handshake of our own reads the alert.
                    None if scheme == "https" => leasehold::diagnose_tls(&addr, &target.tls).await,
                    None => None,
                };
                match advice {
                    Some(advice) => bail!("leaseholdd at {addr}: {advice}"),
                    None => {
                        errors.push(format!("{addr}: {}", causes(&e)));
                        continue;
                    }
                }
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

/// An error and its causes on one line (reqwest's own text leaves out why).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut at = error.source();
    while let Some(e) = at {
        let cause = e.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        at = e.source();
    }
    text
}

pub(super) fn answer((status, body): (u16, Value)) -> anyhow::Result<Value> {
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
pub(super) async fn leader(target: &Target) -> anyhow::Result<String> {
    let view = answer(at_leader(target, |h, a| h.get(format!("{a}/v1/cluster"))).await?)?;
    match view["leader_addr"].as_str() {
        Some(leader) => Ok(leader.to_string()),
        None => bail!("no node leads now"),
    }
}

/// `leasehold cluster status`.
pub async fn status(target: &Target, json: bool) -> anyhow::Result<i32> {
    // The leader's view: it knows every member's lag.
    let first = answer(at_leader(target, |h, a| h.get(format!("{a}/v1/cluster"))).await?)?;
    let view = match first["leader_addr"].as_str() {
        Some(leader) if first["role"] != "leader" => {
            answer(at_leader(&target.at(leader), |h, a| h.get(format!("{a}/v1/cluster"))).await?)
                .unwrap_or(first)
        }
        _ => first,
    };
    if json {
        println!("{view}");
        return Ok(0);
    }
    let num = |v: &Value| v.as_u64().map_or("-".to_string(), |n| n.to_string());
    let quorum = match view["quorum"].as_bool() {
        Some(false) => " · NO QUORUM: a majority of the voters does not answer",
        _ => "",
    };
    println!(
        "leader {} at {} · term {} · last log index {} · committed {}{quorum}",
        num(&view["leader"]),
        view["leader_addr"].as_str().unwrap_or("-"),
        num(&view["term"]),
        num(&view["last_log_index"]),
        num(&view["commit_index"])
    );
    let rows: Vec<[String; 7]> = view["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let role = if m["id"] == view["leader"] {
                "leader"
            } else if m["voter"] == true {
                "voter"
            } else {
                "learner"
            };
            let reachable = match m["reachable"].as_bool() {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            };
            let heard = match m["last_heard_ms"].as_u64() {
                _ if m["id"] == view["leader"] => "-".to_string(),
                Some(ms) => format!("{} ago", crate::cmd::human_ms(ms)),
                None if m["reachable"] == false => "never".to_string(),
                None => "-".to_string(),
            };
            [
                num(&m["id"]),
                m["addr"].as_str().unwrap_or("").to_string(),
                role.to_string(),
                reachable.to_string(),
                heard,
                num(&m["matched_index"]),
                num(&m["lag"]),
            ]
        })
        .collect();
    let header = [
        "ID",
        "ADDRESS",
        "ROLE",
        "REACHABLE",
        "LAST HEARD",
        "MATCHED",
        "LAG",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 7]| {
        let [id, addr, role, reach, heard, matched, lag] = cells;
        println!(
            "{id:<w0$}  {addr:<w1$}  {role:<w2$}  {reach:<w3$}  {heard:<w4$}  {matched:>w5$}  {lag:>w6$}",
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4],
            w5 = widths[5],
            w6 = widths[6],
        );
    };
    line(header);
    for row in &rows {
        line([
            &row[0], &row[1], &row[2], &row[3], &row[4], &row[5], &row[6],
        ]);
    }
    Ok(0)
}

/// `leasehold cluster add ID ADDR`.
pub async fn add(target: &Target, id: u64, addr: &str) -> anyhow::Result<i32> {
    let body = serde_json::json!({ "id": id, "addr": addr });
    // The cluster must answer first (a TLS mistake is then the one line
    // said), before the wait is explained.
    answer(at_leader(target, |h, a| h.get(format!("{a}/v1/cluster"))).await?)?;
    eprintln!(
        "adding node {id} at {addr}: it joins as a learner, catches up with the leader's log, then votes"
    );
    let adding = at_leader(target, |h, a| {
        h.post(format!("{a}/v1/cluster/members")).json(&body)
    });
    tokio::pin!(adding);
    // Says what it waits for while the leader brings the node up to date.
    let mut every = tokio::time::interval(std::time::Duration::from_secs(2));
    every.tick().await;
    let done = loop {
        tokio::select! {
            done = &mut adding => break done,
            _ = every.tick() => {
                let view = at_leader(target, |h, a| h.get(format!("{a}/v1/cluster"))).await;
                let progress = view.ok().and_then(|(_, v)| {
                    let last = v["last_log_index"].as_u64()?;
                    let member = v["members"].as_array()?.iter().find(|m| m["id"] == id)?.clone();
                    Some(match member["matched_index"].as_u64() {
                        Some(matched) => format!("it has {matched} of {last} log entries"),
                        None => "it has not answered the leader yet (is it started, with --node-id and --peers?)".to_string(),
                    })
                });
                eprintln!(
                    "waiting for node {id} to catch up: {}",
                    progress.unwrap_or_else(|| "the leader has not listed it yet".to_string())
                );
            }
        }
    };
    answer(done?)?;
    println!("node {id} at {addr} caught up and is a voter");
    Ok(0)
}

/// `leasehold cluster remove ID`.
pub async fn remove(target: &Target, id: u64) -> anyhow::Result<i32> {
    answer(
        at_leader(target, |h, a| {
            h.delete(format!("{a}/v1/cluster/members/{id}"))
        })
        .await?,
    )?;
    println!("node {id} removed");
    Ok(0)
}

/// `leasehold cluster transfer-leader [ID]`.
pub async fn transfer_leader(target: &Target, id: Option<u64>) -> anyhow::Result<i32> {
    let body = serde_json::json!({ "to": id });
    let status = answer(
        at_leader(target, |h, a| {
            h.post(format!("{a}/v1/cluster/transfer-leader"))
                .json(&body)
        })
        .await?,
    )?;
    match status["leader"].as_u64() {
        Some(leader) => println!("node {leader} leads (term {})", status["term"]),
        None => println!("leadership handed over"),
    }
    Ok(0)
}
