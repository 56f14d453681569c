//! What the engine is told to do in one step, and what it answers: the router's scheduler
//! output in the engine's own types (vLLM V1's shape: new requests whole, running ones as
//! deltas, leaving ones by id).

use tessera_params::{OutputConstraint, SamplingParams};

use crate::PoolingTask;
use crate::sampling::SampledToken;

/// One scheduler step.
#[derive(Debug, Clone, Default)]
pub struct StepPlan {
    /// Requests that join the table in this step (new, or resumed after a preemption).
    pub new: Vec<NewSequence>,
    /// Requests in the table that compute tokens in this step. Those not listed wait.
    pub running: Vec<RunningUpdate>,
    /// Requests that leave the table before the step runs (finished, cancelled, preempted, or
    /// abandoned after a failed step). Unknown ids are ignored.
    pub leaving: Vec<u64>,
}

impl StepPlan {
    /// A step that computes one pending token of each of `ids` (every sequence decoding).
    pub fn decode(ids: impl IntoIterator<Item = u64>) -> Self {
        Self {
            running: ids.into_iter().map(RunningUpdate::decode).collect(),
            ..Self::default()
        }
    }
}

/// A request as it joins the table.
#[derive(Debug, Clone)]
pub struct NewSequence {
    /// Router-wide request id.
    pub id: u64,
    /// Prompt tokens (followed by previously generated ones when resuming).
    pub input_ids: Vec<u32>,
    /// How the next token is chosen (validated by the router).
    pub params: SamplingParams,
    /// The shape the output must take (needs [`super::Engine::with_vocabulary`]).
    pub constraint: Option<OutputConstraint>,
    /// Report the logprob of every prompt token.
    pub prefill_logprobs: bool,
    /// KV blocks covering at least the tokens computed in this step.
    pub blocks: Vec<u32>,
    /// Leading tokens whose K/V are already in `blocks`.
    pub cache_len: usize,
    /// Tokens to compute in this step (`None`: all the rest).
    pub chunk_len: Option<usize>,
    /// Trailing tokens of `input_ids` generated before a preemption.
    pub generated_len: usize,
    /// Pool the prompt instead of generating (`None`: generate).
    pub pooling: Option<PoolingTask>,
}

/// What changed for a running request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningUpdate {
    /// Router-wide request id.
    pub id: u64,
    /// Blocks appended to the request's block table.
    pub new_blocks: Vec<u32>,
    /// Pending tokens to compute in this step (at least 1; more than pending computes all).
    pub chunk_len: usize,
}

impl RunningUpdate {
    /// One more token of `id` (a decode step), in the blocks it has.
    pub fn decode(id: u64) -> Self {
        Self {
            id,
            new_blocks: Vec::new(),
            chunk_len: 1,
        }
    }
}

/// What one sequence produced in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// Router-wide request id.
    pub request_id: u64,
    /// `(token, logprob)` of every prompt token (the first one's logprob is NaN).
    pub prefill: Option<Vec<(u32, f32)>>,
    /// The new tokens (empty while a chunked prefill is unfinished; with speculation, the
    /// accepted proposals followed by the model's own token).
    pub tokens: Vec<SampledToken>,
    /// Proposals the speculator made for this step.
    pub proposed: usize,
    /// A pooling sequence's result, in the step that computes the end of its prompt.
    pub pooled: Option<Vec<f32>>,
}

/// Time spent in one step.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTimings {
    /// In forward passes (a draft model's included).
    pub forward_ns: u64,
    /// In sampling and the verification of proposals.
    pub sampling_ns: u64,
    /// The whole step.
    pub total_ns: u64,
}

/// The engine's answer to one step.
#[derive(Debug, Clone, Default)]
pub struct StepResult {
    /// One entry per sequence that computed tokens, in the order they ran.
    pub outputs: Vec<StepOutput>,
    /// Where the time went.
    pub timings: StepTimings,
}
