//! Input limits, checked at the edge and again inside `apply`.

use crate::LockError;

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// Longest holder name, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;
/// Shortest lease TTL, in milliseconds.
pub const MIN_TTL_MS: u64 = 10;
/// Longest lease TTL, in milliseconds (24 hours).
pub const MAX_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Longest lock-delay, in milliseconds (60 seconds).
pub const MAX_LOCK_DELAY_MS: u64 = 60 * 1000;
/// Longest wait in a key's queue, in milliseconds (1 hour).
pub const MAX_WAIT_MS: u64 = 60 * 60 * 1000;
/// Longest client-certificate subject kept in the audit trail, in bytes;
/// a longer one is cut (at a character boundary) and marked with `…`.
pub const MAX_SUBJECT_LEN: usize = 256;
/// Largest checkpoint, in bytes (64 KiB).
pub const MAX_CHECKPOINT_LEN: usize = 64 * 1024;
/// Most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 10_000;
/// Most keys in one lock set.
pub const MAX_SET_KEYS: usize = 64;
/// Most leases renewed by one call (`KeepAliveMany`).
pub const MAX_RENEWALS_PER_CALL: usize = 4096;

/// Checks a lock key: 1..=512 bytes of UTF-8 with no control characters.
pub fn validate_key(key: &str) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::invalid("key", "must not be empty"));
    }
    validate_text("key", key, MAX_KEY_LEN)
}

/// Checks an acquire's mode: a semaphore has 1 ..= [`MAX_PERMITS`] permits.
pub fn validate_mode(mode: crate::Mode) -> Result<(), LockError> {
    match mode.permits() {
        Some(n) if n == 0 || n > MAX_PERMITS => Err(LockError::invalid(
            "permits",
            format!("is {n}; a semaphore has 1 ..= {MAX_PERMITS} permits"),
        )),
        _ => Ok(()),
    }
}

/// Checks a lock set's keys; answers them sorted, each once.
pub fn validate_set(keys: &[String]) -> Result<Vec<String>, LockError> {
    if keys.is_empty() || keys.len() > MAX_SET_KEYS {
        return Err(LockError::invalid(
            "keys",
            format!("has {}; a set has 1 ..= {MAX_SET_KEYS} keys", keys.len()),
        ));
    }
    for key in keys {
        validate_key(key)?;
    }
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

/// Text of at most `max` bytes with no control characters.
fn validate_text(field: &'static str, text: &str, max: usize) -> Result<(), LockError> {
    if text.len() > max {
        return Err(LockError::invalid(
            field,
            format!("is {} bytes; the limit is {max}", text.len()),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(LockError::invalid(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// Checks a key prefix (of a list, a watch or a role's rule): like a key,
/// but it may be empty (every key).
pub fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    validate_text("prefix", prefix, MAX_KEY_LEN)
}

/// Checks a lease TTL in milliseconds.
pub fn validate_ttl(ttl_ms: u64) -> Result<(), LockError> {
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&ttl_ms) {
        return Err(LockError::invalid(
            "ttl_ms",
            format!("is {ttl_ms}; it must be between {MIN_TTL_MS} and {MAX_TTL_MS} ms"),
        ));
    }
    Ok(())
}

/// Checks a holder name: at most 256 bytes, no control characters.
pub fn validate_holder(holder: &str) -> Result<(), LockError> {
    validate_text("holder", holder, MAX_HOLDER_LEN)
}

/// Checks an acquire's wait and lock-delay.
pub fn validate_wait(wait_ms: u64, lock_delay_ms: u64) -> Result<(), LockError> {
    if wait_ms > MAX_WAIT_MS {
        return Err(LockError::invalid(
            "wait_ms",
            format!("is {wait_ms}; the limit is {MAX_WAIT_MS} ms"),
        ));
    }
    if lock_delay_ms > MAX_LOCK_DELAY_MS {
        return Err(LockError::invalid(
            "lock_delay_ms",
            format!("is {lock_delay_ms}; the limit is {MAX_LOCK_DELAY_MS} ms"),
        ));
    }
    Ok(())
}

/// Checks a checkpoint's size.
pub fn validate_checkpoint(data: &[u8]) -> Result<(), LockError> {
    if data.len() > MAX_CHECKPOINT_LEN {
        return Err(LockError::invalid(
            "checkpoint",
            format!("is {} bytes; the limit is {MAX_CHECKPOINT_LEN}", data.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_at_and_past_the_limit() {
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
        assert!(validate_key("").is_err());
        assert!(validate_key("a\nb").is_err());
        assert!(validate_key("orders/42 ünïcode").is_ok());
    }

    #[test]
    fn ttl_bounds() {
        assert!(validate_ttl(0).is_err());
        assert!(validate_ttl(MIN_TTL_MS).is_ok());
        assert!(validate_ttl(MAX_TTL_MS).is_ok());
        assert!(validate_ttl(MAX_TTL_MS + 1).is_err());
    }
}
