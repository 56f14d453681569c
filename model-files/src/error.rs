use std::path::PathBuf;

/// Everything that can go wrong while reading model files. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A required file is missing from a model directory.
    #[error("{path}: missing; {hint}")]
    Missing {
        /// The file that should exist.
        path: PathBuf,
        /// What the user can do about it.
        hint: String,
    },
    /// The file exists but its content is malformed (truncated, corrupt, inconsistent).
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, in words a user can act on.
        message: String,
    },
    /// The model's architecture is not one Tessera implements.
    #[error("{path}: unsupported architecture {found:?}; supported: {supported}")]
    UnsupportedArchitecture {
        /// The file that declared it.
        path: PathBuf,
        /// The declared architecture.
        found: String,
        /// The supported architectures, comma-separated.
        supported: String,
    },
    /// The checkpoint's weights are quantized by a method Tessera does not read
    /// (`quantization_config` in `config.json`).
    #[error(
        "{path}: a {method} checkpoint (quantization_config.quant_method {quant_method:?}); \
         Tessera reads Hugging Face checkpoints in F32, F16 or BF16 and serves quantized \
         models from GGUF files: serve a GGUF of this model (Q4_K_M, Q8_0, …) or its \
         unquantized checkpoint"
    )]
    QuantizedCheckpoint {
        /// The config that declared it.
        path: PathBuf,
        /// The method as people name it (GPTQ, AWQ, FP8, …).
        method: String,
        /// The method as the config names it.
        quant_method: String,
    },
    /// A tensor is missing or has the wrong shape or type.
    #[error("{path}: tensor {name:?}: {message}")]
    Tensor {
        /// The file (or index) the tensor was looked up in.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// The model's tokenizer files (or a GGUF's tokenizer metadata) cannot be built into a
    /// tokenizer.
    #[error(transparent)]
    Tokenizer(#[from] tessera_text::TokenizerLoadError),
}

impl FormatError {
    /// Shorthand for [`FormatError::Invalid`].
    pub fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`FormatError::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// Shorthand for [`FormatError::Tensor`].
    pub fn tensor(
        path: impl Into<PathBuf>,
        name: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::Tensor {
            path: path.into(),
            name: name.into(),
            message: message.into(),
        }
    }
}
