//! What a request asks of generation, as one set of types from the router's validation to the
//! shard's sampler: [`SamplingParams`] (how the next token is chosen), [`OutputConstraint`]
//! (what shape the output must take) and [`StoppingParams`] (when it ends).
//!
//! The router builds and validates them once; the wire carries them; the shard uses them as
//! they are and only checks what it must to stay memory-safe (token ids within its vocabulary).
//! Beside them, [`LengthDependentRope`]: the one fact of the model the router's scheduler
//! needs when it shares cached prompt prefixes between requests.
//!
//! ```
//! use tessera_params::{OutputConstraint, SamplingParams};
//! let params = SamplingParams { temperature: 0.8, seed: Some(7), ..Default::default() };
//! assert!(params.validate().is_ok() && !params.is_greedy());
//! let json = OutputConstraint::JsonObject;
//! assert_ne!(json, OutputConstraint::Pattern("[a-z]+".into()));
//! ```
#![deny(missing_docs)]

mod constraint;
mod rope;
mod sampling;
mod stopping;

pub use constraint::OutputConstraint;
pub use rope::LengthDependentRope;
pub use sampling::{
    MAX_ABS_FREQUENCY_PRESENCE, MAX_ABS_LOGIT_BIAS, MAX_TOP_N_LOGPROBS, SamplingError,
    SamplingParams,
};
pub use stopping::StoppingParams;
