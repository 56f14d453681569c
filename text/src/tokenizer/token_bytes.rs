//! The bytes each token stands for, for constraints that work on the output's bytes (JSON mode).

use super::ModelTokenizer;
use super::gguf::bytes_to_unicode;

impl ModelTokenizer {
    /// The bytes each token id adds to the output, by id; `None` for special tokens (BOS,
    /// `<|im_end|>`, ...), which add no text. Byte-level vocabularies (GPT-2, Llama 3, Qwen,
    /// SmolLM2) map each character back through GPT-2's byte table; SentencePiece ones turn
    /// `▁` into a space and `<0xAB>` into its byte. A token whose text cannot be mapped is
    /// `None` too, so a constraint never allows bytes it cannot account for.
    pub fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        let byte_level = self
            .tokenizer
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|json| json.contains(r#""type":"ByteLevel""#));
        let mut from_char = std::collections::HashMap::new();
        if byte_level {
            for (byte, c) in bytes_to_unicode().into_iter().enumerate() {
                from_char.insert(c, byte as u8);
            }
        }
        let added = self.tokenizer.get_added_tokens_decoder();
        (0..self.vocab_size() as u32)
            .map(|id| {
                if let Some(token) = added.get(&id) {
                    return (!token.special).then(|| token.content.clone().into_bytes());
                }
                let text = self.tokenizer.id_to_token(id)?;
                if byte_level {
                    text.chars().map(|c| from_char.get(&c).copied()).collect()
                } else {
                    Some(sentencepiece_bytes(&text))
                }
            })
            .collect()
    }
}

/// A SentencePiece piece's bytes: `<0xAB>` is the byte itself (byte fallback), `▁` a space.
fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    let byte = piece
        .strip_prefix("<0x")
        .and_then(|rest| rest.strip_suffix('>'))
        .filter(|hex| hex.len() == 2)
        .and_then(|hex| u8::from_str_radix(hex, 16).ok());
    match byte {
        Some(b) => vec![b],
        None => piece.replace('\u{2581}', " ").into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> ModelTokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures")
            .join(name);
        ModelTokenizer::from_hf_dir(&dir, &[]).expect("fixture tokenizer")
    }

    #[test]
    fn byte_level_tokens_decode_to_their_bytes() {
        let tok = fixture("tiny-llama");
        let bytes = tok.token_bytes();
        assert_eq!(bytes.len(), tok.vocab_size());
        let text = "Hello, world! {\"a\": [1, 2.5e-3]} ünï\n";
        let ids = tok.encode(text, false).unwrap();
        let joined: Vec<u8> = ids
            .iter()
            .flat_map(|&id| bytes[id as usize].clone().expect("a text token"))
            .collect();
        assert_eq!(joined, text.as_bytes());
    }

    #[test]
    fn special_tokens_have_no_bytes() {
        let tok = fixture("tiny-qwen2");
        let bytes = tok.token_bytes();
        for &eos in &tok.eos_token_ids {
            assert_eq!(bytes[eos as usize], None, "eos {eos}");
        }
    }

    #[test]
    fn sentencepiece_pieces() {
        assert_eq!(sentencepiece_bytes("\u{2581}Hello"), b" Hello");
        assert_eq!(sentencepiece_bytes("<0x0A>"), b"\n");
        assert_eq!(sentencepiece_bytes("<0xZZ>"), b"<0xZZ>");
        assert_eq!(sentencepiece_bytes("<s>"), b"<s>");
    }
}
