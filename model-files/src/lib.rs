//! Model files as Tessera reads them: Hugging Face directories (`config.json`, safetensors)
//! and single GGUF files, behind one [`ModelFiles`] handle: the model's configuration and
//! [`Family`], its weights (memory-mapped, converted on request), and its tokenizer, built by
//! `tessera-text` from the directory's tokenizer files or the GGUF's tokenizer metadata.
//!
//! ```no_run
//! let files = tessera_model_files::ModelFiles::open("fixtures/tiny-llama".as_ref())?;
//! let embed = files.weights.load_f32("model.embed_tokens.weight")?;
//! assert_eq!(embed.shape[0], files.config.vocab_size);
//! # Ok::<(), tessera_model_files::FormatError>(())
//! ```
#![deny(missing_docs)]

mod config;
mod error;
mod family;
pub mod gguf;
mod hf_dir;
mod mmap;
mod model_files;
mod pooling;
mod weights;

pub use config::{Architecture, DType, ModelConfig, NotServed, Quantization, RopeScaling};
pub use error::FormatError;
pub use family::{Activation, ExpertActivation, ExpertNames, Family, LayerSpec, Moe};
pub use model_files::ModelFiles;
pub use pooling::{Pooler, Pooling};
pub use weights::{HostTensor, NativeTensor, WeightSource};

/// The tensors of one safetensors file (memory-mapped, converted to f32 on request), for
/// files that sit next to a model rather than being one: draft heads, adapters.
pub fn open_safetensors(path: &std::path::Path) -> Result<Box<dyn WeightSource>, FormatError> {
    Ok(Box::new(hf_dir::SafetensorsWeights::from_files(vec![
        path.to_path_buf(),
    ])?))
}
