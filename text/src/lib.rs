//! Text as Tessera's models read and write it: the [`ModelTokenizer`] (built from a Hugging
//! Face `tokenizer.json` or from GGUF tokenizer metadata, both plain data in a
//! [`TokenizerSource`] that can travel between processes), the bytes each token stands for,
//! chat templates, and the output constraints compiled over the vocabulary: llguidance
//! grammars (JSON Schemas, Lark) and regular-expression patterns.
//!
//! Nothing here reads weights or model configurations: that is `tessera-model-files`, which
//! depends on this crate, never the other way round.
//!
//! ```no_run
//! let tok = tessera_text::ModelTokenizer::from_hf_dir("fixtures/tiny-llama".as_ref(), &[])?;
//! let ids = tok.encode("Hello world", false)?;
//! assert_eq!(tok.decode(&ids, false)?, "Hello world");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod chat_template;
mod declared_properties;
mod error;
mod grammar;
mod output_pattern;
mod tokenizer;

pub use chat_template::{ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions};
pub use declared_properties::close_declared_objects;
pub use error::TokenizerLoadError;
pub use grammar::{GrammarCompiler, GrammarError, GrammarMatcher, GrammarSource};
pub use output_pattern::{MAX_PATTERN_DFA_BYTES, compile_output_pattern};
pub use tokenizer::{
    GgufTokenizerSpec, HfTokenizerFiles, ModelTokenizer, TokenizeError, TokenizerSource,
};
