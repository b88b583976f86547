//! The Rust examples of `README.md` and `docs/*.md`, compiled.
//!
//! `build.rs` turns every ```rust block of those pages into the body of an
//! async function here, so an example that no longer compiles (a renamed
//! method, a `?` where none can go) fails the build instead of a reader.
//! The pages may use what [`prelude`] defines without showing it: a client
//! called `locks`, and the resource they write to.

/// What the pages' examples use without defining it.
pub mod prelude {
    pub use futures::StreamExt;
    pub use leasehold::{Client, LockOptions};

    /// A write to the protected resource.
    pub struct Entry;

    /// The writes to make.
    pub fn entries() -> Vec<Entry> {
        vec![Entry]
    }

    /// The resource: it admits a write only with a token at least the
    /// highest it has seen.
    pub struct Ledger;

    impl Ledger {
        /// Writes `entry`, fenced by `fence`.
        pub async fn write(&self, entry: Entry, fence: leasehold::Fence) -> anyhow::Result<()> {
            let _ = (entry, fence);
            Ok(())
        }
    }

    /// Moves money between two accounts, fenced by `fence`.
    pub async fn transfer(from: u32, to: u32, fence: leasehold::Fence) -> anyhow::Result<()> {
        let _ = (from, to, fence);
        Ok(())
    }

    /// Does the leader's work, fenced by `fence`.
    pub async fn write_as_leader(fence: leasehold::Fence) {
        let _ = fence;
    }
}

include!(concat!(env!("OUT_DIR"), "/examples.rs"));
