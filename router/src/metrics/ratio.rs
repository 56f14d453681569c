//! [`RunningRatio`]: one count over another, both summed since the process started (the
//! prefix-cache hit ratio, the speculative acceptance ratio).

use std::sync::{Mutex, PoisonError};

/// A part and a whole summed since start, whose ratio a gauge reports.
#[derive(Debug)]
pub(crate) struct RunningRatio {
    /// (part, whole), under one lock so that a ratio never mixes two updates.
    sums: Mutex<(u64, u64)>,
}

impl RunningRatio {
    pub(crate) const fn new() -> Self {
        Self {
            sums: Mutex::new((0, 0)),
        }
    }

    /// Adds `part` of `whole`; the ratio of the sums so far, `None` while the whole is 0.
    pub(crate) fn add(&self, part: u64, whole: u64) -> Option<f64> {
        let mut sums = self.sums.lock().unwrap_or_else(PoisonError::into_inner);
        sums.0 = sums.0.saturating_add(part);
        sums.1 = sums.1.saturating_add(whole);
        (sums.1 > 0).then(|| sums.0 as f64 / sums.1 as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_is_of_the_sums_not_a_mean_of_ratios() {
        let ratio = RunningRatio::new();
        assert_eq!(ratio.add(0, 0), None);
        assert_eq!(ratio.add(1, 4), Some(0.25));
        assert_eq!(ratio.add(5, 6), Some(0.6));
        assert_eq!(ratio.add(0, 0), Some(0.6));
    }
}
