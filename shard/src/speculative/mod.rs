//! Speculative decoding (Leviathan, Kalman, Matias 2023): a cheap proposer guesses the next
//! tokens, the model scores all of them in one pass, and a rejection rule keeps exactly the
//! tokens the model itself would have produced (greedy) or the model's distribution
//! (sampling). Proposers that offer several candidates per position (draft heads) verify a
//! tree of them in one pass (`tree`).
//!
//! A shard speculates with one [`Speculation`]: a depth and a [`Proposer`], an enum with one
//! variant per proposer holding what it runs (n-gram: nothing; a [`DraftModel`] and its
//! cache; [`MedusaDraft`] heads; an [`EagleDraft`] layer and its cache). An enum rather than
//! a trait: the proposers are few and known, each pass dispatches to one of them once per
//! step (no `dyn` call, no engine generic over its proposer), a sequence's state is the
//! matching variant of one enum (`ProposerState`), and the compiler's exhaustive matches in
//! `speculation.rs` list everything a new proposer must answer. The engine's pass runs:
//!
//! 1. **propose**: each decoding sequence's `Proposal`, a chain (checked by the rejection
//!    rule, `verify`) or a tree (walked with the sampler, `verify_tree`);
//! 2. **forward**: the target's pass, bringing back the hidden states the proposer reads
//!    (`Speculation::hidden_states`);
//! 3. **accept**: the engine verifies; the proposer follows what the pass settled for each
//!    sequence (`Speculation::settle`: a draft's cache length, a head's hidden state);
//! 4. **catch up**: a draft layer runs over the positions the pass computed
//!    (`Speculation::catch_up`).
//!
//! Each proposer's files sit in one place: `ngram.rs`, `draft.rs`, `medusa/`, `eagle/`.

mod draft;
mod eagle;
mod medusa;
mod ngram;
mod proposal;
mod speculation;
pub(crate) mod state;
mod top_tokens;
mod tree;
mod verify;
mod weights_file;

pub use draft::DraftModel;
pub use eagle::{EagleDraft, EagleHead};
pub use medusa::{MedusaDraft, MedusaHeads, likeliest_paths};
pub use ngram::propose_ngram;
pub(crate) use proposal::{CatchUp, Proposal, Settled};
pub use speculation::{Proposer, Speculation, Speculator};
pub use tree::{TokenTree, TreeVerdict, verify_tree};
pub use verify::{Verdict, verify};

/// Candidate paths a draft head's tree holds by default.
pub const DEFAULT_TREE_WIDTH: usize = 4;
