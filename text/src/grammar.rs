//! Grammar-constrained output on llguidance: JSON Schemas (OpenAI's `json_schema` response
//! format, vLLM's `guided_json`, TGI's `json` grammar) and Lark grammars (vLLM's
//! `guided_grammar`, the tool-call grammars). One compiler for the router, which refuses what
//! cannot be compiled within the limits, and the shard, which masks with the matchers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory, TokenParser};

/// What a grammar constraint is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GrammarSource<'a> {
    /// A JSON Schema's text: the output is one JSON value it accepts.
    JsonSchema(&'a str),
    /// A Lark grammar (llguidance's dialect, which may embed `%json` schemas).
    Lark(&'a str),
}

/// Why a grammar cannot constrain an output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The JSON Schema is not JSON.
    #[error("the JSON schema is not valid JSON: {0}")]
    SchemaJson(String),
    /// llguidance refused the grammar (a syntax error, an unsupported keyword, a schema no
    /// value satisfies, or a limit exceeded).
    #[error("{0}")]
    Compile(String),
    /// The tokenizer's vocabulary could not be turned into a token trie.
    #[error("the vocabulary cannot back grammar constraints: {0}")]
    Vocabulary(String),
}

/// JSON layout of schema-constrained outputs unless the schema's `x-guidance` says otherwise:
/// separators as Python's `json.dumps` writes them and no other whitespace, so that a model
/// cannot spend its tokens on blank space (small models otherwise loop on newlines).
const JSON_LAYOUT: &str =
    r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;

/// Compiled grammars kept for reuse: agents send the same schemas and tools again and again.
const CACHED_GRAMMARS: usize = 64;

/// Limits a grammar's compilation and each step's mask stay within, so that a grammar built
/// to explode is refused instead of stalling a step.
fn limits() -> ParserLimits {
    ParserLimits {
        max_grammar_size: 200_000,
        max_lexer_states: 100_000,
        initial_lexer_fuel: 1_000_000,
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        ..ParserLimits::default()
    }
}

/// Grammar compilation over one vocabulary.
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab_size: usize,
    eos: Vec<u32>,
    compiled: Mutex<HashMap<(bool, String), TokenParser>>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab_size", &self.vocab_size)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// A compiler for the vocabulary whose token `id` adds `tokens[id]` to the output (`None`
    /// for special tokens, which a grammar reaches only as `<[id]>`), ending generation with
    /// any of `eos`.
    pub fn new(tokens: &[Option<Vec<u8>>], eos: &[u32]) -> Result<Self, GrammarError> {
        let first_eos = *eos
            .first()
            .ok_or_else(|| GrammarError::Vocabulary("no end-of-generation token".into()))?;
        let words: Vec<Vec<u8>> = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| match t {
                Some(bytes) if !bytes.is_empty() => bytes.clone(),
                // toktrie's mark for a special token is the byte 0xFF (not the character
                // U+00FF, whose UTF-8 would make the token ordinary text that strings accept):
                // reachable by id, never by bytes.
                _ => {
                    let mut word = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    word.extend_from_slice(format!("<[{id}]>").as_bytes());
                    word
                }
            })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, first_eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Self {
            factory,
            vocab_size: tokens.len(),
            eos: eos.to_vec(),
            compiled: Mutex::new(HashMap::new()),
        })
    }

    /// `source` compiled into a matcher at the start of an output, or why it cannot be. The
    /// first mask is computed here too, so that a grammar whose first step exceeds the limits
    /// fails now rather than mid-generation.
    pub fn compile(&self, source: GrammarSource<'_>) -> Result<GrammarMatcher, GrammarError> {
        let key = match source {
            GrammarSource::JsonSchema(s) => (true, s.to_owned()),
            GrammarSource::Lark(s) => (false, s.to_owned()),
        };
        let lock = || self.compiled.lock().unwrap_or_else(PoisonError::into_inner);
        let cached = lock().get(&key).cloned();
        let parser = match cached {
            Some(p) => p,
            None => {
                let parser = self
                    .factory
                    .create_parser(top_level(source)?)
                    .map_err(|e| GrammarError::Compile(e.to_string()))?;
                let mut compiled = lock();
                if compiled.len() >= CACHED_GRAMMARS {
                    compiled.clear();
                }
                compiled.insert(key, parser.clone());
                parser
            }
        };
        let mut matcher = GrammarMatcher {
            matcher: Matcher::new(Ok(parser)),
            vocab_size: self.vocab_size,
            eos: self.eos.clone(),
        };
        matcher.allowed()?;
        Ok(matcher)
    }
}

/// The grammar of `source`; JSON schemas with [`JSON_LAYOUT`] unless they set their own, and
/// their objects closed to undeclared properties ([`crate::close_declared_objects`]).
fn top_level(source: GrammarSource<'_>) -> Result<TopLevelGrammar, GrammarError> {
    Ok(match source {
        GrammarSource::JsonSchema(text) => {
            let mut schema: serde_json::Value =
                serde_json::from_str(text).map_err(|e| GrammarError::SchemaJson(e.to_string()))?;
            crate::close_declared_objects(&mut schema);
            if let Some(obj) = schema.as_object_mut() {
                obj.entry("x-guidance")
                    .or_insert_with(|| serde_json::from_str(JSON_LAYOUT).unwrap_or_default());
            }
            TopLevelGrammar::from_json_schema(schema)
        }
        GrammarSource::Lark(text) => TopLevelGrammar::from_lark(text.to_owned()),
    })
}

/// One output's position in its grammar.
#[derive(Clone)]
pub struct GrammarMatcher {
    matcher: Matcher,
    vocab_size: usize,
    eos: Vec<u32>,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("stopped", &self.matcher.is_stopped())
            .field("error", &self.matcher.get_error())
            .finish_non_exhaustive()
    }
}

impl GrammarMatcher {
    /// The tokens that may come next, as a bit set of the vocabulary's size: every
    /// end-of-generation token once the grammar accepts the output (only those once it
    /// cannot continue), or why none can be computed.
    pub fn allowed(&mut self) -> Result<Vec<u64>, GrammarError> {
        let mut set = vec![0u64; self.vocab_size.div_ceil(64)];
        let ends = if self.matcher.is_stopped() {
            true
        } else {
            let mask = self
                .matcher
                .compute_mask()
                .map_err(|e| GrammarError::Compile(e.to_string()))?;
            let words = mask.as_slice();
            for (i, w) in set.iter_mut().enumerate() {
                let lo = words.get(2 * i).copied().unwrap_or(0);
                let hi = words.get(2 * i + 1).copied().unwrap_or(0);
                *w = u64::from(lo) | (u64::from(hi) << 32);
            }
            self.eos
                .first()
                .is_some_and(|&e| mask.is_allowed(e) || mask.num_set() == 0)
        };
        if ends {
            for &e in &self.eos {
                if let Some(w) = set.get_mut(e as usize / 64) {
                    *w |= 1 << (e % 64);
                }
            }
        }
        if let Some(last) = set.last_mut() {
            let tail = self.vocab_size % 64;
            if tail != 0 {
                *last &= (1u64 << tail) - 1;
            }
        }
        Ok(set)
    }

    /// Moves past token `id`; `false` if the grammar does not allow it (the matcher then only
    /// allows the end).
    pub fn consume(&mut self, id: u32) -> bool {
        self.matcher.consume_token(id).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EOS: u32 = 0;

    /// Id 0 ends generation; then every byte, then a few multi-byte tokens.
    fn tokens() -> Vec<Option<Vec<u8>>> {
        let mut v = vec![None];
        v.extend((0..=255u8).map(|b| Some(vec![b])));
        for t in ["{\"", "\": ", ", \"", "true", "false", "\"}"] {
            v.push(Some(t.as_bytes().to_vec()));
        }
        v
    }

    fn allowed_texts(m: &mut GrammarMatcher, tokens: &[Option<Vec<u8>>]) -> Vec<String> {
        let set = m.allowed().unwrap();
        (0..tokens.len())
            .filter(|&id| set[id / 64] & (1 << (id % 64)) != 0)
            .map(|id| match &tokens[id] {
                Some(b) => String::from_utf8_lossy(b).into_owned(),
                None => "<eos>".into(),
            })
            .collect()
    }

    fn id_of(tokens: &[Option<Vec<u8>>], text: &str) -> u32 {
        tokens
            .iter()
            .position(|b| b.as_deref() == Some(text.as_bytes()))
            .unwrap() as u32
    }

    #[test]
    fn a_schema_allows_its_keys_and_values_then_only_the_end() {
        let tokens = tokens();
        let compiler = GrammarCompiler::new(&tokens, &[EOS]).unwrap();
        let schema = r#"{"type": "object", "properties": {"ok": {"type": "boolean"}},
                         "required": ["ok"], "additionalProperties": false}"#;
        let mut m = compiler.compile(GrammarSource::JsonSchema(schema)).unwrap();
        assert_eq!(allowed_texts(&mut m, &tokens), ["{", "{\""]);
        for t in ["{\"", "o", "k", "\": "] {
            assert!(m.consume(id_of(&tokens, t)), "{t}");
        }
        let next = allowed_texts(&mut m, &tokens);
        assert!(next.contains(&"true".to_string()) && next.contains(&"f".to_string()));
        assert!(!next.contains(&"1".to_string()) && !next.contains(&"<eos>".to_string()));
        assert!(m.consume(id_of(&tokens, "true")));
        assert!(m.consume(id_of(&tokens, "}")));
        assert_eq!(allowed_texts(&mut m, &tokens), ["<eos>"]);
    }

    /// Special tokens (the end among them) add no text: no string may take them in, so that
    /// an output never ends inside a string it has opened.
    #[test]
    fn special_tokens_never_continue_a_string() {
        let mut tokens = tokens();
        tokens.push(None); // e.g. <|im_start|>: a special token that does not end generation
        let special = tokens.len() - 1;
        let compiler = GrammarCompiler::new(&tokens, &[EOS]).unwrap();
        let schema = r#"{"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}"#;
        let mut m = compiler.compile(GrammarSource::JsonSchema(schema)).unwrap();
        for t in ["{\"", "c", "i", "t", "y", "\": ", "\"", "P", "}"] {
            assert!(m.consume(id_of(&tokens, t)), "{t}");
        }
        let inside = allowed_texts(&mut m, &tokens);
        assert!(inside.contains(&"a".to_string()));
        assert!(!inside.contains(&"<eos>".to_string()), "{inside:?}");
        let set = m.allowed().unwrap();
        assert_eq!(set[special / 64] & (1 << (special % 64)), 0);
        assert!(m.consume(id_of(&tokens, "\"}")));
        assert_eq!(allowed_texts(&mut m, &tokens), ["<eos>"]);
    }

    #[test]
    fn a_token_the_grammar_refuses_is_reported() {
        let tokens = tokens();
        let compiler = GrammarCompiler::new(&tokens, &[EOS]).unwrap();
        let mut m = compiler
            .compile(GrammarSource::Lark(r#"start: "yes" | "no""#))
            .unwrap();
        assert!(!m.consume(id_of(&tokens, "x")));
    }

    #[test]
    fn lark_grammars_embed_schemas() {
        let tokens = tokens();
        let compiler = GrammarCompiler::new(&tokens, &[EOS]).unwrap();
        let grammar = r#"start: "call " obj
obj: %json {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}"#;
        let mut m = compiler.compile(GrammarSource::Lark(grammar)).unwrap();
        for t in "call ".bytes() {
            assert!(m.consume(u32::from(t) + 1));
        }
        assert!(allowed_texts(&mut m, &tokens).contains(&"{".to_string()));
    }

    #[test]
    fn malformed_sources_are_refused_with_a_reason() {
        let tokens = tokens();
        let compiler = GrammarCompiler::new(&tokens, &[EOS]).unwrap();
        let err = compiler
            .compile(GrammarSource::JsonSchema("{not json"))
            .unwrap_err();
        assert!(matches!(err, GrammarError::SchemaJson(_)), "{err}");
        let err = compiler
            .compile(GrammarSource::Lark("start: missing_rule"))
            .unwrap_err();
        assert!(matches!(err, GrammarError::Compile(_)), "{err}");
        let err = compiler
            .compile(GrammarSource::JsonSchema(
                r#"{"type": "integer", "minimum": 5, "maximum": 1}"#,
            ))
            .unwrap_err();
        assert!(matches!(err, GrammarError::Compile(_)), "{err}");
    }
}

#[cfg(test)]
mod trigger_tests {
    use super::*;

    /// The shape of `tool_choice: auto`: free text, or text up to a trigger string after which
    /// the call's grammar holds.
    #[test]
    fn a_call_after_free_text_is_constrained_from_its_trigger() {
        let mut v: Vec<Option<Vec<u8>>> = vec![None];
        v.extend((0..=255u8).map(|b| Some(vec![b])));
        v.push(Some(b"<tool_call>".to_vec()));
        let c = GrammarCompiler::new(&v, &[0]).unwrap();
        let g = r#"start: FREE | lead call
FREE: /(?s:.*)/ & ~/(?s:.*<tool_call>.*)/
lead[stop="<tool_call>"]: /(?s:.*)/
call: "\n" %json {"type": "object", "properties": {"name": {"const": "f"}}, "required": ["name"], "additionalProperties": false} "\n</tool_call>"
"#;
        let mut m = c.compile(GrammarSource::Lark(g)).unwrap();
        for b in b"Sure. " {
            assert!(m.consume(u32::from(*b) + 1));
        }
        let set = m.allowed().unwrap();
        assert!(set[0] & 1 != 0, "eos allowed in free text");
        assert!(m.consume(257), "the trigger token");
        let set = m.allowed().unwrap();
        let ok = |set: &Vec<u64>, b: u8| {
            let id = b as usize + 1;
            set[id / 64] & (1 << (id % 64)) != 0
        };
        assert!(ok(&set, b'\n') && !ok(&set, b'x') && set[0] & 1 == 0);
        for b in b"\n{\"name\": \"f\"}\n</tool_call>" {
            assert!(m.consume(u32::from(*b) + 1), "{}", *b as char);
        }
        let set = m.allowed().unwrap();
        assert!(set[0] & 1 != 0);
    }
}
