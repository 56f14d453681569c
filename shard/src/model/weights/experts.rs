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
            experts,
            shared,
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
