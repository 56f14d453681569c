//! A sparse MLP's weights: the router, each expert's slices for this rank, and a shared
//! expert where the family has one.

use tessera_kernels::cpu::WeightMatrix;
use tessera_model_files::{ExpertNames, Moe};

use super::{Linear, Loader, Part};
use crate::EngineError;

/// A sparse MLP's router (`[experts, hidden]`, whole on every rank: each computes the same
/// routing) and its experts, each sliced like a dense MLP.
pub(crate) struct MoeWeights {
    pub(crate) router: WeightMatrix,
    /// The router's bias (gpt-oss).
    pub(crate) router_bias: Option<Vec<f32>>,
    pub(crate) experts: Vec<Expert>,
    /// Qwen2-MoE's shared expert, which every token goes through.
    pub(crate) shared: Option<SharedExpert>,
}

/// A shared expert: this rank's slices of a dense SiLU MLP, and the whole gate vector whose
/// `sigmoid(x · gate)` scales its output per token.
pub(crate) struct SharedExpert {
    pub(crate) mlp: Expert,
    pub(crate) gate: Vec<f32>,
}

/// One expert: this rank's `[gate | up]` rows and down columns.
pub(crate) struct Expert {
    pub(crate) gate_up: Linear,
    pub(crate) down: Linear,
}

impl Loader<'_> {
    /// Layer `p`'s router and this rank's slices of its experts.
    pub(super) fn experts(
        &self,
        p: &str,
        moe: &Moe,
        hidden: usize,
    ) -> Result<MoeWeights, EngineError> {
        let (block, [gate, up, down]) = match moe.names {
            ExpertNames::Qwen => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
            ExpertNames::Mixtral => ("block_sparse_moe", ["w1", "w3", "w2"]),
            ExpertNames::GptOss => return self.stacked_experts(p, moe, hidden),
        };
        let prefix = format!("{p}.{block}");
        let router = self.matrix(
            &format!("{prefix}.gate.weight"),
            [moe.experts, hidden],
            Part::Whole,
        )?;
        let inter = moe.expert_intermediate;
        let rows = self.partition.split(inter);
        let experts = (0..moe.experts)
            .map(|e| {
                let expert = format!("{prefix}.experts.{e}");
                Ok(Expert {
                    gate_up: self.fused(
                        &expert,
                        &[(gate, inter, rows.clone()), (up, inter, rows.clone())],
                        hidden,
                    )?,
                    down: self.row_parallel(
                        &format!("{expert}.{down}"),
                        hidden,
                        inter,
                        rows.clone(),
                    )?,
                })
            })
            .collect::<Result<_, EngineError>>()?;
        let shared = match moe.shared_expert_intermediate {
            Some(inter) => Some(self.shared_expert(&prefix, inter, hidden)?),
            None => None,
        };
        Ok(MoeWeights {
            router: self.for_compute(router),
            router_bias: None,
            experts,
            shared,
        })
    }

    /// gpt-oss's router and experts (see [`ExpertNames::GptOss`]): each expert's `[gate | up]`
    /// rows gathered from the interleaved, transposed stack, its down columns from theirs.
    fn stacked_experts(
        &self,
        p: &str,
        moe: &Moe,
        hidden: usize,
    ) -> Result<MoeWeights, EngineError> {
        let (e, inter) = (moe.experts, moe.expert_intermediate);
        let prefix = format!("{p}.mlp");
        let router = self.matrix(&format!("{prefix}.router.weight"), [e, hidden], Part::Whole)?;
        let router_bias = self.optional(&format!("{prefix}.router.bias"), &[e], Part::Whole)?;
        let experts = format!("{prefix}.experts");
        let gate_up = self.tensor(&format!("{experts}.gate_up_proj"), &[e, hidden, 2 * inter])?;
        let gate_up_bias = self.tensor(&format!("{experts}.gate_up_proj_bias"), &[e, 2 * inter])?;
        let down = self.tensor(&format!("{experts}.down_proj"), &[e, inter, hidden])?;
        let down_bias = self.tensor(&format!("{experts}.down_proj_bias"), &[e, hidden])?;
        let rows = self.partition.split(inter);
        let n = rows.len();
        let experts = (0..e)
            .map(|x| {
                let gu = &gate_up[x * hidden * 2 * inter..(x + 1) * hidden * 2 * inter];
                // Gate rows first (even columns), then up rows (odd columns).
                let mut w = Vec::with_capacity(2 * n * hidden);
                for parity in [0, 1] {
                    for j in rows.clone() {
                        w.extend((0..hidden).map(|c| gu[c * 2 * inter + 2 * j + parity]));
                    }
                }
                let gb = &gate_up_bias[x * 2 * inter..(x + 1) * 2 * inter];
                let bias = [0, 1]
                    .iter()
                    .flat_map(|&parity| rows.clone().map(move |j| gb[2 * j + parity]))
                    .collect();
                let d = &down[x * inter * hidden..(x + 1) * inter * hidden];
                let mut dw = Vec::with_capacity(hidden * n);
                for o in 0..hidden {
                    dw.extend(rows.clone().map(|j| d[j * hidden + o]));
                }
                Expert {
                    gate_up: Linear {
                        weight: self.for_compute(WeightMatrix::from_f32(2 * n, hidden, w)),
                        bias: Some(bias),
                    },
                    down: Linear {
                        weight: self.for_compute(WeightMatrix::from_f32(hidden, n, dw)),
                        // Added once, after the sum over ranks.
                        bias: (self.partition.rank == 0)
                            .then(|| down_bias[x * hidden..(x + 1) * hidden].to_vec()),
                    },
                }
            })
            .collect();
        Ok(MoeWeights {
            router: self.for_compute(router),
            router_bias,
            experts,
            shared: None,
        })
    }

    /// `{prefix}.shared_expert` (this rank's rows of its inner width `inter`) and its gate.
    fn shared_expert(
        &self,
        prefix: &str,
        inter: usize,
        hidden: usize,
    ) -> Result<SharedExpert, EngineError> {
        let rows = self.partition.split(inter);
        let mlp = format!("{prefix}.shared_expert");
        let parts = [
            ("gate_proj", inter, rows.clone()),
            ("up_proj", inter, rows.clone()),
        ];
        let name = format!("{prefix}.shared_expert_gate.weight");
        // `[1, hidden]` in Hugging Face files; GGUF files may hold it as a vector.
        let gate = self.source.load_f32(&name)?;
        if gate.data.len() != hidden || gate.shape.iter().product::<usize>() != hidden {
            return Err(self.error(format!(
                "tensor {name:?} has shape {:?}, the config implies [1, {hidden}]",
                gate.shape
            )));
        }
        Ok(SharedExpert {
            mlp: Expert {
                gate_up: self.fused(&mlp, &parts, hidden)?,
                down: self.row_parallel(&format!("{mlp}.down_proj"), hidden, inter, rows)?,
            },
            gate: gate.data,
        })
    }
}
