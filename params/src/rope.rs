//! How a model's rotary frequencies depend on a sequence's length: a fact of the model that
//! the shard reads from its files and the router's prefix cache must respect, since keys
//! computed under one set of frequencies cannot be reused under another.

/// How a sequence's length chooses its rotary frequencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthDependentRope {
    /// One set of frequencies up to `threshold` tokens, another past it (LongRoPE).
    Switches {
        /// The longest sequence that takes the first set.
        threshold: usize,
    },
    /// Past `threshold` tokens, other frequencies for every length (dynamic NTK).
    Grows {
        /// The longest sequence that takes the base frequencies.
        threshold: usize,
    },
}
