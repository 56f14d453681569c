//! Results: the JSON report, the terminal tables, and the side-by-side comparison.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::client::Endpoint;
use crate::error::BenchError;
use crate::record::RequestRecord;
use crate::runner::LoadPlan;
use crate::stats::{RunMetrics, Summary};

/// The settings a report was produced with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportConfig {
    /// Server base URL.
    pub url: String,
    /// `model` sent.
    pub model: String,
    /// Route.
    pub endpoint: Endpoint,
    /// Requests per run.
    pub num_requests: usize,
    /// Synthetic prompt length (tokens), if synthetic.
    pub input_len: Option<usize>,
    /// Output length asked (tokens), if fixed.
    pub output_len: Option<u32>,
    /// Spread of synthetic lengths.
    pub range_ratio: f64,
    /// Dataset file, if any.
    pub dataset: Option<String>,
    /// Tokenizer used, if any.
    pub tokenizer: Option<String>,
    /// Seed of prompts and arrivals.
    pub seed: u64,
    /// Warm-up requests sent before measuring.
    pub warmup: usize,
    /// Whether `ignore_eos` was sent.
    pub ignore_eos: bool,
    /// Sampling temperature.
    pub temperature: f32,
}

/// One run (one concurrency level of a sweep).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Short name: `c=4`, `rate=2`, `unbounded`.
    pub label: String,
    /// How requests were released.
    pub plan: LoadPlan,
    /// The statistics.
    pub metrics: RunMetrics,
    /// Every request's measurements.
    pub requests: Vec<RequestRecord>,
}

/// Everything `--json` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// `tessera-bench <version>`.
    pub tool: String,
    /// Unix time the benchmark started.
    pub started_at_unix: u64,
    /// The settings.
    pub config: ReportConfig,
    /// One run, or one per sweep level.
    pub runs: Vec<RunReport>,
}

impl BenchReport {
    /// Reads a report written by `--json`.
    pub fn load(path: &Path) -> Result<Self, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        serde_json::from_str(&text).map_err(|e| BenchError::Report {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Writes the report as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<(), BenchError> {
        // Our own types serialize without error (string keys, finite floats or null).
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        std::fs::write(path, text).map_err(|e| BenchError::Io {
            path: path.to_path_buf(),
            source: e,
        })
    }
}

/// The label of a plan: `c=4`, `rate=2`, `c=4 rate=2`, or `unbounded`.
pub fn plan_label(plan: &LoadPlan) -> String {
    let mut parts = Vec::new();
    if let Some(c) = plan.concurrency {
        parts.push(format!("c={c}"));
    }
    if let Some(r) = plan.request_rate {
        parts.push(format!("rate={r}"));
    }
    if parts.is_empty() {
        "unbounded".into()
    } else {
        parts.join(" ")
    }
}

fn errors_line(m: &RunMetrics) -> String {
    if m.errors.is_empty() {
        return "none".into();
    }
    m.errors
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn cell(s: Option<&Summary>, f: fn(&Summary) -> f64) -> String {
    s.map_or_else(|| "-".into(), |s| format!("{:.2}", f(s)))
}

/// The table of one run: counts, throughputs, and mean/median/p90/p99 of each latency.
pub fn render_run(run: &RunReport) -> String {
    let m = &run.metrics;
    let mut out = String::new();
    let _ = writeln!(out, "=========== tessera-bench: {} ===========", run.label);
    let rows: [(&str, String); 10] = [
        ("Successful requests", m.completed.to_string()),
        ("Failed requests", m.failed.to_string()),
        ("Errors by kind", errors_line(m)),
        ("Benchmark duration (s)", format!("{:.2}", m.duration_s)),
        ("Total input tokens", m.total_input_tokens.to_string()),
        ("Total output tokens", m.total_output_tokens.to_string()),
        ("Streams without usage", m.usage_missing.to_string()),
        (
            "Request throughput (req/s)",
            format!("{:.2}", m.request_throughput),
        ),
        (
            "Output token throughput (tok/s)",
            format!("{:.2}", m.output_throughput),
        ),
        (
            "Total token throughput (tok/s)",
            format!("{:.2}", m.total_token_throughput),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<34}{v}");
    }
    let _ = writeln!(
        out,
        "{:<10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "(ms)", "mean", "median", "p90", "p99", "n"
    );
    for (name, s) in [
        ("TTFT", &m.ttft_ms),
        ("TPOT", &m.tpot_ms),
        ("ITL", &m.itl_ms),
        ("E2E", &m.e2e_ms),
    ] {
        let s = s.as_ref();
        let _ = writeln!(
            out,
            "{name:<10}{:>10}{:>10}{:>10}{:>10}{:>10}",
            cell(s, |s| s.mean),
            cell(s, |s| s.median),
            cell(s, |s| s.p90),
            cell(s, |s| s.p99),
            s.map_or(0, |s| s.count)
        );
    }
    out
}

/// One line per run: the throughput-versus-latency curve of a sweep.
pub fn render_sweep(runs: &[RunReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12}{:>6}{:>6}{:>9}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "level",
        "ok",
        "err",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "ITL p50",
        "E2E p50",
        "E2E p99"
    );
    for run in runs {
        let m = &run.metrics;
        let _ = writeln!(
            out,
            "{:<12}{:>6}{:>6}{:>9.2}{:>10.1}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
            run.label,
            m.completed,
            m.failed,
            m.request_throughput,
            m.output_throughput,
            cell(m.ttft_ms.as_ref(), |s| s.median),
            cell(m.ttft_ms.as_ref(), |s| s.p99),
            cell(m.tpot_ms.as_ref(), |s| s.median),
            cell(m.tpot_ms.as_ref(), |s| s.p99),
            cell(m.itl_ms.as_ref(), |s| s.median),
            cell(m.e2e_ms.as_ref(), |s| s.median),
            cell(m.e2e_ms.as_ref(), |s| s.p99),
        );
    }
    let _ = writeln!(out, "(latencies in ms)");
    out
}

/// The figures compared by `--compare`, with whether higher is better.
fn figures(m: &RunMetrics) -> Vec<(String, Option<f64>, bool)> {
    let mut rows = vec![
        ("completed".to_string(), Some(m.completed as f64), true),
        ("failed".to_string(), Some(m.failed as f64), false),
        ("req/s".to_string(), Some(m.request_throughput), true),
        ("output tok/s".to_string(), Some(m.output_throughput), true),
        (
            "total tok/s".to_string(),
            Some(m.total_token_throughput),
            true,
        ),
    ];
    for (name, s) in [
        ("TTFT", &m.ttft_ms),
        ("TPOT", &m.tpot_ms),
        ("ITL", &m.itl_ms),
        ("E2E", &m.e2e_ms),
    ] {
        for (stat, f) in [
            ("mean", (|s: &Summary| s.mean) as fn(&Summary) -> f64),
            ("median", |s| s.median),
            ("p90", |s| s.p90),
            ("p99", |s| s.p99),
        ] {
            rows.push((format!("{name} {stat} (ms)"), s.as_ref().map(f), false));
        }
    }
    rows
}

/// Two reports side by side, run by run (paired in order), with B/A ratios. A `*` marks
/// ratios where B is better.
pub fn render_compare(a: &BenchReport, b: &BenchReport, a_name: &str, b_name: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A = {a_name} ({} {})", a.config.url, a.config.model);
    let _ = writeln!(out, "B = {b_name} ({} {})", b.config.url, b.config.model);
    if a.runs.len() != b.runs.len() {
        let _ = writeln!(
            out,
            "note: A has {} run(s), B has {}; comparing the first {}",
            a.runs.len(),
            b.runs.len(),
            a.runs.len().min(b.runs.len())
        );
    }
    for (ra, rb) in a.runs.iter().zip(&b.runs) {
        let _ = writeln!(out, "\n--- A {} vs B {} ---", ra.label, rb.label);
        let _ = writeln!(out, "{:<20}{:>12}{:>12}{:>10}", "", "A", "B", "B/A");
        for ((name, va, higher_better), (_, vb, _)) in
            figures(&ra.metrics).into_iter().zip(figures(&rb.metrics))
        {
            let show = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
            let ratio = match (va, vb) {
                (Some(x), Some(y)) if x != 0.0 => {
                    let better = if higher_better { y > x } else { y < x };
                    format!("{:.3}{}", y / x, if better { "*" } else { " " })
                }
                _ => "-".into(),
            };
            let _ = writeln!(out, "{name:<20}{:>12}{:>12}{ratio:>10}", show(va), show(vb));
        }
    }
    out
}
