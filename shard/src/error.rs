use tessera_formats::FormatError;

/// Why a model could not be loaded or a batch could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// Reading the model files failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The weights do not fit the configuration.
    #[error("{path}: {message}")]
    Weights {
        /// The model that was loaded.
        path: String,
        /// What does not fit.
        message: String,
    },
    /// A batch asked for something the model or the cache cannot do.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
}
