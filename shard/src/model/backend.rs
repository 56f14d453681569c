//! The operations a forward pass is made of, as a device implements them. The pass itself
//! (`super::forward`) is written once against this trait; the CPU backend (`super::cpu`) and
//! the CUDA one (`super::cuda`, feature `cuda`) each own their weights and buffers.

use tessera_model_files::Activation;

use super::batch::FlatBatch;
use crate::EngineError;
use crate::kv_cache::PageStore;

/// Which RMSNorm weight to apply.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Norm {
    /// Before attention in layer `i`.
    Input(usize),
    /// Before the MLP in layer `i`.
    PreMlp(usize),
    /// Of the attention's output in layer `i`, before its residual add (sandwich norms).
    AttentionOut(usize),
    /// Of the MLP's output in layer `i`, before its residual add (sandwich norms).
    MlpOut(usize),
}

/// Which projection of a layer to multiply by.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Proj {
    /// `[q | k | v]`.
    Qkv,
    /// Attention output (row-parallel).
    O,
    /// `[gate | up]`.
    GateUp,
    /// MLP output (row-parallel).
    Down,
}

/// This rank's widths of one layer's tensors, and the layer's structure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    /// Norms on the attention and MLP outputs ([`Norm::AttentionOut`], [`Norm::MlpOut`]).
    pub(crate) sandwich_norms: bool,
    /// The MLP's gate activation.
    pub(crate) activation: Activation,
    pub(crate) hidden: usize,
    pub(crate) head_dim: usize,
    /// Query heads of this rank.
    pub(crate) heads: usize,
    /// KV heads of this rank.
    pub(crate) kv_heads: usize,
    /// MLP width of this rank.
    pub(crate) intermediate: usize,
}

impl Dims {
    pub(crate) fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// A device's weights and kernels. Buffers hold `[rows, width]` row-major activations.
pub(crate) trait Backend {
    /// An activation buffer.
    type Act;
    /// Every layer's K and V pages, in this backend's memory and element type: a pass can
    /// only be handed pages of its own backend.
    type Pages: PageStore;
    /// A pass's index arrays (positions, slots, block tables…) where the kernels read them.
    type Batch<'a>
    where
        Self: 'a;

    fn upload<'a>(&'a self, batch: &'a FlatBatch<'a>) -> Result<Self::Batch<'a>, EngineError>;

    /// A zeroed buffer of `len` values.
    fn zeros(&self, len: usize) -> Result<Self::Act, EngineError>;

    /// This rank's embedding rows of the batch's tokens, scaled as the family scales them
    /// (zero rows for other ranks' tokens).
    fn embed(&self, batch: &Self::Batch<'_>, out: &mut Self::Act) -> Result<(), EngineError>;

    fn rms_norm(
        &self,
        norm: Norm,
        x: &Self::Act,
        out: &mut Self::Act,
        rows: usize,
    ) -> Result<(), EngineError>;

    /// `residual += x; out = rms_norm(residual)`.
    fn add_rms_norm(
        &self,
        norm: Norm,
        residual: &mut Self::Act,
        x: &Self::Act,
        out: &mut Self::Act,
        rows: usize,
    ) -> Result<(), EngineError>;

    /// `out = x · Wᵀ (+ bias)` for layer `layer`'s projection `proj`.
    fn linear(
        &self,
        layer: usize,
        proj: Proj,
        x: &Self::Act,
        out: &mut Self::Act,
        rows: usize,
    ) -> Result<(), EngineError>;

    /// Normalises q and k per head where the layer does, rotates them, writes k and v into
    /// layer `layer`'s pages, and attends (with the layer's window, scale and soft-cap):
    /// `out` gets `[rows, heads · head_dim]`.
    fn attention(
        &self,
        layer: usize,
        batch: &Self::Batch<'_>,
        qkv: &mut Self::Act,
        kv: &mut Self::Pages,
        out: &mut Self::Act,
    ) -> Result<(), EngineError>;

    /// `out = act(gate) · up` of `[gate | up]` rows of `2 · width`.
    fn gated(
        &self,
        act: Activation,
        gate_up: &Self::Act,
        out: &mut Self::Act,
        rows: usize,
        width: usize,
    ) -> Result<(), EngineError>;

    /// Whether layer `layer`'s MLP is a mixture of experts ([`Self::moe`]).
    fn sparse_mlp(&self, layer: usize) -> bool;

    /// `out = Σ_picked p_e · expert_e(x)` of layer `layer`'s sparse MLP, for `rows` rows of
    /// `x` (this rank's part of each expert: the sum over ranks follows).
    fn moe(
        &self,
        layer: usize,
        x: &Self::Act,
        out: &mut Self::Act,
        rows: usize,
    ) -> Result<(), EngineError>;

    /// Sums `x` across the tensor-parallel ranks (nothing with one rank).
    fn all_reduce(&self, x: &mut Self::Act) -> Result<(), EngineError>;

    /// Final norm of `residual + proj` for the batch's logit rows: `[logit rows, hidden]`.
    fn final_norm(
        &self,
        batch: &Self::Batch<'_>,
        residual: &Self::Act,
        proj: &Self::Act,
    ) -> Result<Self::Act, EngineError>;

    /// This rank's vocabulary slice of the LM head over `rows` final hidden states:
    /// `[rows, local vocab]`, soft-capped where the family caps them.
    fn lm_head(&self, hidden: &Self::Act, rows: usize) -> Result<Self::Act, EngineError>;

    /// The first `len` values of `x` on the host.
    fn to_host(&self, x: Self::Act, len: usize) -> Result<Vec<f32>, EngineError>;

    /// Host values in this backend's memory and element type.
    fn upload_values(&self, x: &[f32]) -> Result<Self::Act, EngineError>;
}
