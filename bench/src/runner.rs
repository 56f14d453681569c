//! Drives a run: arrivals (all at once, or Poisson/gamma at a rate), a concurrency cap,
//! and a progress bar.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::client::{RequestSpec, Target, send};
use crate::record::RequestRecord;

/// How requests are released.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoadPlan {
    /// At most this many requests in flight (`None`: no cap).
    pub concurrency: Option<usize>,
    /// Mean arrivals per second (`None`: all at once).
    pub request_rate: Option<f64>,
    /// Gamma shape of the inter-arrival times: 1 is Poisson, below 1 burstier, above 1
    /// more regular.
    pub burstiness: f64,
    /// Seeds the arrival times.
    pub seed: u64,
}

/// Arrival offsets in seconds of `n` requests: all 0 without a rate; else cumulative
/// gamma-distributed gaps with mean `1 / rate` and shape `burstiness` (exponential, i.e.
/// Poisson arrivals, at 1). The first request leaves at 0.
pub fn arrival_offsets(n: usize, rate: Option<f64>, burstiness: f64, seed: u64) -> Vec<f64> {
    let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) else {
        return vec![0.0; n];
    };
    let shape = if burstiness.is_finite() && burstiness > 0.0 {
        burstiness
    } else {
        1.0
    };
    let Ok(gamma) = Gamma::new(shape, 1.0 / (rate * shape)) else {
        return vec![0.0; n];
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += gamma.sample(&mut rng);
            }
            t
        })
        .collect()
}

/// A finished run: its records (in request order) and its duration.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// One record per request, `index` set.
    pub records: Vec<RequestRecord>,
    /// From the run's start to the last request's end, in seconds.
    pub duration_s: f64,
}

/// Sends every request of `specs` under `plan` and waits for all of them.
pub async fn run(
    client: &reqwest::Client,
    target: &Target,
    specs: &[RequestSpec],
    plan: &LoadPlan,
    progress: &ProgressBar,
) -> RunOutput {
    let offsets = arrival_offsets(specs.len(), plan.request_rate, plan.burstiness, plan.seed);
    let cap = plan.concurrency.filter(|c| *c > 0);
    let semaphore = cap.map(|c| Arc::new(Semaphore::new(c)));
    let start = Instant::now();
    let mut pending: FuturesUnordered<_> = specs
        .iter()
        .zip(offsets)
        .enumerate()
        .map(|(index, (spec, offset))| {
            let semaphore = semaphore.clone();
            async move {
                tokio::time::sleep_until((start + Duration::from_secs_f64(offset)).into()).await;
                let _permit = match &semaphore {
                    // The semaphore is never closed.
                    Some(s) => s.acquire().await.ok(),
                    None => None,
                };
                let mut record = send(client, target, spec, start).await;
                record.index = index;
                (record, Instant::now())
            }
        })
        .collect();
    let mut records = Vec::with_capacity(specs.len());
    let mut last = start;
    let mut errors = 0;
    while let Some((record, done)) = pending.next().await {
        last = last.max(done);
        if !record.ok() {
            errors += 1;
            progress.set_message(format!("{errors} errors"));
        }
        records.push(record);
        progress.inc(1);
    }
    records.sort_by_key(|r| r.index);
    RunOutput {
        records,
        duration_s: last.duration_since(start).as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_without_rate_are_immediate() {
        assert_eq!(arrival_offsets(3, None, 1.0, 0), vec![0.0; 3]);
        assert_eq!(
            arrival_offsets(2, Some(f64::INFINITY), 1.0, 0),
            vec![0.0; 2]
        );
    }

    #[test]
    fn poisson_and_bursty_arrivals_have_the_asked_mean() {
        for burstiness in [1.0, 0.5, 4.0] {
            let t = arrival_offsets(20_001, Some(10.0), burstiness, 7);
            assert_eq!(t[0], 0.0);
            assert!(t.windows(2).all(|w| w[1] >= w[0]));
            let mean_gap = t[20_000] / 20_000.0;
            assert!((mean_gap - 0.1).abs() < 0.005, "{burstiness}: {mean_gap}");
            // Gamma(k, θ) gaps have variance k θ² = mean² / k.
            let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
            let var = gaps.iter().map(|g| (g - mean_gap).powi(2)).sum::<f64>() / gaps.len() as f64;
            let expected = 0.01 / burstiness;
            assert!((var / expected - 1.0).abs() < 0.1, "{burstiness}: {var}");
        }
        assert_eq!(
            arrival_offsets(5, Some(2.0), 1.0, 1),
            arrival_offsets(5, Some(2.0), 1.0, 1)
        );
    }
}
