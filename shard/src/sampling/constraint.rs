//! Constrained output: which tokens may come next so that the output stays a prefix of a JSON
//! object (JSON mode), of one of a list of strings (`guided_choice`), of a string a regular
//! expression matches (`guided_regex`), or of what a grammar derives (JSON Schemas and Lark,
//! through llguidance).
//!
//! The vocabulary's token bytes live in a trie; the allowed set for a state is one walk of
//! the trie that branches the state at each node and drops a subtree at the first byte the
//! state rejects. JSON sets are cached by state, shared by the sequences of a vocabulary: inside
//! a long string, between array items, and across requests for the same shape, states repeat.
//! A pattern caches its own sets by DFA state; a choice's walk only follows the choices' own
//! bytes, so it is not cached.

use std::sync::{Arc, OnceLock};

use tessera_text::{GrammarCompiler, GrammarError, GrammarMatcher, GrammarSource};

use super::byte_language::ByteLanguage;
use super::choice::{ChoiceState, Choices};
use super::json::JsonState;
use super::pattern::Pattern;
use super::set_cache::SetCache;
use regex_automata::util::primitives::StateID;

/// One JSON object (the recognizer's state carries everything).
struct Json;

impl ByteLanguage for Json {
    type State = JsonState;
    fn start(&self) -> JsonState {
        JsonState::new()
    }
    fn advance(&self, s: JsonState, b: u8) -> Option<JsonState> {
        s.advance(b)
    }
    fn is_complete(&self, s: JsonState) -> bool {
        s.is_complete()
    }
}

/// The vocabulary as the bytes each token adds, and the tokens that end generation.
pub struct TokenVocab {
    size: usize,
    eos: Vec<u32>,
    /// Node `n`'s children are `edges[child_start[n]..child_start[n + 1]]` as (byte, node).
    child_start: Vec<u32>,
    edges: Vec<(u8, u32)>,
    /// Tokens whose bytes end at node `n`: `ends[end_start[n]..end_start[n + 1]]`.
    end_start: Vec<u32>,
    ends: Vec<u32>,
    /// Token `t`'s bytes: `token_bytes[token_start[t]..token_start[t + 1]]`.
    token_start: Vec<u32>,
    token_bytes: Vec<u8>,
    /// Only the end-of-generation tokens.
    ends_only: Arc<Vec<u64>>,
    json_sets: SetCache<JsonState>,
    /// Built on first use: the token trie llguidance needs is its own.
    grammars: OnceLock<Result<GrammarCompiler, GrammarError>>,
}

impl std::fmt::Debug for TokenVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenVocab")
            .field("size", &self.size)
            .field("eos", &self.eos)
            .field("trie_nodes", &(self.child_start.len() - 1))
            .finish()
    }
}

impl TokenVocab {
    /// `bytes[id]`: what token `id` adds to the output (`None`: nothing, never allowed under a
    /// constraint unless it ends generation); `eos`: the ids that end generation.
    pub fn new(bytes: &[Option<Vec<u8>>], eos: &[u32]) -> Self {
        // Build with owned children, then flatten them into ranges of one array.
        let mut children: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut ends: Vec<Vec<u32>> = vec![Vec::new()];
        for (id, b) in bytes.iter().enumerate() {
            let Some(b) = b.as_deref().filter(|b| !b.is_empty()) else {
                continue;
            };
            let mut node = 0usize;
            for &byte in b {
                node = match children[node].iter().find(|(c, _)| *c == byte) {
                    Some(&(_, n)) => n as usize,
                    None => {
                        let n = children.len();
                        children[node].push((byte, n as u32));
                        children.push(Vec::new());
                        ends.push(Vec::new());
                        n
                    }
                };
            }
            ends[node].push(id as u32);
        }
        let eos: Vec<u32> = eos
            .iter()
            .copied()
            .filter(|&e| (e as usize) < bytes.len())
            .collect();
        let mut ends_only = vec![0u64; bytes.len().div_ceil(64)];
        for &e in &eos {
            ends_only[e as usize / 64] |= 1 << (e % 64);
        }
        let mut vocab = Self {
            size: bytes.len(),
            eos,
            child_start: vec![0],
            edges: Vec::new(),
            end_start: vec![0],
            ends: Vec::new(),
            token_start: vec![0],
            token_bytes: Vec::new(),
            ends_only: Arc::new(ends_only),
            json_sets: SetCache::new(CACHED_JSON_STATES),
            grammars: OnceLock::new(),
        };
        for b in bytes {
            vocab
                .token_bytes
                .extend_from_slice(b.as_deref().unwrap_or_default());
            vocab.token_start.push(vocab.token_bytes.len() as u32);
        }
        for (c, e) in children.iter().zip(&ends) {
            vocab.edges.extend_from_slice(c);
            vocab.child_start.push(vocab.edges.len() as u32);
            vocab.ends.extend_from_slice(e);
            vocab.end_start.push(vocab.ends.len() as u32);
        }
        vocab
    }

    /// The tokens that may follow `state` of `language`, as a bit set of `len()` bits: those
    /// whose bytes continue it, plus the end-of-generation ones once it is complete (or when
    /// nothing else is left, so that a stuck sequence ends instead of breaking out).
    fn allowed<L: ByteLanguage>(&self, language: &L, state: L::State) -> Vec<u64> {
        let mut set = vec![0u64; self.size.div_ceil(64)];
        let mut any = false;
        let mut todo = vec![(0usize, state)];
        while let Some((node, s)) = todo.pop() {
            let (lo, hi) = (
                self.end_start[node] as usize,
                self.end_start[node + 1] as usize,
            );
            if node != 0 {
                for &id in &self.ends[lo..hi] {
                    set[id as usize / 64] |= 1 << (id % 64);
                    any = true;
                }
            }
            let (lo, hi) = (
                self.child_start[node] as usize,
                self.child_start[node + 1] as usize,
            );
            for &(byte, child) in &self.edges[lo..hi] {
                if let Some(next) = language.advance(s, byte) {
                    todo.push((child as usize, next));
                }
            }
        }
        if language.is_complete(state) || !any {
            for (w, e) in set.iter_mut().zip(self.ends_only.iter()) {
                *w |= e;
            }
        }
        set
    }

    /// The grammar compiler of this vocabulary, built on the first call.
    pub fn grammars(&self) -> Result<&GrammarCompiler, GrammarError> {
        self.grammars
            .get_or_init(|| {
                let tokens: Vec<Option<Vec<u8>>> = (0..self.size as u32)
                    .map(|id| Some(self.bytes(id).to_vec()).filter(|b| !b.is_empty()))
                    .collect();
                GrammarCompiler::new(&tokens, &self.eos)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// What token `id` adds to the output (empty for tokens that add nothing).
    fn bytes(&self, id: u32) -> &[u8] {
        let id = id as usize;
        match (self.token_start.get(id), self.token_start.get(id + 1)) {
            (Some(&lo), Some(&hi)) => &self.token_bytes[lo as usize..hi as usize],
            _ => &[],
        }
    }
}

/// JSON sets cached per vocabulary (`vocab / 8` bytes each: 6 KiB for 49k tokens, 6 MiB in
/// all).
const CACHED_JSON_STATES: usize = 1024;

/// Where a constrained output is.
#[derive(Clone, Debug)]
enum Position {
    Json(JsonState),
    Choice(Arc<Choices>, ChoiceState),
    Pattern(Arc<Pattern>, StateID),
    Grammar(Box<GrammarMatcher>),
}

impl Position {
    /// The position after token `id`, which adds `bytes`.
    fn feed(self, id: u32, bytes: &[u8]) -> Option<Self> {
        // A token that adds nothing (a special one) continues only a grammar, which names
        // special tokens by id (harmony's channel markers, a call's opening token).
        if bytes.is_empty() && !matches!(self, Position::Grammar(_)) {
            return None;
        }
        Some(match self {
            Position::Json(s) => Position::Json(Json.feed(s, bytes)?),
            Position::Choice(c, s) => {
                let s = c.feed(s, bytes)?;
                Position::Choice(c, s)
            }
            Position::Pattern(p, s) => {
                let s = p.feed(s, bytes)?;
                Position::Pattern(p, s)
            }
            Position::Grammar(mut m) => {
                if !m.consume(id) {
                    return None;
                }
                Position::Grammar(m)
            }
        })
    }

    /// The tokens that may come next from here, over `vocab`; `None` when a grammar cannot
    /// say (its step exceeded the limits), which ends the output.
    fn allowed(&mut self, vocab: &TokenVocab) -> Option<Arc<Vec<u64>>> {
        Some(match self {
            Position::Json(s) => vocab.json_sets.get_or_walk(*s, || vocab.allowed(&Json, *s)),
            Position::Choice(c, s) => Arc::new(vocab.allowed(&**c, *s)),
            Position::Pattern(p, s) => p.sets().get_or_walk(*s, || vocab.allowed(&**p, *s)),
            Position::Grammar(m) => Arc::new(m.allowed().ok()?),
        })
    }
}

/// One sequence's constraint: where its output is, and which tokens may come next.
#[derive(Clone, Debug)]
pub(crate) struct Constraint {
    vocab: Arc<TokenVocab>,
    /// `None` once a recorded token left the language (only possible for tokens the sampler
    /// did not choose): then only end-of-generation tokens are allowed.
    at: Option<Position>,
    allowed: Arc<Vec<u64>>,
}

impl Constraint {
    /// JSON mode, before the first token of the output.
    pub(crate) fn json(vocab: Arc<TokenVocab>) -> Self {
        Self::at(vocab, Position::Json(Json.start()))
    }

    /// One of `choices`, before the first token of the output.
    pub(crate) fn choice(vocab: Arc<TokenVocab>, choices: Arc<Choices>) -> Self {
        let start = choices.start();
        Self::at(vocab, Position::Choice(choices, start))
    }

    /// A string `pattern` matches, before the first token of the output.
    pub(crate) fn pattern(vocab: Arc<TokenVocab>, pattern: Arc<Pattern>) -> Self {
        let start = pattern.start();
        Self::at(vocab, Position::Pattern(pattern, start))
    }

    /// What `source` derives, before the first token of the output; an error if the grammar
    /// cannot be compiled over `vocab`.
    pub(crate) fn grammar(
        vocab: Arc<TokenVocab>,
        source: GrammarSource<'_>,
    ) -> Result<Self, GrammarError> {
        let matcher = vocab.grammars()?.compile(source)?;
        Ok(Self::at(vocab, Position::Grammar(Box::new(matcher))))
    }

    fn at(vocab: Arc<TokenVocab>, mut at: Position) -> Self {
        match at.allowed(&vocab) {
            Some(allowed) => Self {
                allowed,
                at: Some(at),
                vocab,
            },
            None => Self {
                allowed: vocab.ends_only.clone(),
                at: None,
                vocab,
            },
        }
    }

    /// Whether token `id` may come next.
    pub(crate) fn allows(&self, id: usize) -> bool {
        self.allowed
            .get(id / 64)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    /// `logits` with every token that may not come next at `-inf`, into `out`.
    pub(crate) fn mask_into(&self, logits: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend(logits.iter().enumerate().map(|(id, &x)| {
            if self.allows(id) {
                x
            } else {
                f32::NEG_INFINITY
            }
        }));
    }

    /// Moves past token `id`.
    pub(crate) fn advance(&mut self, id: u32) {
        if self.vocab.eos.contains(&id) {
            return;
        }
        let bytes = self.vocab.bytes(id);
        self.at = self.at.take().and_then(|at| at.feed(id, bytes));
        let allowed = self.at.as_mut().and_then(|at| at.allowed(&self.vocab));
        if allowed.is_none() {
            self.at = None;
        }
        self.allowed = allowed.unwrap_or_else(|| self.vocab.ends_only.clone());
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::sampling::{Sampler, SamplingParams};

    const EOS: u32 = 0;

    /// Id 0 ends generation; then every byte on its own, then a few multi-byte tokens.
    fn vocab() -> Vec<Option<Vec<u8>>> {
        let mut v = vec![None];
        v.extend((0..=255u8).map(|b| Some(vec![b])));
        for t in [
            "{\"", "\":", "\"}", "true", "null", ", \"", "\": [", "]}", "12", "é", "\n  ",
        ] {
            v.push(Some(t.as_bytes().to_vec()));
        }
        v
    }

    fn id_of(v: &[Option<Vec<u8>>], text: &str) -> u32 {
        v.iter()
            .position(|b| b.as_deref() == Some(text.as_bytes()))
            .unwrap() as u32
    }

    #[test]
    fn allows_what_continues_the_object_and_ends_only_when_complete() {
        let bytes = vocab();
        let vocab = Arc::new(TokenVocab::new(&bytes, &[EOS]));
        let mut c = Constraint::json(vocab);
        let allowed = |c: &Constraint| -> Vec<String> {
            (0..bytes.len())
                .filter(|&id| c.allows(id))
                .map(|id| match &bytes[id] {
                    Some(b) => String::from_utf8_lossy(b).into_owned(),
                    None => "<eos>".into(),
                })
                .collect()
        };
        assert_eq!(allowed(&c), ["\t", "\n", "\r", " ", "{", "{\"", "\n  "]);
        for t in ["{\"", "a", "\": [", "12", "]}"] {
            c.advance(id_of(&bytes, t));
        }
        assert_eq!(allowed(&c), ["<eos>", "\t", "\n", "\r", " ", "\n  "]);
        // A token the sampler would not have chosen leaves only the end.
        c.advance(id_of(&bytes, "x"));
        assert_eq!(allowed(&c), ["<eos>"]);
    }

    #[test]
    fn special_tokens_are_never_allowed_inside() {
        let mut bytes = vocab();
        bytes.push(None); // e.g. <|im_start|>: adds no bytes, does not end generation
        let special = bytes.len() - 1;
        let vocab = Arc::new(TokenVocab::new(&bytes, &[EOS]));
        let mut c = Constraint::json(vocab);
        assert!(!c.allows(special) && !c.allows(EOS as usize));
        c.advance(id_of(&bytes, "{"));
        c.advance(special as u32);
        assert!(c.allows(EOS as usize) && !c.allows(id_of(&bytes, "}") as usize));
    }

    #[test]
    fn a_grammar_goes_on_past_the_special_tokens_it_names() {
        let mut bytes = vocab();
        bytes.push(None); // e.g. harmony's <|channel|>
        let special = bytes.len() - 1;
        let vocab = Arc::new(TokenVocab::new(&bytes, &[EOS]));
        let grammar = format!("start: <[{special}]> \"final\"");
        let mut c = Constraint::grammar(vocab, GrammarSource::Lark(&grammar)).unwrap();
        assert!(c.allows(special) && !c.allows(EOS as usize));
        c.advance(special as u32);
        assert!(c.allows(id_of(&bytes, "f") as usize) && !c.allows(EOS as usize));
        for b in "final".bytes() {
            c.advance(u32::from(b) + 1);
        }
        assert!(c.allows(EOS as usize));
    }

    #[test]
    fn sampled_choices_are_whole_choices() {
        let bytes = vocab();
        let vocab = Arc::new(TokenVocab::new(&bytes, &[EOS]));
        let labels = ["true", "null", "nullable", "é{"];
        let choices = Arc::new(Choices::new(&labels.map(String::from)).unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        for seed in 0..100 {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..Default::default()
            };
            let mut s = Sampler::new(params, &[]).with_choices(vocab.clone(), choices.clone());
            let mut out = Vec::new();
            loop {
                let logits: Vec<f32> = (0..bytes.len())
                    .map(|_| rng.random_range(-3.0..3.0))
                    .collect();
                let t = s.sample(&logits);
                if t.id == EOS {
                    break;
                }
                out.extend_from_slice(bytes[t.id as usize].as_deref().unwrap());
                assert!(out.len() <= 8, "{out:?}");
            }
            let text = String::from_utf8(out).unwrap();
            assert!(labels.contains(&text.as_str()), "{text:?}");
        }
    }

    #[test]
    fn sampled_patterns_match() {
        let bytes = vocab();
        let vocab = Arc::new(TokenVocab::new(&bytes, &[EOS]));
        let pattern = Arc::new(Pattern::new(r"[0-9]{3}-[a-z]+(é|!)?").unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut ended = 0;
        for seed in 0..100 {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..Default::default()
            };
            let mut s = Sampler::new(params, &[]).with_pattern(vocab.clone(), pattern.clone());
            let mut out = Vec::new();
            for step in 0..64 {
                let logits: Vec<f32> = (0..bytes.len())
                    .map(|id| {
                        let end = if id == 0 { step as f32 / 4.0 } else { 0.0 };
                        rng.random_range(-3.0f32..3.0) + end
                    })
                    .collect();
                let t = s.sample(&logits);
                if t.id == EOS {
                    let text = String::from_utf8(out.clone()).unwrap();
                    let (digits, rest) = text.split_at(3);
                    let letters = rest[1..].trim_end_matches(['é', '!']);
                    assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
                    assert!(rest.starts_with('-'), "{text:?}");
                    assert!(!letters.is_empty(), "{text:?}");
                    assert!(letters.bytes().all(|b| b.is_ascii_lowercase()), "{text:?}");
                    assert!(rest[1..].len() - letters.len() <= "é".len(), "{text:?}");
                    ended += 1;
                    break;
                }
                out.extend_from_slice(bytes[t.id as usize].as_deref().unwrap());
            }
        }
        assert!(ended > 80, "only {ended} of 100 ended");
    }

    /// Sampling over random logits under a JSON Schema: every output that ends validates
    /// (bounds, enums, required keys, array lengths), and masked logits stay masked.
    #[test]
    fn sampled_outputs_validate_against_their_schema() {
        let bytes = vocab();
        let vocab = Arc::new(TokenVocab::new(&bytes, &[EOS]));
        let schema = r#"{"type": "object", "additionalProperties": false,
            "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 7},
                           "tag": {"enum": ["red", "blue"]},
                           "xs": {"type": "array", "items": {"type": "boolean"},
                                  "minItems": 1, "maxItems": 2}},
            "required": ["n", "tag", "xs"]}"#;
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let mut ended = 0;
        for seed in 0..60 {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..Default::default()
            };
            let source = tessera_text::GrammarSource::JsonSchema(schema);
            let mut s = Sampler::new(params, &[])
                .with_grammar(vocab.clone(), source)
                .unwrap();
            let mut out = Vec::new();
            for _ in 0..200 {
                let logits: Vec<f32> = (0..bytes.len())
                    .map(|_| rng.random_range(-3.0f32..3.0))
                    .collect();
                let probs = s.processed_probs(&logits);
                let t = s.sample(&logits);
                assert!(probs[t.id as usize] > 0.0, "drew a masked token");
                if t.id == EOS {
                    let v: serde_json::Value = serde_json::from_slice(&out)
                        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)));
                    let n = v["n"].as_i64().unwrap();
                    assert!((3..=7).contains(&n), "{v}");
                    assert!(["red", "blue"].contains(&v["tag"].as_str().unwrap()), "{v}");
                    let xs = v["xs"].as_array().unwrap();
                    assert!((1..=2).contains(&xs.len()) && xs.iter().all(|x| x.is_boolean()));
                    assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
                    ended += 1;
                    break;
                }
                out.extend_from_slice(bytes[t.id as usize].as_deref().unwrap());
            }
        }
        assert!(ended > 50, "only {ended} of 60 ended");
    }

    /// Sampling over random logits under the constraint: whatever the model "wants", every
    /// output that ends is a JSON object serde_json accepts, and masked logits stay masked.
    #[test]
    fn sampled_outputs_are_json_objects() {
        let bytes = vocab();
        let vocab = Arc::new(TokenVocab::new(&bytes, &[EOS]));
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut ended = 0;
        for seed in 0..200 {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..Default::default()
            };
            let mut s = Sampler::new(params, &[]).with_json(vocab.clone());
            assert!(s.is_constrained());
            let mut out = Vec::new();
            for step in 0..400 {
                // Favour the end late, so that most runs finish.
                let logits: Vec<f32> = (0..bytes.len())
                    .map(|id| {
                        let end = if id == 0 { step as f32 / 40.0 } else { 0.0 };
                        rng.random_range(-3.0f32..3.0) + end
                    })
                    .collect();
                let probs = s.processed_probs(&logits);
                let t = s.sample(&logits);
                assert!(probs[t.id as usize] > 0.0, "drew a masked token");
                if t.id == EOS {
                    let v: serde_json::Value = serde_json::from_slice(&out)
                        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)));
                    assert!(v.is_object());
                    ended += 1;
                    break;
                }
                out.extend_from_slice(bytes[t.id as usize].as_deref().unwrap());
            }
        }
        assert!(ended > 150, "only {ended} of 200 runs ended");
    }
}
