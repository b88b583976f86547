//! Which cluster a node belongs to, so a node of another cluster (a member
//! of the cluster a restore replaced, most of all) cannot join this one.
//!
//! A cluster's id is a random 64-bit number in each member's data dir (the
//! file `cluster`, one line `cluster 0123456789abcdef`). The node that forms
//! a new group makes it; a restore or `--force-new-cluster` makes a new one
//! for the cluster it builds (every member restored from one backup file
//! gets the same id, from the file's checksum). Every Raft call between
//! peers carries the caller's id in the gRPC metadata `leasehold-cluster`,
//! and the node called checks it:
//!
//! | this node | the caller | answer |
//! |---|---|---|
//! | id A | id A | served |
//! | id A | id B, or none | refused: another cluster, or a build that sends none |
//! | none, data dir empty when it started | id B | B is adopted (written to the data dir), served |
//! | none, data dir held a group | id B | refused: it belongs to a cluster without an id |
//! | none | none | served (a cluster formed by 0.2.0, upgraded in place) |
//!
//! A cluster formed by release 0.2.0 has no id and gets none: the check
//! starts with clusters formed, restored or recovered by a later build.
//! Probes and membership questions, which a node asks before it belongs to
//! any group, are not checked.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// The gRPC metadata key that carries the caller's cluster id.
pub const METADATA_KEY: &str = "leasehold-cluster";

/// The file in a data dir that holds its cluster id.
pub const FILE: &str = "cluster";

/// A node's cluster id, as loaded from its data dir; none in memory only
/// (a simulation's nodes) or in a cluster formed by 0.2.0.
#[derive(Debug, Default)]
pub struct ClusterId {
    id: Mutex<Option<u64>>,
    /// Where it is kept; `None`: never written (a simulation).
    file: Mutex<Option<PathBuf>>,
    /// Whether this node may take the id of the first caller that names
    /// one: it started with an empty data dir and has none yet.
    may_adopt: AtomicBool,
    /// When a refusal was last logged (a refused peer retries every
    /// heartbeat: one line in ten seconds is enough).
    warned: Mutex<Option<std::time::Instant>>,
}

impl ClusterId {
    /// Loads the id kept in the data dir `dir`, if there is one, and keeps
    /// it there from now on. Fails, naming the file, on one it cannot read.
    pub fn load(&self, dir: &Path) -> io::Result<()> {
        let path = dir.join(FILE);
        let id = read(&path)?;
        *self.file.lock() = Some(path);
        *self.id.lock() = id;
        Ok(())
    }

    /// The id, if this node has one.
    pub fn get(&self) -> Option<u64> {
        *self.id.lock()
    }

    /// Lets this node adopt the first id a caller names (it holds no group).
    pub fn adopt_from_first_caller(&self) {
        if self.get().is_none() {
            self.may_adopt.store(true, Ordering::SeqCst);
        }
    }

    /// Makes a new random id for a group this node forms, unless it has one.
    pub fn make_for_new_group(&self) -> io::Result<()> {
        if self.get().is_some() {
            return Ok(());
        }
        self.set(rand::random())
    }

    fn set(&self, id: u64) -> io::Result<()> {
        if let Some(path) = self.file.lock().as_ref() {
            write(path, id)?;
        }
        *self.id.lock() = Some(id);
        self.may_adopt.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Whether a Raft call from a caller of cluster `theirs` may be served
    /// (see the table in the module doc); adopts `theirs` where the table
    /// says so. The error is one line for the caller and this node's log.
    pub fn check(&self, theirs: Option<u64>) -> Result<(), String> {
        let checked = self.judge(theirs);
        if let Err(why) = &checked {
            let mut warned = self.warned.lock();
            let now = std::time::Instant::now();
            if warned.is_none_or(|at| now.duration_since(at).as_secs() >= 10) {
                *warned = Some(now);
                tracing::warn!("refused a raft call: {why}");
            }
        }
        checked
    }

    fn judge(&self, theirs: Option<u64>) -> Result<(), String> {
        let mine = self.get();
        match (mine, theirs) {
            (Some(mine), Some(theirs)) if mine == theirs => Ok(()),
            (Some(mine), Some(theirs)) => Err(format!(
                "this node belongs to cluster {mine:016x} and the caller to cluster {theirs:016x}: \
                 a node of another cluster (a member of a cluster that a restore replaced?) may \
                 not join; wipe its data dir before it joins this one"
            )),
            (Some(mine), None) => Err(format!(
                "this node belongs to cluster {mine:016x} and the caller names none (a member \
                 of a cluster formed by 0.2.0, or that build): upgrade it, or wipe its data dir \
                 before it joins this one"
            )),
            (None, Some(theirs)) if self.may_adopt.load(Ordering::SeqCst) => {
                self.set(theirs).map_err(|e| {
                    format!("this node could not keep the cluster id {theirs:016x}: {e}")
                })?;
                tracing::info!(cluster = %format!("{theirs:016x}"), "joined the cluster");
                Ok(())
            }
            (None, Some(theirs)) => Err(format!(
                "this node holds a group without a cluster id (formed by 0.2.0) and the caller \
                 belongs to cluster {theirs:016x}: a node of another cluster may not join; wipe \
                 its data dir before it joins"
            )),
            (None, None) => Ok(()),
        }
    }
}

/// Writes the cluster id `id` into the data dir `dir` (a restore's new
/// cluster).
pub fn write_into(dir: &Path, id: u64) -> io::Result<()> {
    write(&dir.join(FILE), id)
}

fn write(path: &Path, id: u64) -> io::Result<()> {
    super::disk::write_atomically(path, &[format!("cluster {id:016x}\n").as_bytes()])
}

/// The id in `path`; `None` if there is no such file.
pub fn read(path: &Path) -> io::Result<Option<u64>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("read {}: {e}", path.display()),
            ))
        }
    };
    text.trim()
        .strip_prefix("cluster ")
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .map(Some)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds {:?}, not `cluster` and 16 hex digits: restore it from a \
                     member of the same cluster",
                    path.display(),
                    text.trim()
                ),
            )
        })
}

/// The id in a caller's metadata value; `None` if it sent none or one that
/// is not hex (refused as "names none" where an id is needed).
pub fn parse(value: Option<&str>) -> Option<u64> {
    value.and_then(|v| u64::from_str_radix(v, 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pair_of_ids_is_served_or_refused_as_the_table_says() {
        let a = ClusterId::default();
        assert!(a.check(None).is_ok(), "no ids on either side");
        let err = a.check(Some(7)).unwrap_err();
        assert!(err.contains("without a cluster id"), "{err}");

        a.adopt_from_first_caller();
        a.check(Some(7)).expect("adopted");
        assert_eq!(a.get(), Some(7));
        a.check(Some(7)).expect("its own cluster");
        let err = a.check(Some(8)).unwrap_err();
        assert!(
            err.contains("0000000000000007") && err.contains("0000000000000008"),
            "{err}"
        );
        assert!(a.check(None).unwrap_err().contains("names none"));
        assert_eq!(a.get(), Some(7), "a refusal changes nothing");
    }

    #[test]
    fn the_id_is_kept_in_the_data_dir_and_a_bad_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = ClusterId::default();
        a.load(dir.path()).unwrap();
        assert_eq!(a.get(), None);
        a.make_for_new_group().unwrap();
        let made = a.get().expect("an id");
        let b = ClusterId::default();
        b.load(dir.path()).unwrap();
        assert_eq!(b.get(), Some(made));
        // A second group is not made over the first.
        b.make_for_new_group().unwrap();
        assert_eq!(b.get(), Some(made));

        std::fs::write(dir.path().join(FILE), "cluster xyz\n").unwrap();
        let err = ClusterId::default().load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("16 hex digits"), "{err}");
    }
}
