//! [`ByteLanguage`]: what a constraint's recognizer (JSON, a choice, a pattern) tells the
//! vocabulary walk, one byte at a time.

/// A language over bytes: where the output is, and whether it may end there.
pub(crate) trait ByteLanguage {
    type State: Copy;

    /// Before the first byte.
    fn start(&self) -> Self::State;

    /// The state after byte `b`, or `None` if no string of the language continues with it.
    fn advance(&self, s: Self::State, b: u8) -> Option<Self::State>;

    /// Whether the bytes so far are a whole string of the language.
    fn is_complete(&self, s: Self::State) -> bool;

    /// The state after `bytes`, or `None` if they leave the language.
    fn feed(&self, s: Self::State, bytes: &[u8]) -> Option<Self::State> {
        bytes.iter().try_fold(s, |s, &b| self.advance(s, b))
    }
}
