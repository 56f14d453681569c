//! Model files as Tessera reads them: Hugging Face directories (`config.json`, safetensors,
//! `tokenizer.json`, chat templates) and single GGUF files, behind one [`ModelFiles`] handle.
//!
//! ```no_run
//! let files = tessera_formats::ModelFiles::open("fixtures/tiny-llama".as_ref())?;
//! let embed = files.weights.load_f32("model.embed_tokens.weight")?;
//! assert_eq!(embed.shape[0], files.config.vocab_size);
//! # Ok::<(), tessera_formats::FormatError>(())
//! ```
#![deny(missing_docs)]

mod chat_template;
mod config;
mod declared_properties;
mod error;
mod family;
pub mod gguf;
mod grammar;
mod hf_dir;
mod mmap;
mod model_files;
mod output_pattern;
mod tokenizer;
mod weights;

pub use chat_template::{ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions};
pub use config::{Architecture, DType, ModelConfig, RopeScaling};
pub use declared_properties::close_declared_objects;
pub use error::FormatError;
pub use family::{Activation, ExpertNames, Family, LayerSpec, Moe};
pub use grammar::{GrammarCompiler, GrammarError, GrammarMatcher, GrammarSource};
pub use model_files::ModelFiles;
pub use output_pattern::{MAX_PATTERN_DFA_BYTES, compile_output_pattern};
pub use tokenizer::{GgufTokenizerSpec, ModelTokenizer, TokenizeError};
pub use weights::{HostTensor, NativeTensor, WeightSource};

/// The tensors of one safetensors file (memory-mapped, converted to f32 on request), for
/// files that sit next to a model rather than being one: draft heads, adapters.
pub fn open_safetensors(path: &std::path::Path) -> Result<Box<dyn WeightSource>, FormatError> {
    Ok(Box::new(hf_dir::SafetensorsWeights::from_files(vec![
        path.to_path_buf(),
    ])?))
}
