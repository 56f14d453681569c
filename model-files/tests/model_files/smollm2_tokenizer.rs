//! SmolLM2-135M-Instruct's tokenizer rebuilt from its GGUF, compared with transformers.
//!
//! Needs `${TESSERA_CACHE:-$HOME/.cache/tessera}/SmolLM2-135M-Instruct.Q4_1.gguf`; skips when
//! it is absent unless `TESSERA_REQUIRE_SMOLLM2=1`. Expectations come from
//! `fixtures/smollm2/golden.json` and `model-files/tests/data/smollm2_tokenizer_cases.json`
//! (`scripts/make_tokenizer_goldens.py`).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera_model_files::gguf::GgufFile;
use tessera_text::{ChatMessage, ModelTokenizer};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn model_path() -> Option<PathBuf> {
    let cache = std::env::var_os("TESSERA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/tessera")))?;
    let path = cache.join(MODEL);
    if path.exists() {
        return Some(path);
    }
    if std::env::var("TESSERA_REQUIRE_SMOLLM2").as_deref() == Ok("1") {
        panic!(
            "{} is missing and TESSERA_REQUIRE_SMOLLM2=1",
            path.display()
        );
    }
    eprintln!("skipping: {} not found", path.display());
    None
}

fn load() -> Option<ModelTokenizer> {
    let path = model_path()?;
    let spec = GgufFile::open(&path).unwrap().tokenizer_spec().unwrap();
    Some(ModelTokenizer::from_gguf(&spec, &path).unwrap())
}

fn json(relative: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn special_tokens_match_transformers() {
    let Some(tok) = load() else { return };
    let special = &json("../fixtures/smollm2/golden.json")["special"];
    assert_eq!(tok.bos_token, Some(("<|im_start|>".to_string(), 1)));
    assert_eq!(special["bos_token_id"], 1);
    assert_eq!(
        tok.eos_token_ids[0],
        special["eos_token_id"].as_u64().unwrap() as u32
    );
    assert!(
        tok.eos_token_ids.contains(&0),
        "<|endoftext|> also ends generation"
    );
    assert_eq!(tok.add_bos, special["add_bos_token"].as_bool().unwrap());
    assert_eq!(tok.vocab_size(), 49152);
}

#[test]
fn ids_match_transformers() {
    let Some(tok) = load() else { return };
    let mut checked = 0;
    for case in json("../fixtures/smollm2/golden.json")["tokenizer_cases"]
        .as_array()
        .unwrap()
    {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&case["ids"]),
            "encode({text:?})"
        );
        checked += 1;
    }
    for case in json("tests/data/smollm2_tokenizer_cases.json")["cases"]
        .as_array()
        .unwrap()
    {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, ids(&case["ids"]), "encode({text:?})");
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
        checked += 1;
    }
    assert!(checked > 60, "{checked} cases");
}

#[test]
fn chat_template_matches_transformers() {
    let Some(tok) = load() else { return };
    let template = tok
        .chat_template
        .as_ref()
        .expect("the GGUF has a chat template");
    let chat = &json("../fixtures/smollm2/golden.json")["chat"];
    let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
    let text = template.render(&messages, true).unwrap();
    assert_eq!(text, chat["prompt_text"].as_str().unwrap());
    assert_eq!(tok.encode(&text, true).unwrap(), ids(&chat["prompt_ids"]));

    for case in json("tests/data/smollm2_tokenizer_cases.json")["chats"]
        .as_array()
        .unwrap()
    {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let generation = case["add_generation_prompt"].as_bool().unwrap();
        assert_eq!(
            template.render(&messages, generation).unwrap(),
            case["text"].as_str().unwrap()
        );
    }
}

/// Every text token's bytes, joined, give back the text (what JSON mode's byte-level
/// constraint relies on); `<|im_end|>` and the other control tokens have none.
#[test]
fn token_bytes_join_to_the_text() {
    let Some(tok) = load() else { return };
    let bytes = tok.token_bytes();
    assert_eq!(bytes.len(), tok.vocab_size());
    let text = "{\"name\": \"Zoë\", \"tags\": [\"a\\\"b\", null], \"n\": -1.5e+3}\n\t 日本";
    let ids = tok.encode(text, false).unwrap();
    let joined: Vec<u8> = ids
        .iter()
        .flat_map(|&id| bytes[id as usize].clone().unwrap())
        .collect();
    assert_eq!(String::from_utf8(joined).unwrap(), text);
    for &eos in &tok.eos_token_ids {
        assert_eq!(bytes[eos as usize], None);
    }
    let text_tokens = bytes.iter().filter(|b| b.is_some()).count();
    assert!(text_tokens > 49_000, "{text_tokens} text tokens");
}
