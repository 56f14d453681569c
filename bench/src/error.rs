//! The library's error type.

use std::path::PathBuf;

/// What can go wrong preparing a benchmark (running one never fails: request failures are
/// counted in the results).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The model files the tokenizer comes from could not be read.
    #[error("cannot load the tokenizer: {0}")]
    Format(#[from] tessera_model_files::FormatError),
    /// The tokenizer's files could not be read or built into a tokenizer.
    #[error("cannot load the tokenizer: {0}")]
    TokenizerLoad(#[from] tessera_text::TokenizerLoadError),
    /// The tokenizer failed on a text.
    #[error("tokenizer: {0}")]
    Tokenize(#[from] tessera_text::TokenizeError),
    /// The vocabulary has too few whole-word tokens to build synthetic prompts.
    #[error("the vocabulary has only {0} whole-word tokens; synthetic prompts need at least 8")]
    Vocabulary(usize),
    /// The asked prompt length leaves no room for text.
    #[error("--input-len {len} is too short: the tokenizer adds {specials} special token(s)")]
    PromptTooShort {
        /// The asked length.
        len: usize,
        /// Tokens the tokenizer adds to any text.
        specials: usize,
    },
    /// No text of exactly this many tokens was found.
    #[error("could not build a prompt of exactly {0} tokens")]
    InexactPrompt(usize),
    /// A dataset line is not usable.
    #[error("{}:{line}: {message}", path.display())]
    Dataset {
        /// The file.
        path: PathBuf,
        /// The 1-based line (0 for a JSON array or the whole file).
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A results file is not a benchmark report.
    #[error("{}: not a tessera-bench result: {message}", path.display())]
    Report {
        /// The file.
        path: PathBuf,
        /// The parse error.
        message: String,
    },
}
