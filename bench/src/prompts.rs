//! The requests of a run: synthetic prompts of exact token lengths, or a dataset file.
//!
//! **Synthetic prompts** are built from whole-word vocabulary tokens (a space and ASCII
//! letters, one token each), then checked with the tokenizer and adjusted word by word
//! until `encode(text, add_special_tokens = true)` has exactly the asked length, so the
//! count includes a BOS token the tokenizer adds, as the server's `usage.prompt_tokens`
//! does on `/v1/completions`. On `/v1/chat/completions` the chat template adds its own
//! tokens (role markers, a default system prompt) around the text.
//!
//! **Datasets** are JSONL (one object per line) or one JSON array, with either a prompt
//! field (`prompt`, `text`, `input` or `question`, and optionally `output_len` or
//! `max_tokens`) or a ShareGPT conversation (`conversations: [{from, value}]`, or
//! OpenAI-style `messages: [{role, content}]`), whose first human turn is the prompt and
//! whose first model turn, tokenized, gives the output length.

use std::path::Path;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use tessera_text::ModelTokenizer;

use crate::client::RequestSpec;
use crate::error::BenchError;

/// Loads a tokenizer from a `.gguf` file, a Hugging Face model directory, a folder with a
/// `tokenizer.json`, or a `tokenizer.json` file (its folder is read).
pub fn load_tokenizer(path: &Path) -> Result<ModelTokenizer, BenchError> {
    let is_file = path.is_file();
    if is_file && path.file_name().is_some_and(|n| n == "tokenizer.json") {
        let dir = path.parent().unwrap_or(Path::new("."));
        return Ok(ModelTokenizer::from_hf_dir(dir, &[])?);
    }
    if is_file || path.join("config.json").is_file() {
        return Ok(tessera_model_files::ModelFiles::open(path)?.tokenizer()?);
    }
    Ok(ModelTokenizer::from_hf_dir(path, &[])?)
}

/// Adjustment rounds before giving up on an exact length.
const MAX_ROUNDS: usize = 64;

/// Builds prompts of exact token lengths from a tokenizer's vocabulary.
#[derive(Debug)]
pub struct PromptBuilder<'a> {
    tokenizer: &'a ModelTokenizer,
    words: Vec<String>,
}

impl<'a> PromptBuilder<'a> {
    /// Collects the vocabulary's whole-word tokens.
    pub fn new(tokenizer: &'a ModelTokenizer) -> Result<Self, BenchError> {
        let count = |text: &str| tokenizer.encode(text, false).map(|ids| ids.len());
        let mut words = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for id in 0..tokenizer.vocab_size() as u32 {
            let Ok(text) = tokenizer.decode(&[id], true) else {
                continue;
            };
            let word = text.trim_start_matches(' ');
            if word.is_empty()
                || word.len() > 12
                || !word.bytes().all(|b| b.is_ascii_lowercase())
                || seen.contains(word)
            {
                continue;
            }
            seen.insert(word.to_string());
            if count(&format!(" {word}"))? == 1 {
                words.push(word.to_string());
            }
        }
        if words.len() < 8 {
            return Err(BenchError::Vocabulary(words.len()));
        }
        Ok(Self { tokenizer, words })
    }

    /// Tokens of `text` as the server counts a completions prompt.
    pub fn count(&self, text: &str) -> Result<usize, BenchError> {
        Ok(self.tokenizer.encode(text, true)?.len())
    }

    /// A text of exactly `len` tokens (special tokens the tokenizer adds included), with
    /// words drawn from `rng`.
    pub fn exact(&self, len: usize, rng: &mut impl Rng) -> Result<String, BenchError> {
        let specials = self.count("")?;
        if len <= specials {
            return Err(BenchError::PromptTooShort { len, specials });
        }
        let mut words: Vec<&str> = (0..len - specials)
            .map(|_| self.words[rng.random_range(0..self.words.len())].as_str())
            .collect();
        for _ in 0..MAX_ROUNDS {
            let text = words.join(" ");
            let n = self.count(&text)?;
            if n == len {
                return Ok(text);
            }
            if n > len {
                let drop = (n - len).min(words.len().saturating_sub(1)).max(1);
                words.truncate(words.len().saturating_sub(drop));
            } else {
                for _ in 0..len - n {
                    words.push(&self.words[rng.random_range(0..self.words.len())]);
                }
            }
        }
        Err(BenchError::InexactPrompt(len))
    }
}

/// Lengths spread uniformly in `[len (1 - ratio), len (1 + ratio)]`, at least 1.
fn spread(len: usize, ratio: f64, rng: &mut impl Rng) -> usize {
    let lo = ((len as f64) * (1.0 - ratio)).round().max(1.0) as usize;
    let hi = ((len as f64) * (1.0 + ratio)).round().max(lo as f64) as usize;
    rng.random_range(lo..=hi)
}

/// Synthetic requests: `num` prompts of `input_len` tokens and `max_tokens = output_len`,
/// both spread by `range_ratio`, reproducible from `seed`.
pub fn synthetic(
    tokenizer: &ModelTokenizer,
    num: usize,
    input_len: usize,
    output_len: usize,
    range_ratio: f64,
    seed: u64,
) -> Result<Vec<RequestSpec>, BenchError> {
    let builder = PromptBuilder::new(tokenizer)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..num)
        .map(|_| {
            let len = spread(input_len, range_ratio, &mut rng);
            let out = spread(output_len, range_ratio, &mut rng);
            Ok(RequestSpec {
                prompt: builder.exact(len, &mut rng)?,
                prompt_tokens: Some(len as u64),
                output_len: u32::try_from(out).unwrap_or(u32::MAX),
            })
        })
        .collect()
}

/// One dataset entry before sampling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetEntry {
    /// The prompt (first user turn).
    pub prompt: String,
    /// The output length the entry asks for, if it says.
    pub output_len: Option<u32>,
    /// The reference reply (ShareGPT), used to size the output when a tokenizer is given.
    pub reply: Option<String>,
}

/// Parses a dataset file's text (JSONL or one JSON array).
pub fn parse_dataset(text: &str, path: &Path) -> Result<Vec<DatasetEntry>, BenchError> {
    let bad = |line: usize, message: String| BenchError::Dataset {
        path: path.to_path_buf(),
        line,
        message,
    };
    let values: Vec<(usize, Value)> = if text.trim_start().starts_with('[') {
        let array: Vec<Value> =
            serde_json::from_str(text).map_err(|e| bad(e.line(), e.to_string()))?;
        array.into_iter().map(|v| (0, v)).collect()
    } else {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map(|v| (i + 1, v))
                    .map_err(|e| bad(i + 1, e.to_string()))
            })
            .collect::<Result<_, _>>()?
    };
    let mut entries = Vec::new();
    for (line, value) in values {
        match entry(&value) {
            Some(e) if !e.prompt.trim().is_empty() => entries.push(e),
            Some(_) => {}
            None => {
                return Err(bad(
                    line,
                    "expected a `prompt`/`text` field or a ShareGPT `conversations`/`messages` list"
                        .into(),
                ));
            }
        }
    }
    Ok(entries)
}

fn entry(value: &Value) -> Option<DatasetEntry> {
    let output_len = ["output_len", "max_tokens"]
        .iter()
        .find_map(|k| value.get(*k)?.as_u64())
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    for key in ["prompt", "text", "input", "question"] {
        if let Some(prompt) = value.get(key).and_then(Value::as_str) {
            return Some(DatasetEntry {
                prompt: prompt.to_string(),
                output_len,
                reply: None,
            });
        }
    }
    let turns = value
        .get("conversations")
        .or_else(|| value.get("conversation"))
        .or_else(|| value.get("messages"))?
        .as_array()?;
    let turn = |t: &Value| -> Option<(String, String)> {
        let role = t.get("from").or_else(|| t.get("role"))?.as_str()?;
        let text = t.get("value").or_else(|| t.get("content"))?.as_str()?;
        Some((role.to_string(), text.to_string()))
    };
    let turns: Vec<(String, String)> = turns.iter().filter_map(turn).collect();
    let user = turns
        .iter()
        .position(|(r, _)| matches!(r.as_str(), "human" | "user"))?;
    let reply = turns[user + 1..]
        .iter()
        .find(|(r, _)| {
            matches!(
                r.as_str(),
                "gpt" | "assistant" | "chatgpt" | "bing" | "bard"
            )
        })
        .map(|(_, t)| t.clone());
    Some(DatasetEntry {
        prompt: turns[user].1.clone(),
        output_len,
        reply,
    })
}

/// Requests from a dataset file: `num` entries sampled without replacement (cycling
/// when the file has fewer) in an order set by `seed`. The output length is the entry's
/// own, else its reference reply's token count (with a tokenizer), else `default_output`;
/// `force_output` overrides all of them.
pub fn from_dataset(
    path: &Path,
    tokenizer: Option<&ModelTokenizer>,
    num: usize,
    default_output: u32,
    force_output: Option<u32>,
    seed: u64,
) -> Result<Vec<RequestSpec>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let mut entries = parse_dataset(&text, path)?;
    if entries.is_empty() {
        return Err(BenchError::Dataset {
            path: path.to_path_buf(),
            line: 0,
            message: "no usable prompt".into(),
        });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    entries.shuffle(&mut rng);
    let mut out = Vec::with_capacity(num);
    for entry in entries.iter().cycle().take(num) {
        let count = |t: &str| -> Result<Option<u64>, BenchError> {
            Ok(match tokenizer {
                Some(tok) => Some(tok.encode(t, true)?.len() as u64),
                None => None,
            })
        };
        let reply_len = match &entry.reply {
            Some(reply) => count(reply)?.map(|n| u32::try_from(n.max(1)).unwrap_or(u32::MAX)),
            None => None,
        };
        let output_len = force_output
            .or(entry.output_len)
            .or(reply_len)
            .unwrap_or(default_output);
        out.push(RequestSpec {
            prompt: entry.prompt.clone(),
            prompt_tokens: count(&entry.prompt)?,
            output_len,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_and_sharegpt() {
        let text = r#"{"prompt": "hi", "output_len": 7}

{"text": "there"}
{"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a b c"}]}
{"messages": [{"role": "user", "content": "m"}]}
{"prompt": ""}
"#;
        let e = parse_dataset(text, Path::new("x")).unwrap();
        assert_eq!(e.len(), 4);
        assert_eq!((e[0].prompt.as_str(), e[0].output_len), ("hi", Some(7)));
        assert_eq!(e[1].prompt, "there");
        assert_eq!(
            (e[2].prompt.as_str(), e[2].reply.as_deref()),
            ("q", Some("a b c"))
        );
        assert_eq!((e[3].prompt.as_str(), e[3].reply.as_deref()), ("m", None));
    }

    #[test]
    fn json_array_and_errors() {
        let e = parse_dataset(r#"[{"prompt": "a"}, {"question": "b"}]"#, Path::new("x")).unwrap();
        assert_eq!(e.len(), 2);
        let err = parse_dataset("{\"prompt\": \"a\"}\n{oops\n", Path::new("x")).unwrap_err();
        assert!(err.to_string().contains("x:2"), "{err}");
        let err = parse_dataset("{\"foo\": 1}\n", Path::new("x")).unwrap_err();
        assert!(err.to_string().contains("prompt"), "{err}");
    }

    #[test]
    fn synthetic_prompts_have_exact_lengths() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-llama");
        let tok = tessera_model_files::ModelFiles::open(&dir)
            .unwrap()
            .tokenizer()
            .unwrap();
        let specs = synthetic(&tok, 20, 40, 8, 0.5, 3).unwrap();
        for s in &specs {
            let n = tok.encode(&s.prompt, true).unwrap().len() as u64;
            assert_eq!(Some(n), s.prompt_tokens);
            assert!((20..=60).contains(&n) && (4..=12).contains(&s.output_len));
        }
        assert_eq!(specs, synthetic(&tok, 20, 40, 8, 0.5, 3).unwrap());
        let builder = PromptBuilder::new(&tok).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(
            builder.count(&builder.exact(1, &mut rng).unwrap()).unwrap(),
            1
        );
    }

    #[test]
    fn spread_stays_in_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..1000 {
            let n = spread(100, 0.25, &mut rng);
            assert!((75..=125).contains(&n));
        }
        assert_eq!(spread(10, 0.0, &mut rng), 10);
        assert_eq!(spread(1, 0.9, &mut rng), 1);
    }
}
