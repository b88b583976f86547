//! Holds a lock and appends a fenced line to a file every 20 ms, checking the
//! lease right before each write. Used by the pause tests: freeze it with
//! SIGSTOP past its TTL, let another holder in, resume it, and see that it
//! stops before writing again.
//!
//! Usage: fenced_writer ENDPOINT KEY TTL_MS OUT_FILE

use std::io::Write;
use std::time::Duration;

use leasehold::{Client, LockOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, endpoint, key, ttl_ms, out] = &args[..] else {
        anyhow::bail!("usage: fenced_writer ENDPOINT KEY TTL_MS OUT_FILE");
    };
    let client = Client::connect(endpoint).await?;
    let ttl = Duration::from_millis(ttl_ms.parse()?);
    let lease = client
        .try_acquire(key, LockOptions::default().ttl(ttl))
        .await?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    println!("acquired {}", lease.fence().unwrap_or(0));
    // The work runs on a plain thread, as blocking work does: after a pause it
    // resumes straight into its next write, racing the renewal task. The
    // synchronous check in `token()` is what stops it.
    let handle = lease.handle();
    let worker = std::thread::spawn(move || -> std::io::Result<()> {
        loop {
            match handle.token() {
                Ok(fence) => {
                    writeln!(file, "A {fence}")?;
                    file.flush()?;
                }
                Err(e) => {
                    writeln!(file, "A lost: {e}")?;
                    println!("lost: {e}");
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    tokio::task::spawn_blocking(move || worker.join())
        .await?
        .map_err(|_| anyhow::anyhow!("worker panicked"))??;
    std::process::exit(76);
}
