//! `leaseholdd check`: verifies a data dir offline, changing nothing.
//!
//! It reads what a start would read, and more strictly: the format file,
//! the vote, the snapshot (its meta's and its table's checksums, and the
//! table decoded), and every record of every log segment (a damaged one
//! named by segment and byte). Then it checks that the log and the
//! snapshot join up: every entry after the snapshot is in the log.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use crate::raft::storage::format::{read_dir_format, DATA_FORMAT};
use crate::raft::storage::log_store::records::{replay_records, Record, Tail};
use crate::raft::storage::snapshot_store::{FileSnapshots, SnapshotStore};
use crate::raft::Vote;

/// What a check found: a line per part, and the problems.
#[derive(Debug, Default)]
pub struct CheckReport {
    /// What each part holds, in order.
    pub lines: Vec<String>,
    /// What is wrong, each naming the file (and the byte, where known).
    pub problems: Vec<String>,
}

impl CheckReport {
    fn line(&mut self, text: String) {
        self.lines.push(text);
    }

    fn problem(&mut self, text: String) {
        self.problems.push(text);
    }
}

/// Checks the data dir `dir` without changing anything in it.
pub fn check_data_dir(dir: &Path) -> CheckReport {
    let mut report = CheckReport::default();
    if !dir.is_dir() {
        report.problem(format!("{} is not a directory", dir.display()));
        return report;
    }
    match read_dir_format(dir) {
        Ok(None) => report.line("format: an empty data dir".into()),
        Ok(Some(found)) if found.format > DATA_FORMAT => report.problem(format!(
            "{}: data dir format {}, newer than this build reads ({DATA_FORMAT}): check it \
             with the release that wrote it",
            dir.join("format").display(),
            found.format
        )),
        Ok(Some(found)) => report.line(format!(
            "format: data dir format {} (written by leaseholdd {})",
            found.format,
            found
                .written_by
                .as_deref()
                .unwrap_or("0.1.0, without a format file")
        )),
        Err(e) => report.problem(e.to_string()),
    }
    match crate::raft::storage::cluster_id::read(&dir.join(crate::raft::storage::cluster_id::FILE))
    {
        Ok(Some(id)) => report.line(format!("cluster: {id:016x}")),
        Ok(None) => report.line("cluster: no id (a cluster formed by 0.2.0, or none yet)".into()),
        Err(e) => report.problem(e.to_string()),
    }
    check_vote(dir, &mut report);
    let snapshot_index = check_snapshot(dir, &mut report);
    let log = check_log(dir, &mut report);
    if let Some(log) = log {
        join_up(snapshot_index, &log, &mut report);
    }
    report
}

fn check_vote(dir: &Path, report: &mut CheckReport) {
    let path = dir.join("vote");
    match fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice::<Vote>(&bytes) {
            Ok(vote) => report.line(format!(
                "vote: term {} for node {}{}",
                vote.leader_id.term,
                vote.leader_id.node_id,
                if vote.committed { ", elected" } else { "" }
            )),
            Err(e) => report.problem(format!("{}: not a vote: {e}", path.display())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => report.line("vote: none".into()),
        Err(e) => report.problem(format!("{}: {e}", path.display())),
    }
}

/// The last log index the snapshot covers (0 without one).
fn check_snapshot(dir: &Path, report: &mut CheckReport) -> Option<u64> {
    let snapshots = FileSnapshots::in_dir(dir);
    let checked = match snapshots.file_format() {
        Ok(Some(1)) => "written by 0.1.0, without checksums; its table decodes",
        _ => "checksums and table good",
    };
    match snapshots.load() {
        Ok(None) => {
            report.line("snapshot: none".into());
            Some(0)
        }
        Ok(Some((meta, table))) => {
            let index = meta.last_log_id.as_ref().map_or(0, |l| l.index);
            let term = meta.last_log_id.as_ref().map_or(0, |l| l.leader_id.term);
            report.line(format!(
                "snapshot: up to log index {index} (term {term}); {} leases, {} keys held, {} \
                 waiting, next fencing token {}; {checked}",
                table.lease_count(),
                table.held_count(),
                table.waiter_count(),
                table.next_fence()
            ));
            Some(index)
        }
        Err(e) => {
            report.problem(e.to_string());
            None
        }
    }
}

/// What the log's segments hold once replayed.
struct LogContents {
    /// Indexes of the entries left after truncations and purges.
    entries: BTreeSet<u64>,
    /// The highest purge (entries up to it are in a snapshot).
    purged: u64,
}

fn check_log(dir: &Path, report: &mut CheckReport) -> Option<LogContents> {
    let log_dir = dir.join("log");
    let names = match fs::read_dir(&log_dir) {
        Ok(list) => {
            let mut numbers: Vec<(u64, String)> = list
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter_map(|name| Some((name.strip_suffix(".seg")?.parse().ok()?, name)))
                .collect();
            numbers.sort();
            numbers
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            report.line("log: none".into());
            return Some(LogContents {
                entries: BTreeSet::new(),
                purged: 0,
            });
        }
        Err(e) => {
            report.problem(format!("{}: {e}", log_dir.display()));
            return None;
        }
    };
    let mut contents = LogContents {
        entries: BTreeSet::new(),
        purged: 0,
    };
    let mut record_bytes = 0u64;
    let mut intact = true;
    for (i, (_, name)) in names.iter().enumerate() {
        let path = log_dir.join(name);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                report.problem(format!("{}: {e}", path.display()));
                intact = false;
                continue;
            }
        };
        let is_last = i + 1 == names.len();
        let replayed = replay_records(name, &bytes, is_last, Tail::Strict, |record| match record {
            Record::Entry(entry) => {
                contents.entries.insert(entry.log_id.index);
            }
            Record::Truncate(since) => {
                contents.entries.split_off(&since);
            }
            Record::Purge(log_id) => {
                contents.entries = contents.entries.split_off(&(log_id.index + 1));
                contents.purged = contents.purged.max(log_id.index);
            }
        });
        match replayed {
            Ok(end) => {
                record_bytes += end;
                let end = end as usize;
                if bytes[end..].iter().any(|&b| b != 0) {
                    report.line(format!(
                        "log: a torn write at byte {end} of {name}, never acknowledged: it is \
                         cut at the next start"
                    ));
                }
            }
            Err(e) => {
                report.problem(format!("{}: {e}", log_dir.display()));
                intact = false;
            }
        }
    }
    let range = match (contents.entries.first(), contents.entries.last()) {
        (Some(first), Some(last)) => format!("entries {first}..={last}"),
        _ => "no entries".into(),
    };
    report.line(format!(
        "log: {} segment(s), {range}, {record_bytes} bytes of records{}",
        names.len(),
        if contents.purged > 0 {
            format!(", purged up to {}", contents.purged)
        } else {
            String::new()
        }
    ));
    intact.then_some(contents)
}

/// Checks that every entry after the snapshot is in the log, without holes.
fn join_up(snapshot_index: Option<u64>, log: &LogContents, report: &mut CheckReport) {
    if let Some(snapshot) = snapshot_index.filter(|&s| log.purged > s) {
        report.problem(format!(
            "log: purged up to {} but the snapshot covers only up to {snapshot}",
            log.purged
        ));
    }
    let (Some(&first), Some(&last)) = (log.entries.first(), log.entries.last()) else {
        return;
    };
    let held = log.entries.len() as u64;
    if last - first + 1 != held {
        report.problem(format!(
            "log: entries {first}..={last} have {} missing in between",
            last - first + 1 - held
        ));
    }
    if let Some(snapshot) = snapshot_index.filter(|&s| first > s + 1) {
        report.problem(format!(
            "log: entries {}..={} are in neither the snapshot (up to {snapshot}) nor the log",
            snapshot + 1,
            first - 1
        ));
    }
}
