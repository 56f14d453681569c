//! Tokenizers: built from a Hugging Face directory's files (`tokenizer.json`) or rebuilt from
//! GGUF metadata, together with the ids that end generation and the model's chat template.

mod gguf;
mod hf;
mod source;
mod spec;
mod token_bytes;

pub use source::{HfTokenizerFiles, TokenizerSource};
pub use spec::GgufTokenizerSpec;

use std::path::Path;

use tokenizers::Tokenizer;
use tokenizers::processors::template::TemplateProcessing;

use crate::TokenizerLoadError;
use crate::chat_template::{ChatTemplate, ChatTemplateError};

/// Encoding or decoding failed (for example an id outside the vocabulary).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct TokenizeError {
    message: String,
}

impl TokenizeError {
    fn new(what: &str, source: tokenizers::Error) -> Self {
        Self {
            message: format!("{what}: {source}"),
        }
    }
}

/// End-of-turn tokens llama.cpp treats as end of generation when a GGUF names them as control
/// tokens (it finds them by text, as it has no key for all of them).
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "<|return|>",
    "<|call|>",
];

/// A model's tokenizer with the special tokens and the chat template the server needs.
///
/// ```no_run
/// # use tessera_text::ModelTokenizer;
/// let tok = ModelTokenizer::from_hf_dir("models/SmolLM2-135M-Instruct".as_ref(), &[])?;
/// let ids = tok.encode("Hello world", true)?;
/// assert_eq!(tok.decode(&ids, true)?, "Hello world");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ModelTokenizer {
    /// The tokenizer, ready to encode and decode.
    pub tokenizer: Tokenizer,
    /// The beginning-of-sequence token and its id, if the model has one.
    pub bos_token: Option<(String, u32)>,
    /// Every id that ends generation (EOS plus e.g. `<|im_end|>` or `<|eot_id|>`), no duplicates.
    pub eos_token_ids: Vec<u32>,
    /// Whether `encode(prompt, true)` prepends BOS (the post-processor does it).
    pub add_bos: bool,
    /// The chat template, if the model ships one.
    pub chat_template: Option<ChatTemplate>,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("bos_token", &self.bos_token)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("add_bos", &self.add_bos)
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl ModelTokenizer {
    /// Loads the tokenizer of a Hugging Face model directory: `tokenizer.json` (required),
    /// `tokenizer_config.json` (special tokens, `add_bos_token`, the chat template),
    /// `chat_template.jinja` (transformers 5; wins over the config's template) and
    /// `generation_config.json` (`eos_token_id`). `generation_eos` adds ids that end
    /// generation, e.g. from a config the caller already read.
    pub fn from_hf_dir(dir: &Path, generation_eos: &[u32]) -> Result<Self, TokenizerLoadError> {
        hf::build(&HfTokenizerFiles::read(dir, generation_eos)?)
    }

    /// Builds the tokenizer `source` describes, as [`Self::from_hf_dir`] and
    /// [`Self::from_gguf`] do from the files themselves.
    pub fn from_source(source: &TokenizerSource) -> Result<Self, TokenizerLoadError> {
        match source {
            TokenizerSource::HfFiles(files) => hf::build(files),
            TokenizerSource::Gguf { path, spec } => Self::from_gguf(spec, path),
        }
    }

    /// Rebuilds the tokenizer a GGUF file's metadata describes, as transformers does when
    /// loading with `gguf_file=`. `path` is the GGUF file, named in errors.
    pub fn from_gguf(spec: &GgufTokenizerSpec, path: &Path) -> Result<Self, TokenizerLoadError> {
        let mut tokenizer = gguf::build(spec, path)?;
        let token =
            |id: Option<u32>| id.and_then(|id| Some((spec.tokens.get(id as usize)?.clone(), id)));
        let bos_token = token(spec.bos_id);
        let eos_token = token(spec.eos_id);
        // llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
        let add_bos = spec.add_bos.unwrap_or(spec.model == "llama") && bos_token.is_some();
        let add_eos = spec.add_eos.unwrap_or(false) && eos_token.is_some();
        set_post_processor(
            &mut tokenizer,
            bos_token.as_ref(),
            add_bos,
            eos_token.as_ref(),
            add_eos,
        )
        .map_err(|e| {
            TokenizerLoadError::invalid(path, format!("cannot build the post-processor: {e}"))
        })?;

        let mut eos_token_ids = Vec::new();
        if let Some((_, id)) = &eos_token {
            eos_token_ids.push(*id);
        }
        // Harmony (gpt-oss) ends each message with `<|end|>` and the turn with `<|return|>` or
        // `<|call|>`: there `<|end|>` does not end generation.
        let harmony = spec
            .chat_template
            .as_deref()
            .is_some_and(|t| t.contains("<|channel|>"));
        for (id, text) in spec.tokens.iter().enumerate() {
            let control = spec
                .token_types
                .as_ref()
                .and_then(|types| types.get(id))
                .is_some_and(|t| *t == 3);
            let ends_turn =
                END_OF_TURN_TOKENS.contains(&text.as_str()) && !(harmony && text == "<|end|>");
            if control && ends_turn {
                push_unique(&mut eos_token_ids, id as u32);
            }
        }

        let chat_template = match &spec.chat_template {
            Some(source) => Some(
                ChatTemplate::new(
                    source.clone(),
                    bos_token.as_ref().map(|(t, _)| t.clone()),
                    eos_token.as_ref().map(|(t, _)| t.clone()),
                )
                .map_err(|e| {
                    TokenizerLoadError::invalid(path, format!("tokenizer.chat_template: {e}"))
                })?,
            ),
            None => None,
        };
        Ok(Self {
            tokenizer,
            bos_token,
            eos_token_ids,
            add_bos,
            chat_template,
        })
    }

    /// Uses `source` as the chat template instead of the model's (`--chat-template`), with
    /// the same `bos_token` and `eos_token`.
    pub fn replace_chat_template(&mut self, source: String) -> Result<(), ChatTemplateError> {
        let (bos, eos) = match &self.chat_template {
            Some(t) => t.special_tokens(),
            None => (
                self.bos_token.as_ref().map(|(t, _)| t.clone()),
                self.eos_token_ids
                    .first()
                    .and_then(|&id| self.tokenizer.id_to_token(id)),
            ),
        };
        self.chat_template = Some(ChatTemplate::new(source, bos, eos)?);
        Ok(())
    }

    /// Token ids of `text`. With `add_special_tokens` the post-processor adds BOS (when
    /// [`Self::add_bos`]); special tokens written in the text (`<|im_start|>`) always map to
    /// their ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::new("cannot encode the text", e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of the pair `(first, second)`, as transformers' `tokenizer(first, second)`
    /// gives them: each part encoded, then joined by the post-processor's pair template (with
    /// `add_special_tokens`), or simply one after the other.
    pub fn encode_pair(
        &self,
        first: &str,
        second: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self
            .tokenizer
            .encode_fast((first, second), add_special_tokens)
            .map_err(|e| TokenizeError::new("cannot encode the pair of texts", e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, optionally without special tokens. Ids outside the vocabulary are an
    /// error.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizeError> {
        let size = self.tokenizer.get_vocab_size(true);
        if let Some(bad) = ids.iter().find(|id| **id as usize >= size) {
            return Err(TokenizeError {
                message: format!("token id {bad} is outside the vocabulary (size {size})"),
            });
        }
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizeError::new("cannot decode the ids", e))
    }

    /// The number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
}

/// transformers' `update_post_processor`: `[BOS] $A [EOS]`, each part only when asked for.
fn set_post_processor(
    tokenizer: &mut Tokenizer,
    bos: Option<&(String, u32)>,
    add_bos: bool,
    eos: Option<&(String, u32)>,
    add_eos: bool,
) -> Result<(), String> {
    let bos = bos.filter(|_| add_bos);
    let eos = eos.filter(|_| add_eos);
    let mut single = String::new();
    let mut pair = String::new();
    if let Some((b, _)) = bos {
        single.push_str(&format!("{b}:0 "));
    }
    single.push_str("$A:0");
    if let Some((e, _)) = eos {
        single.push_str(&format!(" {e}:0"));
    }
    pair.push_str(&single);
    if let Some((b, _)) = bos {
        pair.push_str(&format!(" {b}:1"));
    }
    pair.push_str(" $B:1");
    if let Some((e, _)) = eos {
        pair.push_str(&format!(" {e}:1"));
    }
    let special: Vec<(String, u32)> = bos.into_iter().chain(eos).cloned().collect();
    let processor = TemplateProcessing::builder()
        .try_single(single.as_str())
        .and_then(|b| b.try_pair(pair.as_str()))
        .map_err(|e| e.to_string())?
        .special_tokens(special)
        .build()
        .map_err(|e| e.to_string())?;
    tokenizer.with_post_processor(Some(processor));
    Ok(())
}

fn push_unique(ids: &mut Vec<u32>, id: u32) {
    if !ids.contains(&id) {
        ids.push(id);
    }
}
