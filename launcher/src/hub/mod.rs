//! `--model-id ORG/NAME[:QUANT]`: the model fetched from the Hugging Face Hub into the cache
//! `huggingface_hub` uses (so each reuses what the other downloaded), before any shard starts;
//! shards read the cached files. The `hf-hub` crate does the transfers (resumable, one
//! writer per file); this module decides what to fetch, verifies it against the Hub's sizes
//! and hashes, serves from the cache when offline or when the Hub cannot be reached, and says
//! what to do when it cannot.

mod fetch;
mod select;
mod settings;
mod spec;

use std::io;
use std::path::PathBuf;

pub(crate) use fetch::resolve;
pub(crate) use settings::HubSettings;
pub(crate) use spec::{HubModel, parse};

/// Why a Hub model could not be made available locally; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HubError {
    /// No cache folder can be named.
    #[error("no Hugging Face cache folder: set HF_HOME (or HF_HUB_CACHE, or HOME)")]
    NoCache,
    /// Offline, and the cache lacks the model.
    #[error(
        "{repo}: not in the local cache ({}) and HF_HUB_OFFLINE is set{detail}: run once with \
         network access (without HF_HUB_OFFLINE), or give --model-id a local directory or \
         .gguf file",
        .cache.display()
    )]
    NotCachedOffline {
        /// The repository.
        repo: String,
        /// The cache folder looked in.
        cache: PathBuf,
        /// What is missing, when something of it is there.
        detail: String,
    },
    /// The Hub cannot be reached and the cache lacks the model.
    #[error(
        "cannot reach {endpoint} for {repo} ({message}), and the local cache ({}) has no \
         complete copy of it: check the network (or HF_ENDPOINT, for a mirror)",
        .cache.display()
    )]
    Unreachable {
        /// The repository.
        repo: String,
        /// The Hub's address.
        endpoint: String,
        /// The cache folder looked in.
        cache: PathBuf,
        /// The transport error.
        message: String,
    },
    /// The Hub refused the request: a gated or private repository.
    #[error(
        "{repo} is gated or private ({status} from {endpoint}): set HF_TOKEN to a token of an \
         account that has access (accept the model's terms on its Hub page first)"
    )]
    Unauthorized {
        /// The repository.
        repo: String,
        /// The Hub's address.
        endpoint: String,
        /// The HTTP status.
        status: u16,
    },
    /// No such repository or revision.
    #[error(
        "no model {repo} (revision {revision}) at {endpoint}: check the id and --revision; a \
         local --model-id must be an existing directory or .gguf file"
    )]
    NoSuchRepo {
        /// The repository.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The Hub's address.
        endpoint: String,
    },
    /// The repository holds nothing Tessera reads.
    #[error("{repo}: {why}; the repository has: {files}")]
    NothingToServe {
        /// The repository.
        repo: String,
        /// What is missing.
        why: String,
        /// Its files.
        files: String,
    },
    /// No GGUF file of the quantization named.
    #[error("{repo}: no GGUF file for :{quant}; its GGUF files are: {ggufs}")]
    NoSuchQuant {
        /// The repository.
        repo: String,
        /// The quantization named (or the default).
        quant: String,
        /// The GGUF files it has.
        ggufs: String,
    },
    /// Parts of a split GGUF are missing from the repository.
    #[error(
        "{repo}: {file} is the first of {count} parts of a split GGUF, and the repository has \
         {found} of its {count} parts"
    )]
    IncompleteSplit {
        /// The repository.
        repo: String,
        /// The first part found.
        file: String,
        /// Parts the split has.
        count: usize,
        /// Parts the repository has.
        found: usize,
    },
    /// A transfer or listing failed.
    #[error("{repo}: fetching {what} from {endpoint} failed: {message}")]
    Transfer {
        /// The repository.
        repo: String,
        /// The file (or listing).
        what: String,
        /// The Hub's address.
        endpoint: String,
        /// Why.
        message: String,
    },
    /// A downloaded file is not what the Hub lists.
    #[error(
        "{repo}: the downloaded {file} does not have the Hub's {what} (expected {expected}, got \
         {actual}); it was removed: start again to download it anew"
    )]
    Corrupt {
        /// The repository.
        repo: String,
        /// The file.
        file: String,
        /// Size or SHA-256.
        what: &'static str,
        /// The Hub's value.
        expected: String,
        /// The file's.
        actual: String,
    },
    /// A cache file could not be read or written.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}
