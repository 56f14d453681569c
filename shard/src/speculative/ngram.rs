//! Prompt-lookup proposals: no model, just the sequence's own history.

use std::collections::HashMap;

use crate::sequence::Sequence;
use crate::speculative::proposal::Proposal;

/// Longest n-gram (of at most this many tokens) matched against the history.
const MAX_NGRAM: usize = 3;

/// Up to `k` tokens that followed the latest earlier occurrence of the longest suffix of
/// `tokens` (of 3, 2 or 1 tokens) that occurs earlier; empty when nothing matches.
pub fn propose_ngram(tokens: &[u32], k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (1..=MAX_NGRAM.min(len.saturating_sub(1))).rev() {
        let pattern = &tokens[len - n..];
        // Latest start j < len - n with tokens[j..j + n] == pattern.
        if let Some(j) = (0..len - n).rev().find(|&j| &tokens[j..j + n] == pattern) {
            let from = j + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// Up to `depth` tokens for every decoding sequence of `work`, as many as its blocks (of
/// `block_size` tokens) leave room for.
pub(crate) fn propose(
    sequences: &HashMap<u64, Sequence>,
    work: &[(u64, usize)],
    depth: usize,
    block_size: usize,
) -> HashMap<u64, Proposal> {
    work.iter()
        .filter_map(|&(id, _)| {
            let seq = sequences.get(&id).filter(|s| s.is_decoding())?;
            let tokens = propose_ngram(&seq.tokens, depth.min(seq.room(block_size)));
            (!tokens.is_empty()).then_some((
                id,
                Proposal::Chain {
                    tokens,
                    draft_probs: None,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_the_latest_match_of_the_longest_suffix() {
        // "a b c d a b" → suffix "a b" seen at 0 → propose "c d a".
        assert_eq!(propose_ngram(&[1, 2, 3, 4, 1, 2], 3), vec![3, 4, 1]);
        // Proposals stop at the end of the history.
        assert_eq!(propose_ngram(&[1, 2, 3, 4, 1, 2], 10), vec![3, 4, 1, 2]);
        // The latest occurrence wins.
        assert_eq!(propose_ngram(&[7, 1, 8, 7, 1, 9, 7, 1], 1), vec![9]);
        // Falls back to shorter n-grams.
        assert_eq!(propose_ngram(&[5, 6, 9, 6], 2), vec![9, 6]);
        assert!(propose_ngram(&[1, 2, 3], 4).is_empty());
        assert!(propose_ngram(&[1], 4).is_empty());
        assert!(propose_ngram(&[1, 1], 0).is_empty());
    }
}
