//! One sequence's input to the pass: its pending tokens up to the chunk's length, followed for
//! a decoding sequence by the proposer's proposals, laid out as the pass verifies them.

use std::collections::HashMap;

use super::Engine;
use crate::EngineError;
use crate::model::{LogitsWanted, TreeMask};
use crate::speculative::{Proposal, TokenTree};

/// One sequence's input to the pass.
pub(super) struct Chunk {
    pub(super) id: u64,
    /// Position of the first input token.
    pub(super) start: usize,
    /// Pending tokens of the chunk, followed by the proposer's proposals.
    pub(super) input: Vec<u32>,
    /// How many of `input` are proposals.
    pub(super) proposed: usize,
    /// Which positions need logits.
    pub(super) logits: LogitsWanted,
    /// The proposals below the pending token and how they are verified (`None`: none).
    pub(super) check: Option<Check>,
}

/// A chunk's proposals, laid out as a tree below its pending token, and the rule that checks
/// them.
pub(super) enum Check {
    /// One line (`tree` is a chain), by the rejection rule against the distributions it was
    /// drawn from (`None`: point masses).
    Chain {
        tree: TokenTree,
        draft_probs: Option<Vec<Vec<f32>>>,
    },
    /// A tree, walked with the sequence's sampler.
    Tree(TokenTree),
}

impl Check {
    /// The attention mask of the proposals' rows.
    pub(super) fn mask(&self) -> TreeMask<'_> {
        match self {
            Check::Chain { tree, .. } | Check::Tree(tree) => tree.mask(),
        }
    }
}

impl Chunk {
    /// Tokens of the sequence itself (without proposals).
    pub(super) fn len(&self) -> usize {
        self.input.len() - self.proposed
    }
}

impl Engine {
    /// Each scheduled sequence's input: its pending tokens up to the chunk's length, and its
    /// proposals (taken from `proposals`), where the proposer made any.
    pub(super) fn chunks(
        &self,
        work: &[(u64, usize)],
        proposals: &mut HashMap<u64, Proposal>,
    ) -> Result<Vec<Chunk>, EngineError> {
        let mut chunks = Vec::with_capacity(work.len());
        for &(id, n) in work {
            let seq = self
                .sequences
                .get(&id)
                .ok_or_else(|| EngineError::InvalidBatch(format!("request {id} is not running")))?;
            let pending = seq.tokens.len() - seq.computed;
            let len = n.min(pending);
            if len == 0 {
                continue;
            }
            let mut input = seq.tokens[seq.computed..seq.computed + len].to_vec();
            let check = match proposals.remove(&id) {
                Some(Proposal::Chain {
                    tokens,
                    draft_probs,
                }) if !tokens.is_empty() => {
                    let tree = TokenTree::from_paths(
                        input[0],
                        std::slice::from_ref(&tokens),
                        tokens.len() + 1,
                    );
                    input.extend(tokens);
                    Some(Check::Chain { tree, draft_probs })
                }
                Some(Proposal::Tree(tree)) if !tree.is_empty() => {
                    input.extend_from_slice(&tree.tokens()[1..]);
                    Some(Check::Tree(tree))
                }
                _ => None,
            };
            let proposed = input.len() - len;
            let completes = seq.computed + len == seq.tokens.len();
            let logits = match (&seq.pool, completes, seq.prefill.is_some() || proposed > 0) {
                (Some(pool), _, _) => pool.logits(completes),
                (None, _, true) => LogitsWanted::All,
                (None, true, false) => LogitsWanted::Last,
                (None, false, false) => LogitsWanted::None,
            };
            chunks.push(Chunk {
                id,
                start: seq.computed,
                input,
                proposed,
                logits,
                check,
            });
        }
        Ok(chunks)
    }
}
