//! A gate for one process guarding its own state.

use parking_lot::Mutex;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::{Fence, FenceGate, GateError, Stale};

const SHARDS: usize = 64;

/// In memory, sharded by resource so that writers to different resources do
/// not contend. Safe to share between threads (`Arc<MemoryGate>`).
pub struct MemoryGate {
    shards: Vec<Mutex<HashMap<String, Fence>>>,
}

impl Default for MemoryGate {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryGate {
    /// An empty gate.
    pub fn new() -> Self {
        MemoryGate {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, resource: &str) -> parking_lot::MutexGuard<'_, HashMap<String, Fence>> {
        let mut h = DefaultHasher::new();
        resource.hash(&mut h);
        self.shards[(h.finish() as usize) % SHARDS].lock()
    }

    /// Admits `fence` and runs `write` under the same shard lock, so the write
    /// itself cannot be overtaken by a higher token's write.
    pub fn admit_with<T>(
        &self,
        resource: &str,
        fence: Fence,
        write: impl FnOnce() -> T,
    ) -> Result<T, Stale> {
        let mut shard = self.shard(resource);
        let highest = shard.get(resource).copied().unwrap_or(0);
        if fence < highest {
            return Err(Stale {
                resource: resource.to_string(),
                presented: fence,
                highest,
            });
        }
        shard.insert(resource.to_string(), fence);
        Ok(write())
    }

    /// Admits `fence` now (synchronous).
    pub fn admit_now(&self, resource: &str, fence: Fence) -> Result<(), Stale> {
        self.admit_with(resource, fence, || ())
    }
}

#[async_trait::async_trait]
impl FenceGate for MemoryGate {
    async fn admit(&self, resource: &str, fence: Fence) -> Result<(), GateError> {
        Ok(self.admit_now(resource, fence)?)
    }

    async fn highest(&self, resource: &str) -> Result<Fence, GateError> {
        Ok(self.shard(resource).get(resource).copied().unwrap_or(0))
    }
}
