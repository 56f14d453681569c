//! The decoder's forward pass, written once for every backend: embedding, then per layer
//! RMSNorm → qkv → RoPE + cache write + attention → o_proj (+ all-reduce) → residual + RMSNorm
//! → gate/up → SiLU·mul → down (+ all-reduce), then the final norm and the LM head.

use super::backend::{Backend, Dims, Norm, Proj};
use super::batch::FlatBatch;
use crate::EngineError;

/// Runs `batch` through `layers` layers of `backend`, writing K/V into `kv`; returns this
/// rank's `[logit rows, local vocab]` logits on the host.
pub(crate) fn forward<B: Backend>(
    backend: &B,
    d: Dims,
    layers: usize,
    batch: &FlatBatch<'_>,
    kv: &mut B::Pages,
    local_vocab: usize,
) -> Result<Vec<f32>, EngineError> {
    let pass = backend.upload(batch)?;
    let logits = run(backend, d, layers, &pass, batch.tokens(), kv)?;
    backend.to_host(logits, batch.logit_rows.len() * local_vocab)
}

/// The pass on the device, from its uploaded index arrays to its logits there (what a CUDA
/// graph captures).
pub(crate) fn run<B: Backend>(
    b: &B,
    d: Dims,
    layers: usize,
    pass: &B::Batch<'_>,
    t: usize,
    kv: &mut B::Pages,
) -> Result<B::Act, EngineError> {
    let mut residual = b.zeros(t * d.hidden)?;
    b.embed(pass, &mut residual)?;
    b.all_reduce(&mut residual)?;
    let mut normed = b.zeros(t * d.hidden)?;
    let mut qkv = b.zeros(t * d.qkv_width())?;
    let mut attn = b.zeros(t * d.heads * d.head_dim)?;
    let mut proj = b.zeros(t * d.hidden)?;
    let mut gate_up = b.zeros(t * 2 * d.intermediate)?;
    let mut act = b.zeros(t * d.intermediate)?;
    for li in 0..layers {
        if li == 0 {
            b.rms_norm(Norm::Input(li), &residual, &mut normed, t)?;
        } else {
            b.add_rms_norm(Norm::Input(li), &mut residual, &proj, &mut normed, t)?;
        }
        b.linear(li, Proj::Qkv, &normed, &mut qkv, t)?;
        b.attention(li, pass, &mut qkv, kv, &mut attn)?;
        b.linear(li, Proj::O, &attn, &mut proj, t)?;
        b.all_reduce(&mut proj)?;
        b.add_rms_norm(
            Norm::PostAttention(li),
            &mut residual,
            &proj,
            &mut normed,
            t,
        )?;
        b.linear(li, Proj::GateUp, &normed, &mut gate_up, t)?;
        b.silu_mul(&gate_up, &mut act, t, d.intermediate)?;
        b.linear(li, Proj::Down, &act, &mut proj, t)?;
        b.all_reduce(&mut proj)?;
    }
    b.logits(pass, &residual, &proj)
}
