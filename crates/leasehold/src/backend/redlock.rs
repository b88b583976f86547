//! Redlock over N independent Redis nodes — `Efficiency`, and **no fencing**.
//!
//! Acquire sets the key on every node with a short per-node timeout; it holds
//! when a majority said yes and the validity left (`ttl - elapsed - drift`) is
//! positive; otherwise it is undone on every node and retried with jitter.
//! Renewal extends a majority; release goes to every node, owner-checked.
//!
//! Redlock has no fencing token: nothing the nodes agree on increases with
//! each grant, and its safety rests on bounded pauses and clock drift. A
//! Redlock lease's [`fence`](crate::Lease::fence) is `None` and
//! [`token`](crate::Lease::token) fails with `Unsupported`. Use it to avoid
//! duplicate work, never to protect data.

use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;

use super::backoff;
use super::redis::Node;
use super::{Acquired, Backend, Guarantee, Hold, LockOptions};
use crate::keeper::{Keeper, RenewError};
use crate::{Error, Result};

/// How long one node may take to answer.
const NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// The Redlock backend.
pub struct Redlock {
    /// Nodes that answered at connect time, and the addresses of all.
    nodes: Vec<Option<Node>>,
    urls: Vec<String>,
}

impl Redlock {
    /// Connects to `redlock://host1:port1,host2:port2,...` (an odd number, 3 or more,
    /// is usual). Nodes that are down now are retried on each acquire.
    pub async fn connect(url: &str) -> Result<Redlock> {
        let hosts = url.trim_start_matches("redlock://");
        let urls: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{h}"))
            .collect();
        if urls.is_empty() {
            return Err(Error::InvalidArgument(
                "redlock:// needs at least one host:port".into(),
            ));
        }
        let nodes = join_all(
            urls.iter()
                .map(|u| async move { Node::connect(u).await.ok() }),
        )
        .await;
        Ok(Redlock { nodes, urls })
    }

    fn quorum(&self) -> usize {
        self.urls.len() / 2 + 1
    }

    fn live_nodes(&self) -> Vec<Node> {
        self.nodes.iter().flatten().cloned().collect()
    }
}

/// Runs `f` on every node with the per-node timeout; counts the `true`s.
async fn on_all<F, Fut>(nodes: &[Node], f: F) -> usize
where
    F: Fn(Node) -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    join_all(
        nodes
            .iter()
            .cloned()
            .map(|n| tokio::time::timeout(NODE_TIMEOUT, f(n))),
    )
    .await
    .into_iter()
    .filter(|r| matches!(r, Ok(Ok(true))))
    .count()
}

#[async_trait::async_trait]
impl Backend for Redlock {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Efficiency
    }

    fn efficiency_reason(&self) -> &'static str {
        "Redlock has no fencing token and its safety depends on bounded pauses and clock drift"
    }

    async fn acquire(
        &self,
        key: &str,
        holder: &str,
        opts: &LockOptions,
        wait: Option<Duration>,
    ) -> Result<Acquired> {
        let ttl = opts.ttl;
        let give_up = Instant::now() + wait.unwrap_or_default();
        let nodes = self.live_nodes();
        let quorum = self.quorum();
        let mut attempt = 0;
        loop {
            let value = format!("{:016x}|{holder}", rand::random::<u64>());
            let started = Instant::now();
            let votes = on_all(&nodes, |n| {
                let (key, value) = (key.to_string(), value.clone());
                async move { n.set_nx(&key, &value, ttl).await }
            })
            .await;
            let drift = ttl / 100 + Duration::from_millis(2);
            let validity = ttl.checked_sub(started.elapsed() + drift);
            if votes >= quorum && validity.is_some() {
                let (nodes_k, k, v) = (nodes.clone(), key.to_string(), value.clone());
                let keeper = Keeper::spawn(ttl, started, move || {
                    let (nodes, k, v) = (nodes_k.clone(), k.clone(), v.clone());
                    async move {
                        let ok = on_all(&nodes, |n| {
                            let (k, v) = (k.clone(), v.clone());
                            async move { n.renew(&k, &v, ttl).await }
                        })
                        .await;
                        if ok >= quorum {
                            Ok(())
                        } else {
                            Err(RenewError::Transient(format!(
                                "only {ok} of {} nodes extended the lock",
                                nodes.len()
                            )))
                        }
                    }
                });
                return Ok(Acquired {
                    fence: None,
                    checkpoint: None,
                    liveness: keeper.liveness().clone(),
                    hold: Box::new(RedlockHold {
                        nodes: nodes.clone(),
                        key: key.to_string(),
                        value,
                        keeper,
                    }),
                });
            }
            // Undo the partial grant everywhere before trying again.
            on_all(&nodes, |n| {
                let (key, value) = (key.to_string(), value.clone());
                async move { n.release_value(&key, &value).await }
            })
            .await;
            if votes < quorum && nodes.len() < quorum {
                return Err(Error::Unavailable(format!(
                    "only {} of {} Redlock nodes are reachable; {quorum} are needed",
                    nodes.len(),
                    self.urls.len()
                )));
            }
            if wait.is_none() {
                return Err(Error::Held {
                    key: key.to_string(),
                    holder: format!(
                        "another client ({votes} of {} nodes granted this one)",
                        self.urls.len()
                    ),
                    fence: None,
                });
            }
            if !backoff(&mut attempt, give_up).await {
                return Err(Error::Timeout {
                    key: key.to_string(),
                });
            }
        }
    }
}

struct RedlockHold {
    nodes: Vec<Node>,
    key: String,
    value: String,
    keeper: Keeper,
}

#[async_trait::async_trait]
impl Hold for RedlockHold {
    async fn release(self: Box<Self>) -> Result<()> {
        self.keeper.stop().await;
        on_all(&self.nodes, |n| {
            let (key, value) = (self.key.clone(), self.value.clone());
            async move { n.release_value(&key, &value).await }
        })
        .await;
        Ok(())
    }
}
