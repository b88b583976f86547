//! Redis: one Lua script checks and raises the resource's highest token and
//! performs the write, so nothing can land between the check and the write.

use redis::aio::MultiplexedConnection;
use redis::Script;

use crate::{Fence, FenceGate, GateError, Stale};

const HASH: &str = "leasehold:fences";

/// Checks, raises, then runs the write given as a command name and arguments.
/// Returns -1 when admitted, otherwise the highest token.
const ADMIT_AND_WRITE: &str = r"
local highest = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local fence = tonumber(ARGV[2])
if fence < highest then return highest end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if #KEYS > 1 then
  local args = {}
  for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
  redis.call(ARGV[3], KEYS[2], unpack(args))
end
return -1
";

/// A fence gate in Redis.
pub struct RedisGate {
    conn: MultiplexedConnection,
}

fn store(e: redis::RedisError) -> GateError {
    GateError::Store(e.to_string())
}

impl RedisGate {
    /// A gate over a connection.
    pub fn new(conn: MultiplexedConnection) -> Self {
        RedisGate { conn }
    }

    /// Connects to `redis://…`.
    pub async fn connect(url: &str) -> Result<Self, GateError> {
        let client = redis::Client::open(url).map_err(store)?;
        Ok(Self::new(
            client
                .get_multiplexed_async_connection()
                .await
                .map_err(store)?,
        ))
    }

    /// Admits `fence` for `resource` and, in the same atomic step, runs
    /// `command key args...` (e.g. `SET ledger 130` or `HSET account:7 balance 130`).
    pub async fn admit_and_write(
        &self,
        resource: &str,
        fence: Fence,
        command: &str,
        key: &str,
        args: &[&str],
    ) -> Result<(), GateError> {
        let script = Script::new(ADMIT_AND_WRITE);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(HASH)
            .key(key)
            .arg(resource)
            .arg(fence)
            .arg(command);
        for a in args {
            invocation.arg(*a);
        }
        let answer: i64 = invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(store)?;
        self.answer(resource, fence, answer)
    }

    fn answer(&self, resource: &str, fence: Fence, answer: i64) -> Result<(), GateError> {
        if answer < 0 {
            Ok(())
        } else {
            Err(Stale {
                resource: resource.to_string(),
                presented: fence,
                highest: answer as Fence,
            }
            .into())
        }
    }
}

#[async_trait::async_trait]
impl FenceGate for RedisGate {
    async fn admit(&self, resource: &str, fence: Fence) -> Result<(), GateError> {
        let answer: i64 = Script::new(ADMIT_AND_WRITE)
            .key(HASH)
            .arg(resource)
            .arg(fence)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(store)?;
        self.answer(resource, fence, answer)
    }

    async fn highest(&self, resource: &str) -> Result<Fence, GateError> {
        let v: Option<u64> = redis::cmd("HGET")
            .arg(HASH)
            .arg(resource)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(store)?;
        Ok(v.unwrap_or(0))
    }
}
