//! Long work that resumes instead of restarting.
//!
//! Processes items in batches under a lease. Each batch's output goes to its
//! own file through a fence gate (write-then-rename, so redoing a batch
//! replaces it rather than duplicating it), then the lease saves a checkpoint
//! ("next batch starts at item N"), fenced by its token. Kill it at any
//! moment: the next holder receives the checkpoint on acquire and carries on.
//! Every item ends up processed exactly once.
//!
//! Usage: checkpoint_job ENDPOINT KEY OUT_DIR ITEMS BATCH [MS_PER_ITEM]

use std::time::Duration;

use anyhow::Context;
use leasehold::{Client, LockOptions};
use leasehold_fence::FileGate;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (endpoint, key, out, items, batch, ms) = match &args[1..] {
        [e, k, o, i, b] => (e, k, o, i.parse()?, b.parse()?, 0),
        [e, k, o, i, b, ms] => (e, k, o, i.parse()?, b.parse()?, ms.parse()?),
        _ => anyhow::bail!("usage: checkpoint_job ENDPOINT KEY OUT_DIR ITEMS BATCH [MS_PER_ITEM]"),
    };
    let (items, batch): (u64, u64) = (items, batch);
    let client = Client::connect(endpoint).await?;
    let lease = client
        .acquire(
            key,
            LockOptions::default()
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(60)),
        )
        .await
        .context("acquire")?;
    let mut next: u64 = match lease.checkpoint() {
        Some(bytes) => std::str::from_utf8(bytes)?.parse().context("checkpoint")?,
        None => 0,
    };
    println!(
        "resuming at item {next} with fence {}",
        lease.fence().unwrap_or(0)
    );
    let gate = FileGate::new(out)?;
    while next < items {
        let end = (next + batch).min(items);
        let mut output = String::new();
        for item in next..end {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            output.push_str(&format!("{item} {}\n", item * item));
        }
        let fence = lease.token()?;
        gate.write(&format!("batch-{next:06}"), fence, output.into_bytes())
            .await?;
        lease.save_checkpoint(end.to_string().as_bytes()).await?;
        next = end;
    }
    println!("done");
    lease.release().await?;
    Ok(())
}
