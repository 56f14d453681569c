//! The end-to-end tests, one module per area, in one test binary: each binary links the whole
//! workspace, so one binary per area would relink them all after any change.

mod agents;
mod anthropic;
mod api;
mod cancel;
mod code_shape;
mod deadline;
mod errors;
mod faults;
mod fuzz_corpus;
mod golden;
mod harmony;
mod hub;
mod lifecycle;
mod metrics_dashboard;
mod metrics_scrape;
mod metrics_support;
mod metrics_tracing;
mod pooling;
mod scheduling;
mod soak;
mod tensor_parallel;
mod tokenizer_source;

/// Held by each test that runs the router in this process. Its metrics recorder is global,
/// and `cargo test` runs the tests on threads of one process: without this, another
/// in-process router's requests would land in the counts `metrics_scrape` checks.
static IN_PROCESS_ROUTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
