//! Property tests of stop-sequence matching across chunk (token) boundaries.
//!
//! For any text cut into any chunks and any stop sequences, what the matcher releases is
//! exactly the text before the earliest stop sequence in the text seen when the first one
//! completes (all of it when none occurs): a stop sequence split across chunks is found
//! and never shown in part; the sequence reported occurs at that position; and it never
//! holds back a whole stop sequence's worth of text.
//!
//! Which sequence is reported when two match at the same position depends on the
//! chunking when one is a prefix of the other (`"a"` and `"a "`: a chunk `"a"` already
//! matches the first); the released text does not.

use proptest::prelude::*;
use tessera_router::{StopMatch, StopSequenceMatcher};

/// Text over a small alphabet (so stop sequences actually occur), with multi-byte
/// characters so chunk boundaries fall next to them.
fn text_strategy(min: usize, max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec!['a', 'b', ' ', 'é', '€', '😀']),
        min..max,
    )
    .prop_map(|c| c.into_iter().collect())
}

/// Cuts `text` into chunks at the given character positions.
fn chunks(text: &str, cuts: &[usize]) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (chars.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut start = 0;
    for c in cuts.into_iter().chain([chars.len()]) {
        out.push(chars[start..c].iter().collect());
        start = c;
    }
    out
}

/// The expected outcome of streaming `parts`: at the end of the first chunk after which
/// the text so far contains a stop sequence, the text before the earliest occurrence (and
/// which sequence); the whole text when none ever occurs. A longer stop sequence that
/// starts earlier but is not complete yet when a shorter one completes does not count: the
/// matcher cannot wait for text that may never come.
fn expected(parts: &[String], stops: &[String]) -> (String, Option<usize>) {
    let mut so_far = String::new();
    for part in parts {
        so_far.push_str(part);
        let found = stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(i, s)| so_far.find(s.as_str()).map(|pos| (pos, i)))
            .min();
        if let Some((pos, i)) = found {
            return (so_far[..pos].to_owned(), Some(i));
        }
    }
    (so_far, None)
}

/// Whether `stops[index]` occurs in `text` right where the released text ends.
fn occurs_at_end(text: &str, released: &str, stops: &[String], index: Option<usize>) -> bool {
    match index {
        None => true,
        Some(i) => text[released.len()..].starts_with(stops[i].as_str()),
    }
}

/// Feeds `parts` and returns the released text and the index of the stop that matched.
fn run(stops: &[String], parts: &[String]) -> (String, Option<usize>, usize) {
    let mut m = StopSequenceMatcher::new(stops.to_vec());
    let longest = stops.iter().map(String::len).max().unwrap_or(0);
    let mut out = String::new();
    let mut max_held = 0;
    for part in parts {
        match m.push(part) {
            StopMatch::Continue(t) => out.push_str(&t),
            StopMatch::Stopped { text, index } => {
                out.push_str(&text);
                // Later pushes release nothing.
                assert_eq!(m.push("more"), StopMatch::Continue(String::new()));
                return (out, Some(index), max_held);
            }
        }
        max_held = max_held.max(m.held().len());
        assert!(
            m.held().len() < longest.max(1),
            "held {:?} with stops {stops:?}",
            m.held()
        );
    }
    out.push_str(&m.finish());
    (out, None, max_held)
}

/// Regression: `StopMatch::Stopped::index` is the index in the list given to `new`, even
/// when empty sequences (which are ignored) come before the one that matched.
#[test]
fn stop_index_counts_empty_sequences() {
    let mut m = StopSequenceMatcher::new(vec![String::new(), "a".into()]);
    assert_eq!(
        m.push("ba"),
        StopMatch::Stopped {
            text: "b".into(),
            index: 1
        }
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn releases_exactly_the_text_before_the_earliest_stop(
        text in text_strategy(0, 40),
        stops in prop::collection::vec(text_strategy(1, 4), 0..4),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let parts = chunks(&text, &cuts);
        prop_assert_eq!(parts.concat(), text.clone());
        let (out, index, _) = run(&stops, &parts);
        let (want, want_index) = expected(&parts, &stops);
        prop_assert_eq!(&out, &want, "chunks {:?} stops {:?}", parts, stops);
        prop_assert_eq!(index.is_some(), want_index.is_some());
        prop_assert!(occurs_at_end(&text, &out, &stops, index), "index {:?}", index);
    }

    #[test]
    fn one_character_per_chunk_and_one_chunk_agree(
        text in text_strategy(0, 30),
        stops in prop::collection::vec(text_strategy(1, 3), 1..3),
    ) {
        let per_char: Vec<String> = text.chars().map(String::from).collect();
        let whole = vec![text.clone()];
        let (a, ia, _) = run(&stops, &per_char);
        let (b, ib, _) = run(&stops, &whole);
        prop_assert_eq!(&a, &expected(&per_char, &stops).0);
        prop_assert_eq!(&b, &expected(&whole, &stops).0);
        // Whether a stop sequence occurs does not depend on the chunking.
        prop_assert_eq!(ia.is_some(), ib.is_some());
        // Streaming never releases more than the one-shot match.
        prop_assert!(b.starts_with(&a) || a.starts_with(&b));
        prop_assert!(occurs_at_end(&text, &a, &stops, ia));
        prop_assert!(occurs_at_end(&text, &b, &stops, ib));
    }

    /// Arbitrary Unicode (no small alphabet): never panics on char boundaries, and the
    /// released text is always a prefix of the input.
    #[test]
    fn arbitrary_unicode_is_safe(
        text in any::<String>(),
        stops in prop::collection::vec(any::<String>(), 0..3),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let parts = chunks(&text, &cuts);
        let (out, _, _) = run(&stops, &parts);
        prop_assert!(text.starts_with(&out));
        let (want, _) = expected(&parts, &stops);
        prop_assert_eq!(out, want);
    }
}
