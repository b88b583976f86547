//! `leasehold run` and `leasehold elect`: run a command while holding a lock.
//!
//! The command must not outlive its lease:
//! - it runs in its own process group, and every signal (the ones passed on,
//!   SIGTERM on loss, SIGKILL after the grace) goes to the whole group;
//! - on Linux it gets SIGKILL the moment `leasehold run` dies, however it
//!   dies (`kill -9` included): a parent-death signal set before exec;
//! - it can check its lease before each write with `leasehold check`, which
//!   fails once the lease is past its client-side deadline even if
//!   `leasehold run` is frozen (see [`super::check`]).

use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context;
use leasehold::{Client, Error, Lease, LockOptions};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use super::check::{StateFile, REFRESH};
use crate::{EXIT_LOST, EXIT_NOT_ACQUIRED};

pub struct Options {
    pub ttl: Duration,
    pub wait: Option<Duration>,
    pub grace: Duration,
    pub lock_delay: Duration,
    pub mode: leasehold::Mode,
    /// Once granted, save this as the key's checkpoint (an election's value,
    /// which `leasehold leader` shows).
    pub proclaim: Option<String>,
    /// Keep waiting for the lock however long it takes (elections).
    pub forever: bool,
}

/// Takes the lock as the options say; `Ok(None)` when someone else has it.
async fn take(client: &Client, key: &str, o: &Options) -> anyhow::Result<Option<Lease>> {
    let mut opts = LockOptions::default().ttl(o.ttl).lock_delay(o.lock_delay);
    opts.mode = o.mode;
    loop {
        let result = match (o.forever, o.wait) {
            (true, _) => {
                client
                    .acquire(key, opts.clone().wait(Duration::from_secs(60)))
                    .await
            }
            (false, Some(wait)) if !wait.is_zero() => {
                client.acquire(key, opts.clone().wait(wait)).await
            }
            _ => client.try_acquire(key, opts.clone()).await,
        };
        match result {
            Ok(lease) => {
                if let Some(value) = &o.proclaim {
                    lease
                        .save_checkpoint(value.as_bytes())
                        .await
                        .with_context(|| format!("proclaim {value:?} as the leader of {key}"))?;
                }
                return Ok(Some(lease));
            }
            Err(Error::Timeout { .. }) if o.forever => continue,
            Err(Error::Held { holder, fence, .. }) => {
                let fence = fence
                    .map(|f| format!(" with fence {f}"))
                    .unwrap_or_default();
                eprintln!("leasehold: {key} is held by {holder}{fence}");
                return Ok(None);
            }
            Err(e @ Error::LockDelayed { .. }) => {
                eprintln!("leasehold: {e}");
                return Ok(None);
            }
            Err(Error::Timeout { .. }) => {
                let holder = client
                    .status(key)
                    .await
                    .ok()
                    .and_then(|l| l.into_iter().find(|l| l.key == key))
                    .map(|l| format!(" (held by {})", l.holder))
                    .unwrap_or_default();
                eprintln!("leasehold: timed out waiting for {key}{holder}");
                return Ok(None);
            }
            Err(e) => return Err(e).with_context(|| format!("acquire {key}")),
        }
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Sends `sig` to the child's process group (the child leads it).
fn send(child: &Child, sig: i32) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on the process group our own child leads.
        unsafe {
            libc::kill(-(pid as i32), sig);
        }
    }
}

/// Why the command did not start.
enum Spawn {
    /// The system refused to run it (no such program, not executable).
    NotStarted {
        program: String,
        error: std::io::Error,
    },
    /// Anything else.
    Other(anyhow::Error),
}

/// Starts the command in its own process group, to die with this process.
fn spawn(command: &[String], key: &str, fence: &str, state: &StateFile) -> Result<Child, Spawn> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Spawn::Other(anyhow::anyhow!("no command given")))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LEASEHOLD_KEY", key)
        .env("LEASEHOLD_FENCE", fence)
        .env("LEASEHOLD_STATE", state.path());
    // SAFETY: getpid is async-signal-safe and called before the fork.
    let supervisor = unsafe { libc::getpid() };
    // SAFETY: between fork and exec the closure calls only async-signal-safe
    // functions (setpgid, prctl, getppid, _exit) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The supervisor may have died before the signal was armed.
                if libc::getppid() != supervisor {
                    libc::_exit(EXIT_LOST);
                }
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(|error| Spawn::NotStarted {
        program: program.clone(),
        error,
    })
}

/// Stops the child's group: SIGTERM, then SIGKILL after `grace`.
async fn stop(child: &mut Child, grace: Duration) {
    send(child, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        send(child, libc::SIGKILL);
        let _ = child.wait().await;
    }
}

/// Exit code of a command that could not be started at all, as `env` and
/// `timeout` report it: 127 when there is no such program, 126 when it
/// cannot be run.
fn not_started(e: &std::io::Error) -> i32 {
    match e.kind() {
        std::io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// Every signal passed on to the command, from now on; `None` once none
/// can arrive any more.
fn passed_on() -> anyhow::Result<tokio::sync::mpsc::UnboundedReceiver<i32>> {
    let (sig_tx, sig_rx) = tokio::sync::mpsc::unbounded_channel();
    for kind in [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
        SignalKind::quit(),
    ] {
        let mut stream = signal(kind).context("listen for signals")?;
        let tx = sig_tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(kind.as_raw_value()).is_err() {
                    return;
                }
            }
        });
    }
    Ok(sig_rx)
}

/// Runs `command` while holding `key`; the caller ends the client's
/// session leases afterwards, on every path (see `cmd::using`).
pub async fn run(
    client: &Client,
    key: &str,
    o: Options,
    command: &[String],
) -> anyhow::Result<i32> {
    // Listening from the start: a signal while waiting for the lock ends
    // the wait (and, by the caller, the session) instead of the process.
    let mut sig_rx = passed_on()?;
    let taken = tokio::select! {
        taken = take(client, key, &o) => taken?,
        Some(sig) = sig_rx.recv() => return Ok(super::exit_by_signal(sig)),
    };
    let Some(lease) = taken else {
        return Ok(EXIT_NOT_ACQUIRED);
    };
    let fence = lease.fence().map(|f| f.to_string()).unwrap_or_default();
    let state = StateFile::create()?;
    let token = lease.fence().unwrap_or(0);
    state.live(token, lease.deadline())?;
    let mut child = match spawn(command, key, &fence, &state) {
        Ok(child) => child,
        Err(Spawn::NotStarted { program, error }) => {
            eprintln!("leasehold: cannot run {program}: {error}");
            if let Err(e) = lease.release().await {
                eprintln!("leasehold: releasing {key}: {e}");
            }
            return Ok(not_started(&error));
        }
        Err(Spawn::Other(e)) => return Err(e),
    };
    let mut refresh = tokio::time::interval(REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut written = lease.deadline();

    let lost = lease.lost();
    tokio::pin!(lost);
    let ended = super::hold::ended_elsewhere(client, key, token);
    tokio::pin!(ended);
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.context("wait for the command")?;
                if let Err(e) = lease.release().await {
                    eprintln!("leasehold: releasing {key}: {e}");
                }
                return Ok(exit_code(status));
            }
            _ = &mut lost => {
                let _ = state.lost(token);
                eprintln!("leasehold: lease on {key} lost ({}); stopping the command", lease.lost_reason());
                stop(&mut child, o.grace).await;
                return Ok(EXIT_LOST);
            }
            why = &mut ended, if lease.fence().is_some() => {
                let _ = state.lost(token);
                eprintln!("leasehold: {why}; stopping the command");
                stop(&mut child, o.grace).await;
                drop(lease);
                return Ok(EXIT_LOST);
            }
            _ = refresh.tick() => {
                let deadline = lease.deadline();
                if deadline != written && lease.is_live() {
                    if let Err(e) = state.live(token, deadline) {
                        eprintln!("leasehold: {e:#}");
                    }
                    written = deadline;
                }
            }
            Some(sig) = sig_rx.recv() => send(&child, sig),
        }
    }
}
