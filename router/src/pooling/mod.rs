//! What the served model does besides generating, decided once at start-up from the shards'
//! facts and `--task` (vLLM's pooling runner): embeddings (a pooled final hidden state) or
//! scores (a classifier over the last token); and the arithmetic that turns the shards' raw
//! results into what clients get.

pub(crate) mod embeddings;
pub(crate) mod score;

use tessera_text::ModelTokenizer;

use crate::validation::ValidationError;

/// What the server is started to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Task {
    /// Text generation (the chat, completions, responses and messages APIs).
    #[default]
    Generate,
    /// Embeddings (`/v1/embeddings`).
    Embed,
    /// Relevance scores of text pairs (`/v1/rerank`, `/v1/score`).
    Score,
}

impl Task {
    /// The name `--task` takes and errors use.
    pub fn name(self) -> &'static str {
        match self {
            Task::Generate => "generate",
            Task::Embed => "embed",
            Task::Score => "score",
        }
    }
}

/// Which final hidden states make an embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// The last token's.
    Last,
    /// The mean of every token's.
    Mean,
    /// The first token's.
    Cls,
}

/// How the router asks the shards to pool one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PoolingAsk {
    /// The pooled final hidden state.
    Embed(Pool),
    /// The last token's classifier logits: the model's score head (`label_tokens` empty), or
    /// these tokens' LM-head logits.
    Classify { label_tokens: Vec<u32> },
}

impl PoolingAsk {
    /// Whether the result is read from the last token alone, so that cached prefix blocks may
    /// stand in for the rest of the prompt (mean and CLS pooling read every token's state).
    pub(crate) fn reads_last_token_only(&self) -> bool {
        !matches!(self, PoolingAsk::Embed(Pool::Mean | Pool::Cls))
    }
}

/// What the server does: generation, or a pooling task with what it needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PoolingModel {
    /// Text generation.
    #[default]
    Generate,
    /// Embeddings.
    Embed(EmbedSpec),
    /// Scores of text pairs.
    Score(ScoreSpec),
}

/// An embedding model's pooling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedSpec {
    /// Which hidden states.
    pub pool: Pool,
    /// Whether vectors are scaled to unit length (after `dimensions` truncates them).
    pub normalize: bool,
    /// Width of a full embedding.
    pub dimensions: usize,
}

/// A scoring model's classifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreSpec {
    /// Tokens whose logits are the labels (a causal LM asked "no" or "yes"); empty: the
    /// model's sequence-classification head.
    pub label_tokens: Vec<u32>,
}

/// The facts the shards report that decide the task (`tessera.v1.InfoResponse`'s; read from
/// it in `client::convert`).
#[derive(Debug, Clone, Default)]
pub struct ModelFacts {
    /// The pooling the model declares, if any.
    pub pooling: Option<Pool>,
    /// Whether the model normalises its embeddings.
    pub normalize: bool,
    /// Labels of its classification head (0: none).
    pub score_labels: u32,
    /// Width of a hidden state.
    pub hidden_size: u32,
}

/// Why the requested task cannot run on the model.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TaskError(String);

impl PoolingModel {
    /// The task `task` asks for (`None`: what the model declares: a classification head
    /// scores, a pooling config embeds, anything else generates), with what it needs.
    /// `score_labels` names the label tokens of a causal LM asked to score (the last one's
    /// probability among them is the score), e.g. `["no", "yes"]` for Qwen3-Reranker.
    pub fn resolve(
        task: Option<Task>,
        facts: &ModelFacts,
        score_labels: &[String],
        tokenizer: &ModelTokenizer,
    ) -> Result<Self, TaskError> {
        let task = task.unwrap_or(if facts.score_labels > 0 {
            Task::Score
        } else if facts.pooling.is_some() {
            Task::Embed
        } else {
            Task::Generate
        });
        Ok(match task {
            Task::Generate => PoolingModel::Generate,
            // A decoder the model files do not describe pools as vLLM pools one: by its last
            // token, normalised.
            Task::Embed => match facts.pooling {
                None => PoolingModel::Embed(EmbedSpec {
                    pool: Pool::Last,
                    normalize: true,
                    dimensions: facts.hidden_size as usize,
                }),
                Some(pool) => PoolingModel::Embed(EmbedSpec {
                    pool,
                    normalize: facts.normalize,
                    dimensions: facts.hidden_size as usize,
                }),
            },
            Task::Score if facts.score_labels > 0 => PoolingModel::Score(ScoreSpec {
                label_tokens: Vec::new(),
            }),
            Task::Score => {
                if score_labels.len() < 2 {
                    return Err(TaskError(
                        "a model without a classification head scores by the logits of two or \
                         more label tokens; give them with --score-labels (e.g. no,yes)"
                            .into(),
                    ));
                }
                let label_tokens = score_labels
                    .iter()
                    .map(|label| single_token(tokenizer, label))
                    .collect::<Result<_, _>>()?;
                PoolingModel::Score(ScoreSpec { label_tokens })
            }
        })
    }

    /// The task the server runs.
    pub fn task(&self) -> Task {
        match self {
            PoolingModel::Generate => Task::Generate,
            PoolingModel::Embed(_) => Task::Embed,
            PoolingModel::Score(_) => Task::Score,
        }
    }

    /// What the shards are asked for each request of `route`, which needs task `needed`, or
    /// why the server cannot answer it.
    pub(crate) fn ask_for(
        &self,
        needed: Task,
        route: &'static str,
    ) -> Result<PoolingAsk, ValidationError> {
        self.ask()
            .filter(|_| self.task() == needed)
            .ok_or_else(|| self.refusal(needed, route))
    }

    /// The embedding model's pooling, for `route`, or why the server cannot answer it.
    pub(crate) fn embedding(&self, route: &'static str) -> Result<&EmbedSpec, ValidationError> {
        match self {
            PoolingModel::Embed(spec) => Ok(spec),
            _ => Err(self.refusal(Task::Embed, route)),
        }
    }

    fn refusal(&self, needed: Task, route: &'static str) -> ValidationError {
        ValidationError::Task {
            route,
            needed: needed.name(),
            running: self.task().name(),
        }
    }

    /// What the shards are asked for each request of this model's pooling task.
    pub(crate) fn ask(&self) -> Option<PoolingAsk> {
        match self {
            PoolingModel::Generate => None,
            PoolingModel::Embed(e) => Some(PoolingAsk::Embed(e.pool)),
            PoolingModel::Score(s) => Some(PoolingAsk::Classify {
                label_tokens: s.label_tokens.clone(),
            }),
        }
    }
}

/// The id of `label`, which must be one token of the vocabulary.
fn single_token(tokenizer: &ModelTokenizer, label: &str) -> Result<u32, TaskError> {
    if let Some(id) = tokenizer.tokenizer.token_to_id(label) {
        return Ok(id);
    }
    let ids = tokenizer
        .encode(label, false)
        .map_err(|e| TaskError(format!("score label {label:?}: {e}")))?;
    match ids.as_slice() {
        [id] => Ok(*id),
        _ => Err(TaskError(format!(
            "score label {label:?} is {} tokens of the model's vocabulary; each label must be \
             one token",
            ids.len()
        ))),
    }
}

/// Whether `ids` can be pooled: not empty, inside the vocabulary of `vocab` tokens, at most
/// `max` tokens (`param` names the field at fault).
pub(crate) fn check_prompt(
    ids: &[u32],
    vocab: usize,
    max: usize,
    param: &'static str,
) -> Result<(), ValidationError> {
    if ids.is_empty() {
        return Err(ValidationError::EmptyInput(param));
    }
    if ids.len() > max {
        return Err(ValidationError::InputLength {
            max,
            given: ids.len(),
        });
    }
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(&token) => Err(ValidationError::TokenId {
            param,
            token: token.to_string(),
            vocab_size: vocab,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detokenizer::tests::byte_level;

    fn facts(pooling: Option<Pool>, score_labels: u32) -> ModelFacts {
        ModelFacts {
            pooling,
            normalize: true,
            score_labels,
            hidden_size: 64,
        }
    }

    fn labels(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn auto_takes_what_the_model_declares() {
        let tok = byte_level();
        let resolve = |f: ModelFacts| PoolingModel::resolve(None, &f, &[], &tok).unwrap();
        assert_eq!(resolve(facts(None, 0)).task(), Task::Generate);
        assert_eq!(resolve(facts(None, 0)).ask(), None);
        let embed = resolve(facts(Some(Pool::Mean), 0));
        assert_eq!(embed.task(), Task::Embed);
        assert_eq!(embed.ask(), Some(PoolingAsk::Embed(Pool::Mean)));
        assert!(matches!(
            embed,
            PoolingModel::Embed(EmbedSpec { dimensions: 64, .. })
        ));
        let score = resolve(facts(None, 1));
        assert_eq!(score.task(), Task::Score);
        assert_eq!(
            score.ask(),
            Some(PoolingAsk::Classify {
                label_tokens: vec![]
            })
        );
    }

    #[test]
    fn a_task_asked_of_a_model_that_declares_nothing() {
        let tok = byte_level();
        let embed = PoolingModel::resolve(Some(Task::Embed), &facts(None, 0), &[], &tok).unwrap();
        assert_eq!(
            embed,
            PoolingModel::Embed(EmbedSpec {
                pool: Pool::Last,
                normalize: true,
                dimensions: 64
            })
        );
        // "hello" is one token (merged), "</s>" a special one; "ab" is two.
        let score = PoolingModel::resolve(
            Some(Task::Score),
            &facts(None, 0),
            &labels(&["</s>", "hello"]),
            &tok,
        )
        .unwrap();
        assert_eq!(
            score.ask(),
            Some(PoolingAsk::Classify {
                label_tokens: vec![262, 259]
            })
        );
        let err = PoolingModel::resolve(
            Some(Task::Score),
            &facts(None, 0),
            &labels(&["ab", "c"]),
            &tok,
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"ab\" is 2 tokens"), "{err}");
        let err = PoolingModel::resolve(Some(Task::Score), &facts(None, 0), &labels(&["a"]), &tok)
            .unwrap_err();
        assert!(err.to_string().contains("--score-labels"), "{err}");
    }

    #[test]
    fn routes_of_another_task_say_which_to_start() {
        let generate = PoolingModel::default();
        let err = generate
            .ask_for(Task::Embed, "/v1/embeddings")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`generate` task") && err.contains("--task embed"),
            "{err}"
        );
    }

    #[test]
    fn prompts_are_checked() {
        assert!(check_prompt(&[1, 2], 10, 4, "input").is_ok());
        assert!(matches!(
            check_prompt(&[], 10, 4, "input"),
            Err(ValidationError::EmptyInput("input"))
        ));
        assert!(matches!(
            check_prompt(&[1; 5], 10, 4, "input"),
            Err(ValidationError::InputLength { max: 4, given: 5 })
        ));
        assert!(matches!(
            check_prompt(&[1, 10], 10, 4, "input"),
            Err(ValidationError::TokenId { .. })
        ));
    }
}
