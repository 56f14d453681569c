//! Tokenizers rebuilt from GGUF metadata, compared with transformers' GGUF loader.

use std::path::Path;

use serde_json::Value;
use tessera_text::{GgufTokenizerSpec, ModelTokenizer, TokenizerLoadError};

const FILE: &str = "test.gguf";

fn golden() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny_spm_tokenizer.json");
    let text = std::fs::read_to_string(&path).expect("tiny_spm_tokenizer.json");
    serde_json::from_str(&text).expect("valid JSON")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap() as u32)
        .collect()
}

/// The tiny SentencePiece spec scripts/make_tokenizer_goldens.py wrote as a GGUF.
fn tiny_spm_spec(g: &Value) -> GgufTokenizerSpec {
    let s = &g["spec"];
    GgufTokenizerSpec {
        model: "llama".into(),
        tokens: strings(&s["tokens"]),
        token_types: Some(
            s["token_types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_i64().unwrap() as i32)
                .collect(),
        ),
        scores: Some(
            s["scores"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_f64().unwrap() as f32)
                .collect(),
        ),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        add_bos: Some(true),
        add_space_prefix: Some(true),
        ..Default::default()
    }
}

#[test]
fn sentencepiece_bpe_matches_transformers() {
    let g = golden();
    let tok = ModelTokenizer::from_gguf(&tiny_spm_spec(&g), Path::new(FILE)).unwrap();
    assert!(tok.add_bos);
    assert_eq!(tok.bos_token, Some(("<s>".to_string(), 1)));
    assert_eq!(tok.eos_token_ids, vec![2]);
    for case in g["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, ids(&case["ids"]), "encode({text:?})");
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&case["ids_no_special"]),
            "encode({text:?}, no special)"
        );
        assert_eq!(
            tok.decode(&got, false).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decode({text:?})"
        );
        assert_eq!(
            tok.decode(&got, true).unwrap(),
            case["decoded_skip_special"].as_str().unwrap(),
            "decode({text:?}, skip special)"
        );
    }
}

/// A byte-level BPE vocabulary: bytes of "Ġhi" etc., with merges given.
fn tiny_gpt2_spec() -> GgufTokenizerSpec {
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    // The printable ASCII bytes map to themselves; space is Ġ, newline Ċ.
    for c in ['h', 'i', 'Ġ', 'Ċ', 'a', 'b', '!'] {
        tokens.push(c.to_string());
    }
    for t in ["hi", "Ġhi", "ab", "<think>"] {
        tokens.push(t.to_string());
    }
    let mut token_types = vec![3, 3, 3];
    token_types.extend(std::iter::repeat_n(1, tokens.len() - 4));
    token_types.push(4);
    GgufTokenizerSpec {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types: Some(token_types),
        merges: Some(vec!["h i".into(), "Ġ hi".into(), "a b".into()]),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        pad_id: Some(2),
        add_bos: Some(false),
        chat_template: Some("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}".into()),
        ..Default::default()
    }
}

/// gpt-oss's vocabulary: `<|end|>` ends a message, `<|return|>` and `<|call|>` the turn.
#[test]
fn harmony_vocabularies_end_on_return_and_call_not_end() {
    let mut spec = tiny_gpt2_spec();
    let first = spec.tokens.len() as u32;
    for t in ["<|end|>", "<|return|>", "<|call|>"] {
        spec.tokens.push(t.into());
        if let Some(types) = spec.token_types.as_mut() {
            types.push(3);
        }
    }
    let plain = ModelTokenizer::from_gguf(&spec, Path::new(FILE)).unwrap();
    assert!(
        plain.eos_token_ids.contains(&first),
        "Phi-3 ends on <|end|>"
    );
    spec.chat_template = Some("<|start|>assistant<|channel|>final<|message|>".into());
    let harmony = ModelTokenizer::from_gguf(&spec, Path::new(FILE)).unwrap();
    assert_eq!(harmony.eos_token_ids, vec![2, 0, first + 1, first + 2]);
}

#[test]
fn byte_level_bpe_with_special_tokens() {
    let tok = ModelTokenizer::from_gguf(&tiny_gpt2_spec(), Path::new(FILE)).unwrap();
    assert!(!tok.add_bos);
    // eos plus the end-of-turn control tokens llama.cpp recognises.
    assert_eq!(tok.eos_token_ids, vec![2, 0]);
    let ids = tok
        .encode("<|im_start|>hi hi!\nab<|im_end|><think>", true)
        .unwrap();
    assert_eq!(ids, vec![1, 10, 11, 9, 6, 12, 2, 13]);
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|im_start|>hi hi!\nab<|im_end|><think>"
    );
    // <think> is user-defined, not special: it stays when skipping special tokens.
    assert_eq!(tok.decode(&ids, true).unwrap(), "hi hi!\nab<think>");
    let chat = tok.chat_template.as_ref().unwrap();
    let text = chat
        .render(&[tessera_text::ChatMessage::new("user", "hi")], false)
        .unwrap();
    assert_eq!(text, "<|im_start|>user\nhi<|im_end|>\n");
}

#[test]
fn known_pre_tokenizers_build() {
    for pre in [
        "llama-bpe",
        "qwen2",
        "qwen35",
        "tekken",
        "gpt-4o",
        "gpt-2",
        "something-new",
    ] {
        let spec = GgufTokenizerSpec {
            pre: Some(pre.into()),
            ..tiny_gpt2_spec()
        };
        let tok = ModelTokenizer::from_gguf(&spec, Path::new(FILE)).unwrap();
        assert_eq!(
            tok.encode("hi hi", false).unwrap(),
            vec![10, 11],
            "pre {pre}"
        );
    }
}

#[test]
fn add_bos_prepends_bos() {
    let spec = GgufTokenizerSpec {
        add_bos: Some(true),
        ..tiny_gpt2_spec()
    };
    let tok = ModelTokenizer::from_gguf(&spec, Path::new(FILE)).unwrap();
    assert!(tok.add_bos);
    assert_eq!(tok.encode("hi", true).unwrap(), vec![1, 10]);
    assert_eq!(tok.encode("hi", false).unwrap(), vec![10]);
}

fn invalid_message(err: TokenizerLoadError) -> String {
    let text = err.to_string();
    assert!(text.starts_with(FILE), "error names the file: {text}");
    text
}

#[test]
fn unsupported_model_is_an_error_naming_it() {
    let spec = GgufTokenizerSpec {
        model: "bert".into(),
        ..tiny_gpt2_spec()
    };
    let text = invalid_message(ModelTokenizer::from_gguf(&spec, Path::new(FILE)).unwrap_err());
    assert!(
        text.contains("\"bert\"") && text.contains("gpt2") && text.contains("llama"),
        "{text}"
    );
}

#[test]
fn inconsistent_specs_are_errors() {
    let base = tiny_gpt2_spec();
    let cases = [
        GgufTokenizerSpec {
            tokens: vec![],
            ..base.clone()
        },
        GgufTokenizerSpec {
            token_types: Some(vec![1]),
            ..base.clone()
        },
        GgufTokenizerSpec {
            eos_id: Some(10_000),
            ..base.clone()
        },
        GgufTokenizerSpec {
            merges: Some(vec!["h i x".into()]),
            ..base.clone()
        },
        GgufTokenizerSpec {
            merges: None,
            scores: None,
            ..base.clone()
        },
        GgufTokenizerSpec {
            merges: None,
            scores: Some(vec![0.0]),
            ..base.clone()
        },
        GgufTokenizerSpec {
            chat_template: Some("{% for %}".into()),
            ..base.clone()
        },
    ];
    for spec in cases {
        let err = ModelTokenizer::from_gguf(&spec, Path::new(FILE)).unwrap_err();
        invalid_message(err);
    }
}

#[test]
fn decode_rejects_ids_outside_the_vocabulary() {
    let tok = ModelTokenizer::from_gguf(&tiny_gpt2_spec(), Path::new(FILE)).unwrap();
    let err = tok.decode(&[1, 99_999], false).unwrap_err();
    assert!(err.to_string().contains("99999"), "{err}");
}

/// A spec as `scripts/make_tokenizer_goldens.py` wrote it to JSON.
fn spec_from_json(s: &Value) -> GgufTokenizerSpec {
    let text = |k: &str| s[k].as_str().map(str::to_string);
    let id = |k: &str| s[k].as_u64().map(|n| n as u32);
    GgufTokenizerSpec {
        model: text("model").expect("model"),
        pre: text("pre"),
        tokens: strings(&s["tokens"]),
        token_types: s["token_types"]
            .as_array()
            .map(|a| a.iter().map(|t| t.as_i64().unwrap() as i32).collect()),
        scores: s["scores"]
            .as_array()
            .map(|a| a.iter().map(|t| t.as_f64().unwrap() as f32).collect()),
        merges: s["merges"].as_array().map(|_| strings(&s["merges"])),
        bos_id: id("bos_id"),
        eos_id: id("eos_id"),
        unk_id: id("unk_id"),
        add_bos: s["add_bos"].as_bool(),
        add_space_prefix: s["add_space_prefix"].as_bool(),
        ..Default::default()
    }
}

/// Gemma's SentencePiece vocabulary (no space prefix) and Qwen's byte-level BPE with the
/// `qwen2` pre-tokenizer, as llama.cpp writes them: the ids and decodes transformers' GGUF
/// loader gives.
#[test]
fn gemma_and_qwen_vocabularies_match_transformers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny_family_tokenizers.json");
    let text = std::fs::read_to_string(&path).expect("tiny_family_tokenizers.json");
    let families: Value = serde_json::from_str(&text).expect("valid JSON");
    let mut failures = Vec::new();
    for family in families.as_array().expect("a list") {
        let arch = family["arch"].as_str().unwrap_or_default();
        let tok = ModelTokenizer::from_gguf(&spec_from_json(&family["spec"]), Path::new(FILE))
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        for case in family["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let ids_with = tok.encode(text, true).unwrap();
            let checks = [
                (
                    "ids",
                    format!("{ids_with:?}"),
                    format!("{:?}", ids(&case["ids"])),
                ),
                (
                    "ids without specials",
                    format!("{:?}", tok.encode(text, false).unwrap()),
                    format!("{:?}", ids(&case["ids_no_special"])),
                ),
                (
                    "decoded",
                    format!("{:?}", tok.decode(&ids_with, false).unwrap()),
                    format!("{:?}", case["decoded"].as_str().unwrap()),
                ),
                (
                    "decoded skipping specials",
                    format!("{:?}", tok.decode(&ids_with, true).unwrap()),
                    format!("{:?}", case["decoded_skip_special"].as_str().unwrap()),
                ),
            ];
            for (what, got, want) in checks {
                if got != want {
                    failures.push(format!(
                        "{arch} {text:?} {what}:\n  ours         {got}\n  transformers {want}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
