//! Logs and traces of a Tessera process, set up the same way in the router and the shards:
//! [`init`] installs the `tracing` subscriber (`RUST_LOG` filter, text or JSON lines) and, given
//! an OTLP endpoint, a layer that exports spans over OTLP/gRPC; [`set_remote_parent`] and
//! [`inject_current`] carry a trace across processes as W3C `traceparent` headers.
//!
//! ```
//! use tessera_telemetry::{Process, TelemetryConfig};
//! let config = TelemetryConfig { service_name: "tessera-router".into(), ..Default::default() };
//! let telemetry = tessera_telemetry::init(&config, Process::Router)?;
//! tracing::info!("no endpoint: logs only, no span export");
//! telemetry.flush();
//! # Ok::<(), tessera_telemetry::TelemetryError>(())
//! ```
#![deny(missing_docs)]

mod propagation;
mod subscriber;

pub use propagation::{inject_current, set_remote_parent};
pub use subscriber::{Process, Telemetry, TelemetryConfig, TelemetryError, init};
