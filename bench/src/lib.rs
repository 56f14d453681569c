//! `tessera-bench`: measures the speed and latency of any OpenAI-compatible server
//! (Tessera, TGI, vLLM, SGLang, llama.cpp's server) with streaming requests.
//!
//! - [`prompts`] builds the requests: synthetic prompts of exact token lengths, or a
//!   JSONL/ShareGPT dataset.
//! - [`client`] sends one streaming request and measures it ([`sse`] parses the stream);
//!   every failure is kept in the [`RequestRecord`], classified by [`ErrorKind`].
//! - [`runner`] releases requests (all at once, Poisson/gamma arrivals, a concurrency cap).
//! - [`stats`] turns records into [`RunMetrics`] (pure and unit-tested).
//! - [`report`] writes tables, the JSON report and comparisons; [`plot`] the SVG.
//!
//! ```
//! use tessera_bench::{RunMetrics, stats::percentile};
//! assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), Some(2.5));
//! let m = RunMetrics::compute(&[], 1.0);
//! assert_eq!((m.completed, m.failed), (0, 0));
//! ```
#![deny(missing_docs)]

pub mod client;
mod error;
pub mod plot;
pub mod prompts;
pub mod record;
pub mod report;
pub mod runner;
pub mod sse;
pub mod stats;

pub use client::{Endpoint, RequestSpec, Target};
pub use error::BenchError;
pub use record::{ErrorKind, RequestError, RequestRecord, Usage};
pub use report::{BenchReport, ReportConfig, RunReport};
pub use runner::LoadPlan;
pub use stats::{RunMetrics, Summary};
