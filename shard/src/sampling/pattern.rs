//! A byte-level recognizer of a regular expression's language (vLLM's `guided_regex`, TGI's
//! regex grammar), over the DFA `tessera_text::compile_output_pattern` builds.

use std::collections::{HashMap, HashSet};

use super::byte_language::ByteLanguage;
use super::set_cache::SetCache;

use regex_automata::Anchored;
use regex_automata::dfa::{Automaton, dense};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;

/// Allowed sets a pattern keeps, by DFA state (`vocab / 8` bytes each).
const CACHED_STATES: usize = 256;

/// A compiled pattern the whole output must match.
pub struct Pattern {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
    /// States from which some continuation ends in a whole match. A DFA reports matches one
    /// byte late, so a state past a match can be neither dead nor live: this set tells.
    live: HashSet<StateID>,
    sets: SetCache<StateID>,
}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pattern")
            .field("dfa_bytes", &self.dfa.memory_usage())
            .finish()
    }
}

impl Pattern {
    /// `pattern` compiled, or why it cannot be.
    pub fn new(pattern: &str) -> Result<Self, String> {
        let dfa = tessera_text::compile_output_pattern(pattern)?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| e.to_string())?;
        let live = live_states(&dfa, start);
        Ok(Self {
            dfa,
            start,
            live,
            sets: SetCache::new(CACHED_STATES),
        })
    }

    /// Allowed sets by state, for the one vocabulary of the engine that uses this pattern.
    pub(crate) fn sets(&self) -> &SetCache<StateID> {
        &self.sets
    }
}

impl ByteLanguage for Pattern {
    type State = StateID;

    /// Before the first byte: the anchored start.
    fn start(&self) -> StateID {
        self.start
    }

    /// The state after byte `b`, or `None` once no string of the language starts so.
    fn advance(&self, s: StateID, b: u8) -> Option<StateID> {
        let next = self.dfa.next_state(s, b);
        self.live.contains(&next).then_some(next)
    }

    /// Whether the bytes so far are a whole string of the language.
    fn is_complete(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
}

/// The states reachable from `start` from which a whole match can still be reached.
fn live_states(dfa: &dense::DFA<Vec<u32>>, start: StateID) -> HashSet<StateID> {
    let mut into: HashMap<StateID, Vec<StateID>> = HashMap::from([(start, Vec::new())]);
    let mut todo = vec![start];
    while let Some(s) = todo.pop() {
        let mut last = None;
        for b in 0..=255u8 {
            let t = dfa.next_state(s, b);
            if Some(t) == last || dfa.is_dead_state(t) || dfa.is_quit_state(t) {
                continue;
            }
            last = Some(t);
            let seen = into.contains_key(&t);
            into.entry(t).or_default().push(s);
            if !seen {
                todo.push(t);
            }
        }
    }
    let mut live: HashSet<StateID> = into
        .keys()
        .copied()
        .filter(|&s| dfa.is_match_state(dfa.next_eoi_state(s)))
        .collect();
    let mut todo: Vec<StateID> = live.iter().copied().collect();
    while let Some(t) = todo.pop() {
        for &s in &into[&t] {
            if live.insert(s) {
                todo.push(s);
            }
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(p: &Pattern, text: &[u8]) -> Option<StateID> {
        text.iter().try_fold(p.start(), |s, &b| p.advance(s, b))
    }

    #[test]
    fn nothing_continues_past_a_whole_match_of_a_closed_pattern() {
        let p = Pattern::new(r"\d{3}-[a-z]+(é|!)?").unwrap();
        assert!(feed(&p, b"123-ab!").is_some_and(|s| p.is_complete(s)));
        assert!(feed(&p, b"123-ab!\x85").is_none(), "a byte after the match");
        assert!(feed(&p, b"123-ab!x").is_none());
        assert!(feed(&p, "123-abé".as_bytes()).is_some_and(|s| p.is_complete(s)));
        assert!(
            feed(&p, b"123-a\xC3").is_some_and(|s| !p.is_complete(s)),
            "half of é"
        );
        assert!(feed(&p, b"12a").is_none());
        let open = Pattern::new("a+").unwrap();
        assert!(feed(&open, b"aaaa").is_some_and(|s| open.is_complete(s)));
        assert!(feed(&open, b"").is_some_and(|s| !open.is_complete(s)));
    }
}
