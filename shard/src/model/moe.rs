//! A sparse mixture-of-experts MLP on the CPU: the router's softmax picks each token's
//! experts, tokens are grouped by expert, and each expert's matrices (in the file's format)
//! are multiplied once over its tokens. Experts no token picked are never read.
//!
//! A token's result does not depend on which tokens share its experts: its rows of each
//! product are computed as they would be alone, and its experts' outputs are added to it in
//! ascending expert order (as transformers' `index_add_` loop adds them), then a shared
//! expert's, scaled by its gate (Qwen2-MoE).

use tessera_kernels::cpu::{ActivationDtype, activation, linear_weights_as};
use tessera_model_files::{ExpertActivation, Moe};

use super::weights::{Expert, MoeWeights};

/// `out = Σ_picked p_e · expert_e(x) + sigmoid(x · g) · shared(x)` for `rows` rows of `x`
/// (see the module documentation).
pub(crate) fn forward(
    w: &MoeWeights,
    moe: &Moe,
    x: &[f32],
    rows: usize,
    activations: ActivationDtype,
    out: &mut [f32],
) {
    let hidden = x.len() / rows.max(1);
    let picked = route(w, moe, x, rows, activations);
    out.fill(0.0);
    let (mut buffers, mut gathered) = (Buffers::default(), Vec::new());
    for (expert, tokens) in w.experts.iter().zip(&picked) {
        if tokens.is_empty() {
            continue;
        }
        gathered.clear();
        for &(t, _) in tokens {
            gathered.extend_from_slice(&x[t * hidden..(t + 1) * hidden]);
        }
        let y = buffers.mlp(
            expert,
            moe.activation,
            &gathered,
            tokens.len(),
            hidden,
            activations,
        );
        for (&(t, p), yr) in tokens.iter().zip(y.chunks_exact(hidden)) {
            for (o, v) in out[t * hidden..(t + 1) * hidden].iter_mut().zip(yr) {
                *o += v * p;
            }
        }
    }
    if let Some(shared) = &w.shared {
        let y = buffers.mlp(
            &shared.mlp,
            ExpertActivation::Silu,
            &x[..rows * hidden],
            rows,
            hidden,
            activations,
        );
        for ((o, xr), yr) in out
            .chunks_exact_mut(hidden)
            .zip(x.chunks_exact(hidden))
            .zip(y.chunks_exact(hidden))
        {
            let g: f32 = xr.iter().zip(&shared.gate).map(|(a, b)| a * b).sum();
            let scale = 1.0 / (1.0 + (-g).exp());
            for (o, v) in o.iter_mut().zip(yr) {
                *o += scale * v;
            }
        }
    }
}

/// Scratch space for the experts' products, reused across experts.
#[derive(Default)]
struct Buffers {
    gate_up: Vec<f32>,
    act: Vec<f32>,
    y: Vec<f32>,
}

impl Buffers {
    /// `down(act(gate, up))` of the `n` rows of `x`.
    fn mlp(
        &mut self,
        expert: &Expert,
        act: ExpertActivation,
        x: &[f32],
        n: usize,
        hidden: usize,
        activations: ActivationDtype,
    ) -> &[f32] {
        let inner = expert.down.in_features();
        self.gate_up.resize(n * 2 * inner, 0.0);
        self.act.resize(n * inner, 0.0);
        self.y.resize(n * hidden, 0.0);
        let (gu, down) = (&expert.gate_up, &expert.down);
        linear_weights_as(
            x,
            &gu.weight,
            gu.bias.as_deref(),
            n,
            &mut self.gate_up,
            activations,
        );
        match act {
            ExpertActivation::Silu => activation::silu_mul(&self.gate_up, inner, &mut self.act),
            ExpertActivation::ClampedSwiglu { alpha, limit } => {
                activation::clamped_swiglu(&self.gate_up, inner, alpha, limit, &mut self.act)
            }
        }
        linear_weights_as(
            &self.act,
            &down.weight,
            down.bias.as_deref(),
            n,
            &mut self.y,
            activations,
        );
        &self.y
    }
}

/// Per expert, the `(row, weight)` of every row that picked it, rows ascending.
fn route(
    w: &MoeWeights,
    moe: &Moe,
    x: &[f32],
    rows: usize,
    activations: ActivationDtype,
) -> Vec<Vec<(usize, f32)>> {
    let e = moe.experts;
    let mut logits = vec![0f32; rows * e];
    linear_weights_as(
        x,
        &w.router,
        w.router_bias.as_deref(),
        rows,
        &mut logits,
        activations,
    );
    let mut picked = vec![Vec::new(); e];
    let mut order: Vec<usize> = Vec::with_capacity(e);
    for (t, row) in logits.chunks_exact(e).enumerate() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = row.iter().map(|l| (l - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        let probs: Vec<f32> = exps.iter().map(|x| x / sum).collect();
        order.clear();
        order.extend(0..e);
        // Highest probability first; ties to the lower expert, as torch.topk keeps them.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let top = &order[..moe.top_k];
        let total: f32 = top.iter().map(|&i| probs[i]).sum();
        for &i in top {
            let p = match moe.norm_topk_prob {
                true => probs[i] / total,
                false => probs[i],
            };
            picked[i].push((t, p));
        }
    }
    picked
}
