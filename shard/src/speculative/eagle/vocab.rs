//! The rows of the model's LM head for a draft vocabulary (FR-Spec): a draft layer that
//! proposes only these tokens scores its states against these rows alone, on every rank whole.

use tessera_kernels::cpu::attention::softcap;
use tessera_kernels::cpu::{ActivationDtype, WeightFormat, WeightMatrix, linear_weights_as};

use crate::EngineError;
use crate::model::Model;

/// The LM head's rows of a draft vocabulary.
pub(crate) struct DraftVocabHead {
    /// The model's token id of each row.
    ids: Vec<u32>,
    /// `[ids, hidden]`, in bf16.
    weight: WeightMatrix,
    softcap: Option<f32>,
}

impl DraftVocabHead {
    /// `target`'s LM head rows for the tokens `ids` (gathered from every rank under tensor
    /// parallelism: every rank must call it).
    pub(crate) fn new(target: &Model, ids: &[u32]) -> Result<Self, EngineError> {
        let h = target.config().hidden_size;
        let rows = target.lm_head_rows(ids)?;
        let bytes: Vec<u8> = rows
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let weight = WeightMatrix::from_bytes(WeightFormat::Bf16, ids.len(), h, &bytes)
            .map_err(|e| EngineError::InvalidBatch(format!("draft vocabulary head: {e}")))?;
        Ok(Self {
            ids: ids.to_vec(),
            weight,
            softcap: target.config().family.final_softcap,
        })
    }

    /// Rows of the draft vocabulary.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// The model's token id of row `i`.
    pub(crate) fn token(&self, i: usize) -> u32 {
        self.ids[i]
    }

    /// `[rows, len]` logits of `rows` states (`[rows, hidden]`), soft-capped as the model caps
    /// its own.
    pub(crate) fn logits(&self, states: &[f32], rows: usize) -> Vec<f32> {
        let mut out = vec![0f32; rows * self.ids.len()];
        linear_weights_as(
            states,
            &self.weight,
            None,
            rows,
            &mut out,
            ActivationDtype::Float32,
        );
        if let Some(cap) = self.softcap {
            out.iter_mut().for_each(|x| *x = softcap(*x, cap));
        }
        out
    }
}
