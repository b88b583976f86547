//! The log's writer task: every write to the log (appends, truncations,
//! purges, the vote) is a [`Job`] queued in the order it was made. The task
//! takes all the jobs waiting when it starts, joins each run of records into
//! one write and one flush (group commit), writes a vote only once the
//! records before it are flushed, and tells each job's caller when it is
//! done. After a failed write it takes no more.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::IOFlushed;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{mpsc, oneshot};

use super::{io_err, segment_name, Span, Spans, QUEUED_WRITES, SEGMENT_BYTES};
use crate::raft::storage::disk::{LogDisk, LogFile};
use crate::raft::TypeConfig;

/// Records to write to the open segment.
#[derive(Default)]
pub(super) struct Records {
    pub bytes: Vec<u8>,
    /// What the records in `bytes` touch.
    pub span: Span,
    /// The highest entry index in `bytes`, if it holds entries.
    pub last_index: Option<u64>,
    /// Segments wholly at or below this index may be deleted after the write.
    pub purge_upto: Option<u64>,
}

impl Records {
    /// Adds `other`'s records after these, to be written in one go.
    fn join(&mut self, other: Records) {
        self.bytes.extend_from_slice(&other.bytes);
        self.span.merge(other.span);
        self.last_index = self.last_index.max(other.last_index);
        self.purge_upto = self.purge_upto.max(other.purge_upto);
    }
}

/// A write for the writer task. Jobs are done in the order they were queued.
pub(super) enum Job {
    /// Records to write and flush.
    Records(Records, Done),
    /// The vote, replaced once every record queued before it is flushed.
    Vote(Vec<u8>, Done),
}

/// Who hears that a job is done.
pub(super) enum Done {
    /// openraft, through an append's callback.
    Flushed(IOFlushed<TypeConfig>),
    /// A caller waiting for it.
    Waiter(oneshot::Sender<io::Result<()>>),
}

impl Done {
    fn tell(self, result: &io::Result<()>) {
        let result = match result {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        match self {
            Done::Flushed(callback) => callback.io_completed(result),
            Done::Waiter(waiter) => {
                let _ = waiter.send(result);
            }
        }
    }
}

/// The writer task: takes every job waiting, writes them in order with one
/// flush for each run of records, and tells each job's waiter.
pub(super) async fn write_jobs<D: LogDisk>(
    writer: Arc<tokio::sync::Mutex<Writer<D>>>,
    mut jobs: mpsc::Receiver<Job>,
) {
    let mut batch = Vec::new();
    while jobs.recv_many(&mut batch, QUEUED_WRITES).await > 0 {
        writer
            .lock()
            .await
            .write_jobs(std::mem::take(&mut batch))
            .await;
    }
}

/// Owns the open segment.
pub(super) struct Writer<D: LogDisk> {
    pub disk: Arc<D>,
    pub file: D::File,
    pub number: u64,
    pub size: u64,
    pub segments: Vec<(u64, u64)>,
    pub spans: Spans,
    pub fsync: Histogram,
    /// Why a write failed, once one has: nothing is written after it.
    pub failed: Option<String>,
    /// The highest entry index written to a segment file.
    pub written: Arc<AtomicU64>,
}

impl<D: LogDisk> Writer<D> {
    /// Does `jobs` in order: runs of records are joined into one write and
    /// flush; a vote is written after the records before it are flushed.
    async fn write_jobs(&mut self, jobs: Vec<Job>) {
        let mut group = Records::default();
        let mut waiting = Vec::new();
        for job in jobs {
            match job {
                Job::Records(records, done) => {
                    group.join(records);
                    waiting.push(done);
                }
                Job::Vote(bytes, done) => {
                    let flushed = self.write(std::mem::take(&mut group)).await;
                    for done in waiting.drain(..) {
                        done.tell(&flushed);
                    }
                    let voted = flushed.and_then(|()| self.disk.write_vote(&bytes));
                    if let Err(e) = &voted {
                        self.fail(e);
                    }
                    done.tell(&voted);
                }
            }
        }
        let flushed = self.write(group).await;
        for done in waiting {
            done.tell(&flushed);
        }
    }

    fn fail(&mut self, e: &io::Error) {
        if self.failed.is_none() {
            // After a failed fsync the kernel may have dropped dirty pages;
            // nothing written after it can be trusted. Stop accepting writes.
            tracing::error!(error = %e, "writing the raft log failed; the log is now read-only");
            self.failed = Some(e.to_string());
        }
    }

    async fn write(&mut self, write: Records) -> io::Result<()> {
        if let Some(why) = &self.failed {
            return Err(io_err(format!(
                "the raft log is read-only after a failed write: {why}"
            )));
        }
        let result = self.write_and_flush(write).await;
        if let Err(e) = &result {
            self.fail(e);
        }
        result
    }

    async fn write_and_flush(&mut self, write: Records) -> io::Result<()> {
        let Records {
            bytes,
            span,
            last_index,
            purge_upto,
        } = write;
        if !bytes.is_empty() {
            self.file.write_at(self.size, &bytes)?;
            let syncing = std::time::Instant::now();
            self.file.sync().await?;
            self.fsync.observe(syncing.elapsed().as_secs_f64());
            self.size += bytes.len() as u64;
            if let (Some(h), Some(last)) = (last_index, self.segments.last_mut()) {
                last.1 = last.1.max(h);
            }
            // The span first: a reader that finds the entries gone from
            // memory (they may leave once `written` passes them) must find
            // the segment that holds them.
            self.spans().entry(self.number).or_default().merge(span);
            if let Some(h) = last_index {
                self.written.fetch_max(h, Ordering::Release);
            }
            if span.truncate_from != u64::MAX {
                // A truncation is the last write of its group (the caller
                // waits for it before writing more): nothing at or after it
                // is written.
                self.written
                    .fetch_min(span.truncate_from.saturating_sub(1), Ordering::Release);
            }
        }
        if let Some(upto) = purge_upto {
            // Delete whole segments that hold nothing above the purge point,
            // never the open one.
            while self.segments.len() > 1 && self.segments[0].1 <= upto {
                let (number, _) = self.segments.remove(0);
                self.disk.remove(&segment_name(number))?;
                self.spans().remove(&number);
            }
        }
        if self.size >= SEGMENT_BYTES {
            let number = self.number + 1;
            self.file = self.disk.create(&segment_name(number), SEGMENT_BYTES)?;
            self.number = number;
            self.size = 0;
            self.segments.push((number, 0));
            self.spans().insert(number, Span::default());
        }
        Ok(())
    }

    fn spans(&self) -> parking_lot::MutexGuard<'_, BTreeMap<u64, Span>> {
        self.spans.lock()
    }
}
