//! A live sequence as the shard holds it: its tokens, how many are in the cache, its blocks,
//! its sampler, and what its proposer keeps for it.

use crate::pooling::PoolState;
use crate::sampling::Sampler;
use crate::speculative::state::ProposerState;

pub(crate) struct Sequence {
    pub(crate) tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache.
    pub(crate) computed: usize,
    pub(crate) blocks: Vec<u32>,
    pub(crate) sampler: Sampler,
    /// Prompt logprobs gathered so far, while the client wants them and the prompt is not
    /// fully computed.
    pub(crate) prefill: Option<Vec<(u32, f32)>>,
    /// Tokens of `tokens` that belong to the prompt (prompt logprobs stop there).
    pub(crate) prompt_len: usize,
    /// What the engine's proposer keeps for this sequence.
    pub(crate) proposer: ProposerState,
    /// A sequence that pools its prompt instead of generating: what it gathers.
    pub(crate) pool: Option<PoolState>,
}

impl Sequence {
    /// Whether it decodes in this step (one pending token after its prompt).
    pub(crate) fn is_decoding(&self) -> bool {
        self.tokens.len() - self.computed == 1 && self.computed >= self.prompt_len
    }

    /// Slots its blocks (of `block_size` tokens) hold past its tokens: room for proposals.
    pub(crate) fn room(&self, block_size: usize) -> usize {
        (self.blocks.len() * block_size).saturating_sub(self.tokens.len())
    }
}
