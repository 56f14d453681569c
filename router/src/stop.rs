//! Stop sequences over streamed text.
//!
//! The matcher sees the detokenized text chunk by chunk. A stop sequence may span chunks,
//! so text that could be the start of a stop sequence is held back until the next chunk
//! tells whether it is; the client never sees any part of a stop sequence. When one
//! matches, the text before it is released and the rest is dropped.
//!
//! Why holding back the longest suffix that is a prefix of some stop sequence is enough:
//! a match that started in already released text would make a longer such suffix.

/// What [`StopSequenceMatcher::push`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopMatch {
    /// No stop sequence yet; this text may be shown (possibly empty: held back).
    Continue(String),
    /// A stop sequence matched: show `text` (what preceded it), then stop.
    Stopped {
        /// The text before the stop sequence that had not been released yet.
        text: String,
        /// Index of the sequence that matched, in the order given to `new`.
        index: usize,
    },
}

/// Finds stop sequences in a stream of text chunks. One per request.
#[derive(Debug, Clone, Default)]
pub struct StopSequenceMatcher {
    /// Non-empty sequences with their index in the list given to `new`.
    stop_sequences: Vec<(usize, String)>,
    held: String,
    stopped: bool,
}

impl StopSequenceMatcher {
    /// A matcher for these sequences. Empty sequences are ignored.
    pub fn new(stop_sequences: Vec<String>) -> Self {
        Self {
            stop_sequences: stop_sequences
                .into_iter()
                .enumerate()
                .filter(|(_, s)| !s.is_empty())
                .collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether there is anything to match.
    pub fn is_empty(&self) -> bool {
        self.stop_sequences.is_empty()
    }

    /// The sequence given at `index` to `new` (as [`StopMatch::Stopped`] names it).
    pub fn sequence(&self, index: usize) -> Option<&str> {
        self.stop_sequences
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, s)| s.as_str())
    }

    /// Text currently held back.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Feeds the next chunk of generated text. After a [`StopMatch::Stopped`], further
    /// pushes return empty `Continue`s.
    pub fn push(&mut self, chunk: &str) -> StopMatch {
        if self.stopped {
            return StopMatch::Continue(String::new());
        }
        if self.stop_sequences.is_empty() {
            return StopMatch::Continue(chunk.to_owned());
        }
        self.held.push_str(chunk);
        // The earliest match wins; at equal positions, the first given.
        let found = self
            .stop_sequences
            .iter()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|pos| (pos, *i)))
            .min();
        if let Some((pos, index)) = found {
            self.stopped = true;
            self.held.truncate(pos);
            return StopMatch::Stopped {
                text: std::mem::take(&mut self.held),
                index,
            };
        }
        let keep = self.partial_match_len();
        let release = self.held.len() - keep;
        let rest = self.held.split_off(release);
        StopMatch::Continue(std::mem::replace(&mut self.held, rest))
    }

    /// Releases the held-back text (generation ended for another reason).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop sequence.
    fn partial_match_len(&self) -> usize {
        let held = self.held.as_str();
        self.stop_sequences
            .iter()
            .filter_map(|(_, s)| {
                let longest = (s.len() - 1).min(held.len());
                (1..=longest)
                    .rev()
                    .find(|&k| s.is_char_boundary(k) && held.ends_with(&s[..k]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopSequenceMatcher {
        StopSequenceMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    fn cont(s: &str) -> StopMatch {
        StopMatch::Continue(s.into())
    }

    fn stopped(s: &str, index: usize) -> StopMatch {
        StopMatch::Stopped {
            text: s.into(),
            index,
        }
    }

    #[test]
    fn no_stop_sequences_passes_through() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("abc"), cont("abc"));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_within_one_chunk_trims_it_and_what_follows() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("hello END there"), stopped("hello ", 0));
        assert_eq!(m.push("more"), cont(""));
    }

    #[test]
    fn stop_split_across_three_tokens() {
        let mut m = matcher(&["###"]);
        assert_eq!(m.push("a#"), cont("a"));
        assert_eq!(m.push("#"), cont(""));
        assert_eq!(m.held(), "##");
        assert_eq!(m.push("#b"), stopped("", 0));
    }

    #[test]
    fn false_start_is_released() {
        let mut m = matcher(&["stop"]);
        assert_eq!(m.push("st"), cont(""));
        assert_eq!(m.push("o"), cont(""));
        assert_eq!(m.push("ry"), cont("story"));
        assert_eq!(m.push(" s"), cont(" "));
        assert_eq!(m.finish(), "s");
    }

    #[test]
    fn overlapping_prefixes() {
        // "aaa" is a false start for its first 'a' only; "aab" then matches.
        let mut m = matcher(&["aab"]);
        assert_eq!(m.push("a"), cont(""));
        assert_eq!(m.push("a"), cont(""));
        assert_eq!(m.push("a"), cont("a"));
        assert_eq!(m.push("b"), stopped("", 0));
        let mut m = matcher(&["abab"]);
        assert_eq!(m.push("aba"), cont(""));
        assert_eq!(m.push("aba"), cont("aba"));
        assert_eq!(m.push("b"), stopped("", 0));
    }

    #[test]
    fn earliest_match_wins_across_sequences() {
        let mut m = matcher(&["world", "lo"]);
        assert_eq!(m.push("hel"), cont("he"));
        assert_eq!(m.push("lo world"), stopped("l", 1));
        let mut m = matcher(&["abc", "b"]);
        assert_eq!(m.push("ab"), stopped("a", 1));
    }

    #[test]
    fn multibyte_characters() {
        let mut m = matcher(&["🛑停"]);
        assert_eq!(m.push("né🛑"), cont("né"));
        assert_eq!(m.push("x"), cont("🛑x"));
        assert_eq!(m.push("🛑"), cont(""));
        assert_eq!(m.push("停止"), stopped("", 0));
        let mut m = matcher(&["é"]);
        assert_eq!(m.push("caf"), cont("caf"));
        assert_eq!(m.push("é!"), stopped("", 0));
    }

    #[test]
    fn a_match_names_its_sequence() {
        let mut m = matcher(&["", "b", "cd"]);
        let StopMatch::Stopped { index, .. } = m.push("acd") else {
            panic!("no match");
        };
        assert_eq!(m.sequence(index), Some("cd"));
        assert_eq!(m.sequence(0), None);
    }

    #[test]
    fn empty_sequences_are_ignored() {
        let mut m = matcher(&[""]);
        assert!(m.is_empty());
        assert_eq!(m.push("x"), cont("x"));
    }
}
