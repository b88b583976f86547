//! Proposals: lock-table commands gathered into log entries (group commit
//! above openraft).
//!
//! One entry per command would cost openraft's core, the log and every
//! follower a round of work per command. Instead concurrent proposals are
//! gathered into one entry: while one batch is being committed, the next
//! fills. (The log groups the flushes of entries that arrive together too.)
//!
//! Commands that keep or free (keepalives, releases, revokes, the expiry
//! tick) have a lane of their own: each batch takes them first (up to three
//! quarters of it, so the other lane always moves), and under a flood of
//! acquires a holder's renewal waits for no acquire queued before it. A
//! cancelled wait stays in the other lane: it must come after the acquire
//! it cancels, which may still be queued there.
//!
//! What a proposal's failure promises is in [`ConsensusError`]: refused here
//! before anything was handed to Raft (`NotLeader`, `Starting`), or handed to
//! Raft and then cut off (`Unknown`: the entry may still commit).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Command, Outcome, Stamp};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{Consensus, ConsensusError, Request};

/// At most this many commands in one log entry.
pub(super) const MAX_BATCH: usize = 1024;
/// At most this many of them from the urgent lane, while the other lane
/// has commands waiting.
const URGENT_PER_BATCH: usize = MAX_BATCH * 3 / 4;
/// At most this many batches handed to openraft at once by a single node.
/// A second batch in flight would only split the next one in two (measured
/// on openraft 0.9: 1 in flight gave 8.3k cycles/s at 50 clients, 2 gave
/// 7.6k, 4 gave 6.0k; on 0.10, with the log grouping flushes, 1, 2 and 4
/// measured alike within this machine's noise, about 30k/s).
const MAX_IN_FLIGHT_ALONE: usize = 1;
/// ... and by the leader of a group, where a batch waits for a follower's
/// fsync and answer: the next batches are written locally meanwhile, and go
/// to the followers together with the answer's next append (measured, 3 nodes,
/// `cycle` x50: 1 in flight 5.1-5.6k/s, 2: 5.9-6.0k/s, 4: 6.4-6.9k/s; on
/// openraft 0.10 with pipelined appends, 4, 8 and 16 measured alike, about
/// 20k/s at 50 clients and 32k/s at 200).
const MAX_IN_FLIGHT_GROUP: usize = 4;
/// A group's leader with other batches in flight lets the rest of the
/// runtime run this many times before it cuts the next batch, so that the
/// requests already read off the sockets join it. On a 2-core machine the
/// cluster is bound by CPU spent waking threads and processes per log entry,
/// so fewer, fuller entries serve more (3 nodes, `cycle` x50, alternated:
/// 6.3-7.4k -> 7.5-9.3k cycles/s). With nothing else in flight a batch goes at
/// once: a lone caller's latency stays where it was (`cycle` x1 p50 1.9-2.0 ms
/// either way).
const YIELDS_BEFORE_A_FOLLOWING_BATCH: usize = 8;
/// A batch not committed within this long is answered `Unknown`, and the next
/// batch may go: a leader cut off from its majority would otherwise hold
/// every caller until a new leader truncated the entry. The entry may still
/// commit; the callers retry with their request ids.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(2);

/// Commands waiting to be proposed, with where their answers go: one
/// command, or several that go into the log together (in order, in one
/// entry) and are answered together.
pub(super) enum Proposal {
    One(Command, oneshot::Sender<Result<Outcome, ConsensusError>>),
    Many(
        Vec<Command>,
        oneshot::Sender<Result<Vec<Outcome>, ConsensusError>>,
    ),
}

/// Where a batch's answers go, in the order of its commands.
enum Answer {
    One(oneshot::Sender<Result<Outcome, ConsensusError>>),
    Many(usize, oneshot::Sender<Result<Vec<Outcome>, ConsensusError>>),
}

impl Proposal {
    /// How many commands it adds to a batch.
    fn len(&self) -> usize {
        match self {
            Proposal::One(..) => 1,
            Proposal::Many(commands, _) => commands.len(),
        }
    }

    /// Answers every command of it with `e`.
    fn fail(self, e: ConsensusError) {
        match self {
            Proposal::One(_, tx) => {
                let _ = tx.send(Err(e));
            }
            Proposal::Many(_, tx) => {
                let _ = tx.send(Err(e));
            }
        }
    }
}

/// Where proposals are sent: two lanes.
#[derive(Clone)]
pub(super) struct Lanes {
    urgent: mpsc::Sender<Proposal>,
    rest: mpsc::Sender<Proposal>,
}

/// Where the batcher takes them from.
pub(super) struct Queues {
    urgent: mpsc::Receiver<Proposal>,
    rest: mpsc::Receiver<Proposal>,
}

/// The two lanes, each holding up to `capacity` proposals.
pub(super) fn lanes(capacity: usize) -> (Lanes, Queues) {
    let (urgent, urgent_queue) = mpsc::channel(capacity);
    let (rest, rest_queue) = mpsc::channel(capacity);
    (
        Lanes { urgent, rest },
        Queues {
            urgent: urgent_queue,
            rest: rest_queue,
        },
    )
}

/// Whether `command` keeps what a holder has or frees it: never held up
/// behind commands that create. Not a cancelled wait: it must follow the
/// acquire it cancels (its caller went away, perhaps before that acquire
/// was even proposed), and that acquire goes in the other lane.
fn keeps_or_frees(command: &Command) -> bool {
    match command {
        Command::As { command, .. } => keeps_or_frees(command),
        Command::KeepAlive { .. }
        | Command::Revoke { .. }
        | Command::Release { .. }
        | Command::Tick => true,
        _ => false,
    }
}

impl Consensus {
    /// Stamps `command` with the leader's clock, replicates it durably and
    /// applies it. Answers once the entry is committed and applied.
    pub async fn propose(&self, command: Command) -> Result<Outcome, ConsensusError> {
        if self.leader_clock().is_none() {
            return Err(self.not_leader());
        }
        let (tx, rx) = oneshot::channel();
        let lane = if keeps_or_frees(&command) {
            &self.proposals.urgent
        } else {
            &self.proposals.rest
        };
        lane.send(Proposal::One(command, tx))
            .await
            .map_err(|_| ConsensusError::Stopped("the proposer stopped".into()))?;
        rx.await
            .map_err(|_| ConsensusError::Unknown("the proposer dropped a proposal".into()))?
    }

    /// Proposes `commands` that keep or free (keepalives, say) in the
    /// urgent lane, as [`propose`](Self::propose) would one by one, and
    /// answers each in order. They go into the log in order, in proposals
    /// of at most [`URGENT_PER_BATCH`] commands, each taken whole into an
    /// entry: a proposal each would cost a channel, an answer and a
    /// wake-up per command.
    pub async fn propose_urgent(
        &self,
        commands: Vec<Command>,
    ) -> Result<Vec<Outcome>, ConsensusError> {
        if self.leader_clock().is_none() {
            return Err(self.not_leader());
        }
        debug_assert!(commands.iter().all(keeps_or_frees));
        let mut answers = Vec::new();
        let mut commands = commands.into_iter().peekable();
        while commands.peek().is_some() {
            let chunk: Vec<Command> = commands.by_ref().take(URGENT_PER_BATCH).collect();
            let (tx, rx) = oneshot::channel();
            self.proposals
                .urgent
                .send(Proposal::Many(chunk, tx))
                .await
                .map_err(|_| ConsensusError::Stopped("the proposer stopped".into()))?;
            answers.push(rx);
        }
        let mut outcomes = Vec::new();
        for rx in answers {
            let answered = rx
                .await
                .map_err(|_| ConsensusError::Unknown("the proposer dropped a proposal".into()))?;
            outcomes.extend(answered?);
        }
        Ok(outcomes)
    }

    /// Gathers proposals into batches, one log entry each, the urgent lane's
    /// first.
    pub(super) async fn batch_proposals(self, mut queues: Queues) {
        let alone = Arc::new(Semaphore::new(MAX_IN_FLIGHT_ALONE));
        let group = Arc::new(Semaphore::new(MAX_IN_FLIGHT_GROUP));
        loop {
            let first = tokio::select! {
                biased;
                Some(p) = queues.urgent.recv() => p,
                Some(p) = queues.rest.recv() => p,
                else => return,
            };
            let voters = self
                .raft
                .metrics()
                .borrow_watched()
                .membership_config
                .membership()
                .voter_ids()
                .count();
            let in_flight = if voters > 1 { &group } else { &alone };
            // Waiting for a slot is what lets the next batch grow.
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let others_in_flight =
                voters > 1 && in_flight.available_permits() + 1 < MAX_IN_FLIGHT_GROUP;
            if others_in_flight {
                for _ in 0..YIELDS_BEFORE_A_FOLLOWING_BATCH {
                    tokio::task::yield_now().await;
                }
            }
            let waiting = queues.urgent.len() + queues.rest.len();
            let mut batch = Vec::with_capacity(MAX_BATCH.min(waiting + 1));
            // Commands in the batch: a proposal of many is taken whole while
            // there is room, so a batch may run over by one such proposal.
            let mut commands = first.len();
            batch.push(first);
            while commands < URGENT_PER_BATCH {
                match queues.urgent.try_recv() {
                    Ok(p) => {
                        commands += p.len();
                        batch.push(p);
                    }
                    Err(_) => break,
                }
            }
            // The other lane has a quarter of a batch whatever the urgent
            // one took (its proposals are one command each).
            let mut others = 0;
            while commands < MAX_BATCH || others < MAX_BATCH - URGENT_PER_BATCH {
                match queues.rest.try_recv() {
                    Ok(p) => {
                        commands += p.len();
                        others += 1;
                        batch.push(p);
                    }
                    Err(_) => break,
                }
            }
            // Room the other lane left: the urgent one fills it.
            while commands < MAX_BATCH {
                match queues.urgent.try_recv() {
                    Ok(p) => {
                        commands += p.len();
                        batch.push(p);
                    }
                    Err(_) => break,
                }
            }
            let this = self.clone();
            tokio::spawn(async move {
                this.write_batch(batch).await;
                drop(permit);
            });
        }
    }

    async fn write_batch(&self, batch: Vec<Proposal>) {
        let Some(clock) = self.leader_clock() else {
            let e = self.not_leader();
            for proposal in batch {
                proposal.fail(e.clone());
            }
            return;
        };
        let mut commands = Vec::with_capacity(batch.iter().map(Proposal::len).sum());
        let mut answers = Vec::with_capacity(batch.len());
        for proposal in batch {
            match proposal {
                Proposal::One(command, tx) => {
                    commands.push(command);
                    answers.push(Answer::One(tx));
                }
                Proposal::Many(many, tx) => {
                    answers.push(Answer::Many(many.len(), tx));
                    commands.extend(many);
                }
            }
        }
        let request = Request {
            stamp: Stamp {
                now: clock.now(self.clock.as_ref()),
                epoch: clock.epoch,
            },
            commands,
        };
        let write = tokio::time::timeout(COMMIT_TIMEOUT, self.raft.client_write(request));
        // A leader that stops serving (deposed, or no quorum answers) will not
        // see this commit soon, if ever: answer now, as unknown.
        let stepped_down = async {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if self.leader_clock().map(|c| c.term) != Some(clock.term) {
                    return;
                }
            }
        };
        let outcome = tokio::select! {
            outcome = write => outcome,
            _ = stepped_down => Ok(Err(RaftError::Fatal(openraft::errors::Fatal::Stopped))),
        };
        let result = match outcome {
            Err(_) => Err(ConsensusError::Unknown(format!(
                "not committed within {COMMIT_TIMEOUT:?}"
            ))),
            Ok(Ok(response)) => Ok(response.data),
            // Refused before it was appended: it will never commit.
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ConsensusError::NotLeader {
                    leader: f.leader_node.map(|n| n.addr),
                })
            }
            Ok(Err(e)) => Err(ConsensusError::Unknown(e.to_string())),
        };
        match result {
            Ok(outcomes) => {
                let mut outcomes = outcomes.into_iter();
                for answer in answers {
                    match answer {
                        Answer::One(tx) => {
                            let outcome = outcomes.next().ok_or_else(|| {
                                ConsensusError::Unknown("an entry answered too few commands".into())
                            });
                            let _ = tx.send(outcome);
                        }
                        Answer::Many(n, tx) => {
                            let mine: Vec<Outcome> = outcomes.by_ref().take(n).collect();
                            let _ = tx.send(if mine.len() == n {
                                Ok(mine)
                            } else {
                                Err(ConsensusError::Unknown(
                                    "an entry answered too few commands".into(),
                                ))
                            });
                        }
                    }
                }
            }
            Err(e) => {
                for answer in answers {
                    match answer {
                        Answer::One(tx) => {
                            let _ = tx.send(Err(e.clone()));
                        }
                        Answer::Many(_, tx) => {
                            let _ = tx.send(Err(e.clone()));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_keeps_or_frees_takes_the_urgent_lane_and_what_creates_does_not() {
        let urgent = [
            Command::KeepAlive { lease: 1 },
            Command::Revoke { lease: 1 },
            Command::Tick,
            Command::As {
                token: Some(3),
                command: Box::new(Command::KeepAlive { lease: 1 }),
            },
        ];
        for command in &urgent {
            assert!(keeps_or_frees(command), "{command:?}");
        }
        let rest = [
            // After the acquire it cancels, which is in this lane.
            Command::CancelWait {
                lease: 1,
                key: "k".into(),
                request_id: 0,
                attempt: 0,
            },
            Command::Grant {
                ttl_ms: 1_000,
                holder: "h".into(),
                request_id: 0,
            },
            Command::As {
                token: Some(3),
                command: Box::new(Command::Grant {
                    ttl_ms: 1_000,
                    holder: "h".into(),
                    request_id: 0,
                }),
            },
        ];
        for command in &rest {
            assert!(!keeps_or_frees(command), "{command:?}");
        }
    }
}
