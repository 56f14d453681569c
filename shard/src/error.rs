use tessera_model_files::FormatError;

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
    /// A collective between tensor-parallel ranks failed (a peer died, timed out or diverged).
    #[error("tensor-parallel group: {0}")]
    Collective(#[from] crate::comm::CommError),
    /// A batch asked for something the model or the cache cannot do.
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The GPU (or its libraries) could not do what was asked: missing driver, out of
    /// memory, a kernel launch that failed.
    #[error("GPU: {0}")]
    Device(String),
}
