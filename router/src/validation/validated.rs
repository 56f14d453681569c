//! What validation hands back: a [`ValidGenerateRequest`] for the batcher, and per API the
//! requests to run with what the response needs.

use tessera_params::{OutputConstraint, SamplingParams, StoppingParams};

use super::parameters::random_u64;
use crate::pooling::PoolingAsk;

/// A request that passed validation; everything the batcher needs to run it.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidGenerateRequest {
    /// Prompt text as sent to the tokenizer (after the chat template).
    pub inputs: String,
    /// Prompt token ids (with special tokens as the model wants them).
    pub input_ids: Vec<u32>,
    /// How the next token is chosen (a seed is always set when sampling).
    pub parameters: SamplingParams,
    /// When to stop.
    pub stopping: StoppingParams,
    /// The shape the output must take, if the client asked for one.
    pub constraint: Option<OutputConstraint>,
    /// Whether the client wants the prompt tokens' logprobs
    /// ([`crate::InferStreamResponse::Prefill`]).
    pub decoder_input_details: bool,
    /// Whether special tokens are left out of the generated text.
    pub skip_special_tokens: bool,
    /// Pool the prompt instead of generating (embeddings, scores).
    pub(crate) pooling: Option<PoolingAsk>,
}

impl ValidGenerateRequest {
    /// A request that pools `input_ids` as `ask` says and generates nothing.
    pub(crate) fn pooled(input_ids: Vec<u32>, ask: PoolingAsk) -> Self {
        Self {
            inputs: String::new(),
            input_ids,
            parameters: SamplingParams::default(),
            stopping: StoppingParams {
                max_new_tokens: 0,
                stop_sequences: Vec::new(),
                ignore_eos: false,
                stop_token_ids: Vec::new(),
            },
            constraint: None,
            decoder_input_details: false,
            skip_special_tokens: true,
            pooling: Some(ask),
        }
    }

    /// `n` copies of the request, each with its own seed (`seed + i` when the client gave
    /// one, a random one otherwise) when sampling.
    pub(crate) fn samples(self, n: usize, client_seed: Option<u64>) -> Vec<Self> {
        (0..n)
            .map(|i| {
                let mut r = self.clone();
                if i > 0 && r.parameters.seed.is_some() {
                    r.parameters.seed = Some(match client_seed {
                        Some(s) => s.wrapping_add(i as u64),
                        None => random_u64(),
                    });
                }
                r
            })
            .collect()
    }
}

/// A validated `/generate` or `/generate_stream` request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ValidNativeRequest {
    /// The request to run.
    pub(crate) request: ValidGenerateRequest,
    /// Whether `/generate` answers with token-level details.
    pub(crate) details: bool,
    /// What goes before the generated text: the prompt with `return_full_text`, else nothing.
    pub(crate) text_prefix: String,
}

/// What an OpenAI response carries besides the text, as the request asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenAiReply {
    /// Answer with server-sent events.
    pub(crate) stream: bool,
    /// Report the tokens' logprobs.
    pub(crate) logprobs: bool,
    /// End a stream with a usage chunk (`"usage": null` in the others).
    pub(crate) include_usage: bool,
}

/// A validated `/v1/chat/completions` request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ValidChatRequest {
    /// One request per choice, in choice order.
    pub(crate) samples: Vec<ValidGenerateRequest>,
    /// The rendered conversation's length in tokens.
    pub(crate) prompt_tokens: u32,
    /// What the response carries.
    pub(crate) reply: OpenAiReply,
    /// How the output is read (reasoning, content, tool calls).
    pub(crate) reading: crate::assistant::OutputReading,
}

/// A validated `/v1/completions` request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ValidCompletionRequest {
    /// One request per choice, in choice order (`prompt_index * n + sample`).
    pub(crate) samples: Vec<ValidGenerateRequest>,
    /// How the choices map to the prompts.
    pub(crate) choices: ChoiceLayout,
    /// What the response carries.
    pub(crate) reply: OpenAiReply,
}

/// How the choices of a completions request map to its prompts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChoiceLayout {
    /// Per prompt, the text echoed before its choices (empty without `echo`).
    pub(crate) echoes: Vec<String>,
    /// Choices per prompt.
    pub(crate) n: usize,
    /// Samples run per prompt, of which the `n` likeliest are the choices.
    pub(crate) best_of: usize,
    /// Prompt tokens, each prompt counted once.
    pub(crate) prompt_tokens: u32,
}

impl ChoiceLayout {
    /// The echo of choice `index`'s prompt.
    pub(crate) fn echo(&self, index: usize) -> &str {
        &self.echoes[index / self.n]
    }
}
