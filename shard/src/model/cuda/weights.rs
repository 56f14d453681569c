//! The weights in GPU memory (dense, or the file's quantized blocks), their upload, and the
//! products with them.

use std::sync::Arc;

use rayon::prelude::*;
use tessera_kernels::cpu::{WeightFormat, WeightMatrix};
use tessera_kernels::cuda::cudarc::driver::{CudaSlice, CudaStream};
use tessera_kernels::cuda::{Gemm, GpuDevice, GpuFloat, GpuKernels, GpuQuant, PtxCache};
use tessera_model_files::Activation;

use super::super::backend::{Backend, Norm, Proj};
use super::super::cpu::CpuBackend;
use super::super::weights::{LayerWeights, Linear};
use super::graph::DecodeGraphs;
use super::*;
use crate::EngineError;

/// A weight matrix in GPU memory: dense in the element type, or the file's ggml blocks.
pub(super) enum GpuWeight<T> {
    Dense(CudaSlice<T>),
    Quant {
        quant: GpuQuant,
        blocks: CudaSlice<u8>,
    },
}

/// Activation rows up to which a quantized product runs as a GEMV straight from the blocks
/// (the kernel re-reads them per 8 rows, still less traffic than a dequantized copy); above,
/// the matrix is dequantized into scratch and multiplied by cuBLASLt.
const GEMV_MAX_ROWS: usize = 64;

pub(super) struct GpuLinear<T> {
    weight: GpuWeight<T>,
    bias: Option<CudaSlice<T>>,
    out_features: usize,
    in_features: usize,
}

pub(super) struct GpuLayer<T> {
    input_norm: CudaSlice<T>,
    pre_mlp_norm: CudaSlice<T>,
    /// The attention's and the MLP's output norms (sandwich norms).
    out_norms: Option<(CudaSlice<T>, CudaSlice<T>)>,
    qkv: GpuLinear<T>,
    o: GpuLinear<T>,
    gate_up: GpuLinear<T>,
    down: GpuLinear<T>,
}

pub(super) fn to_elems<T: GpuFloat>(values: &[f32]) -> Vec<T> {
    values.par_iter().map(|&v| T::from_f32(v)).collect()
}

/// Copies host weights into GPU memory on one stream.
struct Uploader<'a> {
    stream: &'a Arc<CudaStream>,
    /// Whether matrices in a format the GPU kernels read stay in their ggml blocks.
    quantized: bool,
}

impl Uploader<'_> {
    fn put<T: DeviceElem>(&self, values: &[f32]) -> Result<CudaSlice<T>, EngineError> {
        self.stream
            .clone_htod(&to_elems::<T>(values))
            .map_err(device_error)
    }

    /// A matrix already in the element type goes up as it is; others are converted on
    /// rayon's threads (a bf16 checkpoint on a bf16 GPU is copied, never widened).
    fn dense<T: DeviceElem>(&self, m: &WeightMatrix) -> Result<CudaSlice<T>, EngineError> {
        match T::stored(m) {
            Some(values) => self.stream.clone_htod(values).map_err(device_error),
            None => self.put(&m.to_f32()),
        }
    }

    fn weight<T: DeviceElem>(&self, m: &WeightMatrix) -> Result<GpuWeight<T>, EngineError> {
        let quant = match m.ggml_blocks() {
            Some((WeightFormat::Q8_0, b)) => Some((GpuQuant::Q8_0, b)),
            Some((WeightFormat::Q4_0, b)) => Some((GpuQuant::Q4_0, b)),
            Some((WeightFormat::Q4_1, b)) => Some((GpuQuant::Q4_1, b)),
            _ => None,
        };
        Ok(match quant {
            Some((quant, bytes)) if self.quantized => GpuWeight::Quant {
                quant,
                blocks: self.stream.clone_htod(bytes).map_err(device_error)?,
            },
            _ => GpuWeight::Dense(self.dense(m)?),
        })
    }

    fn linear<T: DeviceElem>(&self, l: &Linear) -> Result<GpuLinear<T>, EngineError> {
        Ok(GpuLinear {
            weight: self.weight(&l.weight)?,
            bias: l.bias.as_deref().map(|b| self.put(b)).transpose()?,
            out_features: l.out_features(),
            in_features: l.in_features(),
        })
    }

    fn layer<T: DeviceElem>(&self, l: &LayerWeights) -> Result<GpuLayer<T>, EngineError> {
        // `upload` refuses sparse models first.
        let (gate_up, down) = l.mlp.dense().ok_or_else(|| {
            EngineError::Device("the CUDA backend has no mixture-of-experts MLP".into())
        })?;
        Ok(GpuLayer {
            input_norm: self.put(&l.input_norm)?,
            pre_mlp_norm: self.put(&l.pre_mlp_norm)?,
            out_norms: match &l.out_norms {
                Some((attention, mlp)) => Some((self.put(attention)?, self.put(mlp)?)),
                None => None,
            },
            qkv: self.linear(&l.qkv)?,
            o: self.linear(&l.o)?,
            gate_up: self.linear(gate_up)?,
            down: self.linear(down)?,
        })
    }

    /// The output projection of an untied model (it has no bias).
    fn lm_head<T: DeviceElem>(&self, m: &WeightMatrix) -> Result<GpuLinear<T>, EngineError> {
        Ok(GpuLinear {
            weight: self.weight(m)?,
            bias: None,
            out_features: m.rows(),
            in_features: m.cols(),
        })
    }
}

/// The first of a model's features the CUDA kernels lack, if it has one.
fn unsupported(cpu: &CpuBackend) -> Option<&'static str> {
    let family = &cpu.family;
    let plain_rope = matches!(cpu.rope.fixed(), Some((_, f)) if f == 1.0);
    [
        (!plain_rope, "length-dependent or attention-scaled RoPE"),
        (family.moe.is_some(), "mixture-of-experts MLPs"),
        (family.qk_norm, "per-head q/k norms"),
        (
            family.activation != Activation::Silu,
            "the GeGLU activation",
        ),
        (family.embedding_scale.is_some(), "scaled embeddings"),
        (family.attention_softcap.is_some(), "attention soft-capping"),
        (family.final_softcap.is_some(), "final-logit soft-capping"),
        (
            family.layers.iter().any(|l| l.local_rope),
            "a separate RoPE for sliding layers",
        ),
        (family.layers.iter().any(|l| !l.rope), "layers without RoPE"),
        (
            cpu.weights.layers.iter().any(|l| l.sinks.is_some()),
            "attention sinks",
        ),
    ]
    .into_iter()
    .find_map(|(has, what)| has.then_some(what))
}

/// The most values in any quantized matrix: the dequantization scratch a product may need.
fn largest_quant<T>(layers: &[GpuLayer<T>], lm_head: Option<&GpuLinear<T>>) -> usize {
    layers
        .iter()
        .flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down])
        .chain(lm_head)
        .filter(|l| matches!(l.weight, GpuWeight::Quant { .. }))
        .map(|l| l.out_features * l.in_features)
        .max()
        .unwrap_or(0)
}

impl<T: DeviceElem> CudaBackend<T> {
    pub(super) fn upload(
        cpu: CpuBackend,
        device: GpuDevice,
        options: &CudaOptions,
    ) -> Result<Self, EngineError> {
        if let Some(missing) = unsupported(&cpu) {
            return Err(EngineError::Device(format!(
                "the CUDA backend does not implement {missing} yet; run this model on the CPU"
            )));
        }
        let kernels =
            GpuKernels::load(&device, &PtxCache::default_location()).map_err(device_error)?;
        let gemm = Gemm::new(device.stream().clone()).map_err(device_error)?;
        let stream = device.stream().clone();
        let up = Uploader {
            stream: &stream,
            quantized: options.quantized,
        };
        let w = cpu.weights;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(up.layer(l)?);
        }
        // The lookup kernel reads dense rows.
        let embed = up.dense(&w.embed)?;
        let lm_head = w.lm_head.as_ref().map(|m| up.lm_head(m)).transpose()?;
        let largest_quant = largest_quant(&layers, lm_head.as_ref());
        let final_norm = up.put(&w.final_norm)?;
        let (freqs, _) = cpu.rope.fixed().unwrap_or_default();
        let inv_freq = stream.clone_htod(freqs).map_err(device_error)?;
        stream.synchronize().map_err(device_error)?;
        Ok(CudaBackend {
            kernels,
            gemm,
            layers,
            embed,
            lm_head,
            largest_quant,
            final_norm,
            vocab_start: w.vocab.start,
            local_vocab: w.vocab.len(),
            inv_freq,
            dims: cpu.dims,
            eps: cpu.eps,
            windows: cpu.family.layers.iter().map(|l| l.window).collect(),
            attention_scale: cpu.family.attention_scale,
            rotary_dim: cpu.family.rotary_dim,
            comm: cpu.comm,
            world_size: cpu.world_size,
            graphs: DecodeGraphs::new(options.graphs),
            tensor_core_attention: options.tensor_core_attention
                && GpuKernels::tensor_core_prefill_supported::<T>(cpu.dims.head_dim),
            device,
        })
    }

    /// `out = x · Wᵀ (+ bias)` for `rows` rows, in whichever form `l` keeps its weights.
    pub(super) fn multiply(
        &self,
        l: &GpuLinear<T>,
        x: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        rows: usize,
    ) -> Result<(), EngineError> {
        let (n, k) = (l.out_features, l.in_features);
        match &l.weight {
            GpuWeight::Dense(w) => self.gemm.linear(x, w, l.bias.as_ref(), out, rows, n, k),
            GpuWeight::Quant { quant, blocks } if rows <= GEMV_MAX_ROWS => {
                self.kernels
                    .gemv(*quant, blocks, x, out, (rows, n, k))
                    .map_err(device_error)?;
                match &l.bias {
                    Some(bias) => self.kernels.add_bias(out, bias, rows),
                    None => Ok(()),
                }
            }
            GpuWeight::Quant { quant, blocks } => {
                let mut dense = self.zeros(n * k)?;
                self.kernels
                    .dequantize(*quant, blocks, &mut dense, n, k)
                    .map_err(device_error)?;
                self.gemm
                    .linear(x, &dense, l.bias.as_ref(), out, rows, n, k)
            }
        }
        .map_err(device_error)
    }

    pub(super) fn projection(&self, layer: usize, proj: Proj) -> &GpuLinear<T> {
        let l = &self.layers[layer];
        match proj {
            Proj::Qkv => &l.qkv,
            Proj::O => &l.o,
            Proj::GateUp => &l.gate_up,
            Proj::Down => &l.down,
        }
    }

    pub(super) fn norm_weight(&self, norm: Norm) -> Result<&CudaSlice<T>, EngineError> {
        let out_norms = |l: usize| {
            self.layers[l]
                .out_norms
                .as_ref()
                .ok_or_else(|| EngineError::InvalidBatch(format!("layer {l} has no output norms")))
        };
        Ok(match norm {
            Norm::Input(l) => &self.layers[l].input_norm,
            Norm::PreMlp(l) => &self.layers[l].pre_mlp_norm,
            Norm::AttentionOut(l) => &out_norms(l)?.0,
            Norm::MlpOut(l) => &out_norms(l)?.1,
        })
    }
}
