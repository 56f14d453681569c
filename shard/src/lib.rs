//! The shard: a Llama-family engine over a paged KV cache and a flattened batch, and sampling.
//!
//! ```no_run
//! use tessera_shard::{HiddenStates, LogitsWanted, Model, SequenceChunk};
//! let files = tessera_model_files::ModelFiles::open("fixtures/tiny-llama".as_ref())?;
//! let model = Model::load(&files)?;
//! let mut cache = model.new_cache(64, 16)?;
//! let chunk = SequenceChunk {
//!     tokens: &[1, 2, 3],
//!     start_position: 0,
//!     block_table: &[0],
//!     logits: LogitsWanted::Last,
//!     tree: None,
//!     prompt_len: 3,
//! };
//! let out = model.forward(&[chunk], &mut cache, HiddenStates::None)?;
//! assert_eq!(out.last(0).map(|l| l.len()), Some(model.config().vocab_size));
//! # Ok::<(), tessera_shard::EngineError>(())
//! ```
#![deny(missing_docs)]

pub mod comm;
mod convert;
mod core;
mod error;
mod host_memory;
mod kv_cache;
mod model;
mod pooling;
pub mod sampling;
mod sequence;
pub mod service;
pub mod speculative;
pub mod telemetry;

pub use core::{Engine, NewSequence, RunningUpdate, StepOutput, StepPlan, StepResult, StepTimings};
pub use error::EngineError;
pub use kv_cache::{KvCache, KvDtype};
#[cfg(feature = "cuda")]
pub use model::CudaOptions;
pub use model::{
    ForwardOutput, HiddenStates, LogitsWanted, Model, Op, OpTimes, OpTimesSnapshot, SequenceChunk,
    TreeMask, WeightLayout,
};
pub use pooling::PoolingTask;
