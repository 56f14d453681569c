//! [`ByteLevelDecoder`]: an independent decoder for the fixtures' byte-level tokenizers.

use serde_json::Value;

use crate::fixture;

/// An independent decoder for the fixtures' byte-level BPE tokenizer (GPT-2 byte table),
/// to check the router's detokenization against: the bytes of every token, joined, decoded
/// as UTF-8 with replacement characters (what `tokenizers`' ByteLevel decoder does).
#[derive(Debug)]
pub struct ByteLevelDecoder {
    /// Bytes of each token id; `None` for special tokens.
    tokens: Vec<Option<Vec<u8>>>,
}

impl ByteLevelDecoder {
    /// Reads `fixtures/<model>/tokenizer.json`.
    pub fn for_fixture(model: &str) -> Self {
        let path = fixture(model).join("tokenizer.json");
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
            .expect("tokenizer.json");
        // GPT-2's bytes_to_unicode, inverted.
        let mut printable: Vec<u32> = (u32::from('!')..=u32::from('~'))
            .chain(u32::from('¡')..=u32::from('¬'))
            .chain(u32::from('®')..=u32::from('ÿ'))
            .collect();
        let mut chars = printable.clone();
        let mut n = 0;
        for b in 0..256u32 {
            if !printable.contains(&b) {
                printable.push(b);
                chars.push(256 + n);
                n += 1;
            }
        }
        let byte_of: std::collections::HashMap<char, u8> = chars
            .iter()
            .zip(&printable)
            .map(|(&c, &b)| (char::from_u32(c).expect("char"), b as u8))
            .collect();
        let vocab = json["model"]["vocab"].as_object().expect("model.vocab");
        let mut tokens = vec![None; vocab.len()];
        for (text, id) in vocab {
            let id = id.as_u64().expect("id") as usize;
            if id >= tokens.len() {
                tokens.resize(id + 1, None);
            }
            let bytes = text
                .chars()
                .map(|c| {
                    *byte_of
                        .get(&c)
                        .unwrap_or_else(|| panic!("char {c:?} of {text:?}"))
                })
                .collect();
            tokens[id] = Some(bytes);
        }
        for added in json["added_tokens"].as_array().expect("added_tokens") {
            let id = added["id"].as_u64().expect("id") as usize;
            if id >= tokens.len() {
                tokens.resize(id + 1, None);
            }
            tokens[id] = if added["special"] == true {
                None
            } else {
                Some(
                    added["content"]
                        .as_str()
                        .expect("content")
                        .as_bytes()
                        .to_vec(),
                )
            };
        }
        Self { tokens }
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u64]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .filter_map(|&id| self.tokens.get(id as usize).cloned().flatten())
            .flatten()
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
