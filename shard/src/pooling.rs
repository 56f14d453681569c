//! Sequences that pool instead of generating (embeddings, classifier scores): what they ask
//! for, and what each keeps of its final hidden states while its prompt is computed, chunk by
//! chunk, until it is whole.

use tessera_model_files::{Pooling, WeightSource};

use crate::EngineError;
use crate::model::LogitsWanted;

/// What a pooling sequence brings back once its prompt is computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolingTask {
    /// Its final hidden states pooled into one vector (not normalised).
    Embed(Pooling),
    /// The last token's classifier logits: the model's score head (`label_tokens` empty), or
    /// these tokens' logits from the LM head (a reranker asked for "yes" or "no").
    Classify {
        /// The tokens whose logits are the labels, in order.
        label_tokens: Vec<u32>,
    },
}

impl PoolingTask {
    /// Whether a pooled sequence may start from cached prefix blocks: only if its result is
    /// read from the last token alone.
    pub(crate) fn reads_last_token_only(&self) -> bool {
        !matches!(self, PoolingTask::Embed(Pooling::Mean | Pooling::Cls))
    }
}

/// A pooling sequence's task and what it has gathered so far.
pub(crate) struct PoolState {
    task: PoolingTask,
    /// Sum of the rows seen (mean pooling), or the row kept (first or last token).
    kept: Vec<f32>,
    rows: usize,
}

impl PoolState {
    pub(crate) fn new(task: PoolingTask) -> Self {
        Self {
            task,
            kept: Vec::new(),
            rows: 0,
        }
    }

    /// The logits a chunk of this sequence needs (`completes`: it ends the prompt).
    pub(crate) fn logits(&self, completes: bool) -> LogitsWanted {
        match &self.task {
            PoolingTask::Classify { label_tokens } if completes && !label_tokens.is_empty() => {
                LogitsWanted::Last
            }
            _ => LogitsWanted::None,
        }
    }

    /// Whether its chunks need every row's final hidden state.
    pub(crate) fn needs_hidden(&self) -> bool {
        !matches!(&self.task, PoolingTask::Classify { label_tokens } if !label_tokens.is_empty())
    }

    /// Takes in one chunk: `hidden(i)` is the final hidden state of its token `i` (`len` of
    /// them, the first at position `start`), `last_logits` its last row's logits when it asked
    /// for them. Returns the result once `completes`: the pooled vector, or the label logits
    /// (`score_head` scores a hidden state by the model's own head).
    pub(crate) fn take_chunk<'a>(
        &mut self,
        hidden: impl Fn(usize) -> Option<&'a [f32]>,
        (start, len, completes): (usize, usize, bool),
        last_logits: Option<&[f32]>,
        score_head: impl Fn(&[f32]) -> Result<Vec<f32>, EngineError>,
    ) -> Result<Option<Vec<f32>>, EngineError> {
        let missing =
            || EngineError::InvalidBatch("a pooled chunk's hidden states are missing".into());
        match &self.task {
            PoolingTask::Embed(Pooling::Mean) => {
                for i in 0..len {
                    let row = hidden(i).ok_or_else(missing)?;
                    if self.kept.is_empty() {
                        self.kept = vec![0.0; row.len()];
                    }
                    self.kept.iter_mut().zip(row).for_each(|(s, x)| *s += x);
                    self.rows += 1;
                }
            }
            PoolingTask::Embed(Pooling::Cls) if start == 0 && len > 0 => {
                self.kept = hidden(0).ok_or_else(missing)?.to_vec();
            }
            PoolingTask::Embed(Pooling::Cls) => {}
            PoolingTask::Embed(Pooling::LastToken) | PoolingTask::Classify { .. } => {}
        }
        if !completes {
            return Ok(None);
        }
        let last = || hidden(len.checked_sub(1)?);
        let value = match &self.task {
            PoolingTask::Embed(Pooling::Mean) => {
                let n = self.rows.max(1) as f32;
                std::mem::take(&mut self.kept)
                    .into_iter()
                    .map(|s| s / n)
                    .collect()
            }
            PoolingTask::Embed(Pooling::Cls) => std::mem::take(&mut self.kept),
            PoolingTask::Embed(Pooling::LastToken) => last().ok_or_else(missing)?.to_vec(),
            PoolingTask::Classify { label_tokens } if label_tokens.is_empty() => {
                score_head(last().ok_or_else(missing)?)?
            }
            PoolingTask::Classify { label_tokens } => {
                let logits = last_logits.ok_or_else(|| {
                    EngineError::InvalidBatch("a classified chunk's logits are missing".into())
                })?;
                label_tokens
                    .iter()
                    .map(|&t| logits.get(t as usize).copied().ok_or_else(missing))
                    .collect::<Result<_, _>>()?
            }
        };
        Ok(Some(value))
    }
}

/// A sequence-classification head (`score.weight`, `[labels, hidden]`), kept whole in f32 on
/// every rank: the final hidden states it reads are the same on all of them.
#[derive(Debug)]
pub(crate) struct ScoreHead {
    weight: Vec<f32>,
    hidden: usize,
}

impl ScoreHead {
    pub(crate) fn load(
        source: &dyn WeightSource,
        labels: usize,
        hidden: usize,
        model: &str,
    ) -> Result<Self, EngineError> {
        let bad = |message: String| EngineError::Weights {
            path: model.to_string(),
            message,
        };
        let t = source
            .load_f32("score.weight")
            .map_err(|e| bad(format!("the classification head: {e}")))?;
        if t.shape != [labels, hidden] {
            return Err(bad(format!(
                "score.weight has shape {:?}, expected [{labels}, {hidden}] (num_labels, hidden_size)",
                t.shape
            )));
        }
        Ok(Self {
            weight: t.data,
            hidden,
        })
    }

    /// The logits of one final hidden state.
    pub(crate) fn logits(&self, h: &[f32]) -> Result<Vec<f32>, EngineError> {
        if h.len() != self.hidden {
            return Err(EngineError::InvalidBatch(format!(
                "a hidden state of {} values for a score head of {}",
                h.len(),
                self.hidden
            )));
        }
        Ok(self
            .weight
            .chunks_exact(self.hidden)
            .map(|w| {
                w.iter()
                    .zip(h)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>() as f32
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(task: PoolingTask, rows: &[[f32; 2]], chunks: &[usize]) -> Vec<f32> {
        let mut s = PoolState::new(task);
        let mut start = 0;
        let mut out = None;
        for &len in chunks {
            let completes = start + len == rows.len();
            let logits = [0.5, 1.5, -2.0];
            out = s
                .take_chunk(
                    |i| rows.get(start + i).map(|r| r.as_slice()),
                    (start, len, completes),
                    Some(&logits),
                    |h| Ok(vec![h[0] - h[1]]),
                )
                .unwrap();
            assert_eq!(out.is_some(), completes);
            start += len;
        }
        out.unwrap()
    }

    #[test]
    fn pools_across_chunks() {
        let rows = [[1.0, 2.0], [3.0, 4.0], [5.0, 9.0]];
        assert_eq!(
            run(PoolingTask::Embed(Pooling::Mean), &rows, &[2, 1]),
            [3.0, 5.0]
        );
        assert_eq!(
            run(PoolingTask::Embed(Pooling::Mean), &rows, &[3]),
            [3.0, 5.0]
        );
        assert_eq!(
            run(PoolingTask::Embed(Pooling::Cls), &rows, &[1, 2]),
            [1.0, 2.0]
        );
        assert_eq!(
            run(PoolingTask::Embed(Pooling::LastToken), &rows, &[1, 1, 1]),
            [5.0, 9.0]
        );
        let head = PoolingTask::Classify {
            label_tokens: vec![],
        };
        assert_eq!(run(head, &rows, &[2, 1]), [-4.0]);
        let labels = PoolingTask::Classify {
            label_tokens: vec![2, 0],
        };
        assert_eq!(run(labels, &rows, &[3]), [-2.0, 0.5]);
    }

    #[test]
    fn what_each_task_reads() {
        let labels = PoolState::new(PoolingTask::Classify {
            label_tokens: vec![1],
        });
        assert_eq!(labels.logits(false), LogitsWanted::None);
        assert_eq!(labels.logits(true), LogitsWanted::Last);
        assert!(!labels.needs_hidden());
        let mean = PoolState::new(PoolingTask::Embed(Pooling::Mean));
        assert_eq!(mean.logits(true), LogitsWanted::None);
        assert!(mean.needs_hidden());
        assert!(!PoolingTask::Embed(Pooling::Mean).reads_last_token_only());
        assert!(PoolingTask::Embed(Pooling::LastToken).reads_last_token_only());
    }
}
