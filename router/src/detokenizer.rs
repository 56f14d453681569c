//! Incremental detokenization: token ids in, text out, one token at a time.
//!
//! Decoding each token on its own is wrong in two ways: tokenizers change how a token reads
//! depending on its neighbours (SentencePiece drops the leading space of the first token),
//! and byte-level vocabularies split characters across tokens (an emoji is often 2–4 byte
//! tokens; SentencePiece byte fallback spells it `<0xF0><0x9F>…`). Following TGI and vLLM,
//! the decoder keeps two offsets into the ids: `prefix_offset..read_offset` is text already
//! accounted for (the tail of the prompt, then emitted tokens), and everything after
//! `read_offset` is pending. Each push decodes the window from `prefix_offset` with and
//! without the pending ids; the difference is emitted once it does not end in U+FFFD (an
//! incomplete character). A character is thus never split nor lost.

use std::sync::Arc;

use tessera_text::ModelTokenizer;

/// How many prompt tokens give the first generated tokens their context.
const PROMPT_CONTEXT: usize = 5;

/// Decoding failed inside the tokenizer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("detokenization failed: {0}")]
pub struct DecodeError(String);

/// Turns one request's generated ids into text incrementally. See the module docs.
pub struct IncrementalDecoder {
    tokenizer: Arc<ModelTokenizer>,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl std::fmt::Debug for IncrementalDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncrementalDecoder")
            .field("ids", &self.ids)
            .field("prefix_offset", &self.prefix_offset)
            .field("read_offset", &self.read_offset)
            .finish_non_exhaustive()
    }
}

impl IncrementalDecoder {
    /// A decoder for a request whose prompt ends with `prompt_ids` (only the last few are
    /// kept, as context: the first generated token then decodes as it reads after the
    /// prompt, e.g. with its leading space).
    pub fn new(
        tokenizer: Arc<ModelTokenizer>,
        prompt_ids: &[u32],
        skip_special_tokens: bool,
    ) -> Self {
        let context = &prompt_ids[prompt_ids.len().saturating_sub(PROMPT_CONTEXT)..];
        Self {
            tokenizer,
            skip_special_tokens,
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String, DecodeError> {
        self.tokenizer
            .decode(ids, self.skip_special_tokens)
            .map_err(|e| DecodeError(e.to_string()))
    }

    /// Adds a generated token and returns the text it completes: possibly empty (an
    /// incomplete character, or a skipped special token), possibly several characters.
    pub fn push(&mut self, id: u32) -> Result<String, DecodeError> {
        self.ids.push(id);
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        if full.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        let Some(new) = new_text(&prefix, &full) else {
            return Ok(String::new());
        };
        let new = new.to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(new)
    }

    /// Flushes what is still pending at the end of generation (an incomplete character
    /// comes out as U+FFFD rather than being dropped).
    pub fn finish(&mut self) -> Result<String, DecodeError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        let new = new_text(&prefix, &full).unwrap_or_default().to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(new)
    }
}

/// The part of `full` after `prefix`, if `full` is longer. Replacement characters at the
/// end of `prefix` (an incomplete character that `full` completes) are not counted.
fn new_text<'a>(prefix: &str, full: &'a str) -> Option<&'a str> {
    let stable = prefix.trim_end_matches(char::REPLACEMENT_CHARACTER);
    if full.len() <= prefix.len() && stable.len() == prefix.len() {
        return None;
    }
    let mut at = stable.len().min(full.len());
    while !full.is_char_boundary(at) {
        at -= 1;
    }
    let new = &full[at..];
    (!new.is_empty()).then_some(new)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::str::FromStr;

    /// A byte-level BPE tokenizer without merges (one token per byte, ids 0..256 in the
    /// GPT-2 byte alphabet order) plus merges for "he", "ll", "hell", "hello", and special
    /// tokens `<s>` (256+5) and `</s>` (257+5).
    pub(crate) fn byte_level() -> Arc<ModelTokenizer> {
        let alphabet = byte_alphabet();
        let mut vocab = serde_json::Map::new();
        for (i, c) in alphabet.iter().enumerate() {
            vocab.insert(c.to_string(), serde_json::json!(i));
        }
        for (i, t) in ["he", "ll", "hell", "hello", "Ġw"].iter().enumerate() {
            vocab.insert(t.to_string(), serde_json::json!(256 + i));
        }
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 261, "content": "<s>", "special": true, "single_word": false,
                 "lstrip": false, "rstrip": false, "normalized": false},
                {"id": 262, "content": "</s>", "special": true, "single_word": false,
                 "lstrip": false, "rstrip": false, "normalized": false}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                              "trim_offsets": true, "use_regex": true},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [261], "tokens": ["<s>"]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                        "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab,
                      "merges": ["h e", "l l", "he ll", "hell o", "Ġ w"]}
        });
        let tokenizer = tokenizers::Tokenizer::from_str(&json.to_string()).unwrap();
        Arc::new(ModelTokenizer {
            tokenizer,
            bos_token: Some(("<s>".into(), 261)),
            eos_token_ids: vec![262],
            add_bos: true,
            chat_template: None,
        })
    }

    /// GPT-2's bytes-to-unicode table.
    fn byte_alphabet() -> Vec<char> {
        let mut printable: Vec<u32> = (b'!'..=b'~').map(u32::from).collect();
        printable.extend(0xA1..=0xAC);
        printable.extend(0xAE..=0xFF);
        let mut out = Vec::with_capacity(256);
        let mut extra = 0;
        for b in 0..256u32 {
            if printable.contains(&b) {
                out.push(char::from_u32(b).unwrap());
            } else {
                out.push(char::from_u32(256 + extra).unwrap());
                extra += 1;
            }
        }
        out
    }

    fn byte_ids(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    /// A SentencePiece-style tokenizer with byte fallback: `▁Hello`, `▁world`, `!` and the
    /// 256 `<0xNN>` byte tokens (ids 10 + byte).
    fn sentencepiece() -> Arc<ModelTokenizer> {
        let mut vocab = serde_json::Map::new();
        for (i, t) in ["<unk>", "<s>", "</s>", "▁Hello", "▁world", "!", "▁"]
            .iter()
            .enumerate()
        {
            vocab.insert(t.to_string(), serde_json::json!(i));
        }
        for b in 0..256 {
            vocab.insert(format!("<0x{b:02X}>"), serde_json::json!(10 + b));
        }
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 1, "content": "<s>", "special": true, "single_word": false,
                 "lstrip": false, "rstrip": false, "normalized": false},
                {"id": 2, "content": "</s>", "special": true, "single_word": false,
                 "lstrip": false, "rstrip": false, "normalized": false}
            ],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": vocab, "merges": []}
        });
        let tokenizer = tokenizers::Tokenizer::from_str(&json.to_string()).unwrap();
        Arc::new(ModelTokenizer {
            tokenizer,
            bos_token: Some(("<s>".into(), 1)),
            eos_token_ids: vec![2],
            add_bos: true,
            chat_template: None,
        })
    }

    fn run(dec: &mut IncrementalDecoder, ids: &[u32]) -> Vec<String> {
        let mut out: Vec<String> = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
        out.push(dec.finish().unwrap());
        out
    }

    #[test]
    fn emoji_split_across_byte_tokens_waits_for_the_whole_character() {
        let tok = byte_level();
        let text = "a😀b€";
        let mut dec = IncrementalDecoder::new(tok, &[], true);
        let out = run(&mut dec, &byte_ids(text));
        assert_eq!(out, ["a", "", "", "", "😀", "b", "", "", "€", ""]);
        assert_eq!(out.concat(), text);
    }

    #[test]
    fn merged_tokens_and_prompt_context() {
        let tok = byte_level();
        let enc = tok.tokenizer.encode("hello w", false).unwrap();
        assert_eq!(enc.get_ids(), &[259, 260]);
        let mut dec = IncrementalDecoder::new(tok.clone(), &[259], true);
        // " w" keeps its space after the prompt "hello".
        assert_eq!(dec.push(260).unwrap(), " w");
        assert_eq!(dec.push(u32::from(b'!')).unwrap(), "!");
    }

    #[test]
    fn special_tokens_are_skipped_or_kept() {
        let tok = byte_level();
        let mut dec = IncrementalDecoder::new(tok.clone(), &[261], true);
        assert_eq!(dec.push(259).unwrap(), "hello");
        assert_eq!(dec.push(262).unwrap(), "");
        assert_eq!(dec.finish().unwrap(), "");
        let mut dec = IncrementalDecoder::new(tok, &[261], false);
        assert_eq!(dec.push(259).unwrap(), "hello");
        assert_eq!(dec.push(262).unwrap(), "</s>");
    }

    #[test]
    fn incomplete_character_at_the_end_is_flushed_not_dropped() {
        let tok = byte_level();
        let mut dec = IncrementalDecoder::new(tok, &[], true);
        let bytes = byte_ids("😀");
        assert_eq!(dec.push(u32::from(b'x')).unwrap(), "x");
        assert_eq!(dec.push(bytes[0]).unwrap(), "");
        assert_eq!(dec.push(bytes[1]).unwrap(), "");
        let tail = dec.finish().unwrap();
        assert!(!tail.is_empty() && tail.chars().all(|c| c == '\u{FFFD}'));
    }

    #[test]
    fn invalid_byte_in_the_middle_does_not_stall() {
        let tok = byte_level();
        let mut dec = IncrementalDecoder::new(tok, &[], true);
        // A lone continuation byte, then ASCII: the FFFD is no longer at the end.
        let out = run(&mut dec, &[0x80, u32::from(b'a')]);
        assert_eq!(out.concat(), "\u{FFFD}a");
    }

    #[test]
    fn sentencepiece_byte_fallback_and_leading_space() {
        let tok = sentencepiece();
        let emoji: Vec<u32> = "😀".bytes().map(|b| 10 + u32::from(b)).collect();
        // Prompt "<s> Hello": the first generated token keeps its space.
        let mut dec = IncrementalDecoder::new(tok.clone(), &[1, 3], true);
        let mut ids = vec![4, 6];
        ids.extend(&emoji);
        ids.push(5);
        let out = run(&mut dec, &ids);
        assert_eq!(out, [" world", " ", "", "", "", "😀", "!", ""]);
        // Without context the first token reads like the start of a text.
        let mut dec = IncrementalDecoder::new(tok, &[], true);
        assert_eq!(dec.push(3).unwrap(), "Hello");
        assert_eq!(dec.push(4).unwrap(), " world");
    }

    #[test]
    fn new_text_handles_replacement_in_prefix() {
        assert_eq!(new_text("ab\u{FFFD}", "ab😀"), Some("😀"));
        assert_eq!(new_text("ab", "ab"), None);
        assert_eq!(new_text("ab", "abc"), Some("c"));
    }
}
