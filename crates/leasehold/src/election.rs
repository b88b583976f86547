//! Leader election on a lock: campaign, observe, proclaim, resign.
//!
//! An election is a key. Candidates wait in its FIFO queue; the one holding
//! it leads, for as long as its lease lives, and its fencing token is the
//! leadership's term: a deposed leader's writes carry a lower token than its
//! successor's, so a fence gate refuses them. The leader's value (an address,
//! a node name) is the key's checkpoint, saved under the leader's own token,
//! so an observer knows the value belongs to the leader that holds the key
//! now and not to the one before.
//!
//! ```no_run
//! # async fn run(client: leasehold::Client) -> leasehold::Result<()> {
//! use futures::StreamExt;
//! let election = client.election("scheduler");
//! let leadership = election.campaign("node-3:9000", Default::default()).await?;
//! // ... lead while leadership.token() answers ...
//! leadership.proclaim("node-3:9001").await?;
//! leadership.resign().await?;
//!
//! let mut leaders = election.observe().await?;
//! while let Some(leader) = leaders.next().await {
//!     println!("{:?}", leader?);   // Some(Leader { value, fence, .. }) or None
//! }
//! # Ok(()) }
//! ```

use futures::stream::{BoxStream, StreamExt};

use crate::backend::{LockEvent, LockOptions};
use crate::{Client, Error, Fence, Lease, Result};

/// An election: a name, over a client.
#[derive(Clone)]
pub struct Election {
    client: Client,
    name: String,
}

/// Who leads an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The value the leader proclaimed.
    pub value: Vec<u8>,
    /// The leader's fencing token: higher for every later leader.
    pub fence: Fence,
    /// The leader's holder name.
    pub holder: String,
}

/// This process leads: a lease on the election's key.
pub struct Leadership {
    lease: Lease,
}

impl Client {
    /// The election `name` (a key: leaseholdd, with checkpoints and watches).
    pub fn election(&self, name: &str) -> Election {
        Election {
            client: self.clone(),
            name: name.to_string(),
        }
    }
}

impl Election {
    /// The election's key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits in line until this candidate leads, then proclaims `value`.
    /// Waits however long it takes (`opts.wait` is how long each wait in the
    /// queue lasts before it is renewed); drop the future to stop. If the
    /// proclaim fails (its answer lost, say), the key is released and the
    /// error returned: observers never see a leader without a value. A
    /// process that dies between winning and proclaiming holds the key,
    /// unproclaimed, until its lease expires.
    pub async fn campaign(&self, value: impl AsRef<[u8]>, opts: LockOptions) -> Result<Leadership> {
        let value = value.as_ref();
        leasehold_core::limits::validate_checkpoint(value)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let lease = loop {
            match self.client.acquire(&self.name, opts.clone()).await {
                Ok(lease) => break lease,
                Err(Error::Timeout { .. }) => continue,
                Err(e) => return Err(e),
            }
        };
        match lease.save_checkpoint(value).await {
            Ok(()) => Ok(Leadership { lease }),
            Err(e) => {
                let _ = lease.release().await;
                Err(e)
            }
        }
    }

    /// Who leads now, if anyone has proclaimed under the token that holds
    /// the key.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let status = self.client.status(&self.name).await?;
        let Some(lock) = status.into_iter().find(|l| l.key == self.name) else {
            return Ok(None);
        };
        Ok(match (lock.fence, lock.checkpoint) {
            (Some(fence), Some((saved_by, value))) if saved_by == fence => Some(Leader {
                value,
                fence,
                holder: lock.holder,
            }),
            _ => None,
        })
    }

    /// The leader now, then every change: `Some` when a leader proclaims (a
    /// new one, or a new value), `None` when the leader goes (resigned, or
    /// its lease expired) and nobody has proclaimed since. Every leader that
    /// proclaims while the stream is read is seen, in order. The stream
    /// outlives the node it comes from (the watch resumes elsewhere); should
    /// events be lost all the same (`watch_behind`), it reads the election
    /// again and reports the leader then, if it changed.
    pub async fn observe(&self) -> Result<BoxStream<'static, Result<Option<Leader>>>> {
        let (events, state) = self.follow().await?;
        let first = state.last.clone();
        let election = self.clone();
        let changes = futures::stream::unfold(
            (election, events, state),
            |(election, mut events, mut state)| async move {
                loop {
                    match events.next().await? {
                        Err(Error::WatchBehind { .. }) => match election.follow().await {
                            Ok((again, now)) => {
                                events = again;
                                let change = state.report(now.last.clone());
                                state = now;
                                if let Some(change) = change {
                                    return Some((Ok(change), (election, events, state)));
                                }
                            }
                            Err(e) => return Some((Err(e), (election, events, state))),
                        },
                        Err(e) => return Some((Err(e), (election, events, state))),
                        Ok(event) => {
                            if let Some(change) = state.apply(event) {
                                return Some((Ok(change), (election, events, state)));
                            }
                        }
                    }
                }
            },
        );
        Ok(futures::stream::once(async move { Ok(first) })
            .chain(changes)
            .boxed())
    }

    /// Watches the key, then reads who leads: an event from before the read
    /// is recognised by its token and changes nothing.
    async fn follow(&self) -> Result<(BoxStream<'static, Result<LockEvent>>, Observed)> {
        let events = self.client.watch(&self.name).await?;
        let mut state = Observed {
            holder: None,
            last: None,
            name: self.name.clone(),
        };
        let locks = self.client.status(&self.name).await?;
        if let Some(lock) = locks.into_iter().find(|l| l.key == self.name) {
            state.holder = lock.fence;
            if let (Some(fence), Some((saved_by, value))) = (lock.fence, lock.checkpoint) {
                if saved_by == fence {
                    state.last = Some(Leader {
                        value,
                        fence,
                        holder: lock.holder,
                    });
                }
            }
        }
        Ok((events, state))
    }
}

/// What an observer knows: the token holding the key, and the leader it
/// last reported.
struct Observed {
    holder: Option<Fence>,
    last: Option<Leader>,
    name: String,
}

impl Observed {
    /// Takes in one event; the change to report, if any. Tokens only grow,
    /// so an event older than what is known changes nothing.
    fn apply(&mut self, e: LockEvent) -> Option<Option<Leader>> {
        if e.key != self.name {
            return None;
        }
        match e.kind.as_str() {
            "acquired" if self.holder.is_none_or(|h| e.fence > h) => {
                self.holder = Some(e.fence);
                self.report(None)
            }
            "released" | "expired" if self.holder == Some(e.fence) => {
                self.holder = None;
                self.report(None)
            }
            "checkpoint" if self.holder == Some(e.fence) && !e.data.is_empty() => {
                self.report(Some(Leader {
                    value: e.data,
                    fence: e.fence,
                    holder: e.holder,
                }))
            }
            _ => None,
        }
    }

    fn report(&mut self, leader: Option<Leader>) -> Option<Option<Leader>> {
        if self.last == leader {
            return None;
        }
        self.last = leader.clone();
        Some(leader)
    }
}

impl Leadership {
    /// The lease this leadership is.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The leadership's fencing token, while it lasts; send it with every
    /// write made as the leader.
    pub fn token(&self) -> Result<Fence> {
        self.lease.token()
    }

    /// Completes when the leadership is lost (its lease could not be renewed).
    pub fn lost(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.lease.lost()
    }

    /// Changes the value observers see, without a new election.
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        self.lease.save_checkpoint(value.as_ref()).await
    }

    /// Steps down: the next candidate in line leads.
    pub async fn resign(self) -> Result<()> {
        self.lease.release().await
    }
}
