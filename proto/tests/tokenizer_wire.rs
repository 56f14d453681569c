//! A tokenizer the router rebuilds from what a shard sent encodes, decodes and renders
//! exactly as the one built from the model's files, for every fixture model: each Hugging
//! Face directory and each GGUF file under `fixtures/`.

use std::path::{Path, PathBuf};

use prost::Message;
use tessera_model_files::ModelFiles;
use tessera_proto::v1 as pb;
use tessera_text::{ChatMessage, ModelTokenizer, TokenizerSource};

const TEXTS: &[&str] = &[
    "Hello, world!",
    "  two leading spaces and a tab\there",
    "ünïcödé 日本語 😀 👩‍👩‍👧",
    "<|im_start|>user\nhi<|im_end|>\n<s> </s> <bos><eos>",
    "{\"a\": [1, 2.5e-3, null]}\n\n",
];

/// Every fixture model: the directories with a `tokenizer.json`, and every `.gguf` file.
fn fixture_models() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let mut models = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("tokenizer.json").is_file() && dir.join("config.json").is_file() {
            models.push(dir.clone());
        }
        if dir.is_dir() {
            for file in std::fs::read_dir(&dir).unwrap() {
                let file = file.unwrap().path();
                if file.extension().is_some_and(|e| e == "gguf") {
                    models.push(file);
                }
            }
        }
    }
    models.sort();
    models
}

/// `source` as bytes from the shard, read back as the router reads them.
fn over_the_wire(source: TokenizerSource) -> TokenizerSource {
    let bytes = pb::TokenizerResponse::from(source).encode_to_vec();
    let response = pb::TokenizerResponse::decode(bytes.as_slice()).unwrap();
    TokenizerSource::try_from(response).unwrap()
}

fn assert_same(model: &Path, rebuilt: &ModelTokenizer, direct: &ModelTokenizer) {
    let name = model.display();
    assert_eq!(
        rebuilt.tokenizer.to_string(false).unwrap(),
        direct.tokenizer.to_string(false).unwrap(),
        "{name}: tokenizer"
    );
    assert_eq!(rebuilt.bos_token, direct.bos_token, "{name}: BOS");
    assert_eq!(
        rebuilt.eos_token_ids, direct.eos_token_ids,
        "{name}: EOS ids"
    );
    assert_eq!(rebuilt.add_bos, direct.add_bos, "{name}: add_bos");
    assert_eq!(rebuilt.token_bytes(), direct.token_bytes(), "{name}: bytes");
    let template = |t: &ModelTokenizer| {
        t.chat_template
            .as_ref()
            .map(|c| (c.source().to_owned(), c.special_tokens()))
    };
    assert_eq!(template(rebuilt), template(direct), "{name}: chat template");

    let mut texts: Vec<String> = TEXTS.iter().map(|t| t.to_string()).collect();
    if let Some(chat) = &direct.chat_template {
        let messages = [ChatMessage::new("user", TEXTS[2])];
        texts.push(chat.render(&messages, true).unwrap());
    }
    for text in &texts {
        for add_special in [false, true] {
            let ids = direct.encode(text, add_special).unwrap();
            assert_eq!(
                rebuilt.encode(text, add_special).unwrap(),
                ids,
                "{name}: encode {text:?}"
            );
            for skip_special in [false, true] {
                assert_eq!(
                    rebuilt.decode(&ids, skip_special).unwrap(),
                    direct.decode(&ids, skip_special).unwrap(),
                    "{name}: decode {ids:?}"
                );
            }
        }
    }
}

#[test]
fn tokenizers_rebuilt_from_the_wire_match_those_built_from_the_files() {
    let models = fixture_models();
    assert!(
        models.iter().any(|m| m.is_dir()) && models.iter().any(|m| m.is_file()),
        "expected fixture directories and GGUF files, found {models:?}"
    );
    for model in models {
        let files = ModelFiles::open(&model).unwrap();
        let source = files.tokenizer_source().unwrap();
        let sent = over_the_wire(source.clone());
        assert_eq!(sent, source, "{}: source", model.display());
        let rebuilt = ModelTokenizer::from_source(&sent).unwrap();
        assert_same(&model, &rebuilt, &files.tokenizer().unwrap());
    }
}
