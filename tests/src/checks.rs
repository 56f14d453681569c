//! [`Checks`]: independent checks against one server, every failure reported.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::FutureExt;

/// Runs independent checks against one server and reports every failure at the end,
/// so one broken route does not hide the others.
#[derive(Debug, Default)]
pub struct Checks {
    failures: Vec<String>,
    passed: Vec<String>,
}

impl Checks {
    /// No checks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `check` (at most `limit`), catching its panic as a failure named `name`.
    pub async fn run(&mut self, name: &str, limit: Duration, check: impl Future<Output = ()>) {
        let started = Instant::now();
        let outcome = std::panic::AssertUnwindSafe(tokio::time::timeout(limit, check))
            .catch_unwind()
            .await;
        let elapsed = started.elapsed();
        match outcome {
            Ok(Ok(())) => {
                eprintln!("check {name}: ok ({elapsed:.2?})");
                self.passed.push(name.to_owned());
            }
            Ok(Err(_)) => {
                eprintln!("check {name}: TIMED OUT after {limit:?}");
                self.failures
                    .push(format!("{name}: timed out after {limit:?}"));
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panicked".to_owned());
                eprintln!("check {name}: FAILED ({elapsed:.2?})");
                self.failures.push(format!("{name}: {message}"));
            }
        }
    }

    /// Panics listing every failed check.
    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} of {} checks failed:\n\n{}",
            self.failures.len(),
            self.failures.len() + self.passed.len(),
            self.failures.join("\n\n")
        );
    }
}
