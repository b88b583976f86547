//! What a node's parts share besides consensus: its metrics, and the
//! callers' tokens as of the last auth change.
//!
//! The state machine writes to it as it applies ([`NodeContext::applied`]:
//! lock events counted, the auth version moved, auth changes logged), the
//! service reads and counts calls through it, and the connections count
//! themselves in it. It knows nothing of consensus: `/metrics` is rendered
//! from values the API reads off the node ([`crate::metrics::Gauges`]).

use leasehold_core::Event;

use std::sync::Arc;

use crate::admission::Admission;
use crate::auth_cache::AuthCache;
use crate::metrics::Metrics;
use crate::raft::storage::cluster_id::ClusterId;

/// The metrics and the auth cache of one node.
#[derive(Default)]
pub struct NodeContext {
    /// What `/metrics` exports.
    pub metrics: Metrics,
    /// Callers' tokens as of the last auth change.
    pub auth: AuthCache,
    /// Quotas and rate limits on what callers create.
    pub admission: Admission,
    /// The cluster this node belongs to, checked on every Raft call.
    pub cluster: Arc<ClusterId>,
}

impl NodeContext {
    /// Called by the state machine with the events of one applied entry.
    pub fn applied(&self, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        self.metrics.events(events);
        for event in events {
            if let Event::AuthChanged { audit } = event {
                self.auth.changed();
                tracing::info!(
                    target: "leasehold::audit",
                    seq = audit.seq,
                    at_unix_ms = audit.at_unix_ms,
                    who = %audit.who,
                    "{}",
                    audit.what
                );
            }
        }
    }
}
