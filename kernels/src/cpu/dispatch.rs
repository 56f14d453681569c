//! Runtime CPU-feature dispatch: one function table per instruction-set level, chosen once.
//!
//! Every level computes a dot product the same way: 16 lane accumulators (lane `l` sums the
//! elements `i ≡ l (mod 16)` in order, the `k % 16` tail goes to lanes `0..k % 16`), then the
//! fixed tree `l += l + 8`, `l += l + 4`, `l += l + 2`, `l += l + 1`. The SIMD levels use fused
//! multiply-adds where the portable level multiplies then adds, so levels may differ in the
//! last bits; within a level, an output never depends on batch size, tiling or threads.

use std::sync::OnceLock;

/// An instruction-set level the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Plain Rust, any CPU: the reference the SIMD levels are tested against.
    Portable,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512 F.
    Avx512,
}

impl Level {
    /// Every level, slowest first.
    pub const ALL: [Level; 3] = [Level::Portable, Level::Avx2, Level::Avx512];

    /// Lower-case name, as `TESSERA_CPU_KERNELS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        match self {
            Level::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The levels this CPU supports, slowest first.
    pub fn available() -> Vec<Level> {
        Self::ALL.into_iter().filter(|l| l.is_supported()).collect()
    }
}

/// `out[i * ldo + j] = dot(x_i, w_j)` for every row `x_i` of `x` (`m × k`) and `w_j` of `w`
/// (`n × k`).
///
/// # Safety
/// `out` must be valid for writes at every such `i * ldo + j`, and nothing else may access
/// those elements during the call.
pub(crate) type GemmFn = unsafe fn(x: &[f32], w: &[f32], k: usize, out: *mut f32, ldo: usize);

/// [`GemmFn`] over bfloat16 weights, each widened to f32 in registers: the same bits as
/// widening `w` first and calling the level's [`GemmFn`].
///
/// # Safety
/// As [`GemmFn`].
pub(crate) type GemmBf16Fn =
    unsafe fn(x: &[f32], w: &[half::bf16], k: usize, out: *mut f32, ldo: usize);

/// One level's kernels.
pub struct Kernels {
    /// The level these functions were compiled for.
    pub level: Level,
    pub(crate) gemm: GemmFn,
    /// The level's product with bf16 weights widened in registers, where it has one; small
    /// batches of bf16 matrices take it instead of dequantizing (see `weights::linear`).
    pub(crate) gemm_bf16: Option<GemmBf16Fn>,
    /// Dot product in the fixed lane order described in the module documentation.
    pub(crate) dot: fn(&[f32], &[f32]) -> f32,
    /// `y += a * x`, element by element.
    pub(crate) axpy: fn(f32, &[f32], &mut [f32]),
    /// One query head's attention (see `attention::attend_head`).
    pub(crate) attend: AttendFn,
    /// `out = silu(gate) · up`, element by element (see `activation`).
    pub(crate) silu_mul: fn(gate: &[f32], up: &[f32], out: &mut [f32]),
    /// Inner kernels of tiled attention (see `attention::tile`).
    pub(crate) attention: super::attention::tile::TileOps,
    /// Dequantizers of the stored weight formats (see `weights`).
    pub(crate) dequant: super::weights::Dequant,
}

/// `attention::attend_head` with the level's `dot` and `axpy`.
pub(crate) type AttendFn = fn(
    &super::attention::HeadQuery<'_>,
    cache_k: &[f32],
    cache_v: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
);

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl Kernels {
    /// The table of `level`, or `None` when this CPU (or this build) cannot run it.
    pub fn for_level(level: Level) -> Option<&'static Kernels> {
        if !level.is_supported() {
            return None;
        }
        match level {
            Level::Portable => Some(&super::matmul::PORTABLE),
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => Some(&super::arch::x86_64::avx2::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => Some(&super::arch::x86_64::avx512::KERNELS),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// Dot product of two equally long slices at this level.
    pub fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot of slices of different lengths");
        (self.dot)(a, b)
    }

    /// `y += a * x` at this level.
    pub fn axpy(&self, a: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy of slices of different lengths");
        (self.axpy)(a, x, y)
    }
}

/// The kernels every dispatched function uses: the best level this CPU supports, unless
/// `TESSERA_CPU_KERNELS=portable|avx2|avx512` asks for another (an unsupported or unknown
/// name falls back to the best level). Chosen on first use and fixed for the process.
pub fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<&'static Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let best = *Level::available()
            .last()
            .expect("portable is always available");
        let wanted = std::env::var("TESSERA_CPU_KERNELS")
            .ok()
            .and_then(|v| Level::ALL.into_iter().find(|l| l.name() == v.trim()))
            .filter(|l| l.is_supported())
            .unwrap_or(best);
        Kernels::for_level(wanted).expect("a supported level has a table")
    })
}

/// A short description of the dispatched kernels, for logs and benchmarks.
pub fn describe() -> String {
    let level = kernels().level;
    let int8 = super::int8::Int8Kernels::for_level(level).name;
    format!("{} kernels (int8 products: {int8})", level.name())
}
