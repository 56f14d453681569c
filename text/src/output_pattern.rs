//! Output patterns (vLLM's `guided_regex`, TGI's regex grammar): a regular expression compiled
//! to a byte-level DFA that the whole output must match. One compiler for the router, which
//! refuses what it cannot honour, and the shard, which walks the DFA.

use regex_automata::MatchKind;
use regex_automata::dfa::{StartKind, dense};

/// Most bytes a pattern's DFA may take (and its construction), so that a hostile pattern
/// (`[a-z]{1000}\w{500}`) is refused instead of exhausting memory.
pub const MAX_PATTERN_DFA_BYTES: usize = 16 << 20;

/// `pattern` as an anchored DFA over UTF-8 bytes that matches every string of the pattern's
/// language (not only leftmost-first matches), or why it cannot be.
pub fn compile_output_pattern(pattern: &str) -> Result<dense::DFA<Vec<u32>>, String> {
    dense::Builder::new()
        .configure(
            dense::Config::new()
                .start_kind(StartKind::Anchored)
                .match_kind(MatchKind::All)
                .dfa_size_limit(Some(MAX_PATTERN_DFA_BYTES))
                .determinize_size_limit(Some(MAX_PATTERN_DFA_BYTES)),
        )
        .build(pattern)
        .map_err(|e| {
            // The top error says only which stage failed; its sources say what to fix.
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                message = format!("{message}: {s}");
                source = s.source();
            }
            message
        })
}

#[cfg(test)]
mod tests {
    use regex_automata::Anchored;
    use regex_automata::dfa::Automaton;
    use regex_automata::util::start;

    use super::*;

    fn full_match(pattern: &str, text: &str) -> bool {
        let dfa = compile_output_pattern(pattern).unwrap();
        let mut s = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .unwrap();
        for &b in text.as_bytes() {
            s = dfa.next_state(s, b);
        }
        dfa.is_match_state(dfa.next_eoi_state(s))
    }

    #[test]
    fn matches_whole_strings_of_the_language() {
        assert!(
            full_match("a|ab", "a") && full_match("a|ab", "ab"),
            "not leftmost-first"
        );
        assert!(full_match(r"\d{3}-\d{4}", "555-1234"));
        assert!(!full_match(r"\d{3}-\d{4}", "555-12345") && !full_match(r"\d{3}", "x555"));
        assert!(full_match("(yes|no)!?", "no!") && full_match("é+", "éé"));
    }

    #[test]
    fn refuses_bad_and_huge_patterns() {
        let unclosed = compile_output_pattern("(").unwrap_err();
        assert!(unclosed.contains("unclosed group"), "{unclosed}");
        assert!(compile_output_pattern(r"\w{200}\w{200}[a-z]{1000}").is_err());
    }
}
