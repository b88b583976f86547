//! A client host: takes locks the way the `leasehold` crate does and writes
//! to the fenced resource while it believes it holds them.
//!
//! The lease rules are the crate's own [`Keeper`]: renew every TTL/3, the
//! deadline counted from when the grant or renewal was *sent*, loss on a
//! definitive refusal or at the deadline. Before each write the client
//! checks its lease is live (`token()`), and sometimes its whole process
//! stops between that check and the write for longer than the TTL (a pause
//! the fence must catch). Calls go to the node it believes leads, follow `not_leader`
//! hints, rotate on silence, and retry with the same request id when the
//! outcome is unknown.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::keeper::{Keeper, RenewError};
use leasehold_core::RequestId;
use leasehold_fence::MemoryGate;
use leasehold_server::raft::ConsensusError;
use leasehold_server::service::{AcquireArgs, ApiError, LeaseSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::history::{Event, History, Micros};
use crate::net::{ClientAnswer, ClientCall, Net};

/// The shared resource the locks protect: one fenced register per key.
pub const RESOURCE: &str = "resource";

/// The lock-delay odd-numbered clients ask for (the TTL is 600 ms).
pub const LOCK_DELAY_MS: u64 = 300;

/// How a client behaves.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The keys it picks from.
    pub keys: usize,
    /// The lease TTL.
    pub ttl: Duration,
    /// How long an acquire waits in the queue.
    pub wait: Duration,
    /// Writes per hold, at most.
    pub writes: usize,
    /// The chance that the client's process stops for longer than the TTL
    /// between a `token()` check and its write.
    pub stall: f64,
    /// The deadline is counted from the grant's answer, not its send (a
    /// planted bug).
    pub deadline_from_reply: bool,
    /// Stop starting holds at this time of the world.
    pub until: Micros,
}

/// A client's way to the nodes.
#[derive(Clone)]
struct Caller {
    me: String,
    nodes: Arc<Vec<String>>,
    hint: Arc<AtomicUsize>,
    net: Net,
}

/// A call that got no final answer.
#[derive(Debug)]
enum Failed {
    /// The service refused it (a final answer, not a success).
    Refused(ApiError),
    /// No node answered in time.
    Unavailable,
}

impl Caller {
    /// Calls the leader, following hints and rotating, until `budget` runs
    /// out. A call without an answer is sent again unchanged (same request
    /// id), so it never acts twice.
    async fn call(
        &self,
        call: ClientCall,
        attempt: Duration,
        budget: Duration,
    ) -> Result<ClientAnswer, Failed> {
        let deadline = Instant::now() + budget;
        loop {
            let i = self.hint.load(Ordering::Relaxed) % self.nodes.len();
            let to = &self.nodes[i];
            let sent = self.net.call_node(&self.me, to, call.clone());
            let rotate = || {
                self.hint
                    .store((i + 1) % self.nodes.len(), Ordering::Relaxed)
            };
            match tokio::time::timeout(attempt, sent).await {
                Ok(Ok(Ok(answer))) => return Ok(answer),
                Ok(Ok(Err(ApiError::Consensus(ConsensusError::NotLeader { leader })))) => {
                    match leader.and_then(|l| self.nodes.iter().position(|n| *n == l)) {
                        Some(j) if j != i => self.hint.store(j, Ordering::Relaxed),
                        _ => rotate(),
                    }
                }
                Ok(Ok(Err(ApiError::Consensus(_)))) => {}
                Ok(Ok(Err(e))) => return Err(Failed::Refused(e)),
                Ok(Err(_)) | Err(_) => rotate(),
            }
            if Instant::now() >= deadline {
                return Err(Failed::Unavailable);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn code(result: &Result<ClientAnswer, Failed>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(Failed::Refused(e)) => e.code().into(),
        Err(Failed::Unavailable) => "unavailable".into(),
    }
}

/// One client host.
pub struct SimClient {
    /// Its number.
    pub id: usize,
    /// Its clock's rate against the world's.
    pub rate: f64,
    /// The node addresses.
    pub nodes: Vec<String>,
    /// The network.
    pub net: Net,
    /// The record.
    pub history: History,
    /// The resource's gate.
    pub gate: Arc<MemoryGate>,
    /// What it does.
    pub workload: Workload,
    /// Its own randomness.
    pub seed: u64,
}

impl SimClient {
    /// The world's time at the host's local instant `t`.
    fn world_time(&self, t: Instant) -> Micros {
        let now_world = self.history.now() as f64;
        let now = Instant::now();
        let local = if t >= now {
            (t - now).as_micros() as f64
        } else {
            -((now - t).as_micros() as f64)
        };
        (now_world + local / self.rate).max(0.0) as Micros
    }

    /// Runs holds until the workload's end.
    pub async fn run(self) -> anyhow::Result<()> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let me = format!("c{}", self.id);
        let caller = Caller {
            me: me.clone(),
            nodes: Arc::new(self.nodes.clone()),
            hint: Arc::new(AtomicUsize::new(0)),
            net: self.net.clone(),
        };
        let ttl = self.workload.ttl;
        let ttl_ms = ttl.as_millis() as u64;
        let mut next_id: RequestId = (self.id as u64) << 40;
        let mut request_id = || {
            next_id += 1;
            next_id
        };
        let quick = Duration::from_millis(300);
        while self.history.now() < self.workload.until {
            let key = format!("k{}", rng.gen_range(0..self.workload.keys));
            // A lease, then the key under it, as the crate does.
            let sent_at = Instant::now();
            let grant = ClientCall::Grant {
                ttl_ms,
                holder: me.clone(),
                request_id: request_id(),
            };
            let grant_sent = self.history.now();
            let answer = caller.call(grant, quick, ttl).await;
            self.record_answer("grant", &answer);
            let Ok(ClientAnswer::Lease(lease)) = answer else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            self.history.record(Event::Renewed {
                client: self.id,
                lease,
                sent: grant_sent,
            });
            let (renewer, history, client) = (caller.clone(), self.history.clone(), self.id);
            let renew = move || {
                let (renewer, history) = (renewer.clone(), history.clone());
                async move {
                    let attempt = (ttl / 6).max(Duration::from_millis(200));
                    let sent = history.now();
                    match renewer
                        .call(ClientCall::KeepAlive(lease), attempt, attempt)
                        .await
                    {
                        Ok(_) => {
                            history.record(Event::Renewed {
                                client,
                                lease,
                                sent,
                            });
                            Ok(())
                        }
                        Err(Failed::Refused(e)) => Err(RenewError::Lost(e.to_string())),
                        Err(Failed::Unavailable) => {
                            Err(RenewError::Transient("no node answered".into()))
                        }
                    }
                }
            };
            let keeper = if self.workload.deadline_from_reply {
                Keeper::spawn_counting_from_reply(ttl, Instant::now(), renew)
            } else {
                Keeper::spawn(ttl, sent_at, renew)
            };
            let liveness = keeper.liveness().clone();
            // When the loss was noticed (by the renewal loop), on the world's clock.
            let lost_at = Arc::new(AtomicU64::new(u64::MAX));
            {
                let (token, lost_at, history) = (
                    liveness.token().clone(),
                    lost_at.clone(),
                    self.history.clone(),
                );
                tokio::spawn(async move {
                    token.cancelled().await;
                    lost_at.store(history.now(), Ordering::Relaxed);
                });
            }
            let acquire_sent = self.history.now();
            self.history.record(Event::AcquireSent {
                client: self.id,
                key: key.clone(),
            });
            let args = AcquireArgs {
                lease: LeaseSpec::Existing(lease),
                key: key.clone(),
                wait_ms: self.workload.wait.as_millis() as u64,
                // Odd clients ask for a lock-delay, so expiries start some.
                lock_delay_ms: if self.id % 2 == 1 { LOCK_DELAY_MS } else { 0 },
                request_id: request_id(),
                mode: leasehold_core::Mode::Exclusive,
                set: Vec::new(),
            };
            let answer = caller
                .call(
                    ClientCall::Acquire(args),
                    self.workload.wait + Duration::from_secs(1),
                    self.workload.wait + Duration::from_secs(2),
                )
                .await;
            self.record_answer("acquire", &answer);
            if let Ok(ClientAnswer::Granted(grant)) = answer {
                self.history.record(Event::Granted {
                    client: self.id,
                    key: key.clone(),
                    fence: grant.fence,
                    lease,
                    sent: acquire_sent,
                    checkpoint: grant
                        .checkpoint
                        .as_ref()
                        .map(|c| (c.fence, c.data.to_vec())),
                });
                let mut why = "released";
                let mut saved = 0u32;
                let writes = rng.gen_range(1..=self.workload.writes);
                for _ in 0..writes {
                    if !liveness.is_live() {
                        why = "lost";
                        break;
                    }
                    if rng.gen_bool(self.workload.stall) {
                        self.history.record(Event::Fault {
                            kind: "client-stall",
                            detail: format!(
                                "c{} before writing {key} with fence {}",
                                self.id, grant.fence
                            ),
                        });
                        // The whole process stops (its renewals too), as
                        // in a long GC pause, and resumes to write.
                        self.history
                            .request_pause(&me, (ttl * 3 / 2).as_micros() as Micros);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    if !self.net.arrive(&me, RESOURCE, quick).await {
                        continue;
                    }
                    let admitted = self.gate.admit_now(&key, grant.fence).is_ok();
                    self.history.record(Event::Wrote {
                        client: self.id,
                        key: key.clone(),
                        fence: grant.fence,
                        admitted,
                        // The gate answers in the same step.
                        sent: self.history.now(),
                    });
                    // Progress saved with the lock, for the next holder.
                    if admitted && rng.gen_bool(0.5) {
                        saved += 1;
                        let data = format!("c{}/f{}/{saved}", self.id, grant.fence).into_bytes();
                        self.history.record(Event::CheckpointSent {
                            client: self.id,
                            key: key.clone(),
                            fence: grant.fence,
                            data: data.clone(),
                        });
                        let save = ClientCall::SaveCheckpoint {
                            key: key.clone(),
                            fence: grant.fence,
                            data: data.clone(),
                        };
                        let answer = caller.call(save, quick, quick).await;
                        self.record_answer("checkpoint", &answer);
                        if answer.is_ok() {
                            self.history.record(Event::CheckpointSaved {
                                client: self.id,
                                key: key.clone(),
                                fence: grant.fence,
                                data,
                            });
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(30..200))).await;
                }
                // The belief ends at the earliest of the deadline, noticing
                // the loss and sending the release.
                let deadline = self.world_time(liveness.deadline());
                let lost = lost_at.load(Ordering::Relaxed);
                let release_sent = self.history.now();
                let (until, why) = [(release_sent, why), (deadline, "deadline"), (lost, "lost")]
                    .into_iter()
                    .min_by_key(|(t, _)| *t)
                    .unwrap_or((release_sent, why));
                self.history.record(Event::HoldEnded {
                    client: self.id,
                    key: key.clone(),
                    fence: grant.fence,
                    until,
                    why,
                });
                keeper.stop().await;
                self.history.record(Event::ReleaseSent {
                    client: self.id,
                    key: key.clone(),
                    fence: grant.fence,
                });
                let release = ClientCall::Release {
                    key: key.clone(),
                    fence: grant.fence,
                    request_id: request_id(),
                };
                let answer = caller.call(release, quick, ttl).await;
                self.record_answer("release", &answer);
                if answer.is_ok() {
                    self.history.record(Event::Released {
                        client: self.id,
                        key: key.clone(),
                        fence: grant.fence,
                    });
                }
            } else {
                keeper.stop().await;
            }
            // Now and then, who holds a key: a read that must see every
            // write acknowledged before it was sent. It starts at any node
            // (as after a rotation), not at the one believed to lead.
            if rng.gen_bool(0.5) {
                let reader = Caller {
                    hint: Arc::new(AtomicUsize::new(rng.gen_range(0..self.nodes.len()))),
                    ..caller.clone()
                };
                let sent = self.history.now();
                let answer = reader
                    .call(ClientCall::Describe(key.clone()), quick, ttl)
                    .await;
                self.record_answer("describe", &answer);
                if let Ok(ClientAnswer::Holder(holder)) = answer {
                    // A call that succeeds leaves the hint at the node that answered.
                    let node =
                        self.nodes[reader.hint.load(Ordering::Relaxed) % self.nodes.len()].clone();
                    self.history.record(Event::Observed {
                        client: self.id,
                        key: key.clone(),
                        holder,
                        sent,
                        node,
                    });
                }
            }
            let answer = caller.call(ClientCall::Revoke(lease), quick, ttl).await;
            self.record_answer("revoke", &answer);
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..40))).await;
        }
        Ok(())
    }

    fn record_answer(&self, op: &'static str, answer: &Result<ClientAnswer, Failed>) {
        self.history.record(Event::Answer {
            client: self.id,
            op,
            code: code(answer),
        });
    }
}
