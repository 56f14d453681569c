//! What a proposer keeps for each sequence between passes.

/// One sequence's proposer state: the variant of the engine's proposer
/// (`Speculation::new_state`).
pub(crate) enum ProposerState {
    /// The proposer keeps nothing per sequence (n-gram, or no speculation).
    Stateless,
    /// A draft model: the tokens whose K/V are in its cache.
    Draft { computed: usize },
    /// Medusa heads: the target's final hidden state behind the pending token's logits, which
    /// the heads read (empty until a pass has produced one).
    Medusa { hidden: Vec<f32> },
    /// An EAGLE layer: the positions whose K/V are in its cache, and the target's final hidden
    /// state at the last position the target computed (empty until a pass has produced one).
    Eagle { computed: usize, hidden: Vec<f32> },
}
