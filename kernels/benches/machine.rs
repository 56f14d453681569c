//! Measured limits of this machine, printed next to the benchmarks' throughputs: memory read
//! bandwidth and peak arithmetic rates, each with 1 thread and with `n` threads (rayon's pool
//! size, the threads the kernels use).
//!
//! Bench-only: `kernels/benches/kernels.rs` and `shard/benches/engine.rs` include this file
//! with `#[path]`, so it adds no public API.
//!
//! - **Memory read bandwidth**: every thread sums its share of a buffer much larger than the
//!   last-level cache (`TESSERA_BENCH_BW_MIB`, default 1024 MiB) with 64-byte loads into 8
//!   independent accumulators; the best of several passes. Bytes/s of the buffer read.
//! - **f32 FMA**: 12 (AVX2, 16 registers) or 24 (AVX-512, 32 registers) independent FMA
//!   chains per thread, enough to hide FMA latency on every current core; 2 FLOP per lane.
//! - **bf16 dot** (`vdpbf16ps`, AVX512_BF16): 2 FLOP per bf16 product pair (a multiply and
//!   an add), so 64 FLOP per 512-bit instruction.
//! - **int8 dot** (`vpdpbusd`, AVX512_VNNI): 2 ops per u8·i8 product (multiply and add), so
//!   128 ops per 512-bit instruction.
//!
//! Unsupported instruction sets are skipped with the reason printed.
#![allow(unsafe_code, dead_code)]

use std::hint::black_box;
use std::time::Instant;

/// A rate with 1 thread and with `threads` threads, in units per second.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    pub(crate) one: f64,
    pub(crate) all: f64,
}

/// One arithmetic peak, or why it was skipped.
#[derive(Debug, Clone)]
pub(crate) struct Peak {
    pub(crate) name: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) rate: Result<Rate, String>,
}

/// The machine's measured limits.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Threads of the `all` figures (rayon's pool size).
    pub(crate) threads: usize,
    /// Buffer size of the bandwidth measurement.
    pub(crate) buffer_bytes: usize,
    /// Memory read bandwidth, bytes/s.
    pub(crate) bandwidth: Rate,
    /// f32 FMA with AVX-512, f32 FMA with AVX2, bf16 dot, int8 dot.
    pub(crate) peaks: Vec<Peak>,
}

impl Limits {
    /// Measures everything (about 2-4 s).
    pub(crate) fn measure() -> Limits {
        let threads = rayon::current_num_threads().max(1);
        let mib: usize = std::env::var("TESSERA_BENCH_BW_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1024);
        let buffer_bytes = mib.max(1) << 20;
        let bandwidth = read_bandwidth(buffer_bytes, threads);
        let peaks = vec![
            Peak {
                name: "f32 FMA, AVX-512",
                unit: "GFLOP/s",
                rate: peak(threads, kernels::F32_AVX512),
            },
            Peak {
                name: "f32 FMA, AVX2",
                unit: "GFLOP/s",
                rate: peak(threads, kernels::F32_AVX2),
            },
            Peak {
                name: "bf16 dot (vdpbf16ps), 2 FLOP/pair",
                unit: "GFLOP/s",
                rate: peak(threads, kernels::BF16),
            },
            Peak {
                name: "int8 dot (vpdpbusd), 2 op/pair",
                unit: "GOP/s",
                rate: peak(threads, kernels::INT8),
            },
        ];
        Limits {
            threads,
            buffer_bytes,
            bandwidth,
            peaks,
        }
    }

    /// The best f32 FLOP/s with `threads` threads over the f32 instruction sets.
    pub(crate) fn f32_peak(&self) -> f64 {
        self.peaks[..2]
            .iter()
            .filter_map(|p| p.rate.as_ref().ok().map(|r| r.all))
            .fold(f64::NAN, f64::max)
    }

    /// The bf16 dot FLOP/s with `threads` threads, if the CPU has it.
    pub(crate) fn bf16_peak(&self) -> Option<f64> {
        self.peaks[2].rate.as_ref().ok().map(|r| r.all)
    }

    /// Prints the limits as a small table.
    pub(crate) fn print(&self) {
        let n = self.threads;
        println!(
            "\nMachine limits (measured; best of several runs; {n} threads = rayon's pool)"
        );
        println!("{:<40} {:>16} {:>16}", "limit", "1 thread", format!("{n} threads"));
        println!("{}", "-".repeat(74));
        println!(
            "{:<40} {:>11.1} GB/s {:>11.1} GB/s",
            format!("memory read ({} MiB buffer)", self.buffer_bytes >> 20),
            self.bandwidth.one / 1e9,
            self.bandwidth.all / 1e9
        );
        for p in &self.peaks {
            match &p.rate {
                Ok(r) => println!(
                    "{:<40} {:>8.1} {:<7} {:>8.1} {:<7}",
                    p.name,
                    r.one / 1e9,
                    p.unit,
                    r.all / 1e9,
                    p.unit
                ),
                Err(why) => println!("{:<40} skipped: {why}", p.name),
            }
        }
    }
}

/// Best-of-`reps` read bandwidth of a `bytes` buffer with 1 and `threads` threads.
fn read_bandwidth(bytes: usize, threads: usize) -> Rate {
    let len = bytes / 4 / 128 * 128;
    let mut buf = vec![0f32; len];
    // First touch from the threads that will read (and no zero page: real values).
    std::thread::scope(|s| {
        for part in buf.chunks_mut(len.div_ceil(threads)) {
            s.spawn(move || part.iter_mut().for_each(|v| *v = 1.0));
        }
    });
    let run = |t: usize| {
        let chunk = len.div_ceil(t).div_ceil(128) * 128;
        let start = Instant::now();
        let sum: f32 = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(chunk)
                .map(|part| s.spawn(move || kernels::sum(black_box(part))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        black_box(sum);
        (len * 4) as f64 / start.elapsed().as_secs_f64()
    };
    let best = |t: usize| (0..5).map(|_| run(t)).fold(0f64, f64::max);
    let one = best(1);
    let all = if threads > 1 { best(threads) } else { one };
    Rate { one, all }
}

/// A peak-rate kernel: runs `iters` iterations and returns a value to keep; does
/// `ops_per_iter` operations per iteration. `None` when this CPU cannot run it.
#[derive(Clone, Copy)]
struct PeakKernel {
    available: fn() -> Result<(), String>,
    run: fn(u64) -> f32,
    ops_per_iter: f64,
}

fn peak(threads: usize, k: PeakKernel) -> Result<Rate, String> {
    (k.available)()?;
    // Calibrate to about 40 ms per thread.
    let mut iters = 1u64 << 16;
    loop {
        let t = Instant::now();
        black_box((k.run)(iters));
        if t.elapsed().as_secs_f64() > 0.01 {
            iters = (iters as f64 * 0.04 / t.elapsed().as_secs_f64()) as u64;
            break;
        }
        iters *= 4;
    }
    let run = |t: usize| {
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..t {
                s.spawn(|| black_box((k.run)(iters)));
            }
        });
        (t as f64 * iters as f64 * k.ops_per_iter) / start.elapsed().as_secs_f64()
    };
    let best = |t: usize| (0..3).map(|_| run(t)).fold(0f64, f64::max);
    let one = best(1);
    let all = if threads > 1 { best(threads) } else { one };
    Ok(Rate { one, all })
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    use super::PeakKernel;

    fn has(feature: bool, name: &str) -> Result<(), String> {
        if feature {
            Ok(())
        } else {
            Err(format!("this CPU has no {name}"))
        }
    }

    /// Sum of a slice, read once: AVX-512 when available, else AVX2, else scalar.
    pub(super) fn sum(v: &[f32]) -> f32 {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F.
            unsafe { sum_avx512(v) }
        } else if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            unsafe { sum_avx2(v) }
        } else {
            super::sum_scalar(v)
        }
    }

    #[target_feature(enable = "avx512f")]
    fn sum_avx512(v: &[f32]) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 8];
        let mut chunks = v.chunks_exact(128);
        for c in &mut chunks {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `c` has 128 values, so 16 from `16 * j` are in bounds.
                *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(c.as_ptr().add(16 * j)) });
            }
        }
        let mut total = 0.0;
        for a in acc {
            total += _mm512_reduce_add_ps(a);
        }
        total + super::sum_scalar(chunks.remainder())
    }

    #[target_feature(enable = "avx2")]
    fn sum_avx2(v: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut chunks = v.chunks_exact(64);
        for c in &mut chunks {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `c` has 64 values, so 8 from `8 * j` are in bounds.
                *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * j)) });
            }
        }
        let mut lanes = [0f32; 8];
        let mut total = 0.0;
        for a in acc {
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a) };
            total += lanes.iter().sum::<f32>();
        }
        total + super::sum_scalar(chunks.remainder())
    }

    /// Independent accumulator chains of the peak kernels.
    const CHAINS_512: usize = 24;
    const CHAINS_256: usize = 12;

    pub(super) const F32_AVX512: PeakKernel = PeakKernel {
        available: || has(is_x86_feature_detected!("avx512f"), "AVX-512 F"),
        // SAFETY: `available` checked the CPU's features.
        run: |n| unsafe { fma512(n) },
        ops_per_iter: (CHAINS_512 * 16 * 2) as f64,
    };
    pub(super) const F32_AVX2: PeakKernel = PeakKernel {
        available: || {
            has(
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
                "AVX2 + FMA",
            )
        },
        // SAFETY: `available` checked the CPU's features.
        run: |n| unsafe { fma256(n) },
        ops_per_iter: (CHAINS_256 * 8 * 2) as f64,
    };
    pub(super) const BF16: PeakKernel = PeakKernel {
        available: || {
            has(
                is_x86_feature_detected!("avx512bf16"),
                "AVX512_BF16 (vdpbf16ps)",
            )
        },
        // SAFETY: `available` checked the CPU's features.
        run: |n| unsafe { dpbf16(n) },
        ops_per_iter: (CHAINS_512 * 32 * 2) as f64,
    };
    pub(super) const INT8: PeakKernel = PeakKernel {
        available: || {
            has(
                is_x86_feature_detected!("avx512vnni"),
                "AVX512_VNNI (vpdpbusd)",
            )
        },
        // SAFETY: `available` checked the CPU's features.
        run: |n| unsafe { dpbusd(n) },
        ops_per_iter: (CHAINS_512 * 64 * 2) as f64,
    };

    #[target_feature(enable = "avx512f")]
    fn fma512(iters: u64) -> f32 {
        let a = _mm512_set1_ps(black_box(0.999_9));
        let b = _mm512_set1_ps(black_box(1e-7));
        let mut acc = [_mm512_set1_ps(black_box(1.0)); CHAINS_512];
        for _ in 0..iters {
            for r in &mut acc {
                *r = _mm512_fmadd_ps(*r, a, b);
            }
        }
        acc.iter().map(|&r| _mm512_reduce_add_ps(r)).sum()
    }

    #[target_feature(enable = "avx2,fma")]
    fn fma256(iters: u64) -> f32 {
        let a = _mm256_set1_ps(black_box(0.999_9));
        let b = _mm256_set1_ps(black_box(1e-7));
        let mut acc = [_mm256_set1_ps(black_box(1.0)); CHAINS_256];
        for _ in 0..iters {
            for r in &mut acc {
                *r = _mm256_fmadd_ps(*r, a, b);
            }
        }
        let mut lanes = [0f32; 8];
        let mut total = 0.0;
        for r in acc {
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), r) };
            total += lanes.iter().sum::<f32>();
        }
        total
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    fn dpbf16(iters: u64) -> f32 {
        // bf16 0.5 and 0.25 in every element.
        let a: __m512bh = _mm512_cvtne2ps_pbh(
            _mm512_set1_ps(black_box(0.5)),
            _mm512_set1_ps(black_box(0.5)),
        );
        let b: __m512bh = _mm512_cvtne2ps_pbh(
            _mm512_set1_ps(black_box(0.25)),
            _mm512_set1_ps(black_box(0.25)),
        );
        let mut acc = [_mm512_set1_ps(black_box(0.0)); CHAINS_512];
        for _ in 0..iters {
            for r in &mut acc {
                *r = _mm512_dpbf16_ps(*r, a, b);
            }
        }
        acc.iter().map(|&r| _mm512_reduce_add_ps(r)).sum()
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    fn dpbusd(iters: u64) -> f32 {
        let a = _mm512_set1_epi8(black_box(3));
        let b = _mm512_set1_epi8(black_box(-2));
        let mut acc = [_mm512_set1_epi32(black_box(0)); CHAINS_512];
        for _ in 0..iters {
            for r in &mut acc {
                *r = _mm512_dpbusd_epi32(*r, a, b);
            }
        }
        acc.iter().map(|&r| _mm512_reduce_add_epi32(r) as f32).sum()
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod kernels {
    use super::PeakKernel;

    pub(super) fn sum(v: &[f32]) -> f32 {
        super::sum_scalar(v)
    }

    const NONE: PeakKernel = PeakKernel {
        available: || Err("not an x86-64 CPU (only x86-64 peak kernels exist)".into()),
        run: |_| 0.0,
        ops_per_iter: 0.0,
    };
    pub(super) const F32_AVX512: PeakKernel = NONE;
    pub(super) const F32_AVX2: PeakKernel = NONE;
    pub(super) const BF16: PeakKernel = NONE;
    pub(super) const INT8: PeakKernel = NONE;
}

/// Portable sum with 16 accumulators (vectorized by the compiler at the baseline level).
fn sum_scalar(v: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}
