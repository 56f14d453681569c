//! Typed launchers for the kernels of `kernels/cuda/`: one method per kernel, shapes checked
//! against the buffers before anything is launched.
//!
//! Conventions shared with the CPU kernels: activations are row-major `[rows, width]`; the KV
//! cache of a layer is `[num_blocks * block_size, kv_heads, head_dim]` for K and for V; block
//! tables are `[num_seqs, max_blocks]` i32 (unused entries may hold anything); positions,
//! ids and slots are i32 (a slot of -1 skips the cache write).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use half::{bf16, f16};

use super::{CudaError, GpuDevice, PtxCache, SOURCES, arch_for};

/// A storage type the kernels are instantiated for; arithmetic is always f32.
pub trait GpuFloat:
    DeviceRepr + ValidAsZeroBits + Copy + Default + std::fmt::Debug + Send + Sync + 'static
{
    /// Suffix of the kernel names (`rms_norm_bf16`).
    const SUFFIX: &'static str;
    /// Rounds from f32 (to nearest even).
    fn from_f32(v: f32) -> Self;
    /// Widens to f32.
    fn to_f32(self) -> f32;
}

impl GpuFloat for f32 {
    const SUFFIX: &'static str = "f32";
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl GpuFloat for f16 {
    const SUFFIX: &'static str = "f16";
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl GpuFloat for bf16 {
    const SUFFIX: &'static str = "bf16";
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Head dims the prefill kernel is instantiated for (`flash_attention.cu`).
pub const PREFILL_HEAD_DIMS: [usize; 7] = [16, 32, 64, 80, 96, 128, 256];
/// Query rows / keys per tile in `flash_attention.cu` (`FA_BM`, `FA_BN`).
const FA_BM: usize = 32;
const FA_BN: usize = 32;
/// Query rows / keys per tile in `flash_attention_mma.cu` (`MMA_BM`, `MMA_BN`).
const MMA_BM: usize = 64;
const MMA_BN: usize = 64;
/// Head dims the tensor-core prefill kernel is instantiated for (bf16 and f16 only).
pub const TC_PREFILL_HEAD_DIMS: [usize; 2] = [64, 128];
/// Positions per decode partition; contexts up to this length are not split.
const DECODE_PARTITION: usize = 512;
/// Rows of activations per quantized GEMV launch (`GQ_MAX_M`).
const GQ_MAX_M: usize = 8;
/// Maximum k of [`GpuKernels::topk`].
pub const MAX_TOP_K: usize = 256;

/// The ggml block formats the quantized kernels read (32 values per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuQuant {
    /// `value = q · d`, 34 bytes.
    Q8_0,
    /// `value = (q - 8) · d`, 18 bytes.
    Q4_0,
    /// `value = q · d + m`, 20 bytes.
    Q4_1,
}

impl GpuQuant {
    /// Bytes of one 32-value block.
    pub const fn block_bytes(self) -> usize {
        match self {
            GpuQuant::Q8_0 => 34,
            GpuQuant::Q4_0 => 18,
            GpuQuant::Q4_1 => 20,
        }
    }

    fn name(self) -> &'static str {
        match self {
            GpuQuant::Q8_0 => "q8_0",
            GpuQuant::Q4_0 => "q4_0",
            GpuQuant::Q4_1 => "q4_1",
        }
    }
}

/// Arguments of [`GpuKernels::rope_and_cache`].
#[derive(Debug)]
pub struct RopeCacheArgs<'a, T> {
    /// Fused qkv projection `[tokens, row_stride]`; q and k are rotated in place.
    pub qkv: &'a mut CudaSlice<T>,
    /// Tokens in the batch.
    pub tokens: usize,
    /// Values per qkv row.
    pub row_stride: usize,
    /// Offsets of q, k and v inside a row.
    pub q_offset: usize,
    /// See `q_offset`.
    pub k_offset: usize,
    /// See `q_offset`.
    pub v_offset: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Rotated dims per head (`head_dim` unless the model uses partial rotary).
    pub rot_dim: usize,
    /// Position of each token.
    pub positions: &'a CudaSlice<i32>,
    /// `rot_dim / 2` inverse frequencies.
    pub inv_freq: &'a CudaSlice<f32>,
    /// Cache slot of each token (-1: no write).
    pub slot_mapping: &'a CudaSlice<i32>,
    /// The layer's K cache.
    pub cache_k: &'a mut CudaSlice<T>,
    /// The layer's V cache.
    pub cache_v: &'a mut CudaSlice<T>,
}

/// The paged cache of one layer and how the query heads map onto it.
#[derive(Debug, Clone, Copy)]
pub struct CacheView<'a, T> {
    /// `[num_blocks * block_size, kv_heads, head_dim]`.
    pub k: &'a CudaSlice<T>,
    /// Same shape as `k`.
    pub v: &'a CudaSlice<T>,
    /// Tokens per block.
    pub block_size: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// `[num_seqs, max_blocks]`.
    pub block_tables: &'a CudaSlice<i32>,
    /// Columns of `block_tables`.
    pub max_blocks: usize,
}

/// Arguments of [`GpuKernels::paged_attention_decode`]: one query row per sequence.
#[derive(Debug)]
pub struct DecodeArgs<'a, T> {
    /// `[num_seqs, num_heads * head_dim]`.
    pub out: &'a mut CudaSlice<T>,
    /// Query rows `q_stride` apart, heads at the start of each row.
    pub q: &'a CudaSlice<T>,
    /// Values between query rows.
    pub q_stride: usize,
    /// The cache.
    pub cache: CacheView<'a, T>,
    /// Context length of each sequence (the query is at `len - 1`), already in the cache.
    pub context_lens: &'a CudaSlice<i32>,
    /// The longest context (host-side, to size the split).
    pub max_context: usize,
    /// Sequences.
    pub num_seqs: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Sliding window: a query at p sees `p - window < j <= p`.
    pub window: Option<usize>,
}

/// Arguments of [`GpuKernels::flash_attention_prefill`]: a flattened, variable-length batch.
#[derive(Debug)]
pub struct PrefillArgs<'a, T> {
    /// `[total_rows, num_heads * head_dim]`.
    pub out: &'a mut CudaSlice<T>,
    /// Query rows `q_stride` apart, heads at the start of each row.
    pub q: &'a CudaSlice<T>,
    /// Values between query rows.
    pub q_stride: usize,
    /// The cache, which already holds every attended position.
    pub cache: CacheView<'a, T>,
    /// `[num_seqs + 1]` first query row of each sequence, then the total.
    pub cu_seqlens: &'a CudaSlice<i32>,
    /// `[num_seqs]` position of each sequence's first query row.
    pub first_pos: &'a CudaSlice<i32>,
    /// Sequences.
    pub num_seqs: usize,
    /// Most query rows of one sequence (host-side, to size the grid).
    pub max_rows: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Softmax scale.
    pub scale: f32,
    /// Sliding window, as in [`DecodeArgs::window`].
    pub window: Option<usize>,
}

/// Which prefill kernel to launch, and its tiling.
struct Prefill {
    module: &'static str,
    name: String,
    tile_rows: usize,
    smem: usize,
}

/// The compiled kernels of one device.
#[derive(Debug)]
pub struct GpuKernels {
    stream: Arc<CudaStream>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

fn shape(ok: bool, what: impl FnOnce() -> String) -> Result<(), CudaError> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Shape(what()))
    }
}

fn i32_of(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::Shape(format!("{what} = {v} does not fit in i32")))
}

fn grid(x: usize, y: usize, z: usize, threads: u32, smem: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, z as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem as u32,
    }
}

/// Threads for a one-block-per-row kernel: enough warps to cover the row, at most 1024.
fn row_threads(width: usize) -> u32 {
    (width.div_ceil(32) * 32).clamp(32, 1024) as u32
}

impl GpuKernels {
    /// Compiles (or loads from `cache`) every source for the device's architecture and loads
    /// the modules.
    pub fn load(device: &GpuDevice, cache: &PtxCache) -> Result<Self, CudaError> {
        let arch = arch_for(device.compute_capability());
        let mut modules = HashMap::new();
        for source in SOURCES {
            let ptx = cache.get_or_compile(source, &arch)?;
            let module = device.context().load_module(Ptx::from_src(ptx))?;
            modules.insert(source.name, module);
        }
        Ok(GpuKernels {
            stream: device.stream().clone(),
            modules,
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn function(&self, module: &'static str, name: &str) -> Result<CudaFunction, CudaError> {
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = functions.get(name) {
            return Ok(f.clone());
        }
        let f = self.modules[module].load_function(name)?;
        functions.insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// `out = rms_norm(x) * weight` for `rows` rows of `weight.len()` values.
    pub fn rms_norm<T: GpuFloat>(
        &self,
        x: &CudaSlice<T>,
        weight: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let d = weight.len();
        shape(x.len() >= rows * d && out.len() >= rows * d, || {
            format!(
                "rms_norm: {rows} rows of {d} vs x {} out {}",
                x.len(),
                out.len()
            )
        })?;
        if rows == 0 {
            return Ok(());
        }
        let f = self.function("norm.cu", &format!("rms_norm_{}", T::SUFFIX))?;
        let d = i32_of(d, "hidden size")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(weight).arg(out).arg(&d).arg(&eps);
        // SAFETY: `rows` rows of `d` values fit in `x` and `out` (checked above).
        unsafe { b.launch(grid(rows, 1, 1, row_threads(d as usize), 0)) }?;
        Ok(())
    }

    /// `residual += x; out = rms_norm(residual) * weight`, row by row.
    pub fn add_rms_norm<T: GpuFloat>(
        &self,
        residual: &mut CudaSlice<T>,
        x: &CudaSlice<T>,
        weight: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let d = weight.len();
        shape(
            x.len() >= rows * d && out.len() >= rows * d && residual.len() >= rows * d,
            || format!("add_rms_norm: {rows} rows of {d}"),
        )?;
        if rows == 0 {
            return Ok(());
        }
        let f = self.function("norm.cu", &format!("add_rms_norm_{}", T::SUFFIX))?;
        let d = i32_of(d, "hidden size")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(residual)
            .arg(x)
            .arg(weight)
            .arg(out)
            .arg(&d)
            .arg(&eps);
        // SAFETY: `rows` rows of `d` values fit in every buffer (checked above).
        unsafe { b.launch(grid(rows, 1, 1, row_threads(d as usize), 0)) }?;
        Ok(())
    }

    /// `out[r, :] = silu(gate_up[r, :d]) * gate_up[r, d..]`.
    pub fn silu_mul<T: GpuFloat>(
        &self,
        gate_up: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
        d: usize,
    ) -> Result<(), CudaError> {
        shape(
            gate_up.len() >= rows * 2 * d && out.len() >= rows * d,
            || format!("silu_mul: {rows} rows of {d}"),
        )?;
        if rows * d == 0 {
            return Ok(());
        }
        let f = self.function("activation.cu", &format!("silu_mul_{}", T::SUFFIX))?;
        let (r, dd) = (i32_of(rows, "rows")?, i32_of(d, "width")?);
        let blocks = (rows * d).div_ceil(256).min(65_535);
        let mut b = self.stream.launch_builder(&f);
        b.arg(gate_up).arg(out).arg(&r).arg(&dd);
        // SAFETY: the kernel touches rows·2d inputs and rows·d outputs (checked above).
        unsafe { b.launch(grid(blocks, 1, 1, 256, 0)) }?;
        Ok(())
    }

    /// `out[t, :] = table[ids[t] - vocab_start, :]`, zeros for ids outside this rank's rows.
    pub fn embedding<T: GpuFloat>(
        &self,
        ids: &CudaSlice<i32>,
        table: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        hidden: usize,
        vocab_start: usize,
    ) -> Result<(), CudaError> {
        let tokens = ids.len();
        shape(
            hidden > 0 && table.len().is_multiple_of(hidden) && out.len() >= tokens * hidden,
            || format!("embedding: hidden {hidden}, table {}", table.len()),
        )?;
        if tokens == 0 {
            return Ok(());
        }
        let f = self.function("embedding.cu", &format!("embedding_{}", T::SUFFIX))?;
        let h = i32_of(hidden, "hidden")?;
        let start = i32_of(vocab_start, "vocab_start")?;
        let rows = i32_of(table.len() / hidden, "vocab rows")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(ids)
            .arg(table)
            .arg(out)
            .arg(&h)
            .arg(&start)
            .arg(&rows);
        // SAFETY: rows outside the table are never read; `out` holds tokens × hidden.
        unsafe { b.launch(grid(tokens, 1, 1, row_threads(hidden).min(256), 0)) }?;
        Ok(())
    }

    /// Rotary embedding of q and k in place, and k/v into the paged cache.
    pub fn rope_and_cache<T: GpuFloat>(&self, a: RopeCacheArgs<'_, T>) -> Result<(), CudaError> {
        let slot_w = a.kv_heads * a.head_dim;
        shape(
            a.qkv.len() >= a.tokens * a.row_stride
                && a.q_offset + a.num_heads * a.head_dim <= a.row_stride
                && a.k_offset + slot_w <= a.row_stride
                && a.v_offset + slot_w <= a.row_stride
                && a.positions.len() >= a.tokens
                && a.slot_mapping.len() >= a.tokens
                && a.rot_dim <= a.head_dim
                && a.rot_dim.is_multiple_of(2)
                && a.inv_freq.len() >= a.rot_dim / 2
                && a.cache_k.len() == a.cache_v.len()
                && a.cache_k.len().is_multiple_of(slot_w.max(1)),
            || {
                format!(
                    "rope_and_cache: {} tokens, row stride {}, offsets q {} k {} v {}, \
                     {} heads / {} kv heads of {} (rotary {}), cache {}",
                    a.tokens,
                    a.row_stride,
                    a.q_offset,
                    a.k_offset,
                    a.v_offset,
                    a.num_heads,
                    a.kv_heads,
                    a.head_dim,
                    a.rot_dim,
                    a.cache_k.len()
                )
            },
        )?;
        if a.tokens == 0 {
            return Ok(());
        }
        let f = self.function("rope_cache.cu", &format!("rope_and_cache_{}", T::SUFFIX))?;
        let row_stride = a.row_stride as i64;
        let ints = [
            a.q_offset,
            a.k_offset,
            a.v_offset,
            a.num_heads,
            a.kv_heads,
            a.head_dim,
            a.rot_dim,
        ]
        .map(|v| i32_of(v, "rope_and_cache argument"));
        let [qo, ko, vo, nh, kvh, hd, rd] = ints;
        let (qo, ko, vo, nh, kvh, hd, rd) = (qo?, ko?, vo?, nh?, kvh?, hd?, rd?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(a.qkv).arg(&row_stride).arg(&qo).arg(&ko).arg(&vo);
        b.arg(&nh).arg(&kvh).arg(&hd).arg(&rd);
        b.arg(a.positions).arg(a.inv_freq).arg(a.slot_mapping);
        b.arg(a.cache_k).arg(a.cache_v);
        // SAFETY: row offsets were checked against the row stride and the token count against
        // every per-token buffer; slots are the caller's (the scheduler's) and index the cache.
        unsafe { b.launch(grid(a.tokens, 1, 1, 128, 0)) }?;
        Ok(())
    }

    fn check_cache<T>(
        c: &CacheView<'_, T>,
        num_heads: usize,
        seqs: usize,
    ) -> Result<(), CudaError> {
        shape(
            c.kv_heads > 0
                && num_heads.is_multiple_of(c.kv_heads)
                && c.k.len() == c.v.len()
                && c.k
                    .len()
                    .is_multiple_of((c.block_size * c.kv_heads * c.head_dim).max(1))
                && c.block_tables.len() >= seqs * c.max_blocks,
            || {
                format!(
                    "attention: {num_heads} heads over {} kv heads, cache {}, tables {} for {seqs} × {}",
                    c.kv_heads,
                    c.k.len(),
                    c.block_tables.len(),
                    c.max_blocks
                )
            },
        )
    }

    /// Decode attention, split over the context when it is longer than one partition.
    pub fn paged_attention_decode<T: GpuFloat>(
        &self,
        a: DecodeArgs<'_, T>,
    ) -> Result<(), CudaError> {
        let c = a.cache;
        Self::check_cache(&c, a.num_heads, a.num_seqs)?;
        let width = a.num_heads * c.head_dim;
        shape(
            a.out.len() >= a.num_seqs * width
                && a.q_stride >= width
                && a.q.len() >= a.num_seqs.saturating_sub(1) * a.q_stride + width
                && a.context_lens.len() >= a.num_seqs
                && a.max_context <= c.max_blocks * c.block_size,
            || {
                format!(
                    "paged_attention_decode: {} seqs of width {width}",
                    a.num_seqs
                )
            },
        )?;
        if a.num_seqs == 0 || a.max_context == 0 {
            return Ok(());
        }
        let span = a.window.map_or(a.max_context, |w| w.min(a.max_context));
        let parts = span.div_ceil(DECODE_PARTITION);
        let partition = if parts == 1 { span } else { DECODE_PARTITION };
        let scratch_rows = if parts > 1 {
            a.num_seqs * a.num_heads * parts
        } else {
            1
        };
        let mut part_out = self.stream.alloc_zeros::<f32>(scratch_rows * c.head_dim)?;
        let mut part_max = self.stream.alloc_zeros::<f32>(scratch_rows)?;
        let mut part_sum = self.stream.alloc_zeros::<f32>(scratch_rows)?;

        let f = self.function(
            "paged_attention.cu",
            &format!("paged_attention_decode_{}", T::SUFFIX),
        )?;
        let q_stride = a.q_stride as i64;
        let max_blocks = i32_of(c.max_blocks, "max_blocks")?;
        let window = i32_of(a.window.unwrap_or(0), "window")?;
        let nh = i32_of(a.num_heads, "num_heads")?;
        let kvh = i32_of(c.kv_heads, "kv_heads")?;
        let hd = i32_of(c.head_dim, "head_dim")?;
        let bs = i32_of(c.block_size, "block_size")?;
        let ps = i32_of(partition, "partition")?;
        let smem = (c.head_dim + partition) * 4;
        {
            let mut b = self.stream.launch_builder(&f);
            b.arg(&mut *a.out)
                .arg(&mut part_out)
                .arg(&mut part_max)
                .arg(&mut part_sum);
            b.arg(a.q)
                .arg(&q_stride)
                .arg(c.k)
                .arg(c.v)
                .arg(c.block_tables)
                .arg(&max_blocks);
            b.arg(a.context_lens)
                .arg(&a.scale)
                .arg(&window)
                .arg(&nh)
                .arg(&kvh)
                .arg(&hd);
            b.arg(&bs).arg(&ps);
            // SAFETY: shapes checked above; scratch holds seqs × heads × parts rows when split;
            // the context lengths and block tables are the scheduler's and stay inside the
            // cache (`max_context` ≤ max_blocks · block_size).
            unsafe { b.launch(grid(a.num_heads, a.num_seqs, parts, 128, smem)) }?;
        }
        if parts > 1 {
            let f = self.function(
                "paged_attention.cu",
                &format!("paged_attention_reduce_{}", T::SUFFIX),
            )?;
            let p = i32_of(parts, "partitions")?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(a.out).arg(&part_out).arg(&part_max).arg(&part_sum);
            b.arg(&nh).arg(&hd).arg(&p);
            // SAFETY: reads the scratch written above, writes seqs × heads × head_dim outputs.
            unsafe { b.launch(grid(a.num_heads, a.num_seqs, 1, 128, 0)) }?;
        }
        Ok(())
    }

    /// Prefill attention over the paged cache for a flattened batch of sequences (f32 math
    /// on CUDA cores; any dtype and every head_dim of [`PREFILL_HEAD_DIMS`]).
    pub fn flash_attention_prefill<T: GpuFloat>(
        &self,
        a: PrefillArgs<'_, T>,
    ) -> Result<(), CudaError> {
        let hd = a.cache.head_dim;
        shape(PREFILL_HEAD_DIMS.contains(&hd), || {
            format!("flash_attention_prefill: head_dim {hd} not in {PREFILL_HEAD_DIMS:?}")
        })?;
        let kernel = Prefill {
            module: "flash_attention.cu",
            name: format!("flash_attention_prefill_{}_hd{hd}", T::SUFFIX),
            tile_rows: FA_BM,
            smem: (FA_BM * hd + FA_BN * (hd + 1) + FA_BN * hd) * 4,
        };
        self.prefill(a, kernel)
    }

    /// Whether [`Self::flash_attention_prefill_tc`] has an instance for `T` and `head_dim`.
    pub fn tensor_core_prefill_supported<T: GpuFloat>(head_dim: usize) -> bool {
        matches!(T::SUFFIX, "bf16" | "f16") && TC_PREFILL_HEAD_DIMS.contains(&head_dim)
    }

    /// [`Self::flash_attention_prefill`] with q·kᵀ and p·v on tensor cores
    /// (`flash_attention_mma.cu`, sm_80+): bf16/f16, head_dim 64 or 128. `p` is rounded to
    /// the storage type before its product.
    pub fn flash_attention_prefill_tc<T: GpuFloat>(
        &self,
        a: PrefillArgs<'_, T>,
    ) -> Result<(), CudaError> {
        let hd = a.cache.head_dim;
        shape(Self::tensor_core_prefill_supported::<T>(hd), || {
            format!(
                "flash_attention_prefill_tc: {} head_dim {hd}: only bf16/f16 with {TC_PREFILL_HEAD_DIMS:?}",
                T::SUFFIX
            )
        })?;
        let kernel = Prefill {
            module: "flash_attention_mma.cu",
            name: format!("flash_attention_prefill_mma_{}_hd{hd}", T::SUFFIX),
            tile_rows: MMA_BM,
            smem: 2 * MMA_BN * (hd + 8) * std::mem::size_of::<T>(),
        };
        self.prefill(a, kernel)
    }

    fn prefill<T: GpuFloat>(&self, a: PrefillArgs<'_, T>, k: Prefill) -> Result<(), CudaError> {
        let c = a.cache;
        Self::check_cache(&c, a.num_heads, a.num_seqs)?;
        shape(
            a.cu_seqlens.len() > a.num_seqs
                && a.first_pos.len() >= a.num_seqs
                && a.q_stride >= a.num_heads * c.head_dim,
            || format!("{}: {} seqs", k.name, a.num_seqs),
        )?;
        if a.num_seqs == 0 || a.max_rows == 0 {
            return Ok(());
        }
        let f = self.function(k.module, &k.name)?;
        if k.smem > 48 * 1024 {
            // Above 48 KiB, dynamic shared memory must be opted into per function.
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                k.smem as i32,
            )?;
        }
        let q_stride = a.q_stride as i64;
        let max_blocks = i32_of(c.max_blocks, "max_blocks")?;
        let window = i32_of(a.window.unwrap_or(0), "window")?;
        let nh = i32_of(a.num_heads, "num_heads")?;
        let kvh = i32_of(c.kv_heads, "kv_heads")?;
        let bs = i32_of(c.block_size, "block_size")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(a.out).arg(a.q).arg(&q_stride).arg(c.k).arg(c.v);
        b.arg(a.cu_seqlens)
            .arg(a.first_pos)
            .arg(c.block_tables)
            .arg(&max_blocks);
        b.arg(&a.scale).arg(&window).arg(&nh).arg(&kvh).arg(&bs);
        let tiles = a.max_rows.div_ceil(k.tile_rows);
        // SAFETY: shapes checked above; `cu_seqlens` / `first_pos` / block tables come from the
        // scheduler and address rows of `q`/`out` and blocks of the cache.
        unsafe { b.launch(grid(tiles, a.num_heads, a.num_seqs, 128, k.smem)) }?;
        Ok(())
    }

    /// `y[m, n] = x[m, k] · W[n, k]ᵀ` with `W` as `quant` blocks, dequantized in registers
    /// (for decode: the kernel reads the weights once for up to 8 rows of `x` at a time).
    pub fn gemv<T: GpuFloat>(
        &self,
        quant: GpuQuant,
        w: &CudaSlice<u8>,
        x: &CudaSlice<T>,
        y: &mut CudaSlice<T>,
        dims: (usize, usize, usize),
    ) -> Result<(), CudaError> {
        let (m, n, k) = dims;
        let kernel = format!("gemv_{}", quant.name());
        shape(
            k.is_multiple_of(32)
                && w.len() >= n * (k / 32) * quant.block_bytes()
                && x.len() >= m * k
                && y.len() >= m * n,
            || format!("{kernel}: m={m} n={n} k={k}, w {} bytes", w.len()),
        )?;
        let f = self.function("gemv_quant.cu", &format!("{kernel}_{}", T::SUFFIX))?;
        let (nn, kk) = (i32_of(n, "n")?, i32_of(k, "k")?);
        for i0 in (0..m).step_by(GQ_MAX_M) {
            let rows = i32_of(GQ_MAX_M.min(m - i0), "m")?;
            let xs = x.slice(i0 * k..);
            let mut ys = y.slice_mut(i0 * n..);
            let mut b = self.stream.launch_builder(&f);
            b.arg(w).arg(&xs).arg(&mut ys).arg(&nn).arg(&kk).arg(&rows);
            // SAFETY: n rows of k / 32 blocks fit in `w`; `rows` activation rows of k values
            // remain in `xs` and of n values in `ys` (checked above).
            unsafe { b.launch(grid(n.div_ceil(4), 1, 1, 128, 0)) }?;
        }
        Ok(())
    }

    /// `out[n, k]`: the `quant` matrix `w` dequantized into the storage type.
    pub fn dequantize<T: GpuFloat>(
        &self,
        quant: GpuQuant,
        w: &CudaSlice<u8>,
        out: &mut CudaSlice<T>,
        n: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let blocks = n * (k / 32);
        shape(
            k.is_multiple_of(32) && w.len() >= blocks * quant.block_bytes() && out.len() >= n * k,
            || {
                format!(
                    "dequantize {}: n={n} k={k}, w {} bytes",
                    quant.name(),
                    w.len()
                )
            },
        )?;
        if blocks == 0 {
            return Ok(());
        }
        let f = self.function(
            "gemv_quant.cu",
            &format!("dequant_{}_{}", quant.name(), T::SUFFIX),
        )?;
        let count = blocks as i64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(w).arg(out).arg(&count);
        // SAFETY: `blocks` blocks in `w` and 32 · blocks values in `out` (checked above).
        unsafe { b.launch(grid(blocks.div_ceil(128), 1, 1, 128, 0)) }?;
        Ok(())
    }

    /// `y[r, :] += bias` for `rows` rows of `bias.len()` values.
    pub fn add_bias<T: GpuFloat>(
        &self,
        y: &mut CudaSlice<T>,
        bias: &CudaSlice<T>,
        rows: usize,
    ) -> Result<(), CudaError> {
        let n = bias.len();
        shape(y.len() >= rows * n, || {
            format!("add_bias: {rows} rows of {n}, y {}", y.len())
        })?;
        if rows * n == 0 {
            return Ok(());
        }
        let f = self.function("activation.cu", &format!("add_bias_{}", T::SUFFIX))?;
        let (r, nn) = (i32_of(rows, "rows")?, i32_of(n, "width")?);
        let blocks = (rows * n).div_ceil(256).min(65_535);
        let mut b = self.stream.launch_builder(&f);
        b.arg(y).arg(bias).arg(&r).arg(&nn);
        // SAFETY: rows · n values of `y` and n of `bias` (checked above).
        unsafe { b.launch(grid(blocks, 1, 1, 256, 0)) }?;
        Ok(())
    }

    /// Greedy ids: the first maximum of each row of `logits` `[rows, vocab]`.
    pub fn argmax<T: GpuFloat>(
        &self,
        logits: &CudaSlice<T>,
        ids: &mut CudaSlice<i32>,
        vocab: usize,
    ) -> Result<(), CudaError> {
        let rows = ids.len();
        shape(logits.len() >= rows * vocab && vocab > 0, || {
            format!("argmax: {rows} rows of {vocab}")
        })?;
        if rows == 0 {
            return Ok(());
        }
        let f = self.function("sampling.cu", &format!("argmax_{}", T::SUFFIX))?;
        let v = i32_of(vocab, "vocab")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(logits).arg(ids).arg(&v);
        // SAFETY: rows × vocab logits (checked above).
        unsafe { b.launch(grid(rows, 1, 1, 1024, 0)) }?;
        Ok(())
    }

    /// f32 `log_softmax(logits / temperature)` of each row.
    pub fn log_softmax<T: GpuFloat>(
        &self,
        logits: &CudaSlice<T>,
        out: &mut CudaSlice<f32>,
        vocab: usize,
        temperature: f32,
    ) -> Result<(), CudaError> {
        shape(
            vocab > 0 && out.len().is_multiple_of(vocab) && logits.len() >= out.len(),
            || format!("log_softmax: vocab {vocab}"),
        )?;
        shape(temperature > 0.0, || {
            "log_softmax: temperature must be > 0".into()
        })?;
        let rows = out.len() / vocab;
        if rows == 0 {
            return Ok(());
        }
        let f = self.function("sampling.cu", &format!("log_softmax_{}", T::SUFFIX))?;
        let v = i32_of(vocab, "vocab")?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(logits).arg(out).arg(&v).arg(&temperature);
        // SAFETY: rows × vocab in and out (checked above).
        unsafe { b.launch(grid(rows, 1, 1, 1024, 0)) }?;
        Ok(())
    }

    /// The `k` best logits of each row and their ids, best first (ties: lowest id).
    pub fn topk<T: GpuFloat>(
        &self,
        logits: &CudaSlice<T>,
        values: &mut CudaSlice<f32>,
        ids: &mut CudaSlice<i32>,
        vocab: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        shape(
            (1..=MAX_TOP_K.min(vocab)).contains(&k)
                && values.len() == ids.len()
                && values.len().is_multiple_of(k)
                && logits.len() >= values.len() / k * vocab,
            || format!("topk: k {k} (max {MAX_TOP_K}), vocab {vocab}"),
        )?;
        let rows = values.len() / k;
        if rows == 0 {
            return Ok(());
        }
        let f = self.function("sampling.cu", &format!("topk_{}", T::SUFFIX))?;
        let (v, kk) = (i32_of(vocab, "vocab")?, i32_of(k, "k")?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(logits).arg(values).arg(ids).arg(&v).arg(&kk);
        // SAFETY: rows × vocab logits, rows × k outputs (checked above).
        unsafe { b.launch(grid(rows, 1, 1, 1024, 0)) }?;
        Ok(())
    }
}
