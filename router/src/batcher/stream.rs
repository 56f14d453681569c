//! Per-request output state: token ids in, client events out. Detokenizes incrementally,
//! holds back and trims stop sequences, and decides when a request is finished.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use tessera_text::ModelTokenizer;

use crate::client::SampledToken;
use crate::detokenizer::IncrementalDecoder;
use crate::infer::{
    FinishReason, GeneratedText, InferError, InferStreamResponse, PrefillToken, Token,
    ValidGenerateRequest,
};
use crate::stop::{StopMatch, StopSequenceMatcher};

/// What the batcher knows about the vocabulary's special tokens.
#[derive(Debug, Default)]
pub(crate) struct SpecialTokens {
    /// Tokens that end generation.
    pub(crate) eos: Vec<u32>,
    /// Control and other special tokens (eos included).
    pub(crate) special: HashSet<u32>,
}

impl SpecialTokens {
    pub(crate) fn of(tokenizer: &ModelTokenizer) -> Self {
        let mut special: HashSet<u32> = tokenizer
            .tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        special.extend(tokenizer.eos_token_ids.iter().copied());
        Self {
            eos: tokenizer.eos_token_ids.clone(),
            special,
        }
    }
}

pub(crate) struct OutputStream {
    tokenizer: Arc<ModelTokenizer>,
    special: Arc<SpecialTokens>,
    decoder: IncrementalDecoder,
    stop: StopSequenceMatcher,
    /// The stop sequence that matched.
    matched: Option<String>,
    text: String,
    generated: u32,
    max_new_tokens: u32,
    ignore_eos: bool,
    stop_token_ids: Vec<u32>,
    seed: Option<u64>,
    queued: Instant,
    start: Option<Instant>,
    accepted_per_step: Vec<u32>,
}

impl OutputStream {
    pub(crate) fn new(
        request: &ValidGenerateRequest,
        tokenizer: Arc<ModelTokenizer>,
        special: Arc<SpecialTokens>,
        queued: Instant,
    ) -> Self {
        Self {
            decoder: IncrementalDecoder::new(
                tokenizer.clone(),
                &request.input_ids,
                request.skip_special_tokens,
            ),
            tokenizer,
            special,
            stop: StopSequenceMatcher::new(request.stopping.stop_sequences.clone()),
            matched: None,
            text: String::new(),
            generated: 0,
            max_new_tokens: request.stopping.max_new_tokens,
            ignore_eos: request.stopping.ignore_eos,
            stop_token_ids: request.stopping.stop_token_ids.clone(),
            seed: request.parameters.seed,
            queued,
            start: None,
            accepted_per_step: Vec::new(),
        }
    }

    /// Notes a step that verified proposals for this request and accepted `accepted`.
    pub(crate) fn speculated(&mut self, accepted: usize) {
        self.accepted_per_step
            .push(u32::try_from(accepted).unwrap_or(u32::MAX));
    }

    /// When the request's first prefill started, if it has.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.start
    }

    /// Marks the start of the request's first prefill; true the first time only.
    pub(crate) fn first_prefill(&mut self) -> bool {
        let first = self.start.is_none();
        self.start.get_or_insert_with(Instant::now);
        first
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    fn is_special(&self, id: u32) -> bool {
        self.special.special.contains(&id)
    }

    /// The prompt tokens with their logprobs, as the client sees them.
    pub(crate) fn prefill_event(&self, tokens: &[(u32, f32)]) -> InferStreamResponse {
        InferStreamResponse::Prefill(
            tokens
                .iter()
                .enumerate()
                .map(|(i, &(id, lp))| PrefillToken {
                    id,
                    text: self.token_text(id),
                    logprob: (i > 0 && !lp.is_nan()).then_some(lp),
                })
                .collect(),
        )
    }

    /// Takes one generated token; returns the event for the client and whether the request
    /// is finished.
    pub(crate) fn push(
        &mut self,
        token: SampledToken,
    ) -> Result<(InferStreamResponse, bool), InferError> {
        self.generated += 1;
        let ends_here = (!self.ignore_eos && self.special.eos.contains(&token.id))
            || self.stop_token_ids.contains(&token.id);
        // The token that ends the output is not part of its text (as vLLM answers), also when
        // special tokens are kept: a reader of the text would take it for the model's words.
        let piece = if ends_here {
            String::new()
        } else {
            self.decoder
                .push(token.id)
                .map_err(|e| InferError::GenerationError(e.to_string()))?
        };
        let (mut emitted, mut finish) = match self.stop.push(&piece) {
            StopMatch::Continue(text) => (text, None),
            StopMatch::Stopped { text, index } => {
                self.matched = self.stop.sequence(index).map(str::to_owned);
                (text, Some(FinishReason::StopSequence))
            }
        };
        if finish.is_none() {
            if !self.ignore_eos && self.special.eos.contains(&token.id) {
                finish = Some(FinishReason::EosToken);
            } else if self.stop_token_ids.contains(&token.id) {
                finish = Some(FinishReason::StopSequence);
            } else if self.generated >= self.max_new_tokens {
                finish = Some(FinishReason::Length);
            }
            if finish.is_some() {
                // Flush what was held back: an unfinished character, a partial stop match.
                let tail = self
                    .decoder
                    .finish()
                    .map_err(|e| InferError::GenerationError(e.to_string()))?;
                match self.stop.push(&tail) {
                    StopMatch::Continue(text) => {
                        emitted.push_str(&text);
                        emitted.push_str(&self.stop.finish());
                    }
                    StopMatch::Stopped { text, index } => {
                        emitted.push_str(&text);
                        self.matched = self.stop.sequence(index).map(str::to_owned);
                        finish = Some(FinishReason::StopSequence);
                    }
                }
            }
        }
        self.text.push_str(&emitted);
        let top_tokens = token
            .top
            .iter()
            .map(|&(id, logprob)| {
                let text = self.token_text(id);
                Token {
                    id,
                    piece: text.clone(),
                    text,
                    logprob,
                    special: self.is_special(id),
                }
            })
            .collect();
        let token = Token {
            id: token.id,
            piece: self.token_text(token.id),
            text: emitted,
            logprob: token.logprob,
            special: self.is_special(token.id),
        };
        Ok(match finish {
            None => (
                InferStreamResponse::Intermediate { token, top_tokens },
                false,
            ),
            Some(finish_reason) => (
                InferStreamResponse::End {
                    token,
                    top_tokens,
                    generated_text: GeneratedText {
                        text: std::mem::take(&mut self.text),
                        generated_tokens: self.generated,
                        finish_reason,
                        stop_sequence: self.matched.take(),
                        seed: self.seed,
                        accepted_per_step: std::mem::take(&mut self.accepted_per_step),
                    },
                    queued: self.queued,
                    start: self.start.unwrap_or(self.queued),
                },
                true,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detokenizer::tests::byte_level;
    use tessera_params::{SamplingParams, StoppingParams};

    /// The output of the byte-level tokens of `text` (one per byte), up to its end.
    fn finish(stop: &[&str], text: &str) -> GeneratedText {
        let ids: Vec<u32> = text.bytes().map(u32::from).collect();
        finish_ids(stop, &ids, true)
    }

    /// The output of tokens `ids`, up to its end.
    fn finish_ids(stop: &[&str], ids: &[u32], skip_special_tokens: bool) -> GeneratedText {
        let request = ValidGenerateRequest {
            inputs: String::new(),
            input_ids: Vec::new(),
            parameters: SamplingParams::default(),
            stopping: StoppingParams {
                max_new_tokens: 8,
                stop_sequences: stop.iter().map(|s| s.to_string()).collect(),
                ignore_eos: false,
                stop_token_ids: Vec::new(),
            },
            constraint: None,
            decoder_input_details: false,
            skip_special_tokens,
            pooling: None,
        };
        let tokenizer = byte_level();
        let special = Arc::new(SpecialTokens::of(&tokenizer));
        let mut out = OutputStream::new(&request, tokenizer, special, Instant::now());
        for &id in ids {
            let token = SampledToken {
                id,
                logprob: 0.0,
                top: Vec::new(),
            };
            if let (InferStreamResponse::End { generated_text, .. }, true) =
                out.push(token).expect("a token")
            {
                return generated_text;
            }
        }
        panic!("{ids:?} did not finish");
    }

    #[test]
    fn the_token_that_ends_the_output_is_not_in_its_text() {
        // 262 is `</s>`, special and the end of generation: with special tokens kept, it
        // still ends the output without joining its text.
        let g = finish_ids(&[], &[104, 262, 105, 262], false);
        assert_eq!(g.finish_reason, FinishReason::EosToken);
        assert_eq!(g.text, "h");
    }

    #[test]
    fn the_stop_sequence_that_matched_is_reported() {
        let g = finish(&["zz", "lo"], "hello");
        assert_eq!(g.finish_reason, FinishReason::StopSequence);
        assert_eq!(g.stop_sequence.as_deref(), Some("lo"));
        assert_eq!(g.text, "hel");
        let g = finish(&["zz"], "abcdefgh");
        assert_eq!(g.finish_reason, FinishReason::Length);
        assert_eq!((g.text.as_str(), g.stop_sequence), ("abcdefgh", None));
    }
}
