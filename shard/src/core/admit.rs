//! How a new sequence joins the table: the invariants the router's plan must keep, and its
//! sampler, held to its output constraint.

use std::sync::Arc;

use tessera_params::OutputConstraint;
use tessera_text::GrammarSource;

use super::{Engine, NewSequence};
use crate::pooling::PoolState;
use crate::sampling::{Choices, Pattern, Sampler};
use crate::sequence::Sequence;
use crate::speculative::state::ProposerState;
use crate::{EngineError, PoolingTask};

/// Compiled output patterns an engine keeps.
const CACHED_PATTERNS: usize = 16;

impl Engine {
    /// Adds `seq` to the table. Its parameters were validated by the router; what is checked
    /// here is what the engine needs to stay in bounds (token ids, cached lengths, ids).
    pub(super) fn admit(&mut self, seq: NewSequence) -> Result<(), EngineError> {
        let refuse =
            |what: String| EngineError::InvalidBatch(format!("request {}: {what}", seq.id));
        seq.params
            .check_vocab(self.model.config().vocab_size)
            .map_err(|e| refuse(e.to_string()))?;
        if seq.cache_len >= seq.input_ids.len() {
            return Err(refuse(format!(
                "needs at least one token beyond the {} cached ones",
                seq.cache_len
            )));
        }
        if self.sequences.contains_key(&seq.id) {
            return Err(EngineError::InvalidBatch(format!(
                "request {} already exists",
                seq.id
            )));
        }
        if seq.prefill_logprobs && seq.cache_len > 0 {
            return Err(refuse(
                "prompt logprobs need the whole prompt computed (cache_len must be 0)".into(),
            ));
        }
        if let Some(task) = &seq.pooling {
            self.check_pooling(task, &seq).map_err(refuse)?;
        }
        let prompt_len = seq.input_ids.len() - seq.generated_len.min(seq.input_ids.len());
        let sampler = Sampler::new(seq.params.clone(), &seq.input_ids[..prompt_len]);
        let mut sampler = self
            .constrained(sampler, seq.constraint.as_ref())
            .map_err(refuse)?;
        for &t in &seq.input_ids[prompt_len..] {
            sampler.record(t);
        }
        let proposer = match &self.speculation {
            Some(s) => s.new_state(seq.cache_len),
            None => ProposerState::Stateless,
        };
        self.sequences.insert(
            seq.id,
            Sequence {
                tokens: seq.input_ids,
                computed: seq.cache_len,
                blocks: seq.blocks,
                sampler,
                prefill: seq.prefill_logprobs.then(Vec::new),
                prompt_len,
                proposer,
                pool: seq.pooling.map(PoolState::new),
            },
        );
        Ok(())
    }

    /// Why a pooling sequence cannot run as asked, if it cannot.
    fn check_pooling(&self, task: &PoolingTask, seq: &NewSequence) -> Result<(), String> {
        if seq.prefill_logprobs || seq.generated_len > 0 {
            return Err("a pooling request neither reports logprobs nor generates".into());
        }
        if seq.cache_len > 0 && !task.reads_last_token_only() {
            return Err("mean and CLS pooling need the whole prompt computed (cache_len 0)".into());
        }
        match task {
            PoolingTask::Classify { label_tokens } if label_tokens.is_empty() => {
                if self.model.score_head().is_none() {
                    return Err("the model has no classification head; name label tokens".into());
                }
            }
            PoolingTask::Classify { label_tokens } => {
                let vocab = self.model.config().vocab_size;
                if let Some(t) = label_tokens.iter().find(|&&t| t as usize >= vocab) {
                    return Err(format!(
                        "label token {t} is outside the vocabulary of {vocab}"
                    ));
                }
            }
            PoolingTask::Embed(_) => {}
        }
        Ok(())
    }

    /// `sampler` held to `constraint`, if any, or why it cannot be.
    fn constrained(
        &mut self,
        sampler: Sampler,
        constraint: Option<&OutputConstraint>,
    ) -> Result<Sampler, String> {
        let Some(constraint) = constraint else {
            return Ok(sampler);
        };
        let vocab = self.vocab.clone().ok_or(
            "constrained output needs the model's tokenizer, which this shard has not loaded",
        )?;
        Ok(match constraint {
            OutputConstraint::JsonObject => sampler.with_json(vocab),
            OutputConstraint::OneOf(choices) => {
                sampler.with_choices(vocab, Arc::new(Choices::new(choices)?))
            }
            OutputConstraint::Pattern(text) => sampler.with_pattern(vocab, self.pattern(text)?),
            OutputConstraint::JsonSchema(schema) => sampler
                .with_grammar(vocab, GrammarSource::JsonSchema(schema))
                .map_err(|e| e.to_string())?,
            OutputConstraint::Lark(grammar) => sampler
                .with_grammar(vocab, GrammarSource::Lark(grammar))
                .map_err(|e| e.to_string())?,
        })
    }

    /// `text` compiled, from the engine's recent patterns when it is one of them.
    fn pattern(&mut self, text: &str) -> Result<Arc<Pattern>, String> {
        if let Some(p) = self.patterns.get(text) {
            return Ok(p.clone());
        }
        let p = Arc::new(Pattern::new(text)?);
        if self.patterns.len() >= CACHED_PATTERNS {
            self.patterns.clear();
        }
        self.patterns.insert(text.to_owned(), p.clone());
        Ok(p)
    }
}
