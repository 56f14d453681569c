//! Rebuilding a `tokenizers::Tokenizer` from GGUF metadata, the way transformers does it
//! (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`, transformers 5.x), so that a
//! `.gguf` file alone is a complete model.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use super::GgufTokenizerSpec;
use crate::TokenizerLoadError;

/// The tokenizer models (`tokenizer.ggml.model`) this module can rebuild.
pub(crate) const SUPPORTED_MODELS: &str = "gpt2 (byte-level BPE), llama (SentencePiece BPE)";

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// GPT-2's split regex, which `ByteLevel` applies when `use_regex` is on.
const GPT2_PRE_TOKENIZERS: &[&str] = &["default", "gpt-2", "gpt2", "smollm"];

const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The split regex for a llama.cpp pre-tokenizer name, as transformers'
/// `GGUF_PRE_TOKENIZER_SPLITS` has it. `None` means GPT-2's regex (inside `ByteLevel`).
fn split_regex(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// GPT-2's byte-to-character table: every byte gets a printable character.
pub(super) fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (byte, slot) in table.iter_mut().enumerate() {
        let b = byte as u32;
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let code = if printable {
            b
        } else {
            let code = next;
            next += 1;
            code
        };
        // Every code is below 512, a valid scalar value.
        *slot = char::from_u32(code).unwrap_or('\u{fffd}');
    }
    table
}

/// Rebuilds the tokenizer a GGUF file describes. `path` is only used in error messages.
pub(crate) fn build(
    spec: &GgufTokenizerSpec,
    path: &Path,
) -> Result<Tokenizer, TokenizerLoadError> {
    if spec.tokens.is_empty() {
        return Err(TokenizerLoadError::invalid(
            path,
            "tokenizer.ggml.tokens is empty",
        ));
    }
    if let Some(types) = &spec.token_types
        && types.len() != spec.tokens.len()
    {
        return Err(TokenizerLoadError::invalid(
            path,
            format!(
                "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}",
                types.len(),
                spec.tokens.len()
            ),
        ));
    }
    for (key, id) in [
        ("bos_token_id", spec.bos_id),
        ("eos_token_id", spec.eos_id),
        ("unknown_token_id", spec.unk_id),
        ("padding_token_id", spec.pad_id),
    ] {
        if let Some(id) = id
            && id as usize >= spec.tokens.len()
        {
            return Err(TokenizerLoadError::invalid(
                path,
                format!(
                    "tokenizer.ggml.{key} is {id} but the vocabulary has {} tokens",
                    spec.tokens.len()
                ),
            ));
        }
    }
    let mut tokenizer = match spec.model.as_str() {
        "gpt2" => byte_level(spec, path)?,
        "llama" => sentencepiece(spec, path)?,
        other => {
            return Err(TokenizerLoadError::invalid(
                path,
                format!(
                    "tokenizer.ggml.model {other:?} is not supported; supported: {SUPPORTED_MODELS}"
                ),
            ));
        }
    };
    add_special_tokens(&mut tokenizer, spec, path)?;
    Ok(tokenizer)
}

fn bpe(
    vocab: Vocab,
    merges: Merges,
    sentencepiece: bool,
    path: &Path,
) -> Result<BPE, TokenizerLoadError> {
    let builder = BPE::builder().vocab_and_merges(vocab, merges);
    let builder = if sentencepiece {
        builder.fuse_unk(true).byte_fallback(true)
    } else {
        builder
            .continuing_subword_prefix(String::new())
            .end_of_word_suffix(String::new())
    };
    builder.build().map_err(|e| {
        TokenizerLoadError::invalid(path, format!("cannot build the BPE tokenizer: {e}"))
    })
}

/// Merges as the file gives them (`"left right"`), or derived from the vocabulary.
fn merges(spec: &GgufTokenizerSpec, path: &Path) -> Result<Merges, TokenizerLoadError> {
    match &spec.merges {
        Some(merges) => merges
            .iter()
            .enumerate()
            .map(|(i, merge)| {
                // transformers splits on every " "; a merge with more than one space is malformed.
                let mut parts = merge.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(l), Some(r), None) => Ok((l.to_string(), r.to_string())),
                    _ => Err(TokenizerLoadError::invalid(
                        path,
                        format!("tokenizer.ggml.merges[{i}] = {merge:?} is not \"left right\""),
                    )),
                }
            })
            .collect(),
        None => {
            let Some(scores) = &spec.scores else {
                return Err(TokenizerLoadError::invalid(
                    path,
                    "the tokenizer has neither tokenizer.ggml.merges nor tokenizer.ggml.scores",
                ));
            };
            if scores.len() != spec.tokens.len() {
                return Err(TokenizerLoadError::invalid(
                    path,
                    format!(
                        "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
                        scores.len(),
                        spec.tokens.len()
                    ),
                ));
            }
            Ok(generate_merges(&spec.tokens, scores))
        }
    }
}

/// transformers' `generate_merges(vocab, vocab_scores)`: every split of every token into two
/// tokens of the vocabulary, best score first (ties: longer left, then longer right piece).
fn generate_merges(tokens: &[String], scores: &[f32]) -> Merges {
    // Python dicts: the last index/score wins, the first position is kept.
    let mut vocab: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    let mut score_of: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
    for (index, (token, score)) in tokens.iter().zip(scores).enumerate() {
        if vocab.insert(token, index).is_none() {
            order.push(token);
        }
        score_of.insert(token, *score);
    }
    let mut all: Vec<(&str, &str, f32)> = Vec::new();
    for token in order {
        let score = score_of.get(token).copied().unwrap_or(0.0);
        let mut local: Vec<(&str, &str, f32)> = token
            .char_indices()
            .skip(1)
            .map(|(at, _)| token.split_at(at))
            .filter(|(l, r)| vocab.contains_key(l) && vocab.contains_key(r))
            .map(|(l, r)| (l, r, score))
            .collect();
        local.sort_by_key(|(l, r, _)| (vocab[l], vocab[r]));
        all.extend(local);
    }
    // Python's `sorted(..., reverse=True)` is stable: equal keys keep their order.
    all.sort_by(|a, b| {
        b.2.total_cmp(&a.2)
            .then_with(|| b.0.chars().count().cmp(&a.0.chars().count()))
            .then_with(|| b.1.chars().count().cmp(&a.1.chars().count()))
    });
    all.into_iter()
        .map(|(l, r, _)| (l.to_string(), r.to_string()))
        .collect()
}

/// Byte-level BPE (`GPT2Tokenizer` plus transformers' `set_split_regex`).
fn byte_level(spec: &GgufTokenizerSpec, path: &Path) -> Result<Tokenizer, TokenizerLoadError> {
    let spelling = bytes_to_unicode();
    let alphabet: HashSet<char> = spelling.iter().copied().collect();
    // Tokens outside the byte alphabet are respelled from their UTF-8 bytes.
    let vocab: Vocab = spec
        .tokens
        .iter()
        .enumerate()
        .map(|(id, token)| {
            let spelled = if token.chars().all(|c| alphabet.contains(&c)) {
                token.clone()
            } else {
                token.bytes().map(|b| spelling[b as usize]).collect()
            };
            (spelled, id as u32)
        })
        .collect();
    let model = bpe(vocab, merges(spec, path)?, false, path)?;
    let mut tokenizer = Tokenizer::new(model);

    let pre = spec.pre.as_deref().unwrap_or("default");
    let pre_tokenizer: PreTokenizerWrapper = match split_regex(pre) {
        Some(regex) => {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| {
                TokenizerLoadError::invalid(
                    path,
                    format!("pre-tokenizer {pre:?}: bad split regex: {e}"),
                )
            })?;
            PreTokenizerSequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into()
        }
        None => {
            if !GPT2_PRE_TOKENIZERS.contains(&pre) {
                tracing::warn!(
                    path = %path.display(),
                    pre,
                    "unknown tokenizer.ggml.pre; splitting text with GPT-2's regex (as transformers does)"
                );
            }
            ByteLevel::new(false, true, true).into()
        }
    };
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevel::new(true, true, true)));
    Ok(tokenizer)
}

/// SentencePiece-style BPE with byte fallback (transformers' `LlamaTokenizer`).
fn sentencepiece(spec: &GgufTokenizerSpec, path: &Path) -> Result<Tokenizer, TokenizerLoadError> {
    let vocab: Vocab = spec
        .tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id as u32))
        .collect();
    let model = bpe(vocab, merges(spec, path)?, true, path)?;
    let mut tokenizer = Tokenizer::new(model);
    let add_prefix_space = spec.add_space_prefix.unwrap_or(true);
    let prepend = if add_prefix_space {
        PrependScheme::First
    } else {
        PrependScheme::Never
    };
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('\u{2581}', prepend, false)));
    let replace = Replace::new("\u{2581}", " ")
        .map_err(|e| TokenizerLoadError::invalid(path, format!("cannot build the decoder: {e}")))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_prefix_space {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Registers the special tokens so they are matched whole in text: BOS/EOS/UNK/PAD and control
/// tokens as special tokens, user-defined tokens as plain added tokens.
fn add_special_tokens(
    tokenizer: &mut Tokenizer,
    spec: &GgufTokenizerSpec,
    path: &Path,
) -> Result<(), TokenizerLoadError> {
    let failed = |e: tokenizers::Error| {
        TokenizerLoadError::invalid(path, format!("cannot register the special tokens: {e}"))
    };
    let byte_level = spec.model == "gpt2";
    let alphabet: HashSet<char> = bytes_to_unicode().iter().copied().collect();
    let token_type = |id: usize| spec.token_types.as_ref().and_then(|t| t.get(id)).copied();

    let mut special: Vec<AddedToken> = Vec::new();
    for id in [spec.bos_id, spec.eos_id, spec.unk_id, spec.pad_id]
        .into_iter()
        .flatten()
    {
        if let Some(token) = spec.tokens.get(id as usize) {
            special.push(AddedToken::from(token.clone(), true).normalized(false));
        }
    }
    for (id, token) in spec.tokens.iter().enumerate() {
        // In a byte-level vocabulary a "control" token outside the byte alphabet is a llama.cpp
        // mislabel; transformers skips it.
        if token_type(id) == Some(TOKEN_TYPE_CONTROL)
            && (!byte_level || token.chars().all(|c| alphabet.contains(&c)))
        {
            special.push(AddedToken::from(token.clone(), true).normalized(false));
        }
    }
    tokenizer.add_special_tokens(special).map_err(failed)?;

    let user_defined: Vec<AddedToken> = spec
        .tokens
        .iter()
        .enumerate()
        .filter(|(id, _)| token_type(*id) == Some(TOKEN_TYPE_USER_DEFINED))
        .map(|(_, token)| AddedToken::from(token.clone(), false).normalized(false))
        .collect();
    if !user_defined.is_empty() {
        tokenizer.add_tokens(user_defined).map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = bytes_to_unicode();
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], '\u{120}'); // Ġ
        assert_eq!(t[b'\n' as usize], '\u{10a}'); // Ċ
        assert_eq!(t[0], '\u{100}');
        let distinct: HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn generate_merges_orders_by_score_then_length() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "abc", "bc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -3.0, -2.0];
        let merges = generate_merges(&tokens, &scores);
        let merges: Vec<(&str, &str)> = merges
            .iter()
            .map(|(l, r)| (l.as_str(), r.as_str()))
            .collect();
        assert_eq!(
            merges,
            vec![("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]
        );
    }
}
