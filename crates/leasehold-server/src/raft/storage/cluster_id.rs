//! Which cluster a node belongs to, so a node of another cluster (a member
//! of the cluster a restore replaced, most of all) cannot join this one.
//!
//! A cluster's id is a random 64-bit number in each member's data dir (the
//! file `cluster`, one line `cluster 0123456789abcdef`). The node that forms
//! a new group makes it; a restore or `--force-new-cluster` makes a new one
//! for the cluster it builds (every member restored from one backup file
//! with the same `--peers` and fence floor gets the same id: a hash of the
//! backup's last log id, the new sequences and the members). Every Raft call between
//! peers carries the caller's id in the gRPC metadata `leasehold-cluster`,
//! and the node called checks it:
//!
//! | this node | the caller | answer |
//! |---|---|---|
//! | id A | id A | served |
//! | id A, data dir held a group or it joined one since | id B, or none | refused: another cluster, or a build that sends none |
//! | none, in no group when it started (no entry, no snapshot; a vote at most) | id B, sending appends (heartbeats too) or a snapshot | B is adopted (written to the data dir), served |
//! | none, in no group when it started | id B, a vote | served, nothing adopted (the group is forming) |
//! | id A, in no group when it started | id B | as for none: A binds nothing (see below) |
//! | none, data dir held a group | id B | refused: it belongs to a cluster without an id |
//! | none | none | served (a cluster formed by 0.2.0, upgraded in place) |
//!
//! An id in the data dir of a node that holds no entry and no snapshot came
//! with none of its group's data: the node made it for a group it stopped
//! before forming (killed between keeping the id and `initialize`), or took
//! it from a leader whose entries it never kept. It is replaced by the id
//! of the first leader that sends it an append, or by a new one if this
//! node forms the group; kept, it would refuse the group that formed
//! without it until its data dir was wiped. Either way it binds from then
//! on, as does A once a leader of cluster A has sent an append.
//!
//! A cluster formed by release 0.2.0 has no id and gets none: the check
//! starts with clusters formed, restored or recovered by a later build.
//! Probes and membership questions, which a node asks before it belongs to
//! any group, are not checked.

use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// The gRPC metadata key that carries the caller's cluster id.
pub const METADATA_KEY: &str = "leasehold-cluster";

/// The file in a data dir that holds its cluster id.
pub const FILE: &str = "cluster";

/// A node's cluster id, as loaded from its data dir; none in memory only
/// (a simulation's nodes) or in a cluster formed by 0.2.0.
#[derive(Debug, Default)]
pub struct ClusterId {
    /// The id, and whether it may still be adopted; one lock, so two
    /// callers cannot both adopt theirs.
    state: Mutex<State>,
    /// Where it is kept; `None`: never written (a simulation).
    file: Mutex<Option<PathBuf>>,
    /// When a refusal was last logged (a refused peer retries every
    /// heartbeat: one line in ten seconds is enough).
    warned: Mutex<Option<std::time::Instant>>,
}

#[derive(Debug, Default)]
struct State {
    id: Option<u64>,
    /// Whether this node may take the id of the first leader that names
    /// one: it started in no group and has none yet.
    may_adopt: bool,
}

impl ClusterId {
    /// Loads the id kept in the data dir `dir`, if there is one, and keeps
    /// it there from now on. Fails, naming the file, on one it cannot read.
    pub fn load(&self, dir: &Path) -> io::Result<()> {
        let path = dir.join(FILE);
        let id = read(&path)?;
        *self.file.lock() = Some(path);
        self.state.lock().id = id;
        Ok(())
    }

    /// The id, if this node has one.
    pub fn get(&self) -> Option<u64> {
        self.state.lock().id
    }

    /// Lets this node adopt the id of the first leader that sends it
    /// entries or a snapshot naming one: it holds no group's data, so an id
    /// it kept binds nothing (see the module doc).
    pub fn adopt_from_first_leader(&self) {
        self.state.lock().may_adopt = true;
    }

    /// Makes a new random id for a group this node forms, unless it has one
    /// that binds it; the id made, if it made one.
    pub fn make_for_new_group(&self) -> io::Result<Option<u64>> {
        let mut state = self.state.lock();
        if state.id.is_some() && !state.may_adopt {
            return Ok(None);
        }
        let id = rand::random();
        self.keep(&mut state, id)?;
        Ok(Some(id))
    }

    /// Takes back `made`, the id [`ClusterId::make_for_new_group`] made for
    /// a group openraft then refused to form (this node had meanwhile voted
    /// in another's election): the first leader's id is adopted instead.
    pub fn unmake(&self, made: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.id != Some(made) {
            return Ok(());
        }
        if let Some(path) = self.file.lock().as_ref() {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        state.id = None;
        state.may_adopt = true;
        Ok(())
    }

    /// Takes `id` as this node's, written to the data dir first.
    fn keep(&self, state: &mut State, id: u64) -> io::Result<()> {
        if let Some(path) = self.file.lock().as_ref() {
            write(path, id)?;
        }
        state.id = Some(id);
        state.may_adopt = false;
        Ok(())
    }

    /// Whether a Raft call from a caller of cluster `theirs` may be served
    /// (see the table in the module doc); `from_leader`: the call sends
    /// entries or a snapshot, so its id may be adopted. The error is one
    /// line for the caller and this node's log.
    pub fn check(&self, theirs: Option<u64>, from_leader: bool) -> Result<(), String> {
        let checked = self.judge(theirs, from_leader);
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

    fn judge(&self, theirs: Option<u64>, from_leader: bool) -> Result<(), String> {
        let mut state = self.state.lock();
        match (state.id, theirs) {
            (Some(mine), Some(theirs)) if mine == theirs => {
                // The first leader's entries: this id binds from now on.
                if from_leader {
                    state.may_adopt = false;
                }
                Ok(())
            }
            // Votes before the first leader (the group forming) are
            // answered; the leader's entries bring the id.
            (_, Some(_)) if state.may_adopt && !from_leader => Ok(()),
            (kept, Some(theirs)) if state.may_adopt => {
                self.keep(&mut state, theirs).map_err(|e| {
                    format!("this node could not keep the cluster id {theirs:016x}: {e}")
                })?;
                match kept {
                    Some(kept) => tracing::info!(
                        cluster = %format!("{theirs:016x}"),
                        replaced = %format!("{kept:016x}"),
                        "joined the cluster, in place of the id this node kept with none of its group's data"
                    ),
                    None => {
                        tracing::info!(cluster = %format!("{theirs:016x}"), "joined the cluster")
                    }
                }
                Ok(())
            }
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
            (None, Some(theirs)) => Err(format!(
                "this node's data dir holds a group without a cluster id (one formed by 0.2.0) \
                 and the caller belongs to cluster {theirs:016x}: a node of another cluster may \
                 not join; to add this node to the caller's cluster, wipe this node's data dir \
                 and start it again"
            )),
            (None, None) => {
                // A leader of a cluster without an id brought this node in.
                if from_leader {
                    state.may_adopt = false;
                }
                Ok(())
            }
        }
    }
}

/// Writes the cluster id `id` into the data dir `dir` (a restore's new
/// cluster).
pub fn write_into(dir: &Path, id: u64) -> io::Result<()> {
    write(&dir.join(FILE), id)
}

fn write(path: &Path, id: u64) -> io::Result<()> {
    crate::raft::storage::disk::write_atomically(path, &[format!("cluster {id:016x}\n").as_bytes()])
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
        assert!(a.check(None, true).is_ok(), "no ids on either side");
        let err = a.check(Some(7), true).unwrap_err();
        assert!(err.contains("without a cluster id"), "{err}");

        a.adopt_from_first_leader();
        // A vote while the group forms is answered, and adopts nothing.
        a.check(Some(9), false)
            .expect("a vote before the first leader");
        assert_eq!(a.get(), None);
        a.check(Some(7), true)
            .expect("adopted from the leader's entries");
        assert_eq!(a.get(), Some(7));
        a.check(Some(7), false).expect("its own cluster");
        let err = a.check(Some(8), true).unwrap_err();
        assert!(
            err.contains("0000000000000007") && err.contains("0000000000000008"),
            "{err}"
        );
        assert!(a.check(None, false).unwrap_err().contains("names none"));
        assert_eq!(a.get(), Some(7), "a refusal changes nothing");

        // Brought in by a leader without an id: it adopts none later.
        let b = ClusterId::default();
        b.adopt_from_first_leader();
        b.check(None, true).expect("a cluster formed by 0.2.0");
        assert!(b.check(Some(7), true).is_err());
        assert_eq!(b.get(), None);
    }

    #[test]
    fn the_id_is_kept_in_the_data_dir_and_a_bad_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = ClusterId::default();
        a.load(dir.path()).unwrap();
        assert_eq!(a.get(), None);
        let made = a.make_for_new_group().unwrap().expect("an id made");
        assert_eq!(a.get(), Some(made));
        let b = ClusterId::default();
        b.load(dir.path()).unwrap();
        assert_eq!(b.get(), Some(made));
        // A second group is not made over the first.
        assert_eq!(b.make_for_new_group().unwrap(), None);
        assert_eq!(b.get(), Some(made));
        // Taken back (openraft refused to form the group): gone from the
        // data dir, and the first leader's id is adopted.
        b.unmake(made).unwrap();
        assert_eq!(b.get(), None);
        assert!(!dir.path().join(FILE).exists());
        b.check(Some(7), true).expect("adopted");
        assert_eq!(b.get(), Some(7));
        // Only the id it made is taken back.
        b.unmake(made).unwrap();
        assert_eq!(b.get(), Some(7));

        // Kept with none of a group's data (stopped between making it and
        // forming the group): the first leader's id takes its place, and
        // from then on binds.
        let c = ClusterId::default();
        c.load(dir.path()).unwrap();
        c.adopt_from_first_leader();
        c.check(Some(9), false)
            .expect("a vote of the group that formed");
        assert_eq!(c.get(), Some(7));
        c.check(Some(9), true).expect("its leader's entries");
        assert_eq!(c.get(), Some(9));
        let d = ClusterId::default();
        d.load(dir.path()).unwrap();
        assert_eq!(d.get(), Some(9), "written to the data dir");
        assert!(c.check(Some(7), true).is_err(), "and binds");
        // Reached by a leader of the id it kept: that id binds.
        let f = ClusterId::default();
        f.load(dir.path()).unwrap();
        f.adopt_from_first_leader();
        f.check(Some(9), true).expect("its own cluster's leader");
        assert!(f.check(Some(7), true).is_err(), "the kept id binds now");
        assert_eq!(f.get(), Some(9));
        // Or this node forms the group after all: with an id of its own.
        let e = ClusterId::default();
        e.load(dir.path()).unwrap();
        e.adopt_from_first_leader();
        let new = e.make_for_new_group().unwrap().expect("an id made");
        assert_ne!(new, 9);
        assert!(e.check(Some(9), true).is_err(), "its own group's id binds");

        std::fs::write(dir.path().join(FILE), "cluster xyz\n").unwrap();
        let err = ClusterId::default().load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("16 hex digits"), "{err}");
    }
}
