//! The bodies of Tessera's fuzz targets, one function per target, so that the
//! libFuzzer binaries in `fuzz_targets/` stay one line each and the same code can be
//! replayed over the committed corpora.
//!
//! Every function takes arbitrary bytes and must neither panic, nor hang, nor allocate
//! without bound; where a stronger property holds (a tokenizer round trip, a streaming
//! decoder that agrees with a one-shot decode, no 5xx on a request body) it is asserted.
//!
//! Run them with `scripts/fuzz.sh` (see `fuzz/README.md`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tessera_model_files::{ModelConfig, ModelFiles};
use tessera_text::{ChatMessage, ChatTemplate, ModelTokenizer};

/// `fixtures/<name>` of the repository.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}

/// The fixtures' tokenizers (byte-level BPE), loaded once.
fn tokenizers() -> &'static [Arc<ModelTokenizer>] {
    static TOKENIZERS: OnceLock<Vec<Arc<ModelTokenizer>>> = OnceLock::new();
    TOKENIZERS.get_or_init(|| {
        ["tiny-llama", "tiny-qwen2", "tiny-mistral"]
            .iter()
            .map(|m| {
                Arc::new(
                    ModelTokenizer::from_hf_dir(&fixture(m), &[])
                        .unwrap_or_else(|e| panic!("fixture tokenizer {m}: {e}")),
                )
            })
            .collect()
    })
}

/// Writes `data` to a fresh temporary file named `name` in a fresh folder.
fn temp_file(name: &str, data: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(data).expect("write");
    (dir, path)
}

/// Largest tensor (in elements) the targets convert, so a header that declares a huge
/// (but in-bounds, e.g. zero-byte-typed) tensor does not make a run slow.
const MAX_ELEMENTS: usize = 1 << 20;

/// `gguf`: a GGUF file of arbitrary bytes is opened, its config and tokenizer spec derived,
/// and each of its (small) tensors converted to f32. Errors are fine; panics are not.
pub fn gguf(data: &[u8]) {
    let (_dir, path) = temp_file("model.gguf", data);
    let Ok(file) = tessera_model_files::gguf::GgufFile::open(&path) else {
        return;
    };
    let _ = file.architecture();
    for (key, value) in file.metadata_entries() {
        std::hint::black_box((key, value));
    }
    let _ = file.model_config();
    if let Ok(spec) = file.tokenizer_spec() {
        let _ = ModelTokenizer::from_gguf(&spec, &path);
    }
    let names: Vec<String> = file
        .tensors()
        .iter()
        .filter(|t| t.elements() <= MAX_ELEMENTS)
        .map(|t| t.name.clone())
        .collect();
    for name in names {
        let _ = file.load_gguf_f32(&name);
    }
    if let Ok(files) = ModelFiles::open(&path) {
        load_known(&files);
    }
}

/// Loads the tensors a Llama-family engine asks for first, when they are small.
fn load_known(files: &ModelFiles) {
    for name in [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.mlp.down_proj.weight",
    ] {
        if let Ok(shape) = files.weights.shape(name)
            && shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_some_and(|n| n <= MAX_ELEMENTS)
        {
            let _ = files.weights.load_f32(name);
        }
    }
}

/// `safetensors_config`: the input is `u16 LE config length | config.json | safetensors
/// bytes`. The config is parsed on its own, then the pair is opened as a model folder and
/// its usual tensors loaded.
pub fn safetensors_config(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let n = usize::from(u16::from_le_bytes([data[0], data[1]])).min(data.len() - 2);
    let (config, weights) = data[2..].split_at(n);
    if let Ok(text) = std::str::from_utf8(config) {
        let _ = ModelConfig::from_hf_json(text);
    }
    let (dir, _) = temp_file("config.json", config);
    std::fs::write(dir.path().join("model.safetensors"), weights).expect("write");
    if let Ok(files) = ModelFiles::open(dir.path()) {
        load_known(&files);
    }
}

/// `tokenizer_roundtrip`: any text (invalid UTF-8 replaced) encodes and decodes back to
/// itself with every fixture tokenizer (all byte-level BPE without a normalizer), with and
/// without special tokens added.
pub fn tokenizer_roundtrip(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for tok in tokenizers() {
        let ids = tok.encode(&text, false).expect("encode");
        assert!(
            ids.iter().all(|&id| (id as usize) < tok.vocab_size()),
            "id out of vocabulary"
        );
        let back = tok.decode(&ids, false).expect("decode");
        assert_eq!(back, text, "round trip of {text:?} through {ids:?}");
        let with_special = tok.encode(&text, true).expect("encode with special tokens");
        let back = tok.decode(&with_special, true).expect("decode");
        assert_eq!(back, text, "round trip (special) of {text:?}");
    }
}

/// `detokenizer`: the input is `flags | prompt length | u16 LE ids…`. The ids (some out of
/// the vocabulary) are streamed through the router's `IncrementalDecoder`; nothing panics,
/// and when every id is valid and the one-shot decode has no incomplete character, the
/// streamed text equals it.
pub fn detokenizer(data: &[u8]) {
    let [flags, prompt_len, rest @ ..] = data else {
        return;
    };
    let tok = &tokenizers()[usize::from(flags & 3) % tokenizers().len()];
    let skip_special = flags & 4 != 0;
    // 1 in 64 ids falls outside the vocabulary.
    let vocab = tok.vocab_size() as u32;
    let ids: Vec<u32> = rest
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])) % (vocab + vocab / 64 + 1))
        .collect();
    let split = usize::from(*prompt_len).min(ids.len());
    let (prompt, generated) = ids.split_at(split);
    let mut decoder = tessera_router::IncrementalDecoder::new(tok.clone(), prompt, skip_special);
    let mut streamed = String::new();
    for &id in generated {
        match decoder.push(id) {
            Ok(t) => streamed.push_str(&t),
            Err(_) => return,
        }
    }
    match decoder.finish() {
        Ok(t) => streamed.push_str(&t),
        Err(_) => return,
    }
    if prompt.is_empty()
        && let Ok(whole) = tok.decode(generated, skip_special)
        && !whole.contains(char::REPLACEMENT_CHARACTER)
    {
        assert_eq!(streamed, whole, "streamed decode of {generated:?}");
    }
}

/// The fixtures' chat templates, compiled once, with the tokenizers' own templates.
fn templates() -> &'static [ChatTemplate] {
    static TEMPLATES: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        let mut out = Vec::new();
        for m in ["tiny-llama", "tiny-qwen2", "tiny-mistral"] {
            let source = std::fs::read_to_string(fixture(m).join("chat_template.jinja"))
                .expect("chat_template.jinja");
            out.push(
                ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into()))
                    .expect("fixture template"),
            );
        }
        // A template in the style of the real models' (system prompt handling, role
        // checks with raise_exception, tojson, loop controls).
        let zephyr = "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' ~ message['role']) }}{% endif %}<|{{ message['role'] }}|>\n{{ message['content'] | trim }}{{ eos_token }}\n{% if loop.last and add_generation_prompt %}<|assistant|>\n{% endif %}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}";
        out.push(ChatTemplate::new(zephyr.into(), None, Some("</s>".into())).expect("zephyr"));
        out
    })
}

/// `chat_template`: hostile conversations (any roles, contents with template syntax,
/// control characters, invalid UTF-8 replaced, many messages) rendered by every template.
/// The input is `flags | role \0 content \0 role \0 content …`; a last odd piece is taken as
/// a JSON `tools` value. Errors are fine; panics are not, and the output never re-expands
/// the template syntax a message carries.
pub fn chat_template(data: &[u8]) {
    let [flags, rest @ ..] = data else {
        return;
    };
    let pieces: Vec<String> = rest
        .split(|&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let messages: Vec<ChatMessage> = pieces
        .chunks_exact(2)
        .map(|p| ChatMessage::new(p[0].clone(), p[1].clone()))
        .collect();
    let tools = (pieces.len() % 2 == 1)
        .then(|| {
            serde_json::from_str::<serde_json::Value>(pieces.last().unwrap_or(&String::new())).ok()
        })
        .flatten();
    for template in templates() {
        let options = tessera_text::RenderOptions {
            add_generation_prompt: flags & 1 != 0,
            tools: tools.as_ref(),
            extra: None,
        };
        let rendered = template.render_with(&messages, &options);
        if let Ok(text) = rendered {
            // Every message's content appears verbatim (templates do not evaluate it) —
            // checked loosely: the rendered text is at least as long as the longest
            // content after trimming.
            let longest = messages
                .iter()
                .map(|m| m.content.trim().len())
                .max()
                .unwrap_or(0);
            assert!(text.len() >= longest, "rendered text lost a message");
        }
    }
}

/// The routes that take a body, in the order `http_bodies`' first byte picks them.
const ROUTES: [&str; 6] = [
    "/",
    "/generate",
    "/generate_stream",
    "/tokenize",
    "/v1/chat/completions",
    "/v1/completions",
];

/// The router app over a fake batcher that answers every request with one token, and a
/// runtime to drive it.
fn http_app() -> &'static (tokio::runtime::Runtime, axum::Router) {
    static APP: OnceLock<(tokio::runtime::Runtime, axum::Router)> = OnceLock::new();
    APP.get_or_init(|| {
        use tessera_router::{
            AppState, FinishReason, GeneratedText, Infer, InferStreamResponse, ModelInfo, Token,
            ValidationConfig,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (queue, mut entries) = tokio::sync::mpsc::channel::<tessera_router::Entry>(64);
        runtime.spawn(async move {
            while let Some(entry) = entries.recv().await {
                let now = std::time::Instant::now();
                let token = Token {
                    id: 42,
                    text: "x".into(),
                    logprob: -0.5,
                    special: false,
                    piece: "x".into(),
                };
                let _ = entry.response_tx.send(Ok(InferStreamResponse::End {
                    token,
                    top_tokens: Vec::new(),
                    generated_text: GeneratedText {
                        text: "x".into(),
                        generated_tokens: 1,
                        finish_reason: FinishReason::Length,
                        stop_sequence: None,
                        seed: None,
                        accepted_per_step: Vec::new(),
                    },
                    queued: entry.queued,
                    start: now,
                }));
            }
        });
        let state = AppState::builder(Infer::new(queue, 64), tokenizers()[0].clone(), "tiny-llama")
            .validation(ValidationConfig {
                max_input_tokens: 200,
                max_total_tokens: 256,
                ..Default::default()
            })
            .info(ModelInfo {
                model_id: "fixtures/tiny-llama".into(),
                ..Default::default()
            })
            .build();
        (runtime, tessera_router::app(state))
    })
}

/// `http_bodies`: the input is `route index | body`. The body (any bytes: JSON of any
/// shape, huge numbers, deep nesting, invalid UTF-8, control characters) is POSTed to the
/// route through the real axum app; the answer must come within 10 s, never be a 5xx, and
/// be JSON unless it is a 200 stream.
pub fn http_bodies(data: &[u8]) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let [route, body @ ..] = data else {
        return;
    };
    let path = ROUTES[usize::from(*route) % ROUTES.len()];
    let (runtime, app) = http_app();
    let request = axum::http::Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_vec()))
        .expect("request");
    runtime.block_on(async {
        let answer = tokio::time::timeout(Duration::from_secs(10), async {
            let response = app.clone().oneshot(request).await.expect("infallible");
            let status = response.status();
            let sse = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let bytes = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (status, sse, bytes)
        })
        .await;
        let Ok((status, sse, bytes)) = answer else {
            panic!("POST {path} did not answer within 10 s");
        };
        assert!(
            !status.is_server_error(),
            "POST {path} answered {status}: {}",
            String::from_utf8_lossy(&bytes)
        );
        if sse {
            // Every event of a stream is JSON (or OpenAI's `[DONE]`).
            let text = String::from_utf8_lossy(&bytes);
            for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
                let data = data.trim();
                assert!(
                    data == "[DONE]" || serde_json::from_str::<serde_json::Value>(data).is_ok(),
                    "POST {path}: SSE data that is not JSON: {data:?}"
                );
            }
        } else {
            assert!(
                serde_json::from_slice::<serde_json::Value>(&bytes).is_ok(),
                "POST {path} answered {status} with a body that is not JSON: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
    });
}
