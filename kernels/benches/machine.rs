//! Measured limits of this machine, printed next to the benchmarks' throughputs: memory read
//! bandwidth and peak arithmetic rates, each with 1 thread and with `n` threads (rayon's pool
//! size, the threads the kernels use).
//!
//! Bench-only: `kernels/benches/kernels.rs` and `shard/benches/engine.rs` include this file
//! with `#[path]`, so it adds no public API.
//!
//! Every figure is the best of many short lock-step rounds (all threads start together; a
//! round lasts until the last one finishes): clocks and the machine's other processes vary,
//! and a short round often runs undisturbed.
//!
//! - **Memory read bandwidth**: each round every thread sums its own 32 MiB window of a
//!   buffer much larger than the last-level cache (`TESSERA_BENCH_BW_MIB`, default 1024 MiB;
//!   the windows cycle through it) in 8 side-by-side sequential streams (64-byte loads, one
//!   accumulator each). Bytes/s read.
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
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Measures everything (about 5 s).
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

    /// Each figure the better of `self`'s and `other`'s (limits measured before and after a
    /// benchmark, so that a busy moment of the machine does not lower them).
    pub(crate) fn max(mut self, other: &Limits) -> Limits {
        let max = |a: &mut Rate, b: &Rate| {
            a.one = a.one.max(b.one);
            a.all = a.all.max(b.all);
        };
        max(&mut self.bandwidth, &other.bandwidth);
        for (p, q) in self.peaks.iter_mut().zip(&other.peaks) {
            if let (Ok(a), Ok(b)) = (&mut p.rate, &q.rate) {
                max(a, b);
            }
        }
        self
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
            "\nMachine limits (measured: best of short lock-step rounds; {n} threads = rayon's pool)"
        );
        println!(
            "{:<40} {:>16} {:>16}",
            "limit",
            "1 thread",
            format!("{n} threads")
        );
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
        let f32_one = self.peaks[..2]
            .iter()
            .filter_map(|p| p.rate.as_ref().ok().map(|r| r.one))
            .fold(f64::NAN, f64::max);
        if n > 1 && self.f32_peak() < 0.75 * n as f64 * f32_one {
            println!(
                "note: the {n}-thread f32 peak is below 75% of {n} × the 1-thread one: the \
                 threads share cores (SMT), or other processes kept cores busy; the % columns \
                 use the measured {n}-thread figures"
            );
        }
    }
}

/// The best rate of `threads` threads that each call `work(thread, round)` in lock-step
/// rounds for about `secs` (at least 5 rounds): a round starts them together and ends when
/// the last one finishes, and does `units` of work. Short rounds, best one: the clock speed
/// and other processes on the machine vary, and a short round often runs undisturbed.
fn lockstep(threads: usize, secs: f64, units: f64, work: &(dyn Fn(usize, usize) + Sync)) -> f64 {
    let go = Barrier::new(threads + 1);
    let done = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (go, done, stop) = (&go, &done, &stop);
            s.spawn(move || {
                for round in 0.. {
                    go.wait();
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    work(t, round);
                    done.wait();
                }
            });
        }
        let begin = Instant::now();
        let mut best = 0f64;
        let mut rounds = 0;
        loop {
            if rounds >= 5 && begin.elapsed().as_secs_f64() >= secs {
                stop.store(true, Ordering::Release);
                go.wait();
                break best;
            }
            let t0 = Instant::now();
            go.wait();
            done.wait();
            best = best.max(units / t0.elapsed().as_secs_f64());
            rounds += 1;
        }
    })
}

/// Read bandwidth of a `bytes` buffer with 1 and `threads` threads: each round, every thread
/// reads its own 32 MiB window, the windows cycling through the buffer (so a window was last
/// read a whole buffer ago, long evicted from the caches).
fn read_bandwidth(bytes: usize, threads: usize) -> Rate {
    const WINDOW: usize = 32 << 20;
    let window = WINDOW / 4;
    let windows = (bytes / WINDOW).max(2 * threads);
    let buf = vec![1f32; windows * window];
    // Touch every page (no zero page: real values); `vec!` of a non-zero value wrote them.
    black_box(&buf);
    let measure = |t: usize| {
        // All threads undisturbed at once is rarer on a busy machine: more rounds.
        let secs = if t > 1 { 0.6 } else { 0.3 };
        lockstep(t, secs, (t * WINDOW) as f64, &|thread, round| {
            let w = (round * t + thread) % windows;
            black_box(kernels::sum(black_box(&buf[w * window..(w + 1) * window])));
        })
    };
    let one = measure(1);
    let all = if threads > 1 { measure(threads) } else { one };
    Rate { one, all }
}

/// A peak-rate kernel: `run(iters)` runs `iters` iterations of `ops_per_iter` operations.
#[derive(Clone, Copy)]
struct PeakKernel {
    available: fn() -> Result<(), String>,
    run: fn(u64) -> f32,
    ops_per_iter: f64,
}

fn peak(threads: usize, k: PeakKernel) -> Result<Rate, String> {
    (k.available)()?;
    // Calibrate to about 2 ms per round.
    let mut iters = 1u64 << 12;
    loop {
        let t = Instant::now();
        black_box((k.run)(iters));
        let s = t.elapsed().as_secs_f64();
        if s > 0.001 {
            iters = ((iters as f64 * 0.002 / s) as u64).max(1);
            break;
        }
        iters *= 4;
    }
    let measure = |t: usize| {
        let secs = if t > 1 { 0.6 } else { 0.25 };
        lockstep(
            t,
            secs,
            t as f64 * iters as f64 * k.ops_per_iter,
            &|_, _| {
                black_box((k.run)(iters));
            },
        )
    };
    let one = measure(1);
    let all = if threads > 1 { measure(threads) } else { one };
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

    /// Sums `STREAMS` equal parts of `v` side by side (several sequential streams keep more
    /// cache misses in flight than one), one accumulator per stream.
    #[target_feature(enable = "avx512f")]
    fn sum_avx512(v: &[f32]) -> f32 {
        let part = v.len() / STREAMS / 16 * 16;
        let mut acc = [_mm512_setzero_ps(); STREAMS];
        let mut i = 0;
        while i < part {
            for (s, a) in acc.iter_mut().enumerate() {
                // SAFETY: s * part + i + 16 <= STREAMS * part <= v.len().
                *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(v.as_ptr().add(s * part + i)) });
            }
            i += 16;
        }
        let mut total = 0.0;
        for a in acc {
            total += _mm512_reduce_add_ps(a);
        }
        total + super::sum_scalar(&v[STREAMS * part..])
    }

    /// As `sum_avx512`, 32-byte loads.
    #[target_feature(enable = "avx2")]
    fn sum_avx2(v: &[f32]) -> f32 {
        let part = v.len() / STREAMS / 8 * 8;
        let mut acc = [_mm256_setzero_ps(); STREAMS];
        let mut i = 0;
        while i < part {
            for (s, a) in acc.iter_mut().enumerate() {
                // SAFETY: s * part + i + 8 <= STREAMS * part <= v.len().
                *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(v.as_ptr().add(s * part + i)) });
            }
            i += 8;
        }
        let mut lanes = [0f32; 8];
        let mut total = 0.0;
        for a in acc {
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a) };
            total += lanes.iter().sum::<f32>();
        }
        total + super::sum_scalar(&v[STREAMS * part..])
    }

    /// Sequential read streams per thread.
    const STREAMS: usize = 8;

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

    /// `CHAINS_512` chains of `acc += a·b` (f32, 16 lanes).
    #[target_feature(enable = "avx512f")]
    fn fma512(iters: u64) -> f32 {
        let a: __m512 = _mm512_set1_ps(black_box(0.999_9));
        let b: __m512 = _mm512_set1_ps(black_box(1e-7));
        // SAFETY: the caller checked the CPU's features; the loop only touches the
        // registers it declares.
        unsafe {
            std::arch::asm!(
            "vpxord zmm0, zmm0, zmm0",
            "vpxord zmm1, zmm1, zmm1",
            "vpxord zmm2, zmm2, zmm2",
            "vpxord zmm3, zmm3, zmm3",
            "vpxord zmm4, zmm4, zmm4",
            "vpxord zmm5, zmm5, zmm5",
            "vpxord zmm6, zmm6, zmm6",
            "vpxord zmm7, zmm7, zmm7",
            "vpxord zmm8, zmm8, zmm8",
            "vpxord zmm9, zmm9, zmm9",
            "vpxord zmm10, zmm10, zmm10",
            "vpxord zmm11, zmm11, zmm11",
            "vpxord zmm12, zmm12, zmm12",
            "vpxord zmm13, zmm13, zmm13",
            "vpxord zmm14, zmm14, zmm14",
            "vpxord zmm15, zmm15, zmm15",
            "vpxord zmm16, zmm16, zmm16",
            "vpxord zmm17, zmm17, zmm17",
            "vpxord zmm18, zmm18, zmm18",
            "vpxord zmm19, zmm19, zmm19",
            "vpxord zmm20, zmm20, zmm20",
            "vpxord zmm21, zmm21, zmm21",
            "vpxord zmm22, zmm22, zmm22",
            "vpxord zmm23, zmm23, zmm23",
            "2:",
            "vfmadd231ps zmm0, zmm30, zmm31",
            "vfmadd231ps zmm1, zmm30, zmm31",
            "vfmadd231ps zmm2, zmm30, zmm31",
            "vfmadd231ps zmm3, zmm30, zmm31",
            "vfmadd231ps zmm4, zmm30, zmm31",
            "vfmadd231ps zmm5, zmm30, zmm31",
            "vfmadd231ps zmm6, zmm30, zmm31",
            "vfmadd231ps zmm7, zmm30, zmm31",
            "vfmadd231ps zmm8, zmm30, zmm31",
            "vfmadd231ps zmm9, zmm30, zmm31",
            "vfmadd231ps zmm10, zmm30, zmm31",
            "vfmadd231ps zmm11, zmm30, zmm31",
            "vfmadd231ps zmm12, zmm30, zmm31",
            "vfmadd231ps zmm13, zmm30, zmm31",
            "vfmadd231ps zmm14, zmm30, zmm31",
            "vfmadd231ps zmm15, zmm30, zmm31",
            "vfmadd231ps zmm16, zmm30, zmm31",
            "vfmadd231ps zmm17, zmm30, zmm31",
            "vfmadd231ps zmm18, zmm30, zmm31",
            "vfmadd231ps zmm19, zmm30, zmm31",
            "vfmadd231ps zmm20, zmm30, zmm31",
            "vfmadd231ps zmm21, zmm30, zmm31",
            "vfmadd231ps zmm22, zmm30, zmm31",
            "vfmadd231ps zmm23, zmm30, zmm31",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters.max(1) => _,
            in("zmm30") a,
            in("zmm31") b,
            out("zmm0") _,
            out("zmm1") _,
            out("zmm2") _,
            out("zmm3") _,
            out("zmm4") _,
            out("zmm5") _,
            out("zmm6") _,
            out("zmm7") _,
            out("zmm8") _,
            out("zmm9") _,
            out("zmm10") _,
            out("zmm11") _,
            out("zmm12") _,
            out("zmm13") _,
            out("zmm14") _,
            out("zmm15") _,
            out("zmm16") _,
            out("zmm17") _,
            out("zmm18") _,
            out("zmm19") _,
            out("zmm20") _,
            out("zmm21") _,
            out("zmm22") _,
            out("zmm23") _,
            options(nostack, nomem),
            );
        }
        0.0
    }

    /// `CHAINS_256` chains of `acc += a·b` (f32, 8 lanes).
    #[target_feature(enable = "avx2,fma")]
    fn fma256(iters: u64) -> f32 {
        let a: __m256 = _mm256_set1_ps(black_box(0.999_9));
        let b: __m256 = _mm256_set1_ps(black_box(1e-7));
        // SAFETY: the caller checked the CPU's features; the loop only touches the
        // registers it declares.
        unsafe {
            std::arch::asm!(
            "vpxor ymm0, ymm0, ymm0",
            "vpxor ymm1, ymm1, ymm1",
            "vpxor ymm2, ymm2, ymm2",
            "vpxor ymm3, ymm3, ymm3",
            "vpxor ymm4, ymm4, ymm4",
            "vpxor ymm5, ymm5, ymm5",
            "vpxor ymm6, ymm6, ymm6",
            "vpxor ymm7, ymm7, ymm7",
            "vpxor ymm8, ymm8, ymm8",
            "vpxor ymm9, ymm9, ymm9",
            "vpxor ymm10, ymm10, ymm10",
            "vpxor ymm11, ymm11, ymm11",
            "2:",
            "vfmadd231ps ymm0, ymm14, ymm15",
            "vfmadd231ps ymm1, ymm14, ymm15",
            "vfmadd231ps ymm2, ymm14, ymm15",
            "vfmadd231ps ymm3, ymm14, ymm15",
            "vfmadd231ps ymm4, ymm14, ymm15",
            "vfmadd231ps ymm5, ymm14, ymm15",
            "vfmadd231ps ymm6, ymm14, ymm15",
            "vfmadd231ps ymm7, ymm14, ymm15",
            "vfmadd231ps ymm8, ymm14, ymm15",
            "vfmadd231ps ymm9, ymm14, ymm15",
            "vfmadd231ps ymm10, ymm14, ymm15",
            "vfmadd231ps ymm11, ymm14, ymm15",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters.max(1) => _,
            in("ymm14") a,
            in("ymm15") b,
            out("ymm0") _,
            out("ymm1") _,
            out("ymm2") _,
            out("ymm3") _,
            out("ymm4") _,
            out("ymm5") _,
            out("ymm6") _,
            out("ymm7") _,
            out("ymm8") _,
            out("ymm9") _,
            out("ymm10") _,
            out("ymm11") _,
            options(nostack, nomem),
            );
        }
        0.0
    }

    /// `CHAINS_512` chains of `acc += a0·b0 + a1·b1` per f32 lane (bf16 0.5 and 0.25).
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn dpbf16(iters: u64) -> f32 {
        let a: __m512i = _mm512_set1_epi16(black_box(0x3f00));
        let b: __m512i = _mm512_set1_epi16(black_box(0x3e80));
        // SAFETY: the caller checked the CPU's features; the loop only touches the
        // registers it declares.
        unsafe {
            std::arch::asm!(
            "vpxord zmm0, zmm0, zmm0",
            "vpxord zmm1, zmm1, zmm1",
            "vpxord zmm2, zmm2, zmm2",
            "vpxord zmm3, zmm3, zmm3",
            "vpxord zmm4, zmm4, zmm4",
            "vpxord zmm5, zmm5, zmm5",
            "vpxord zmm6, zmm6, zmm6",
            "vpxord zmm7, zmm7, zmm7",
            "vpxord zmm8, zmm8, zmm8",
            "vpxord zmm9, zmm9, zmm9",
            "vpxord zmm10, zmm10, zmm10",
            "vpxord zmm11, zmm11, zmm11",
            "vpxord zmm12, zmm12, zmm12",
            "vpxord zmm13, zmm13, zmm13",
            "vpxord zmm14, zmm14, zmm14",
            "vpxord zmm15, zmm15, zmm15",
            "vpxord zmm16, zmm16, zmm16",
            "vpxord zmm17, zmm17, zmm17",
            "vpxord zmm18, zmm18, zmm18",
            "vpxord zmm19, zmm19, zmm19",
            "vpxord zmm20, zmm20, zmm20",
            "vpxord zmm21, zmm21, zmm21",
            "vpxord zmm22, zmm22, zmm22",
            "vpxord zmm23, zmm23, zmm23",
            "2:",
            "vdpbf16ps zmm0, zmm30, zmm31",
            "vdpbf16ps zmm1, zmm30, zmm31",
            "vdpbf16ps zmm2, zmm30, zmm31",
            "vdpbf16ps zmm3, zmm30, zmm31",
            "vdpbf16ps zmm4, zmm30, zmm31",
            "vdpbf16ps zmm5, zmm30, zmm31",
            "vdpbf16ps zmm6, zmm30, zmm31",
            "vdpbf16ps zmm7, zmm30, zmm31",
            "vdpbf16ps zmm8, zmm30, zmm31",
            "vdpbf16ps zmm9, zmm30, zmm31",
            "vdpbf16ps zmm10, zmm30, zmm31",
            "vdpbf16ps zmm11, zmm30, zmm31",
            "vdpbf16ps zmm12, zmm30, zmm31",
            "vdpbf16ps zmm13, zmm30, zmm31",
            "vdpbf16ps zmm14, zmm30, zmm31",
            "vdpbf16ps zmm15, zmm30, zmm31",
            "vdpbf16ps zmm16, zmm30, zmm31",
            "vdpbf16ps zmm17, zmm30, zmm31",
            "vdpbf16ps zmm18, zmm30, zmm31",
            "vdpbf16ps zmm19, zmm30, zmm31",
            "vdpbf16ps zmm20, zmm30, zmm31",
            "vdpbf16ps zmm21, zmm30, zmm31",
            "vdpbf16ps zmm22, zmm30, zmm31",
            "vdpbf16ps zmm23, zmm30, zmm31",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters.max(1) => _,
            in("zmm30") a,
            in("zmm31") b,
            out("zmm0") _,
            out("zmm1") _,
            out("zmm2") _,
            out("zmm3") _,
            out("zmm4") _,
            out("zmm5") _,
            out("zmm6") _,
            out("zmm7") _,
            out("zmm8") _,
            out("zmm9") _,
            out("zmm10") _,
            out("zmm11") _,
            out("zmm12") _,
            out("zmm13") _,
            out("zmm14") _,
            out("zmm15") _,
            out("zmm16") _,
            out("zmm17") _,
            out("zmm18") _,
            out("zmm19") _,
            out("zmm20") _,
            out("zmm21") _,
            out("zmm22") _,
            out("zmm23") _,
            options(nostack, nomem),
            );
        }
        0.0
    }

    /// `CHAINS_512` chains of `acc += Σ4 u8·i8` per i32 lane.
    #[target_feature(enable = "avx512f,avx512vnni")]
    fn dpbusd(iters: u64) -> f32 {
        let a: __m512i = _mm512_set1_epi8(black_box(3));
        let b: __m512i = _mm512_set1_epi8(black_box(-2));
        // SAFETY: the caller checked the CPU's features; the loop only touches the
        // registers it declares.
        unsafe {
            std::arch::asm!(
            "vpxord zmm0, zmm0, zmm0",
            "vpxord zmm1, zmm1, zmm1",
            "vpxord zmm2, zmm2, zmm2",
            "vpxord zmm3, zmm3, zmm3",
            "vpxord zmm4, zmm4, zmm4",
            "vpxord zmm5, zmm5, zmm5",
            "vpxord zmm6, zmm6, zmm6",
            "vpxord zmm7, zmm7, zmm7",
            "vpxord zmm8, zmm8, zmm8",
            "vpxord zmm9, zmm9, zmm9",
            "vpxord zmm10, zmm10, zmm10",
            "vpxord zmm11, zmm11, zmm11",
            "vpxord zmm12, zmm12, zmm12",
            "vpxord zmm13, zmm13, zmm13",
            "vpxord zmm14, zmm14, zmm14",
            "vpxord zmm15, zmm15, zmm15",
            "vpxord zmm16, zmm16, zmm16",
            "vpxord zmm17, zmm17, zmm17",
            "vpxord zmm18, zmm18, zmm18",
            "vpxord zmm19, zmm19, zmm19",
            "vpxord zmm20, zmm20, zmm20",
            "vpxord zmm21, zmm21, zmm21",
            "vpxord zmm22, zmm22, zmm22",
            "vpxord zmm23, zmm23, zmm23",
            "2:",
            "vpdpbusd zmm0, zmm30, zmm31",
            "vpdpbusd zmm1, zmm30, zmm31",
            "vpdpbusd zmm2, zmm30, zmm31",
            "vpdpbusd zmm3, zmm30, zmm31",
            "vpdpbusd zmm4, zmm30, zmm31",
            "vpdpbusd zmm5, zmm30, zmm31",
            "vpdpbusd zmm6, zmm30, zmm31",
            "vpdpbusd zmm7, zmm30, zmm31",
            "vpdpbusd zmm8, zmm30, zmm31",
            "vpdpbusd zmm9, zmm30, zmm31",
            "vpdpbusd zmm10, zmm30, zmm31",
            "vpdpbusd zmm11, zmm30, zmm31",
            "vpdpbusd zmm12, zmm30, zmm31",
            "vpdpbusd zmm13, zmm30, zmm31",
            "vpdpbusd zmm14, zmm30, zmm31",
            "vpdpbusd zmm15, zmm30, zmm31",
            "vpdpbusd zmm16, zmm30, zmm31",
            "vpdpbusd zmm17, zmm30, zmm31",
            "vpdpbusd zmm18, zmm30, zmm31",
            "vpdpbusd zmm19, zmm30, zmm31",
            "vpdpbusd zmm20, zmm30, zmm31",
            "vpdpbusd zmm21, zmm30, zmm31",
            "vpdpbusd zmm22, zmm30, zmm31",
            "vpdpbusd zmm23, zmm30, zmm31",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters.max(1) => _,
            in("zmm30") a,
            in("zmm31") b,
            out("zmm0") _,
            out("zmm1") _,
            out("zmm2") _,
            out("zmm3") _,
            out("zmm4") _,
            out("zmm5") _,
            out("zmm6") _,
            out("zmm7") _,
            out("zmm8") _,
            out("zmm9") _,
            out("zmm10") _,
            out("zmm11") _,
            out("zmm12") _,
            out("zmm13") _,
            out("zmm14") _,
            out("zmm15") _,
            out("zmm16") _,
            out("zmm17") _,
            out("zmm18") _,
            out("zmm19") _,
            out("zmm20") _,
            out("zmm21") _,
            out("zmm22") _,
            out("zmm23") _,
            options(nostack, nomem),
            );
        }
        0.0
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
