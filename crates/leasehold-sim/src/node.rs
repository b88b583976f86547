//! A leaseholdd node as a host of the world: the real consensus, lock table,
//! expiry driver and lock service, over the simulated disk, network and
//! clock.

use parking_lot::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::sync::Arc;

use leasehold_server::context::NodeContext;
use leasehold_server::raft::{
    Consensus, LogStore, MemorySnapshots, NodeId, NodeSpec, RaftOptions, StateMachine, SystemClock,
};
use leasehold_server::service::{LockService, PlantedBug};

use crate::applied::AppliedLog;
use crate::disk::{Disk, SimDisk};
use crate::net::{ClientAnswer, ClientCall, Envelope, Net, SimTransport};

/// The address of node `id` on the simulated network (host:port, as the
/// membership API wants one).
pub fn addr(id: NodeId) -> String {
    format!("n{id}:7419")
}

/// The nodes that are up, for the nemesis to find the leader.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<BTreeMap<NodeId, Consensus>>>);

impl Registry {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<NodeId, Consensus>> {
        self.0.lock()
    }

    /// Forgets a node that died.
    pub fn remove(&self, id: NodeId) {
        self.lock().remove(&id);
    }

    /// The node that leads in the highest term, as the nodes see it, and
    /// that term.
    pub fn leader(&self) -> Option<(NodeId, u64)> {
        self.lock()
            .values()
            .map(|c| c.membership().status())
            .filter(|s| s.role == "leader")
            .max_by_key(|s| s.term)
            .map(|s| (s.id, s.term))
    }

    /// Node `id`, if it is up.
    pub fn get(&self, id: NodeId) -> Option<Consensus> {
        self.lock().get(&id).cloned()
    }

    /// Whether the leader counts `id` among its voters.
    pub fn is_voter(&self, id: NodeId) -> bool {
        let leader = self.leader().and_then(|(l, _)| self.get(l));
        leader.is_some_and(|c| {
            c.membership()
                .status()
                .members
                .iter()
                .any(|m| m.id == id && m.voter)
        })
    }

    /// Node `id`'s view: role, term and last applied index.
    pub fn status(&self, id: NodeId) -> Option<(&'static str, u64, u64)> {
        self.lock()
            .get(&id)
            .map(|c| c.membership().status())
            .map(|s| (s.role, s.term, s.last_applied))
    }
}

/// What a node keeps across crashes, and how it is built.
#[derive(Clone)]
pub struct NodeParts {
    /// Its id.
    pub id: NodeId,
    /// The initial voters.
    pub members: Vec<NodeId>,
    /// Its log's disk (which knows how long a sync takes, and whether it
    /// lies about syncing).
    pub disk: Arc<Disk>,
    /// Its snapshot.
    pub snapshots: MemorySnapshots,
    /// Raft's timing for it.
    pub options: RaftOptions,
    /// A bug planted in its lock service.
    pub planted: Option<PlantedBug>,
    /// The network.
    pub net: Net,
    /// Where it says it is up.
    pub registry: Registry,
    /// Where its state machine shows what it applies.
    pub applied: AppliedLog,
}

impl NodeParts {
    /// Runs the node until its host dies, its inbox closes, or its Raft
    /// stops (an error: the world restarts the node).
    pub async fn run(self) -> anyhow::Result<()> {
        let me = addr(self.id);
        // Open for peers at once: a peer's probe waits in the inbox until
        // the node is up.
        let mut inbox = self.net.listen(&me);
        let spec = NodeSpec {
            id: self.id,
            addr: me.clone(),
            members: self
                .members
                .iter()
                .map(|&id| (id, addr(id)))
                .collect::<BTreeMap<_, _>>(),
            source: None,
        };
        tokio::spawn(self.disk.clone().write_back());
        let log = LogStore::open_on(SimDisk(self.disk.clone()))?;
        let context = Arc::new(NodeContext::default());
        let sm = StateMachine::open(
            Arc::new(self.snapshots.clone()),
            context.clone(),
            self.options.snapshot_every,
            log.applied_index(),
        )?;
        sm.tap(self.applied.tap());
        let transport = Arc::new(SimTransport {
            from: me.clone(),
            net: self.net.clone(),
        });
        let consensus = Consensus::start_with(
            spec,
            self.options.clone(),
            log,
            sm,
            transport,
            // The host runtime's clock, which the world runs at the host's rate.
            Arc::new(SystemClock::default()),
        )
        .await?;
        self.registry.lock().insert(self.id, consensus.clone());
        tokio::spawn(leasehold_server::expiry::run(
            consensus.clone(),
            futures::future::pending(),
        ));
        let mut service = LockService::new(consensus.clone(), context);
        if let Some(bug) = self.planted {
            service = service.plant(bug);
        }
        // As leaseholdd does: a node whose Raft stopped exits, and its
        // supervisor (the world) starts it again.
        let stopped = consensus.stopped();
        tokio::pin!(stopped);
        loop {
            let envelope = tokio::select! {
                why = &mut stopped => {
                    self.registry.remove(self.id);
                    self.net.close(&me);
                    anyhow::bail!("raft stopped: {why}");
                }
                envelope = inbox.recv() => envelope,
            };
            let Some(envelope) = envelope else {
                return Ok(());
            };
            let net = self.net.clone();
            match envelope {
                Envelope::Peer { id, call, payload } => {
                    let consensus = consensus.clone();
                    tokio::spawn(async move {
                        net.answer_peer(id, consensus.peers().serve(call, &payload).await);
                    });
                }
                Envelope::Stream {
                    mut requests,
                    answers,
                } => {
                    let requests =
                        Box::pin(futures::stream::poll_fn(move |cx| requests.poll_recv(cx)));
                    let mut served = consensus.peers().serve_append_stream(requests);
                    tokio::spawn(async move {
                        use futures::StreamExt;
                        while let Some(answer) = served.next().await {
                            if answers.send(answer).is_err() {
                                return;
                            }
                        }
                    });
                }
                Envelope::Client { id, call } => {
                    let service = service.clone();
                    tokio::spawn(async move {
                        net.answer_client(id, serve(&service, call).await);
                    });
                }
            }
        }
    }
}

async fn serve(
    service: &LockService,
    call: ClientCall,
) -> Result<ClientAnswer, leasehold_server::service::ApiError> {
    match call {
        ClientCall::Grant {
            ttl_ms,
            holder,
            request_id,
        } => service
            .grant(ttl_ms, holder, request_id)
            .await
            .map(|(lease, _)| ClientAnswer::Lease(lease)),
        ClientCall::KeepAlive(lease) => service.keep_alive(lease).await.map(|_| ClientAnswer::Done),
        ClientCall::Acquire(args) => service.acquire(args).await.map(ClientAnswer::Granted),
        ClientCall::Release {
            key,
            fence,
            request_id,
        } => service
            .release(key, fence, request_id)
            .await
            .map(|()| ClientAnswer::Done),
        ClientCall::Revoke(lease) => service.revoke(lease).await.map(|_| ClientAnswer::Done),
        ClientCall::SaveCheckpoint { key, fence, data } => service
            .save_checkpoint(key, fence, data)
            .await
            .map(|()| ClientAnswer::Done),
        ClientCall::Describe(key) => service
            .lock(&key)
            .await
            .map(|view| ClientAnswer::Holder(view.and_then(|v| v.holder).map(|h| h.fence))),
    }
}
