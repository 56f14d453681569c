//! A sparse MLP's weights: the router, each expert's slices for this rank, and a shared
//! expert where the family has one.

use tessera_kernels::cpu::{WeightFormat, WeightMatrix};
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
        let stacks = |stem: &str| {
            let stack = format!("{p}.mlp.experts.{stem}");
            self.source.contains(&stack) || self.source.contains(&format!("{stack}_blocks"))
        };
        let (block, router, [gate, up, down]) = match moe.names {
            ExpertNames::Qwen => ("mlp", "gate", ["gate_proj", "up_proj", "down_proj"]),
            ExpertNames::Mixtral => ("block_sparse_moe", "gate", ["w1", "w3", "w2"]),
            ExpertNames::GptOss if stacks("gate_up_proj") => {
                return self.stacked_experts(p, moe, hidden);
            }
            // A GGUF file's: gate and up apart, each expert's matrices and biases by name.
            ExpertNames::GptOss => ("mlp", "router", ["gate_proj", "up_proj", "down_proj"]),
        };
        let prefix = format!("{p}.{block}");
        let router_bias = self.optional(
            &format!("{prefix}.{router}.bias"),
            &[moe.experts],
            Part::Whole,
        )?;
        let router = self.matrix(
            &format!("{prefix}.{router}.weight"),
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
            router_bias,
            experts,
            shared,
        })
    }

    /// gpt-oss's router and experts (see [`ExpertNames::GptOss`]): each expert's `[gate | up]`
    /// rows gathered from the interleaved stack, its down columns from theirs; from MXFP4
    /// `*_blocks`/`*_scales` (kept in MXFP4) or from plain, transposed float stacks.
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
        let gate_up_bias = self.tensor(&format!("{experts}.gate_up_proj_bias"), &[e, 2 * inter])?;
        let down_bias = self.tensor(&format!("{experts}.down_proj_bias"), &[e, hidden])?;
        let rows = self.partition.split(inter);
        let matrices = if self
            .source
            .contains(&format!("{experts}.gate_up_proj_blocks"))
        {
            self.mxfp4_expert_matrices(&experts, e, inter, hidden)?
        } else {
            self.float_expert_matrices(&experts, e, inter, hidden)?
        };
        let experts = matrices
            .into_iter()
            .enumerate()
            .map(|(x, (gate_up, down))| {
                let gb = &gate_up_bias[x * 2 * inter..(x + 1) * 2 * inter];
                let bias = [0, 1]
                    .iter()
                    .flat_map(|&parity| rows.clone().map(move |j| gb[2 * j + parity]))
                    .collect();
                Expert {
                    gate_up: Linear {
                        weight: self.for_compute(gate_up),
                        bias: Some(bias),
                    },
                    down: Linear {
                        weight: self.for_compute(down),
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

    /// Each expert's `[gate | up]` rows and down columns for this rank from the float stacks
    /// `gate_up_proj` (`[experts, hidden, 2 · inter]`, gate and up interleaved in its columns)
    /// and `down_proj` (`[experts, inter, hidden]`), as f32.
    fn float_expert_matrices(
        &self,
        experts: &str,
        e: usize,
        inter: usize,
        hidden: usize,
    ) -> Result<Vec<(WeightMatrix, WeightMatrix)>, EngineError> {
        let gate_up = self.tensor(&format!("{experts}.gate_up_proj"), &[e, hidden, 2 * inter])?;
        let down = self.tensor(&format!("{experts}.down_proj"), &[e, inter, hidden])?;
        let rows = self.partition.split(inter);
        let n = rows.len();
        Ok((0..e)
            .map(|x| {
                let gu = &gate_up[x * hidden * 2 * inter..(x + 1) * hidden * 2 * inter];
                // Gate rows first (even columns), then up rows (odd columns).
                let mut w = Vec::with_capacity(2 * n * hidden);
                for parity in [0, 1] {
                    for j in rows.clone() {
                        w.extend((0..hidden).map(|c| gu[c * 2 * inter + 2 * j + parity]));
                    }
                }
                let d = &down[x * inter * hidden..(x + 1) * inter * hidden];
                let mut dw = Vec::with_capacity(hidden * n);
                for o in 0..hidden {
                    dw.extend(rows.clone().map(|j| d[j * hidden + o]));
                }
                (
                    WeightMatrix::from_f32(2 * n, hidden, w),
                    WeightMatrix::from_f32(hidden, n, dw),
                )
            })
            .collect())
    }

    /// Each expert's `[gate | up]` rows and down columns for this rank from MXFP4 stacks:
    /// `gate_up_proj_blocks` (`[experts · 2 · inter, hidden]` as values, gate and up
    /// interleaved in its rows) and `down_proj_blocks` (`[experts · hidden, inter]`). Rows stay
    /// MXFP4 blocks; down columns too when this rank's slice starts and ends on a block
    /// (otherwise, and for [`WeightLayout::F32`](super::WeightLayout), f32).
    fn mxfp4_expert_matrices(
        &self,
        experts: &str,
        e: usize,
        inter: usize,
        hidden: usize,
    ) -> Result<Vec<(WeightMatrix, WeightMatrix)>, EngineError> {
        let native = |name: String, shape: [usize; 2]| {
            let t = self
                .source
                .load_native(&name)?
                .filter(|t| t.format == WeightFormat::MXFP4)
                .ok_or_else(|| self.error(format!("tensor {name:?} is not MXFP4")))?;
            if t.shape != shape {
                return Err(self.error(format!(
                    "tensor {name:?} has shape {:?}, the config implies {shape:?}",
                    t.shape
                )));
            }
            Ok(t.bytes)
        };
        let gate_up = native(
            format!("{experts}.gate_up_proj_blocks"),
            [e * 2 * inter, hidden],
        )?;
        let down = native(format!("{experts}.down_proj_blocks"), [e * hidden, inter])?;
        let block = WeightFormat::MXFP4.block_bytes();
        let per_block = WeightFormat::MXFP4.block_elements();
        let (gate_up_row, down_row) = (hidden / per_block * block, inter / per_block * block);
        let rows = self.partition.split(inter);
        let n = rows.len();
        let aligned = rows.start.is_multiple_of(per_block) && rows.end.is_multiple_of(per_block);
        let matrix = |rows: usize, cols: usize, bytes: &[u8]| {
            let w = WeightMatrix::from_bytes(WeightFormat::MXFP4, rows, cols, bytes)
                .map_err(|err| self.error(format!("{experts}: {err}")))?;
            Ok::<_, EngineError>(if self.native {
                w
            } else {
                WeightMatrix::from_f32(rows, cols, w.to_f32())
            })
        };
        (0..e)
            .map(|x| {
                // Gate rows first (even rows), then up rows (odd rows).
                let mut w = Vec::with_capacity(2 * n * gate_up_row);
                for parity in [0, 1] {
                    for j in rows.clone() {
                        let at = (x * 2 * inter + 2 * j + parity) * gate_up_row;
                        w.extend_from_slice(&gate_up[at..at + gate_up_row]);
                    }
                }
                let expert_down = &down[x * hidden * down_row..(x + 1) * hidden * down_row];
                let down = if aligned {
                    let (a, b) = (rows.start / per_block * block, rows.end / per_block * block);
                    let mut dw = Vec::with_capacity(hidden * (b - a));
                    for row in expert_down.chunks_exact(down_row) {
                        dw.extend_from_slice(&row[a..b]);
                    }
                    matrix(hidden, n, &dw)?
                } else {
                    let whole = matrix(hidden, inter, expert_down)?.to_f32();
                    let mut dw = Vec::with_capacity(hidden * n);
                    for row in whole.chunks_exact(inter) {
                        dw.extend_from_slice(&row[rows.clone()]);
                    }
                    WeightMatrix::from_f32(hidden, n, dw)
                };
                Ok((matrix(2 * n, hidden, &w)?, down))
            })
            .collect()
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
