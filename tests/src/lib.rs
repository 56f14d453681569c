//! Support for Tessera's end-to-end tests: they start the real `tessera-launcher` (which
//! starts `tessera-shard` and `tessera-router`) on a free port of 127.0.0.1 and talk HTTP to
//! it.
//!
//! - [`Server`] starts a launcher, waits for `/health`, and kills everything it started when
//!   dropped (also when the test panics). The launcher also gets a parent-death signal, so
//!   it cannot outlive the test thread that started it.
//! - [`binary`] finds the binaries next to the test executable (`target/<profile>/`) and
//!   fails clearly when one is missing or older than its sources.
//! - [`Sse`] reads server-sent events; [`within`] bounds every wait; [`Checks`] runs several
//!   independent checks against one server and reports every failure.

mod binaries;
mod byte_level;
mod checks;
mod process;
mod requests;
mod rng;
mod server;
mod sse;

use std::future::Future;
use std::time::Duration;

pub use binaries::{binary, binary_dir, fixture, fixture_json, golden, workspace_root};
pub use byte_level::ByteLevelDecoder;
pub use checks::Checks;
pub use process::{
    Paused, alive, children_of, comm, descendants_of, rss_kib, signal, wait_all_dead,
};
pub use requests::{client, detail_ids, metric_value, read_json, u64s};
pub use rng::TestRng;
pub use server::{Server, free_port};
pub use sse::{Sse, SseItem};

/// Timeout of every HTTP request a test sends (unless it sets its own).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a launcher may take to become healthy.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);

/// Awaits `fut` for at most `limit`; panics naming `what` when it takes longer.
pub async fn within<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}
