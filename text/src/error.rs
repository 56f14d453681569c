use std::path::PathBuf;

/// Why a tokenizer could not be built from its sources. Every variant names the file (or,
/// for a GGUF file, the file and the metadata key) to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerLoadError {
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
    /// The file exists but its content is malformed or describes a tokenizer Tessera cannot
    /// build.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, in words a user can act on.
        message: String,
    },
}

impl TokenizerLoadError {
    /// Shorthand for [`TokenizerLoadError::Invalid`].
    pub fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }

    /// Shorthand for [`TokenizerLoadError::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
