//! Helpers the kernels' unit tests share.

use rand::Rng;

use super::dispatch::{Kernels, Level};

/// `n` values drawn uniformly from `[-1, 1)`.
pub(crate) fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// The table of every level this CPU runs, slowest first.
pub(crate) fn levels() -> Vec<&'static Kernels> {
    Level::available()
        .into_iter()
        .map(|l| Kernels::for_level(l).unwrap())
        .collect()
}
