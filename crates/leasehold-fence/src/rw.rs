//! A gate for a resource behind a read/write lock.

use std::future::Future;

use crate::{Fence, FenceGate, GateError};

/// Tells whether `fence` holds `key` as its writer right now (an exclusive
/// hold; not a reader's, not a semaphore permit, not ended). With the
/// `leasehold` client: `client.is_writer(key, fence)`.
#[async_trait::async_trait]
pub trait WriterCheck: Send + Sync {
    /// Whether `fence` is the writer's token of `key`.
    async fn is_writer(&self, key: &str, fence: Fence) -> Result<bool, GateError>;
}

#[async_trait::async_trait]
impl<F, Fut> WriterCheck for F
where
    F: Fn(String, Fence) -> Fut + Send + Sync,
    Fut: Future<Output = Result<bool, GateError>> + Send,
{
    async fn is_writer(&self, key: &str, fence: Fence) -> Result<bool, GateError> {
        self(key.to_string(), fence).await
    }
}

/// Admits a write only with the writer's token of a read/write lock, and
/// only in order: readers hold tokens too (each its own, from the same
/// sequence), so the order alone would let a reader's newer token write.
/// The writer check asks the lock service; then the inner gate refuses a
/// token lower than one it admitted before (a writer paused past its lease).
pub struct ReadWriteGate<G, C> {
    gate: G,
    check: C,
}

impl<G: FenceGate, C: WriterCheck> ReadWriteGate<G, C> {
    /// `gate` keeps the order; `check` tells a writer's token from a reader's.
    pub fn new(gate: G, check: C) -> Self {
        ReadWriteGate { gate, check }
    }

    /// Admits a write to `resource` with `fence`, which must hold `key` as
    /// its writer now and be at least every token admitted before.
    pub async fn admit_write(
        &self,
        resource: &str,
        key: &str,
        fence: Fence,
    ) -> Result<(), GateError> {
        if !self.check.is_writer(key, fence).await? {
            return Err(GateError::NotWriter {
                resource: resource.to_string(),
                key: key.to_string(),
                fence,
            });
        }
        self.gate.admit(resource, fence).await
    }

    /// The inner gate.
    pub fn gate(&self) -> &G {
        &self.gate
    }
}
