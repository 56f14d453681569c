//! Pure statistics over request records: percentiles, per-metric summaries, throughput.
//!
//! Definitions (the same as `vllm bench serve`):
//! - **TTFT**: send to the first chunk carrying generated text.
//! - **ITL**: every gap between successive text chunks, pooled over all requests.
//! - **TPOT**: per request, `(latency - TTFT) / (output_tokens - 1)`, for requests with at
//!   least two output tokens; then summarised over requests.
//! - **E2E latency**: send to the end of the stream.
//! - Throughputs divide totals over successful requests by the run's duration.
//!
//! Percentiles interpolate linearly between closest ranks (numpy's default): the p-th
//! percentile of sorted `x[0..n]` is `x[i] + f (x[i+1] - x[i])` with `i + f = p/100 (n-1)`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;

/// Summary of one metric's samples, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// Smallest sample.
    pub min: f64,
    /// 50th percentile.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// The `p`-th percentile (0..=100) of ascending `sorted` samples, interpolated linearly;
/// `None` when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (p / 100.0).clamp(0.0, 1.0) * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + frac * (sorted[hi] - sorted[lo]))
}

/// Summarises samples given in seconds, reporting milliseconds; `None` when empty.
/// Non-finite samples are ignored.
pub fn summarize_seconds(samples: impl IntoIterator<Item = f64>) -> Option<Summary> {
    let mut ms: Vec<f64> = samples
        .into_iter()
        .filter(|x| x.is_finite())
        .map(|x| x * 1000.0)
        .collect();
    summarize(&mut ms)
}

/// Summarises samples in place (they get sorted); `None` when empty.
pub fn summarize(samples: &mut [f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let var = samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    Some(Summary {
        count: samples.len(),
        mean,
        std: var.sqrt(),
        min: samples[0],
        median: percentile(samples, 50.0)?,
        p90: percentile(samples, 90.0)?,
        p99: percentile(samples, 99.0)?,
        max: samples[samples.len() - 1],
    })
}

/// Everything measured in one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMetrics {
    /// Wall time from the first send to the last completion, in seconds.
    pub duration_s: f64,
    /// Successful requests.
    pub completed: usize,
    /// Failed requests.
    pub failed: usize,
    /// Failed requests by error key (`http_503`, `malformed_chunk`, ...).
    pub errors: BTreeMap<String, usize>,
    /// Prompt tokens of successful requests.
    pub total_input_tokens: u64,
    /// Output tokens of successful requests.
    pub total_output_tokens: u64,
    /// Successful requests whose stream had no `usage` (output counted from chunks).
    pub usage_missing: usize,
    /// Successful requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Prompt plus output tokens per second.
    pub total_token_throughput: f64,
    /// Time to first token (ms).
    pub ttft_ms: Option<Summary>,
    /// Time per output token after the first (ms).
    pub tpot_ms: Option<Summary>,
    /// Inter-token latency (ms), every gap of every request.
    pub itl_ms: Option<Summary>,
    /// End-to-end latency (ms).
    pub e2e_ms: Option<Summary>,
}

impl RunMetrics {
    /// Computes the metrics of `records` over a run of `duration_s` seconds. Statistics
    /// cover successful requests only; failures are counted by kind.
    pub fn compute(records: &[RequestRecord], duration_s: f64) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
        let mut errors = BTreeMap::new();
        for error in records.iter().filter_map(|r| r.error.as_ref()) {
            *errors.entry(error.key()).or_insert(0) += 1;
        }
        let total_input_tokens: u64 = ok.iter().map(|r| r.prompt_tokens()).sum();
        let total_output_tokens: u64 = ok.iter().map(|r| r.output_tokens()).sum();
        let per_second = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        Self {
            duration_s,
            completed: ok.len(),
            failed: records.len() - ok.len(),
            errors,
            total_input_tokens,
            total_output_tokens,
            usage_missing: ok.iter().filter(|r| r.usage.is_none()).count(),
            request_throughput: per_second(ok.len() as f64),
            output_throughput: per_second(total_output_tokens as f64),
            total_token_throughput: per_second((total_input_tokens + total_output_tokens) as f64),
            ttft_ms: summarize_seconds(ok.iter().filter_map(|r| r.ttft_s)),
            tpot_ms: summarize_seconds(ok.iter().filter_map(|r| r.tpot_s())),
            itl_ms: summarize_seconds(ok.iter().flat_map(|r| r.itl_s.iter().copied())),
            e2e_ms: summarize_seconds(ok.iter().map(|r| r.latency_s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ErrorKind, RequestError, Usage};

    fn record(ttft: f64, itl: &[f64], latency: f64, usage: Option<(u64, u64)>) -> RequestRecord {
        RequestRecord {
            index: 0,
            start_s: 0.0,
            ttft_s: Some(ttft),
            itl_s: itl.to_vec(),
            latency_s: latency,
            content_chunks: itl.len() as u64 + 1,
            empty_chunks: 0,
            generated_chars: 0,
            usage: usage.map(|(p, c)| Usage {
                prompt_tokens: p,
                completion_tokens: c,
            }),
            expected_prompt_tokens: Some(7),
            max_tokens: 16,
            finish_reason: Some("length".into()),
            error: None,
        }
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&x, 0.0), Some(1.0));
        assert_eq!(percentile(&x, 100.0), Some(4.0));
        assert_eq!(percentile(&x, 50.0), Some(2.5));
        // rank 0.9 * 3 = 2.7 -> 3 + 0.7 * 1
        assert!((percentile(&x, 90.0).unwrap() - 3.7).abs() < 1e-12);
        // rank 0.99 * 3 = 2.97
        assert!((percentile(&x, 99.0).unwrap() - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&[5.0], 99.0), Some(5.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn summary_of_known_samples() {
        let mut x = [4.0, 1.0, 3.0, 2.0];
        let s = summarize(&mut x).unwrap();
        assert_eq!(s.count, 4);
        assert_eq!(s.mean, 2.5);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 4.0);
        assert_eq!(s.median, 2.5);
        assert!((s.std - 1.25f64.sqrt()).abs() < 1e-12);
        assert!(summarize(&mut []).is_none());
    }

    #[test]
    fn run_metrics_arithmetic() {
        // Request A: ttft 0.1, gaps 0.02 0.04, latency 0.2, usage 10 prompt / 3 output.
        // Request B: ttft 0.3, one gap 0.1, latency 0.5, no usage -> 2 output tokens
        //            from chunks, prompt 7 from the tokenizer.
        // Request C: failed (http 503), must not enter the statistics.
        let a = record(0.1, &[0.02, 0.04], 0.2, Some((10, 3)));
        let b = record(0.3, &[0.1], 0.5, None);
        let mut c = record(9.0, &[9.0], 9.0, Some((1, 1)));
        c.error = Some(RequestError {
            status: Some(503),
            ..RequestError::new(ErrorKind::Http, "busy")
        });
        let m = RunMetrics::compute(&[a, b, c], 2.0);
        assert_eq!(m.completed, 2);
        assert_eq!(m.failed, 1);
        assert_eq!(m.errors.get("http_503"), Some(&1));
        assert_eq!(m.total_input_tokens, 17);
        assert_eq!(m.total_output_tokens, 5);
        assert_eq!(m.usage_missing, 1);
        assert_eq!(m.request_throughput, 1.0);
        assert_eq!(m.output_throughput, 2.5);
        assert_eq!(m.total_token_throughput, 11.0);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let ttft = m.ttft_ms.unwrap();
        assert!(close(ttft.mean, 200.0) && close(ttft.median, 200.0));
        assert!(close(ttft.p90, 100.0 + 0.9 * 200.0));
        // TPOT: A (0.2 - 0.1) / 2 = 50 ms, B (0.5 - 0.3) / 1 = 200 ms.
        let tpot = m.tpot_ms.unwrap();
        assert_eq!(tpot.count, 2);
        assert!(close(tpot.mean, 125.0) && close(tpot.min, 50.0) && close(tpot.max, 200.0));
        // ITL pools 20, 40, 100 ms.
        let itl = m.itl_ms.unwrap();
        assert_eq!(itl.count, 3);
        assert!(close(itl.median, 40.0) && close(itl.mean, 160.0 / 3.0));
        assert!(close(itl.p99, 40.0 + 0.98 * 60.0));
        let e2e = m.e2e_ms.unwrap();
        assert!(close(e2e.mean, 350.0) && close(e2e.p90, 200.0 + 0.9 * 300.0));
    }

    #[test]
    fn tpot_needs_two_tokens() {
        let one = record(0.1, &[], 0.1, Some((1, 1)));
        assert_eq!(one.tpot_s(), None);
        let m = RunMetrics::compute(&[one], 0.0);
        assert!(m.tpot_ms.is_none() && m.itl_ms.is_none());
        assert_eq!(m.request_throughput, 0.0);
    }
}
