//! A cluster of real `leaseholdd` processes on one machine: free ports, a
//! data dir each, killed when dropped.
//!
//! [`Cluster::start_isolatable`] puts node N on its own loopback address,
//! 127.0.0.(N+1), behind a [`FaultProxy`] on that address: the members know
//! each other by the proxies' addresses, and a node connects to its peers
//! from its own address, so a proxy can refuse one node's traffic to
//! another, or clients' (from 127.0.0.1), and partitions are real lost
//! connections.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{free_port, http_get, wait_until, workspace_bin, FaultProxy, Process};

/// One node of a [`Cluster`].
pub struct ClusterNode {
    /// Its id.
    pub id: u64,
    /// Where it listens: `127.0.0.1:PORT`, or its own 127.0.0.N when isolatable.
    pub addr: String,
    /// The address the members know it by: `addr`, or its proxy's.
    pub advertised: String,
    /// The proxy in front of it, when isolatable.
    pub proxy: Option<FaultProxy>,
    /// The process; `None` while stopped.
    pub process: Option<Process>,
    args: Vec<String>,
    data: PathBuf,
    log: PathBuf,
}

impl ClusterNode {
    /// Its data dir.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on and connects from.
    pub fn ip(&self) -> IpAddr {
        self.addr
            .rsplit_once(':')
            .and_then(|(ip, _)| ip.parse().ok())
            .unwrap_or(IpAddr::from([127, 0, 0, 1]))
    }

    /// What `/health` says, if it answers.
    pub fn health(&self) -> Option<String> {
        self.process.as_ref()?;
        http_get(&self.addr, "/health")
    }

    /// Whether it leads and serves.
    pub fn leads(&self) -> bool {
        self.health().is_some_and(|h| h.contains("\"leader\":true"))
    }

    /// What it logged so far, over all its runs.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn start(&mut self) {
        self.process = Some(Process::spawn(
            &workspace_bin("leaseholdd"),
            &self.args,
            &self.log,
        ));
    }
}

/// Nodes 1..=n forming one group.
pub struct Cluster {
    /// The nodes, node `i + 1` at index `i`.
    pub nodes: Vec<ClusterNode>,
    peers: Vec<(u64, String)>,
    dir: tempfile::TempDir,
    /// Extra flags for node `id`.
    extra: Box<dyn Fn(u64) -> Vec<String>>,
}

impl Cluster {
    /// Starts `n` nodes and waits until one leads and every one answers.
    pub fn start(n: usize) -> Cluster {
        Self::start_with(n, &[])
    }

    /// Starts `n` nodes with extra flags each and waits until one leads.
    pub fn start_with(n: usize, extra: &[&str]) -> Cluster {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::launch(n, Box::new(move |_| extra.clone()), false)
    }

    /// Starts `n` nodes, node `id` with the flags `extra(id)` (its own
    /// certificate, say), and waits until one leads.
    pub fn start_each(n: usize, extra: impl Fn(u64) -> Vec<String> + 'static) -> Cluster {
        let cluster = Self::spawn_each(n, extra);
        cluster.wait_leader();
        cluster
    }

    /// Starts `n` nodes as [`Self::start_each`] does, without waiting for a
    /// leader (for nodes that do not answer plain HTTP, with TLS for clients).
    pub fn spawn_each(n: usize, extra: impl Fn(u64) -> Vec<String> + 'static) -> Cluster {
        Self::spawn(n, Box::new(extra), false)
    }

    /// Starts `n` nodes, each on its own 127.0.0.N behind a proxy (see the
    /// module doc), and waits until one leads.
    pub fn start_isolatable(n: usize) -> Cluster {
        Self::launch(n, Box::new(|_| Vec::new()), true)
    }

    /// Starts `n` nodes on data dirs that `prepare(id, data_dir, peers)`
    /// builds first (a restore, say; `peers` is the `--peers` value), and
    /// waits until one leads and every one answers.
    pub fn start_prepared(n: usize, prepare: impl Fn(u64, &Path, &str)) -> Cluster {
        let cluster = Self::spawn_prepared(n, Box::new(|_| Vec::new()), false, &prepare);
        cluster.wait_leader();
        wait_until(Duration::from_secs(30), "every node answering", || {
            cluster.nodes.iter().all(|n| n.health().is_some())
        });
        cluster
    }

    fn launch(n: usize, extra: Box<dyn Fn(u64) -> Vec<String>>, isolatable: bool) -> Cluster {
        let cluster = Self::spawn(n, extra, isolatable);
        cluster.wait_leader();
        // Two nodes elect a leader; a test that talks to each node needs
        // the third one listening too (on a loaded machine it can be late).
        wait_until(Duration::from_secs(30), "every node answering", || {
            cluster.nodes.iter().all(|n| n.health().is_some())
        });
        cluster
    }

    fn spawn(n: usize, extra: Box<dyn Fn(u64) -> Vec<String>>, isolatable: bool) -> Cluster {
        Self::spawn_prepared(n, extra, isolatable, &|_, _, _| {})
    }

    fn spawn_prepared(
        n: usize,
        extra: Box<dyn Fn(u64) -> Vec<String>>,
        isolatable: bool,
        prepare: &dyn Fn(u64, &Path, &str),
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ip = |id: u64| {
            if isolatable {
                format!("127.0.0.{}", id + 1)
            } else {
                "127.0.0.1".to_string()
            }
        };
        let listen: Vec<(u64, String)> = (1..=n as u64)
            .map(|id| (id, format!("{}:{}", ip(id), free_port())))
            .collect();
        let proxies: Vec<Option<FaultProxy>> = listen
            .iter()
            .map(|(id, addr)| {
                isolatable
                    .then(|| FaultProxy::start_on(&format!("{}:{}", ip(*id), free_port()), addr))
            })
            .collect();
        let peers: Vec<(u64, String)> = listen
            .iter()
            .zip(&proxies)
            .map(|((id, addr), proxy)| {
                (*id, proxy.as_ref().map_or(addr.clone(), |p| p.addr.clone()))
            })
            .collect();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            peers: peers.clone(),
            dir,
            extra,
        };
        for (((id, addr), proxy), (_, advertised)) in listen.into_iter().zip(proxies).zip(peers) {
            let mut node = cluster.node(id, addr, &cluster.peers_arg());
            node.advertised = advertised;
            node.proxy = proxy;
            cluster.nodes.push(node);
        }
        let peers = cluster.peers_arg();
        for node in &mut cluster.nodes {
            prepare(node.id, &node.data, &peers);
            node.start();
        }
        cluster
    }

    fn node(&self, id: u64, addr: String, peers: &str) -> ClusterNode {
        let data = self.dir.path().join(format!("node-{id}"));
        let mut args = vec![
            "--node-id".to_string(),
            id.to_string(),
            "--listen".to_string(),
            addr.clone(),
            "--peers".to_string(),
            peers.to_string(),
            "--data-dir".to_string(),
            data.display().to_string(),
        ];
        args.extend((self.extra)(id));
        ClusterNode {
            id,
            advertised: addr.clone(),
            addr,
            proxy: None,
            process: None,
            args,
            log: self.dir.path().join(format!("node-{id}.log")),
            data,
        }
    }

    /// `1=127.0.0.1:P1,2=...`: the initial voters.
    pub fn peers_arg(&self) -> String {
        self.peers
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `http://127.0.0.1:P1,127.0.0.1:P2,...`: every node, for a client.
    pub fn endpoints(&self) -> String {
        let addrs: Vec<&str> = self.nodes.iter().map(|n| n.addr.as_str()).collect();
        format!("http://{}", addrs.join(","))
    }

    /// Every node, for a client, with node `first` first and the rest in
    /// order after it: a client given these talks to `first` until it fails.
    pub fn endpoints_from(&self, first: usize) -> String {
        let n = self.nodes.len();
        let addrs: Vec<&str> = (0..n)
            .map(|i| self.nodes[(first + i) % n].addr.as_str())
            .collect();
        format!("http://{}", addrs.join(","))
    }

    /// The index of the node that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(ClusterNode::leads)
    }

    /// Waits until a node leads; its index.
    pub fn wait_leader(&self) -> usize {
        let mut found = None;
        wait_until(Duration::from_secs(20), "a leader", || {
            found = self.leader();
            found.is_some()
        });
        found.unwrap_or(0)
    }

    /// Cuts node `i` (of an isolatable cluster) off from the other nodes,
    /// both ways; clients still reach every node.
    pub fn isolate(&self, i: usize) {
        for (_, other) in self.nodes.iter().enumerate().filter(|(j, _)| *j != i) {
            if let Some(p) = &self.nodes[i].proxy {
                p.block_from(other.ip());
            }
            if let Some(p) = &other.proxy {
                p.block_from(self.nodes[i].ip());
            }
        }
    }

    /// Ends every cut made by [`Cluster::isolate`].
    pub fn heal(&self) {
        for p in self.nodes.iter().filter_map(|n| n.proxy.as_ref()) {
            p.allow_all();
        }
    }

    /// `kill -9` node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.nodes[i].process.take() {
            p.kill9();
        }
    }

    /// Starts node `i` again on its data dir.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.nodes[i].start();
    }

    /// Kills node `i`, deletes its data dir, and starts it empty.
    pub fn wipe(&mut self, i: usize) {
        self.kill(i);
        let _ = std::fs::remove_dir_all(&self.nodes[i].data);
        self.nodes[i].start();
    }

    /// Starts node `id`, outside the initial voters, to be added with
    /// `cluster add`; its index.
    pub fn start_new_node(&mut self, id: u64) -> usize {
        let addr = format!("127.0.0.1:{}", free_port());
        let peers = format!("{},{id}={addr}", self.peers_arg());
        let mut node = self.node(id, addr, &peers);
        node.start();
        self.nodes.push(node);
        self.nodes.len() - 1
    }
}
