//! A shard's speculation: how deep, and which proposer, with each step of the pass dispatched to
//! it by one `match`.

use std::collections::HashMap;

use crate::EngineError;
use crate::model::{ForwardOutput, HiddenStates, Model};
use crate::sequence::Sequence;
use crate::speculative::draft::DraftModel;
use crate::speculative::eagle::EagleDraft;
use crate::speculative::medusa::MedusaDraft;
use crate::speculative::ngram;
use crate::speculative::proposal::{CatchUp, Proposal, Settled};
use crate::speculative::state::ProposerState;

/// Speculative decoding as a shard runs it: `depth` proposals a step, made by `proposer`.
pub struct Speculation {
    depth: usize,
    proposer: Proposer,
}

/// What proposes tokens, with what it runs.
#[allow(clippy::large_enum_variant)] // one per engine, never moved on a hot path
pub enum Proposer {
    /// Prompt lookup: continue the latest earlier occurrence of the last few tokens.
    Ngram,
    /// A smaller model sharing the tokenizer runs ahead on its own paged KV cache.
    Draft(DraftModel),
    /// Medusa heads over the model's final hidden state propose a tree of candidates.
    Medusa(MedusaDraft),
    /// An EAGLE-style draft layer over the model's hidden states, run a few times on its own
    /// guesses, proposes a tree of candidates.
    Eagle(EagleDraft),
}

/// A proposer's kind, by its `--speculator` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculator {
    /// [`Proposer::Ngram`].
    Ngram,
    /// [`Proposer::Draft`].
    Draft,
    /// [`Proposer::Medusa`].
    Medusa,
    /// [`Proposer::Eagle`].
    Eagle,
}

impl Speculator {
    /// Its `--speculator` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ngram => "ngram",
            Self::Draft => "draft",
            Self::Medusa => "medusa",
            Self::Eagle => "eagle",
        }
    }

    /// Parses a `--speculator` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "ngram" => Some(Self::Ngram),
            "draft" => Some(Self::Draft),
            "medusa" => Some(Self::Medusa),
            "eagle" => Some(Self::Eagle),
            _ => None,
        }
    }
}

impl Speculation {
    /// `depth` proposals a step from `proposer` (for trees: levels below the pending token).
    pub fn new(depth: usize, proposer: Proposer) -> Self {
        Self { depth, proposer }
    }

    /// Proposals a step.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The proposer's kind.
    pub fn speculator(&self) -> Speculator {
        match self.proposer {
            Proposer::Ngram => Speculator::Ngram,
            Proposer::Draft(_) => Speculator::Draft,
            Proposer::Medusa(_) => Speculator::Medusa,
            Proposer::Eagle(_) => Speculator::Eagle,
        }
    }

    /// Slots past its tokens a decoding sequence's blocks should have for the proposals of
    /// one step: the depth of a chain, the nodes of a tree.
    pub fn lookahead(&self) -> usize {
        match &self.proposer {
            Proposer::Ngram | Proposer::Draft(_) => self.depth,
            Proposer::Medusa(m) => m.lookahead(self.depth),
            Proposer::Eagle(e) => e.lookahead(self.depth),
        }
    }

    /// The final hidden states the target's pass must bring back for the proposer.
    pub(crate) fn hidden_states(&self) -> HiddenStates {
        match self.proposer {
            Proposer::Ngram | Proposer::Draft(_) => HiddenStates::None,
            Proposer::Medusa(_) => HiddenStates::LogitRows,
            Proposer::Eagle(_) => HiddenStates::All,
        }
    }

    /// What the proposer keeps for a sequence that joins with `cache_len` tokens cached.
    pub(crate) fn new_state(&self, cache_len: usize) -> ProposerState {
        match self.proposer {
            Proposer::Ngram => ProposerState::Stateless,
            Proposer::Draft(_) => ProposerState::Draft { computed: 0 },
            Proposer::Medusa(_) => ProposerState::Medusa { hidden: Vec::new() },
            Proposer::Eagle(_) => ProposerState::Eagle {
                computed: cache_len,
                hidden: Vec::new(),
            },
        }
    }

    /// Replaces the proposer's cache, if it has one, with one of `num_blocks` blocks of
    /// `block_size` tokens (the target's block ids).
    pub(crate) fn resize_cache(
        &mut self,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<(), EngineError> {
        match &mut self.proposer {
            Proposer::Ngram | Proposer::Medusa(_) => Ok(()),
            Proposer::Draft(d) => d.resize_cache(num_blocks, block_size),
            Proposer::Eagle(e) => {
                e.resize_cache(num_blocks, block_size);
                Ok(())
            }
        }
    }

    /// Bytes one block of the proposer's cache takes.
    pub(crate) fn block_bytes(&self, block_size: usize) -> usize {
        match &self.proposer {
            Proposer::Ngram | Proposer::Medusa(_) => 0,
            Proposer::Draft(d) => d.block_bytes(block_size),
            Proposer::Eagle(e) => e.block_bytes(block_size),
        }
    }

    /// Proposals for the decoding sequences of `work` (`(id, tokens)` the pass computes), where
    /// their blocks (of `block_size` tokens) leave room for them.
    pub(crate) fn propose(
        &mut self,
        target: &Model,
        sequences: &mut HashMap<u64, Sequence>,
        work: &[(u64, usize)],
        block_size: usize,
    ) -> Result<HashMap<u64, Proposal>, EngineError> {
        let depth = self.depth;
        match &mut self.proposer {
            Proposer::Ngram => Ok(ngram::propose(sequences, work, depth, block_size)),
            Proposer::Draft(d) => d.propose(sequences, work, depth, block_size),
            Proposer::Medusa(m) => m.propose(target, sequences, work, depth, block_size),
            Proposer::Eagle(e) => e.propose(target, sequences, work, depth, block_size),
        }
    }

    /// Follows what the pass (`out`) settled for `seq`; returns the positions a draft layer has
    /// to catch up on.
    pub(crate) fn settle(
        &self,
        seq: &mut Sequence,
        settled: &Settled<'_>,
        out: &ForwardOutput,
    ) -> Option<CatchUp> {
        match &self.proposer {
            Proposer::Ngram => None,
            Proposer::Draft(_) => {
                DraftModel::settle(seq, settled);
                None
            }
            Proposer::Medusa(_) => {
                MedusaDraft::settle(seq, settled, out);
                None
            }
            Proposer::Eagle(e) => e.settle(seq, settled, out),
        }
    }

    /// Runs the proposer over the positions the pass computed that it has yet to see.
    pub(crate) fn catch_up(
        &mut self,
        target: &Model,
        sequences: &mut HashMap<u64, Sequence>,
        work: Vec<CatchUp>,
    ) -> Result<(), EngineError> {
        match &mut self.proposer {
            Proposer::Eagle(e) => e.catch_up(target, sequences, work),
            Proposer::Ngram | Proposer::Draft(_) | Proposer::Medusa(_) => Ok(()),
        }
    }
}
