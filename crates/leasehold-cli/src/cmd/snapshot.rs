//! `leasehold snapshot save FILE` and `leasehold snapshot status FILE`:
//! backups of a leaseholdd cluster, taken online from the leader.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context};

use super::cluster::{leader, Target};

/// Saves a backup from the leader into `file`: written beside it, synced,
/// checked (its version and checksums, when this build has the server in
/// it, as by default) and renamed into place, its directory synced, so
/// `file` is whole or absent, also after a crash.
pub async fn save(target: &Target, file: &Path) -> anyhow::Result<i32> {
    let leader = leader(target).await?;
    let http = target.http()?;
    let mut call = http.get(format!("{}://{leader}/v1/snapshot", target.scheme()));
    if let Some(token) = &target.token {
        call = call.bearer_auth(token);
    }
    let mut response = call
        .send()
        .await
        .with_context(|| format!("ask {leader} for a backup"))?;
    if !response.status().is_success() {
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let message = body["error"]["message"]
            .as_str()
            .map_or_else(|| body.to_string(), str::to_string);
        bail!("{leader} gave no backup: {message}");
    }
    let index = response
        .headers()
        .get("leasehold-snapshot-index")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    let aside = file.with_extension("partial");
    let mut out =
        std::fs::File::create(&aside).with_context(|| format!("create {}", aside.display()))?;
    let mut bytes = 0u64;
    while let Some(chunk) = response
        .chunk()
        .await
        .with_context(|| format!("read the backup from {leader}"))?
    {
        out.write_all(&chunk)
            .with_context(|| format!("write {}", aside.display()))?;
        bytes += chunk.len() as u64;
    }
    out.sync_all()
        .with_context(|| format!("sync {}", aside.display()))?;
    drop(out);
    let checked = match verify(&aside) {
        Ok(checked) => checked,
        Err(e) => {
            let _ = std::fs::remove_file(&aside);
            bail!("the backup from {leader} is damaged ({e:#}); nothing was saved: try again");
        }
    };
    std::fs::rename(&aside, file).with_context(|| format!("move it to {}", file.display()))?;
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("sync {}", dir.display()))?;
    println!(
        "saved {} ({bytes} bytes) from {leader}: the log up to index {index}{}",
        file.display(),
        if checked {
            "; version and checksums checked"
        } else {
            "; not checked (this build has no server in it: `leasehold snapshot status` of a default build checks it)"
        }
    );
    Ok(0)
}

/// Checks a backup's version and checksums; whether it could.
#[cfg(feature = "embedded-server")]
fn verify(file: &Path) -> anyhow::Result<bool> {
    leasehold_server::raft::operations::backup::backup_status(file).map(|_| true)
}

#[cfg(not(feature = "embedded-server"))]
fn verify(_file: &Path) -> anyhow::Result<bool> {
    Ok(false)
}

/// Prints what a backup holds, checking its version and checksums.
#[cfg(feature = "embedded-server")]
pub fn status(file: &Path, json: bool) -> anyhow::Result<i32> {
    let status = leasehold_server::raft::operations::backup::backup_status(file)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(0);
    }
    println!("{}", file.display());
    println!("  format      snapshot file format {}", status.format);
    println!("  size        {} bytes", status.bytes);
    println!(
        "  log         up to index {} (term {})",
        status.index, status.term
    );
    println!("  voters      {:?}", status.voters);
    println!(
        "  table       {} leases, {} keys held, {} waiting",
        status.leases, status.held, status.waiting
    );
    println!("  next token  {}", status.next_fence);
    println!("  next lease  {}", status.next_lease);
    println!(
        "  checksums   {}",
        if status.format >= 2 {
            "good"
        } else {
            "none (written by 0.1.0); the table decodes"
        }
    );
    Ok(0)
}

#[cfg(not(feature = "embedded-server"))]
pub fn status(_file: &Path, _json: bool) -> anyhow::Result<i32> {
    bail!("this leasehold was built without leaseholdd (the embedded-server feature): build it with default features to read a backup")
}
