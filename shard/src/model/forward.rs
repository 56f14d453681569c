//! The decoder's forward pass, written once for every backend and family: embedding, then per
//! layer RMSNorm → qkv → (q/k norms,) RoPE + cache write + attention → o_proj (+ all-reduce)
//! (→ output norm) → residual + RMSNorm → gate/up → act·mul → down (+ all-reduce) (→ output
//! norm), then the final norm and the LM head. What varies by family is data: `Dims` says
//! whether the output norms exist and which activation gates, the backend's attention reads
//! each layer's options.

use super::backend::{Backend, Dims, Norm, Proj};
use super::batch::FlatBatch;
use crate::EngineError;

/// What a pass computed, on the host: this rank's `[logit rows, local vocab]` logits, and the
/// final hidden states of the batch's kept rows when it keeps them (empty otherwise): the
/// logit rows', then its other kept rows'.
pub(crate) struct HostOutput {
    pub(crate) logits: Vec<f32>,
    pub(crate) hidden: Vec<f32>,
}

/// Runs `batch` through `layers` layers of `backend`, writing K/V into `kv`.
pub(crate) fn forward<B: Backend>(
    backend: &B,
    d: Dims,
    layers: usize,
    batch: &FlatBatch<'_>,
    kv: &mut B::Pages,
    local_vocab: usize,
) -> Result<HostOutput, EngineError> {
    let pass = backend.upload(batch)?;
    let rows = batch.logit_rows.len();
    let out = run(backend, d, layers, &pass, batch.tokens(), rows, kv)?;
    Ok(HostOutput {
        logits: backend.to_host(out.logits, rows * local_vocab)?,
        hidden: if batch.keep_hidden {
            let kept = rows + batch.hidden_only_rows.len();
            backend.to_host(out.hidden, kept * d.hidden)?
        } else {
            Vec::new()
        },
    })
}

/// A pass's results on the device: the logit rows' logits and final hidden states.
pub(crate) struct PassOutput<A> {
    pub(crate) logits: A,
    pub(crate) hidden: A,
}

/// The pass on the device over `t` tokens, from its uploaded index arrays to the results of
/// its `logit_rows` rows there (what a CUDA graph captures).
pub(crate) fn run<B: Backend>(
    b: &B,
    d: Dims,
    layers: usize,
    pass: &B::Batch<'_>,
    t: usize,
    logit_rows: usize,
    kv: &mut B::Pages,
) -> Result<PassOutput<B::Act>, EngineError> {
    let mut residual = b.zeros(t * d.hidden)?;
    b.embed(pass, &mut residual)?;
    b.all_reduce(&mut residual)?;
    let mut normed = b.zeros(t * d.hidden)?;
    let mut qkv = b.zeros(t * d.qkv_width())?;
    let mut attn = b.zeros(t * d.heads * d.head_dim)?;
    let mut proj = b.zeros(t * d.hidden)?;
    let mut gate_up = b.zeros(t * 2 * d.intermediate)?;
    let mut act = b.zeros(t * d.intermediate)?;
    // The output norms' results, swapped into `proj`.
    let mut out_normed = if d.sandwich_norms {
        b.zeros(t * d.hidden)?
    } else {
        b.zeros(0)?
    };
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
        if d.sandwich_norms {
            b.rms_norm(Norm::AttentionOut(li), &proj, &mut out_normed, t)?;
            std::mem::swap(&mut proj, &mut out_normed);
        }
        b.add_rms_norm(Norm::PreMlp(li), &mut residual, &proj, &mut normed, t)?;
        if b.sparse_mlp(li) {
            b.moe(li, &normed, &mut proj, t)?;
        } else {
            b.linear(li, Proj::GateUp, &normed, &mut gate_up, t)?;
            b.gated(d.activation, &gate_up, &mut act, t, d.intermediate)?;
            b.linear(li, Proj::Down, &act, &mut proj, t)?;
        }
        b.all_reduce(&mut proj)?;
        if d.sandwich_norms {
            b.rms_norm(Norm::MlpOut(li), &proj, &mut out_normed, t)?;
            std::mem::swap(&mut proj, &mut out_normed);
        }
    }
    let hidden = b.final_norm(pass, &residual, &proj)?;
    let logits = b.lm_head(&hidden, logit_rows)?;
    Ok(PassOutput { logits, hidden })
}
