//! What a proposer and the engine's pass hand each other: a sequence's proposals before the
//! pass, what the pass settled for it after, and the positions a draft layer has to catch up
//! on.

use crate::speculative::tree::TokenTree;

/// Proposals for one decoding sequence, below its pending token.
pub(crate) enum Proposal {
    /// One line of tokens, checked by the rejection rule (`verify`) against the distributions
    /// they were drawn from (`None`: point masses).
    Chain {
        tokens: Vec<u32>,
        draft_probs: Option<Vec<Vec<f32>>>,
    },
    /// Candidates laid out as a tree (the pending token its root), walked with the sequence's
    /// sampler (`verify_tree`).
    Tree(TokenTree),
}

/// What a pass settled for one sequence: what its proposer follows.
pub(crate) struct Settled<'a> {
    /// The sequence's id.
    pub(crate) id: u64,
    /// The sequence's chunk in the pass (its rows of the pass's output).
    pub(crate) chunk: usize,
    /// Position of the chunk's first token.
    pub(crate) start: usize,
    /// Proposals the chunk carried.
    pub(crate) proposed: usize,
    /// Proposals the pass accepted.
    pub(crate) accepted: usize,
    /// The chunk's rows of the positions the pass computed, in order (for a tree: the root's,
    /// then the accepted path's).
    pub(crate) computed_rows: &'a [usize],
    /// The logits row that gave the sequence its new pending token (`None`: no new token).
    pub(crate) pending_row: Option<usize>,
}

/// Positions a sequence's draft layer has yet to see, and the target's states before them.
pub(crate) struct CatchUp {
    pub(crate) id: u64,
    /// The first position.
    pub(crate) start: usize,
    /// Per position `j`, the target's final hidden state at `j - 1` (zeros where there is none).
    pub(crate) features: Vec<f32>,
}
