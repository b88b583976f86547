//! `leasehold auth ...`: turning auth on and off, roles, tokens and the
//! audit trail, over the HTTP admin API (`/v1/auth`), at the leader.

use anyhow::bail;
use serde_json::{json, Value};

use super::cluster::{answer, at_leader, Target};

/// Unix milliseconds as an RFC 3339 time (UTC, to the second).
fn when(ms: &Value) -> String {
    let ms = ms.as_u64().unwrap_or(0);
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// 32 random bytes in hex: a new token's secret, chosen here so that the
/// request can be sent again when its answer is lost.
fn new_secret() -> String {
    (0..32)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

/// Sends a request that makes a token until it gets an answer: when none
/// comes back (unreachable, or `unavailable`/`outcome_unknown`), the same
/// request, with the same secret, is sent again, and the server answers a
/// repeat with the token the first one made.
async fn until_answered(
    target: &Target,
    request: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
) -> anyhow::Result<Value> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match at_leader(target, &request).await {
            Ok((503, _)) | Err(_) if attempt < 10 => {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            other => return answer(other?),
        }
    }
}

/// `leasehold auth enable`.
pub async fn enable(target: &Target) -> anyhow::Result<i32> {
    let body = json!({ "secret": new_secret() });
    let created = until_answered(target, |h, a| {
        h.post(format!("{a}/v1/auth/enable")).json(&body)
    })
    .await?;
    let Some(token) = created["token"].as_str() else {
        bail!("the server answered without a token: {created}");
    };
    println!("{token}");
    eprintln!(
        "auth is on. This is the root token (admin on every key, id {}); it is not shown again.\n\
         Use it with --token or LEASEHOLD_TOKEN to create roles and tokens for everyone else.",
        created["id"]
    );
    Ok(0)
}

/// `leasehold auth disable`.
pub async fn disable(target: &Target) -> anyhow::Result<i32> {
    answer(at_leader(target, |h, a| h.post(format!("{a}/v1/auth/disable"))).await?)?;
    println!("auth is off");
    Ok(0)
}

async fn state(target: &Target) -> anyhow::Result<Value> {
    answer(at_leader(target, |h, a| h.get(format!("{a}/v1/auth"))).await?)
}

/// `leasehold auth status`.
pub async fn status(target: &Target, json: bool) -> anyhow::Result<i32> {
    let view = state(target).await?;
    if json {
        let mut view = view;
        if let Some(v) = view.as_object_mut() {
            v.remove("audit");
        }
        println!("{view}");
        return Ok(0);
    }
    println!(
        "auth is {}",
        if view["enabled"] == true { "on" } else { "off" }
    );
    println!("\nROLE             RULES");
    for role in view["roles"].as_array().into_iter().flatten() {
        let rules: Vec<String> = role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{} {}",
                    r["permission"].as_str().unwrap_or("?"),
                    r["prefix"]
                )
            })
            .collect();
        println!(
            "{:<16} {}",
            role["name"].as_str().unwrap_or(""),
            rules.join(", ")
        );
    }
    println!("\n{:<8} {:<20} {:<16} CREATED", "TOKEN", "NAME", "ROLE");
    for t in view["tokens"].as_array().into_iter().flatten() {
        println!(
            "{:<8} {:<20} {:<16} {}",
            t["id"].as_u64().unwrap_or(0),
            t["name"].as_str().unwrap_or(""),
            t["role"].as_str().unwrap_or(""),
            when(&t["created_unix_ms"])
        );
    }
    Ok(0)
}

/// `leasehold auth audit`.
pub async fn audit(target: &Target, json: bool) -> anyhow::Result<i32> {
    let view = state(target).await?;
    for entry in view["audit"].as_array().into_iter().flatten() {
        if json {
            println!("{entry}");
        } else {
            println!(
                "{}  {}  {}",
                when(&entry["at_unix_ms"]),
                entry["who"].as_str().unwrap_or(""),
                entry["what"].as_str().unwrap_or("")
            );
        }
    }
    Ok(0)
}

/// `leasehold auth role set NAME --read P --lock P --admin P --deny P`:
/// `prefixes` by permission, lowest first.
pub async fn set_role(
    target: &Target,
    name: &str,
    prefixes: [Vec<String>; 4],
) -> anyhow::Result<i32> {
    let mut rules = Vec::new();
    for (permission, list) in ["none", "read", "lock", "admin"].iter().zip(prefixes) {
        for prefix in list {
            rules.push(json!({ "prefix": prefix, "permission": permission }));
        }
    }
    if rules.is_empty() {
        bail!("a role needs at least one rule: --read, --lock, --admin or --deny PREFIX");
    }
    let body = json!({ "rules": rules });
    let path = format!("/v1/auth/roles/{}", urlencoding(name));
    answer(at_leader(target, |h, a| h.put(format!("{a}{path}")).json(&body)).await?)?;
    println!("role {name} set");
    Ok(0)
}

/// `leasehold auth role delete NAME`.
pub async fn delete_role(target: &Target, name: &str) -> anyhow::Result<i32> {
    let path = format!("/v1/auth/roles/{}", urlencoding(name));
    answer(at_leader(target, |h, a| h.delete(format!("{a}{path}"))).await?)?;
    println!("role {name} deleted");
    Ok(0)
}

/// `leasehold auth token create --role R [--name N]`.
pub async fn create_token(
    target: &Target,
    role: &str,
    name: Option<&str>,
    json: bool,
) -> anyhow::Result<i32> {
    let body = json!({ "role": role, "name": name.unwrap_or(role), "secret": new_secret() });
    let created = until_answered(target, |h, a| {
        h.post(format!("{a}/v1/auth/tokens")).json(&body)
    })
    .await?;
    if json {
        println!("{created}");
    } else {
        let Some(token) = created["token"].as_str() else {
            bail!("the server answered without a token: {created}");
        };
        println!("{token}");
        eprintln!(
            "token {} for role {role}; it is not shown again",
            created["id"]
        );
    }
    Ok(0)
}

/// `leasehold auth token revoke ID`.
pub async fn revoke_token(target: &Target, id: u64) -> anyhow::Result<i32> {
    answer(at_leader(target, |h, a| h.delete(format!("{a}/v1/auth/tokens/{id}"))).await?)?;
    println!("token {id} revoked");
    Ok(0)
}

/// A path segment, percent-encoded.
fn urlencoding(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
