//! One handle over a model, whether it is a Hugging Face directory or a single GGUF file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::token_ids;
use crate::gguf::GgufFile;
use crate::hf_dir::SafetensorsWeights;
use tessera_text::{HfTokenizerFiles, ModelTokenizer, TokenizerSource};

use crate::{FormatError, ModelConfig, Pooler, WeightSource};

enum Source {
    /// A Hugging Face directory; the count of its other towers' tensors (a wrapped
    /// checkpoint's vision tower and projector), which are not loaded.
    HfDir {
        other_tower_tensors: usize,
    },
    Gguf(Arc<GgufFile>),
}

/// An opened model: its configuration and weights (memory-mapped, nothing converted yet), and
/// the means to build its tokenizer.
pub struct ModelFiles {
    /// The directory or `.gguf` file that was opened.
    pub path: PathBuf,
    /// Shape and hyper-parameters.
    pub config: ModelConfig,
    /// Weights by Hugging Face name.
    pub weights: Arc<dyn WeightSource>,
    source: Source,
}

impl std::fmt::Debug for ModelFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFiles")
            .field("path", &self.path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ModelFiles {
    /// Opens a Hugging Face model directory or a `.gguf` file.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let meta = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
        if meta.is_dir() {
            let config = ModelConfig::from_hf_file(&path.join("config.json"))?;
            let weights = SafetensorsWeights::open(path)?;
            let other_tower_tensors = weights.other_tower_tensors();
            Ok(Self {
                path: path.to_path_buf(),
                config,
                weights: Arc::new(weights),
                source: Source::HfDir {
                    other_tower_tensors,
                },
            })
        } else {
            let gguf = Arc::new(GgufFile::open(path)?);
            let config = gguf.model_config()?;
            Ok(Self {
                path: path.to_path_buf(),
                config,
                weights: gguf.clone(),
                source: Source::Gguf(gguf),
            })
        }
    }

    /// How many tensors of other towers than the language model (a wrapped checkpoint's
    /// vision tower and projector) the files hold and Tessera leaves unread.
    pub fn other_tower_tensors(&self) -> usize {
        match self.source {
            Source::HfDir {
                other_tower_tensors,
            } => other_tower_tensors,
            Source::Gguf(_) => 0,
        }
    }

    /// What the model's tokenizer is built from: the directory's tokenizer files (with the
    /// end-of-generation ids of `config.json` and `generation_config.json`) or the GGUF file's
    /// tokenizer metadata.
    pub fn tokenizer_source(&self) -> Result<TokenizerSource, FormatError> {
        match &self.source {
            Source::HfDir { .. } => {
                let mut eos = self.config.eos_token_ids.clone();
                eos.extend(generation_eos(&self.path.join("generation_config.json"))?);
                eos.sort_unstable();
                eos.dedup();
                Ok(TokenizerSource::HfFiles(HfTokenizerFiles::read(
                    &self.path, &eos,
                )?))
            }
            Source::Gguf(gguf) => Ok(TokenizerSource::Gguf {
                path: self.path.clone(),
                spec: gguf.tokenizer_spec()?,
            }),
        }
    }

    /// Builds the tokenizer (and chat template) that ships with the model.
    pub fn tokenizer(&self) -> Result<ModelTokenizer, FormatError> {
        Ok(ModelTokenizer::from_source(&self.tokenizer_source()?)?)
    }

    /// How the model pools its hidden states into embeddings, when it says (a
    /// sentence-transformers directory, a GGUF file with a pooling type); `None`: it does not.
    pub fn pooler(&self) -> Result<Option<Pooler>, FormatError> {
        match &self.source {
            Source::HfDir { .. } => crate::pooling::from_hf_dir(&self.path),
            Source::Gguf(gguf) => crate::pooling::from_gguf(gguf),
        }
    }

    /// Whether the model is a GGUF file (rather than a Hugging Face directory).
    pub fn is_gguf(&self) -> bool {
        matches!(self.source, Source::Gguf(_))
    }
}

/// `eos_token_id` of `generation_config.json`, which is optional.
fn generation_eos(path: &Path) -> Result<Vec<u32>, FormatError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FormatError::io(path, e)),
    };
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| FormatError::invalid(path, format!("invalid JSON: {e}")))?;
    Ok(token_ids(value.get("eos_token_id")))
}
