//! Decode at batch 1, measured against the memory's read bandwidth in the same run.
//!
//! Run with `cargo bench -p tessera-kernels --bench decode`. Every case below runs once per
//! round, round after round, so that the machine's drift and the other processes on it touch
//! them all alike; each case reports its median and best round.
//!
//! - **probe**: read bandwidth of a rotating buffer (`TESSERA_BENCH_COLD_MIB`, default 640:
//!   more than twice the last-level caches of the machines this runs on)
//!   with 1 thread and with the decode team, at 1, 2 and 4 sequential streams per thread.
//! - **gemv**: one product `x · wᵀ` at the 1.1B model's shapes (`TESSERA_BENCH_SHAPES=3b`
//!   for the 3B one's) per format, on 1 thread, on the decode team and on rayon's pool (the
//!   team switched off), each call on another copy of the matrix so that the weights come
//!   from memory. GB/s count the file's bytes (`WeightMatrix::storage_bytes`); `% probe` is
//!   against the probe with as many threads and the best stream count.
//! - **token**: the products of one decode token of a random Q4_K_M model of that shape
//!   (q, k, v stacked; gate and up stacked; `Q6_K` for v and down where llama.cpp's
//!   `Q4_K_M` puts them, and for the LM head), back to back, on the team and on rayon's pool:
//!   tokens/s and `% bound`, the share of (team probe ÷ file bytes per token) reached.
//!
//! `TESSERA_BENCH_ROUNDS` (default 15) sets the rounds; `TESSERA_BENCH_FILTER=text` keeps the
//! cases whose name contains `text`.

#![allow(unsafe_code)]

use std::hint::black_box;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use tessera_kernels::cpu::{WeightFormat, WeightMatrix, describe, linear_weights, team};

/// The shapes of the real-size bench models (`scripts/make_bench_models.sh`).
struct Shape {
    name: &'static str,
    hidden: usize,
    kv: usize,
    intermediate: usize,
    vocab: usize,
    layers: usize,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "1.1b",
        hidden: 2048,
        kv: 256,
        intermediate: 5632,
        vocab: 49152,
        layers: 22,
    },
    Shape {
        name: "3b",
        hidden: 3072,
        kv: 1024,
        intermediate: 8192,
        vocab: 49152,
        layers: 28,
    },
];

/// How a case runs its work.
#[derive(Clone, Copy, PartialEq)]
enum Threads {
    One,
    Team,
    Rayon,
}

impl Threads {
    fn name(self) -> &'static str {
        match self {
            Threads::One => "1 thread",
            Threads::Team => "team",
            Threads::Rayon => "rayon",
        }
    }

    fn run(self, one: &rayon::ThreadPool, f: impl FnOnce() + Send) {
        match self {
            // Inside a pool of another size than the team's, products run on that pool.
            Threads::One => one.install(f),
            Threads::Team => {
                team::set_enabled(true);
                f()
            }
            Threads::Rayon => {
                team::set_enabled(false);
                f();
                team::set_enabled(true);
            }
        }
    }
}

/// A case: one round's work, and the bytes it counts.
struct Case {
    name: String,
    group: &'static str,
    threads: Threads,
    bytes: usize,
    run: Box<dyn Fn()>,
    seconds: Vec<f64>,
}

fn random_matrix(format: WeightFormat, n: usize, k: usize, rng: &mut impl Rng) -> WeightMatrix {
    let blocks = n * k / format.block_elements();
    // Bytes in 0x10..0x3b keep every f16 field of every block layout finite, normal and
    // below 1.
    let bytes: Vec<u8> = (0..blocks * format.block_bytes())
        .map(|_| rng.random_range(0x10..0x3b))
        .collect();
    WeightMatrix::from_bytes(format, n, k, &bytes)
        .expect("a whole number of blocks")
        .into_int8()
}

/// Sums `v` as `streams` equal parts side by side, one 64-byte load per part per step.
fn sum_streams(v: &[f32], streams: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512 F.
        return unsafe { sum_streams_avx512(v, streams) };
    }
    v.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_streams_avx512(v: &[f32], streams: usize) -> f32 {
    use std::arch::x86_64::*;
    let part = v.len() / streams / 16 * 16;
    let mut acc = [_mm512_setzero_ps(); 8];
    let streams = streams.min(acc.len());
    let mut i = 0;
    while i < part {
        for (s, a) in acc[..streams].iter_mut().enumerate() {
            // SAFETY: s * part + i + 16 <= streams * part <= v.len().
            *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(v.as_ptr().add(s * part + i)) });
        }
        i += 16;
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

fn probe_cases(cold: usize, members: usize, pool: &'static rayon::ThreadPool) -> Vec<Case> {
    const WINDOW: usize = 8 << 20;
    let windows = (cold / WINDOW).max(2 * members);
    let buf: &'static [f32] = Vec::leak(vec![1f32; windows * WINDOW / 4]);
    let mut cases = Vec::new();
    for threads in [Threads::One, Threads::Team] {
        for streams in [1, 2, 4] {
            let per_round = if threads == Threads::One {
                4
            } else {
                4 * members
            };
            let next = std::cell::Cell::new(0usize);
            cases.push(Case {
                name: format!("probe {} {streams} stream(s)/thread", threads.name()),
                group: "probe",
                threads,
                bytes: per_round * WINDOW,
                run: Box::new(move || {
                    let first = next.get();
                    next.set(first + per_round);
                    threads.run(pool, || {
                        team::run(per_round, &|i| {
                            let w = (first + i) % windows;
                            let window = &buf[w * WINDOW / 4..(w + 1) * WINDOW / 4];
                            black_box(sum_streams(black_box(window), streams));
                        })
                    });
                }),
                seconds: Vec::new(),
            });
        }
    }
    cases
}

fn gemv_cases(
    shape: &Shape,
    cold: usize,
    rng: &mut impl Rng,
    pool: &'static rayon::ThreadPool,
    wanted: &dyn Fn(&str) -> bool,
) -> Vec<Case> {
    let products = [
        (shape.hidden, shape.hidden),
        (shape.hidden, shape.kv),
        (shape.hidden, 2 * shape.intermediate),
        (shape.intermediate, shape.hidden),
        (shape.hidden, shape.vocab),
    ];
    let mut cases = Vec::new();
    for format in [WeightFormat::Q4K, WeightFormat::Q6K, WeightFormat::Q8_0] {
        for (k, n) in products {
            let name = |t: Threads| format!("gemv {} {k}->{n} {}", format.name(), t.name());
            let variants = [Threads::One, Threads::Team, Threads::Rayon];
            if !variants.iter().any(|&t| wanted(&name(t))) {
                continue;
            }
            let w = random_matrix(format, n, k, rng);
            let bytes = w.storage_bytes();
            let copies: &'static [WeightMatrix] = Vec::leak(
                (0..cold.div_ceil(bytes).max(2))
                    .map(|_| w.clone())
                    .collect(),
            );
            let x: &'static [f32] =
                Vec::leak((0..k).map(|_| rng.random_range(-1.0..1.0)).collect());
            for threads in variants {
                let out = std::cell::RefCell::new(vec![0f32; n]);
                cases.push(Case {
                    name: name(threads),
                    group: "gemv",
                    threads,
                    bytes: bytes * copies.len(),
                    run: Box::new(move || {
                        let mut guard = out.borrow_mut();
                        let out: &mut Vec<f32> = &mut guard;
                        threads.run(pool, || {
                            for c in copies {
                                linear_weights(black_box(x), c, None, 1, out);
                            }
                        });
                        black_box(out);
                    }),
                    seconds: Vec::new(),
                });
            }
        }
    }
    cases
}

/// A decode token's weights: per layer the q/k/v stack, o, the gate/up stack, down; then the
/// LM head.
struct TokenWeights {
    layers: Vec<[WeightMatrix; 4]>,
    head: WeightMatrix,
}

impl TokenWeights {
    fn random(shape: &Shape, rng: &mut impl Rng) -> TokenWeights {
        let (h, n) = (shape.hidden, shape.layers);
        let layers = (0..n)
            .map(|i| {
                // llama.cpp's `use_more_bits`: which layers' v and down get Q6_K in Q4_K_M.
                let more = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
                let wide = if more {
                    WeightFormat::Q6K
                } else {
                    WeightFormat::Q4K
                };
                let q4 = WeightFormat::Q4K;
                [
                    WeightMatrix::concat_rows(vec![
                        random_matrix(q4, h, h, rng),
                        random_matrix(q4, shape.kv, h, rng),
                        random_matrix(wide, shape.kv, h, rng),
                    ]),
                    random_matrix(q4, h, h, rng),
                    WeightMatrix::concat_rows(vec![
                        random_matrix(q4, shape.intermediate, h, rng),
                        random_matrix(q4, shape.intermediate, h, rng),
                    ]),
                    random_matrix(wide, h, shape.intermediate, rng),
                ]
            })
            .collect();
        let head = random_matrix(WeightFormat::Q6K, shape.vocab, h, rng);
        TokenWeights { layers, head }
    }

    fn bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .flatten()
            .map(|w| w.storage_bytes())
            .sum();
        layers + self.head.storage_bytes()
    }

    fn token(&self, x: &mut [f32], wide: &mut [f32], out: &mut Vec<f32>) {
        let _awake = team::awake();
        for [qkv, o, gate_up, down] in &self.layers {
            for (w, input) in [(qkv, &*x), (o, &*x), (gate_up, &*x)] {
                out.resize(w.rows(), 0.0);
                linear_weights(input, w, None, 1, out);
            }
            linear_weights(&wide[..down.cols()], down, None, 1, &mut x[..down.rows()]);
        }
        out.resize(self.head.rows(), 0.0);
        linear_weights(x, &self.head, None, 1, out);
        black_box(&out);
    }
}

fn token_cases(shape: &Shape, rng: &mut impl Rng, pool: &'static rayon::ThreadPool) -> Vec<Case> {
    let weights: &'static TokenWeights = Box::leak(Box::new(TokenWeights::random(shape, rng)));
    let bytes = weights.bytes();
    println!(
        "token model {}: {:.1} MB of file bytes per token",
        shape.name,
        bytes as f64 / 1e6
    );
    [Threads::Team, Threads::Rayon]
        .into_iter()
        .map(|threads| {
            let x = std::cell::RefCell::new(vec![0.01f32; shape.hidden]);
            let wide = std::cell::RefCell::new(vec![0.01f32; shape.intermediate]);
            let out = std::cell::RefCell::new(Vec::new());
            Case {
                name: format!("token {} Q4_K_M {}", shape.name, threads.name()),
                group: "token",
                threads,
                bytes,
                run: Box::new(move || {
                    let (mut x, mut wide, mut out) =
                        (x.borrow_mut(), wide.borrow_mut(), out.borrow_mut());
                    let (x, wide, out): (&mut [f32], &mut [f32], &mut Vec<f32>) =
                        (&mut x, &mut wide, &mut out);
                    threads.run(pool, || weights.token(x, wide, out));
                }),
                seconds: Vec::new(),
            }
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let cold = env_usize("TESSERA_BENCH_COLD_MIB", 640) << 20;
    let rounds = env_usize("TESSERA_BENCH_ROUNDS", 15).max(1);
    let filter = std::env::var("TESSERA_BENCH_FILTER").unwrap_or_default();
    let shape_name = std::env::var("TESSERA_BENCH_SHAPES").unwrap_or_else(|_| "1.1b".into());
    let Some(shape) = SHAPES.iter().find(|s| s.name == shape_name) else {
        eprintln!("TESSERA_BENCH_SHAPES: one of 1.1b, 3b");
        std::process::exit(2);
    };
    let members = rayon::current_num_threads();
    let pool: &'static rayon::ThreadPool = Box::leak(Box::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a one-thread pool"),
    ));
    println!("{}; {members} threads; {} rounds", describe(), rounds);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
    let mut cases = probe_cases(cold, members, pool);
    let wanted = |name: &str| name.contains(&filter);
    cases.extend(gemv_cases(shape, cold, &mut rng, pool, &wanted));
    if wanted(&format!("token {}", shape.name)) {
        cases.extend(token_cases(shape, &mut rng, pool));
    }
    cases.retain(|c| c.group == "probe" || wanted(&c.name));
    for c in &cases {
        (c.run)();
    }
    for _ in 0..rounds {
        for c in &mut cases {
            let start = Instant::now();
            (c.run)();
            c.seconds.push(start.elapsed().as_secs_f64());
        }
    }
    let gbs = |c: &Case, s: f64| c.bytes as f64 / s / 1e9;
    let best_probe = |threads: Threads| {
        cases
            .iter()
            .filter(|c| c.group == "probe" && c.threads == threads)
            .map(|c| gbs(c, median(&c.seconds)))
            .fold(0f64, f64::max)
    };
    let (probe_one, probe_team) = (best_probe(Threads::One), best_probe(Threads::Team));
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "case", "median ms", "GB/s", "best GB/s", "% probe", "tok/s"
    );
    for c in &cases {
        let (med, best) = (
            median(&c.seconds),
            c.seconds.iter().copied().fold(f64::MAX, f64::min),
        );
        let probe = match c.threads {
            Threads::One => probe_one,
            _ => probe_team,
        };
        let tokens = if c.group == "token" {
            format!("{:8.1}", 1.0 / med)
        } else {
            String::new()
        };
        println!(
            "{:<44} {:>9.3} {:>9.2} {:>9.2} {:>7.1}% {tokens}",
            c.name,
            med * 1e3,
            gbs(c, med),
            gbs(c, best),
            100.0 * gbs(c, med) / probe,
        );
    }
    println!("probe: {probe_one:.2} GB/s on 1 thread, {probe_team:.2} GB/s on the team (medians)");
}
