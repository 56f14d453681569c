//! `ModelTokenizer::from_hf_dir` on directories written here.

use std::path::Path;

use tessera_text::{ChatMessage, GgufTokenizerSpec, ModelTokenizer};

/// A `tokenizer.json` (byte-level BPE) produced by rebuilding a small GGUF spec.
fn tokenizer_json(add_bos: bool) -> String {
    let tokens: Vec<String> = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "h",
        "i",
        "Ġ",
        "hi",
        "Ġhi",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let spec = GgufTokenizerSpec {
        model: "gpt2".into(),
        tokens,
        token_types: Some(vec![3, 3, 3, 1, 1, 1, 1, 1]),
        merges: Some(vec!["h i".into(), "Ġ hi".into()]),
        bos_id: Some(1),
        eos_id: Some(2),
        add_bos: Some(add_bos),
        ..Default::default()
    };
    let tok = ModelTokenizer::from_gguf(&spec, Path::new("spec.gguf")).unwrap();
    tok.tokenizer.to_string(true).unwrap()
}

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn loads_tokenizer_config_and_template() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tokenizer.json", &tokenizer_json(false));
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "lstrip": false, "special": true},
        "chat_template": CHATML,
    });
    write(dir.path(), "tokenizer_config.json", &config.to_string());
    write(
        dir.path(),
        "generation_config.json",
        r#"{"eos_token_id": [2, 0]}"#,
    );
    let tok = ModelTokenizer::from_hf_dir(dir.path(), &[7]).unwrap();
    assert_eq!(tok.bos_token, Some(("<|im_start|>".to_string(), 1)));
    assert_eq!(tok.eos_token_ids, vec![7, 2, 0]);
    assert!(!tok.add_bos);
    assert_eq!(
        tok.encode("<|im_start|>hi hi<|im_end|>", true).unwrap(),
        vec![1, 6, 7, 2]
    );
    assert_eq!(tok.decode(&[1, 6, 7, 2], true).unwrap(), "hi hi");
    let rendered = tok
        .chat_template
        .as_ref()
        .unwrap()
        .render(&[ChatMessage::new("user", "hi")], true)
        .unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn the_post_processor_of_tokenizer_json_wins_over_the_config_flags() {
    // As transformers 5 loads them: beside a tokenizer.json, the config's add_bos_token and
    // add_eos_token are dropped (Qwen3-Embedding's post-processor appends EOS whatever they say).
    let dir = tempfile::tempdir().unwrap();
    for (file_adds_bos, config) in [
        (false, r#""add_bos_token": true"#),
        (true, r#""add_bos_token": false, "add_eos_token": false"#),
    ] {
        write(dir.path(), "tokenizer.json", &tokenizer_json(file_adds_bos));
        write(
            dir.path(),
            "tokenizer_config.json",
            &format!(r#"{{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", {config}}}"#),
        );
        let tok = ModelTokenizer::from_hf_dir(dir.path(), &[]).unwrap();
        assert_eq!(tok.add_bos, file_adds_bos, "{config}");
        let want: &[u32] = if file_adds_bos { &[1, 6] } else { &[6] };
        assert_eq!(tok.encode("hi", true).unwrap(), want, "{config}");
        assert_eq!(tok.encode("hi", false).unwrap(), vec![6]);
        assert_eq!(tok.eos_token_ids, vec![2]);
        assert!(tok.chat_template.is_none());
    }
}

#[test]
fn named_templates_and_chat_template_jinja() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tokenizer.json", &tokenizer_json(true));
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "DEFAULT {{ bos_token }}"},
        ],
    });
    write(dir.path(), "tokenizer_config.json", &config.to_string());
    let tok = ModelTokenizer::from_hf_dir(dir.path(), &[]).unwrap();
    // tokenizer.json's own post-processor adds BOS; the config does not override it.
    assert!(tok.add_bos);
    let render = |tok: &ModelTokenizer| {
        tok.chat_template
            .as_ref()
            .unwrap()
            .render(&[], false)
            .unwrap()
    };
    assert_eq!(render(&tok), "DEFAULT <|im_start|>");

    // transformers 5 writes the template to chat_template.jinja; it wins.
    write(
        dir.path(),
        "chat_template.jinja",
        "JINJA {{ messages | length }}\n",
    );
    let tok = ModelTokenizer::from_hf_dir(dir.path(), &[]).unwrap();
    assert_eq!(render(&tok), "JINJA 0");
}

#[test]
fn missing_or_corrupt_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = ModelTokenizer::from_hf_dir(dir.path(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("missing"),
        "{err}"
    );

    write(
        dir.path(),
        "tokenizer.json",
        "{\"version\": \"1.0\", \"model\": 12",
    );
    let err = ModelTokenizer::from_hf_dir(dir.path(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("not a valid tokenizer.json"),
        "{err}"
    );

    write(dir.path(), "tokenizer.json", &tokenizer_json(false));
    write(dir.path(), "tokenizer_config.json", "{not json");
    let err = ModelTokenizer::from_hf_dir(dir.path(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("not valid JSON"),
        "{err}"
    );

    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"chat_template": "{% if %}"}"#,
    );
    let err = ModelTokenizer::from_hf_dir(dir.path(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("syntax error"),
        "{err}"
    );

    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#,
    );
    let err = ModelTokenizer::from_hf_dir(dir.path(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("default"),
        "{err}"
    );
}

/// The fixture model directories against transformers' `AutoTokenizer`
/// (`text/tests/data/hf_fixture_tokenizer_cases.json`, scripts/make_tokenizer_goldens.py).
#[test]
fn fixture_dirs_match_transformers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text =
        std::fs::read_to_string(root.join("tests/data/hf_fixture_tokenizer_cases.json")).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (name, expected) in golden.as_object().unwrap() {
        let tok = ModelTokenizer::from_hf_dir(&root.join("../fixtures").join(name), &[]).unwrap();
        // fixtures/tiny-qwen2/tokenizer.json splits with GPT-2's regex, but transformers 5 loads
        // it as Qwen2Tokenizer, which replaces the pre-tokenizer with Qwen2's split (digits one
        // by one). Tessera follows tokenizer.json; real Qwen2 tokenizer.json files carry the
        // Qwen2 split themselves, so only this fixture differs.
        let cases = if name == "tiny-qwen2" {
            &[][..]
        } else {
            expected["cases"].as_array().unwrap()
        };
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            let got = tok.encode(text, true).unwrap();
            assert_eq!(got, want, "{name}: encode({text:?})");
            assert_eq!(
                tok.decode(&got, true).unwrap(),
                case["decoded_skip_special"].as_str().unwrap(),
                "{name}: decode({text:?})"
            );
        }
        let template = tok
            .chat_template
            .as_ref()
            .expect("fixture has a chat template");
        for chat in expected["chats"].as_array().unwrap() {
            let messages: Vec<ChatMessage> =
                serde_json::from_value(chat["messages"].clone()).unwrap();
            let generation = chat["add_generation_prompt"].as_bool().unwrap();
            let rendered = template.render(&messages, generation);
            match chat["text"].as_str() {
                Some(want) => assert_eq!(rendered.unwrap(), want, "{name}: chat"),
                None => assert!(rendered.is_err(), "{name}: transformers rejected this chat"),
            }
        }
    }
}
