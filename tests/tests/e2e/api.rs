//! Every route of the router, streaming and not, with the answers' shapes checked field by
//! field; streaming detokenization; stop sequences. One server (tiny-llama, default dtype)
//! shared by independent checks.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_e2e::{Checks, Server, detail_ids, within};

const CHECK_LIMIT: Duration = Duration::from_secs(60);
const MODEL: &str = "tiny-llama";

fn assert_token(t: &Value, what: &str) {
    let id = t["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: id in {t}"));
    assert!(id < 512, "{what}: id {id} outside the vocabulary");
    assert!(t["text"].is_string(), "{what}: text in {t}");
    let lp = t["logprob"]
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: logprob in {t}"));
    assert!(lp <= 1e-6, "{what}: logprob {lp} > 0");
    assert!(t["special"].is_boolean(), "{what}: special in {t}");
    assert_eq!(
        t.as_object().map(|o| o.len()),
        Some(4),
        "{what}: fields of {t}"
    );
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("header {name} missing"))
        .to_str()
        .expect("ascii header")
}

async fn native_generate(s: &Server) {
    let inputs = "The capital of France is";
    let prompt_ids = s.tokenize(inputs).await;
    let body = json!({"inputs": inputs, "parameters": {
        "max_new_tokens": 8, "details": true, "top_n_tokens": 3,
        "decoder_input_details": true, "ignore_eos": true}});
    let r = s
        .client()
        .post(s.url("/generate"))
        .json(&body)
        .send()
        .await
        .expect("POST /generate");
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "application/json");
    assert_eq!(header(&r, "x-compute-type"), "tessera");
    assert_eq!(header(&r, "x-prompt-tokens"), prompt_ids.len().to_string());
    assert_eq!(header(&r, "x-generated-tokens"), "8");
    for h in [
        "x-total-time",
        "x-queue-time",
        "x-inference-time",
        "x-time-per-token",
    ] {
        header(&r, h).parse::<u64>().expect(h);
    }
    let v: Value = r.json().await.expect("JSON body");
    // Sorted: whether serde_json preserves key order depends on workspace feature unification.
    let mut keys: Vec<&String> = v.as_object().expect("object").keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        ["details", "generated_text"],
        "top-level fields of {v}"
    );
    let text = v["generated_text"].as_str().expect("generated_text");
    let d = &v["details"];
    assert_eq!(d["finish_reason"], "length");
    assert_eq!(d["generated_tokens"], 8);
    assert_eq!(d["seed"], Value::Null, "greedy has no seed");
    // Prefill: one entry per prompt token, the first without a logprob.
    let prefill = d["prefill"].as_array().expect("prefill");
    let prefill_ids: Vec<u64> = prefill
        .iter()
        .map(|p| p["id"].as_u64().expect("id"))
        .collect();
    assert_eq!(prefill_ids, prompt_ids, "prefill ids are the prompt's");
    assert_eq!(
        prefill[0]["logprob"],
        Value::Null,
        "first prompt token has no logprob"
    );
    for p in &prefill[1..] {
        let lp = p["logprob"]
            .as_f64()
            .unwrap_or_else(|| panic!("prefill logprob in {p}"));
        assert!(lp <= 1e-6, "prefill logprob {lp}");
        assert!(p["text"].is_string());
    }
    let prefill_text: String = prefill
        .iter()
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert_eq!(prefill_text, inputs, "prefill texts spell the prompt");
    // Tokens and their top-n alternatives; greedy picks the most likely one.
    let tokens = d["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 8);
    let top = d["top_tokens"].as_array().expect("top_tokens");
    assert_eq!(top.len(), 8, "one top_tokens list per token");
    for (i, (t, alts)) in tokens.iter().zip(top).enumerate() {
        assert_token(t, &format!("tokens[{i}]"));
        let alts = alts.as_array().expect("top_tokens[i]");
        assert_eq!(alts.len(), 3, "top_n_tokens = 3 at {i}");
        for (j, a) in alts.iter().enumerate() {
            assert_token(a, &format!("top_tokens[{i}][{j}]"));
        }
        let lps: Vec<f64> = alts
            .iter()
            .map(|a| a["logprob"].as_f64().unwrap())
            .collect();
        assert!(
            lps.windows(2).all(|w| w[0] >= w[1]),
            "top_tokens[{i}] sorted: {lps:?}"
        );
        assert_eq!(alts[0]["id"], t["id"], "greedy token is the top-1 at {i}");
        let diff = (lps[0] - t["logprob"].as_f64().unwrap()).abs();
        assert!(diff < 1e-4, "top-1 logprob equals the token's at {i}");
    }
    let joined: String = tokens.iter().map(|t| t["text"].as_str().unwrap()).collect();
    assert_eq!(joined, text, "token texts spell generated_text");

    // Without details: only generated_text. With return_full_text: the prompt first.
    let (status, plain) = s
        .post(
            "/generate",
            &json!({"inputs": inputs, "parameters": {"max_new_tokens": 8, "ignore_eos": true}}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(plain, json!({"generated_text": text}));
    let full = s
        .generate(&json!({"inputs": inputs, "parameters": {
            "max_new_tokens": 8, "ignore_eos": true, "return_full_text": true}}))
        .await;
    assert_eq!(full["generated_text"], format!("{inputs}{text}"));
}

async fn native_stream(s: &Server) {
    let inputs = "Once upon a time";
    let prompt_len = s.tokenize(inputs).await.len();
    let params = json!({"max_new_tokens": 10, "ignore_eos": true, "top_n_tokens": 2});
    let reference = s
        .generate(&json!({"inputs": inputs, "parameters": {"max_new_tokens": 10, "ignore_eos": true, "details": true}}))
        .await;
    let r = s
        .client()
        .post(s.url("/generate_stream"))
        .json(&json!({"inputs": inputs, "parameters": params}))
        .send()
        .await
        .expect("POST /generate_stream");
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    let (events, done) = tessera_e2e::Sse::new(r).collect_json().await;
    assert!(!done, "the native stream has no [DONE]");
    assert_eq!(events.len(), 10, "one event per token: {events:?}");
    for (i, e) in events.iter().enumerate() {
        let mut keys: Vec<&String> = e.as_object().expect("event object").keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            ["details", "generated_text", "index", "token", "top_tokens"],
            "fields of event {i}"
        );
        assert_eq!(e["index"], i + 1, "1-based index");
        assert_token(&e["token"], &format!("event {i} token"));
        let alts = e["top_tokens"].as_array().expect("top_tokens");
        assert_eq!(alts.len(), 2, "top_n_tokens = 2 at event {i}");
        assert_eq!(alts[0]["id"], e["token"]["id"]);
        if i + 1 < events.len() {
            assert_eq!(e["generated_text"], Value::Null, "event {i}");
            assert_eq!(e["details"], Value::Null, "event {i}");
        }
    }
    let last = events.last().unwrap();
    assert_eq!(last["generated_text"], reference["generated_text"]);
    assert_eq!(
        last["details"],
        json!({"finish_reason": "length", "generated_tokens": 10, "seed": null, "input_length": prompt_len})
    );
    let ids: Vec<u64> = events
        .iter()
        .map(|e| e["token"]["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, detail_ids(&reference), "stream and /generate agree");
}

async fn tokenize(s: &Server) {
    let inputs = "Hello world, héllo wörld!";
    let (status, v) = s.post("/tokenize", &json!({"inputs": inputs})).await;
    assert_eq!(status, 200);
    let tokens = v.as_array().expect("array");
    assert!(!tokens.is_empty());
    let mut end = 0;
    for t in tokens {
        assert_eq!(t.as_object().map(|o| o.len()), Some(4), "fields of {t}");
        assert!(t["id"].as_u64().expect("id") < 512);
        let (start, stop) = (
            t["start"].as_u64().unwrap() as usize,
            t["stop"].as_u64().unwrap() as usize,
        );
        assert!(start <= stop && stop <= inputs.len(), "offsets of {t}");
        if start >= end {
            assert_eq!(start, end, "offsets are contiguous: {v}");
        }
        end = end.max(stop);
        if inputs.is_char_boundary(start) && inputs.is_char_boundary(stop) {
            assert_eq!(t["text"], inputs[start..stop], "text of {t}");
        }
    }
    assert_eq!(end, inputs.len(), "offsets cover the input");
}

async fn info(s: &Server) {
    let (status, v) = s.get("/info").await;
    assert_eq!(status, 200);
    let fields = [
        "model_id",
        "model_sha",
        "model_dtype",
        "model_device_type",
        "served_model_name",
        "max_concurrent_requests",
        "max_best_of",
        "max_stop_sequences",
        "max_input_tokens",
        "max_total_tokens",
        "max_top_n_tokens",
        "max_batch_total_tokens",
        "max_batch_prefill_tokens",
        "router",
        "version",
        "sha",
        "docker_label",
    ];
    let mut keys: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort_unstable();
    let mut expected = fields.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert!(v["model_id"].as_str().unwrap().ends_with(MODEL), "{v}");
    assert_eq!(v["served_model_name"], MODEL);
    assert_eq!(v["model_device_type"], "cpu");
    assert!(v["model_dtype"].is_string());
    assert_eq!(v["router"], "tessera-router");
    assert!(v["version"].is_string());
    assert_eq!(v["max_concurrent_requests"], 128);
    assert_eq!(v["max_stop_sequences"], 4);
    assert_eq!(v["max_top_n_tokens"], 5);
    assert_eq!(v["max_best_of"], 8);
    assert_eq!(
        v["max_total_tokens"], 256,
        "the model's max_position_embeddings"
    );
    let max_input = v["max_input_tokens"].as_u64().unwrap();
    assert!(max_input > 0 && max_input < 256);
    assert!(v["max_batch_total_tokens"].as_u64().unwrap() > 0);
    assert!(v["max_batch_prefill_tokens"].as_u64().unwrap() > 0);
}

async fn health(s: &Server) {
    let (status, v) = s.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(v, json!({"status": "ok"}));
}

async fn metrics(s: &Server) {
    // At least one request has run before this check (see the order below).
    s.generate(&json!({"inputs": "x", "parameters": {"max_new_tokens": 2}}))
        .await;
    let r = s
        .client()
        .get(s.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/plain"));
    let text = r.text().await.expect("text");
    for series in [
        "tessera_requests_total",
        "tessera_request_success_total",
        "tessera_kv_blocks_used",
        "tessera_kv_blocks_capacity",
        "tessera_queue_requests",
        "tessera_running_requests",
    ] {
        assert!(
            tessera_e2e::metric_value(&text, series).is_some(),
            "{series} missing from /metrics:\n{text}"
        );
    }
    assert!(text.contains("# TYPE tessera_kv_blocks_used gauge"));
    assert!(tessera_e2e::metric_value(&text, "tessera_kv_blocks_capacity").unwrap() > 0.0);
    assert!(tessera_e2e::metric_value(&text, "tessera_request_success_total").unwrap() >= 1.0);
    assert!(
        text.lines()
            .any(|l| l.starts_with("tessera_request_duration_seconds")),
        "request duration histogram"
    );
}

async fn models(s: &Server) {
    let (status, v) = s.get("/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 1);
    let m = &data[0];
    assert_eq!(m["id"], MODEL);
    assert_eq!(m["object"], "model");
    assert_eq!(m["owned_by"], "tessera");
    assert!(m["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(m["max_model_len"], 256);
}

fn chat_body(stream: bool, include_usage: Option<bool>) -> Value {
    let mut b = json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": stream,
    });
    if let Some(u) = include_usage {
        b["stream_options"] = json!({"include_usage": u});
    }
    b
}

async fn chat(s: &Server) {
    let template = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n";
    let prompt_tokens = s.tokenize(template).await.len();
    let mut body = chat_body(false, None);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["model"], MODEL);
    assert!(v["system_fingerprint"].is_string());
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 1);
    let c = &choices[0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    let content = c["message"]["content"].as_str().expect("content");
    assert_eq!(c["finish_reason"], "length");
    let lp = c["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content");
    assert_eq!(lp.len(), 12);
    let mut top1_mismatches = Vec::new();
    for l in lp {
        assert!(l["token"].is_string() && l["logprob"].as_f64().unwrap() <= 1e-6);
        assert_eq!(
            l["bytes"].as_array().unwrap().len(),
            l["token"].as_str().unwrap().len()
        );
        assert_eq!(l["top_logprobs"].as_array().unwrap().len(), 2);
        let top1 = &l["top_logprobs"][0];
        assert!((top1["logprob"].as_f64().unwrap() - l["logprob"].as_f64().unwrap()).abs() < 1e-4);
        // Greedy: the chosen token is the top-1 alternative, so their strings must agree.
        if top1["token"] != l["token"] {
            top1_mismatches.push(format!("token {} vs top-1 {}", l["token"], top1["token"]));
        }
    }
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": 12, "total_tokens": prompt_tokens + 12}),
        "usage (prompt counted through the ChatML template)"
    );
    // The same greedy output through the native API on the templated prompt.
    let native = s
        .generate(
            &json!({"inputs": template, "parameters": {"max_new_tokens": 12, "ignore_eos": true}}),
        )
        .await;
    assert_eq!(
        native["generated_text"], content,
        "chat = native on the rendered template"
    );

    // Streamed, with usage.
    let sse = s
        .stream("/v1/chat/completions", &chat_body(true, Some(true)))
        .await;
    let (chunks, done) = sse.collect_json().await;
    assert!(done, "the chat stream ends with [DONE]");
    let id = chunks[0]["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("chatcmpl-"));
    for c in &chunks {
        assert_eq!(c["id"], id.as_str(), "same id on every chunk");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], MODEL);
        assert!(c["created"].is_u64() && c["system_fingerprint"].is_string());
        assert!(
            c.get("usage").is_some(),
            "include_usage: usage on every chunk: {c}"
        );
    }
    let first = &chunks[0];
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(first["usage"], Value::Null);
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(
        usage_chunk["usage"],
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": 12, "total_tokens": prompt_tokens + 12})
    );
    let finish = rest.last().unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["usage"], Value::Null);
    let mut streamed = String::new();
    for c in &rest[..rest.len() - 1] {
        assert_eq!(c["choices"].as_array().unwrap().len(), 1);
        assert_eq!(c["choices"][0]["index"], 0);
        assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
        streamed.push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(
        streamed, content,
        "streamed deltas spell the non-streamed content"
    );

    // Streamed without usage: no usage field at all.
    let sse = s
        .stream("/v1/chat/completions", &chat_body(true, None))
        .await;
    let (chunks, done) = sse.collect_json().await;
    assert!(done);
    for c in &chunks {
        assert!(
            c.get("usage").is_none(),
            "no usage without include_usage: {c}"
        );
        assert_eq!(c["choices"].as_array().unwrap().len(), 1);
    }
    assert!(
        top1_mismatches.is_empty(),
        "chat logprobs: `token` of a generated token is not the token's string (its top-1 \
         alternative has the same logprob but another string): {top1_mismatches:?}"
    );
}

/// `response_format: json_object` reaches the shard: even this random model's output is
/// blanks and then an object (whole when it stopped), never free text; `guided_choice` makes it
/// one of the choices, `guided_regex` (and TGI's regex grammar) a whole match.
async fn constrained_output(s: &Server) {
    for seed in 0..3 {
        let body = json!({"model": MODEL, "max_tokens": 24, "seed": seed, "temperature": 1.0,
            "response_format": {"type": "json_object"},
            "messages": [{"role": "user", "content": "Answer in JSON."}]});
        let (status, v) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        let content = c["message"]["content"].as_str().expect("content");
        let start = content.trim_start();
        assert!(
            start.is_empty() || start.starts_with('{'),
            "seed {seed}: {content:?}"
        );
        if c["finish_reason"] == "stop" {
            let parsed: Value = serde_json::from_str(content).expect("a whole object");
            assert!(parsed.is_object(), "{parsed}");
        }
    }
    // vLLM's guided_choice: exactly one of the strings, then the end.
    let choices = ["alpha", "beta gamma"];
    for seed in 0..3 {
        let body = json!({"model": MODEL, "max_tokens": 16, "seed": seed, "temperature": 1.0,
            "guided_choice": choices,
            "messages": [{"role": "user", "content": "Pick one."}]});
        let (status, v) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        let content = c["message"]["content"].as_str().expect("content");
        assert!(choices.contains(&content), "seed {seed}: {content:?}");
        assert_eq!(c["finish_reason"], "stop", "seed {seed}");
    }
    // guided_regex, and TGI's regex grammar on /generate: a whole match, then the end.
    let matches =
        |t: &str| (2..=4).contains(&t.len()) && t.bytes().all(|b| (b'a'..=b'c').contains(&b));
    for seed in 0..3 {
        let body = json!({"model": MODEL, "max_tokens": 16, "seed": seed, "temperature": 1.0,
            "guided_regex": "[a-c]{2,4}", "prompt": "Letters:"});
        let (status, v) = s.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        let text = v["choices"][0]["text"].as_str().expect("text");
        assert!(matches(text), "seed {seed}: {text:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "seed {seed}");
    }
    let body = json!({"inputs": "Letters:", "parameters": {"max_new_tokens": 16,
        "do_sample": true, "seed": 4, "grammar": {"type": "regex", "value": "[a-c]{2,4}"}}});
    let (status, v) = s.post("/generate", &body).await;
    assert_eq!(status, 200, "{v}");
    let text = v["generated_text"].as_str().expect("generated_text");
    assert!(matches(text), "/generate: {text:?}");
}

async fn completions(s: &Server) {
    let prompts = ["The", "Once upon a time"];
    let mut prompt_tokens = 0;
    let mut native = Vec::new();
    for p in prompts {
        prompt_tokens += s.tokenize(p).await.len();
        let v = s
            .generate(
                &json!({"inputs": p, "parameters": {"max_new_tokens": 6, "ignore_eos": true}}),
            )
            .await;
        native.push(v["generated_text"].as_str().unwrap().to_owned());
    }
    let body = json!({"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 6,
                      "temperature": 0, "ignore_eos": true});
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["created"].is_u64() && v["system_fingerprint"].is_string());
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4, "2 prompts x n=2");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(
            c["text"],
            native[i / 2],
            "choice {i} (prompt {}) is greedy",
            i / 2
        );
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(c["logprobs"], Value::Null);
    }
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": 24, "total_tokens": prompt_tokens + 24})
    );

    // Streamed, with usage: per-index texts spell the same choices.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let (chunks, done) = s
        .stream("/v1/completions", &sbody)
        .await
        .collect_json()
        .await;
    assert!(done);
    let mut texts = vec![String::new(); 4];
    let mut finished = [0; 4];
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    for c in rest {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["usage"], Value::Null);
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        texts[i].push_str(choice["text"].as_str().unwrap());
        if !choice["finish_reason"].is_null() {
            assert_eq!(choice["finish_reason"], "length");
            finished[i] += 1;
        }
    }
    assert_eq!(finished, [1; 4], "one finish_reason per choice");
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(t, &native[i / 2], "streamed choice {i}");
    }
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], v["usage"]);
}

/// The concatenated token texts of a stream equal its final generated_text, for several
/// prompts (the tiny model emits many byte tokens that are not whole characters).
async fn stream_detokenization(s: &Server) {
    let prompts = [
        "The",
        "Once upon a time",
        "The capital of France is Paris. Every morning the",
        "Attention lets every position look at earlier positions, and",
        "naïve café — 東京 🚀",
        "\n\n  spaces   and\ttabs",
    ];
    let decoder = tessera_e2e::ByteLevelDecoder::for_fixture(MODEL);
    let mut byte_tokens = 0;
    for p in prompts {
        let body = json!({"inputs": p, "parameters": {"max_new_tokens": 60, "ignore_eos": true}});
        let (events, _) = s
            .stream("/generate_stream", &body)
            .await
            .collect_json()
            .await;
        let joined: String = events
            .iter()
            .map(|e| e["token"]["text"].as_str().unwrap())
            .collect();
        let last = events.last().expect("events");
        assert_eq!(events.len(), 60, "{p:?}");
        assert_eq!(
            last["generated_text"].as_str().unwrap(),
            joined,
            "prompt {p:?}: streamed texts do not spell generated_text"
        );
        // The random model emits invalid UTF-8 too; the text must be what decoding all
        // the ids at once gives.
        let ids: Vec<u64> = events
            .iter()
            .map(|e| e["token"]["id"].as_u64().unwrap())
            .collect();
        assert_eq!(
            joined,
            decoder.decode(&ids),
            "prompt {p:?}: streamed text differs from decoding the ids {ids:?}"
        );
        byte_tokens += events.iter().filter(|e| e["token"]["text"] == "").count();
        // And /generate gives the same text.
        let v = s.generate(&body).await;
        assert_eq!(v["generated_text"], last["generated_text"], "prompt {p:?}");
    }
    eprintln!("stream_detokenization: {byte_tokens} events with empty text (partial characters)");
}

/// A stop string spanning a token boundary of a known greedy output: the output ends just
/// before it (native: `stop_sequence`; OpenAI: `stop`), streamed and not.
async fn stop_sequences(s: &Server) {
    let inputs = "Once upon a time";
    let body = json!({"inputs": inputs, "parameters": {"max_new_tokens": 30, "ignore_eos": true}});
    let (events, _) = s
        .stream("/generate_stream", &body)
        .await
        .collect_json()
        .await;
    let texts: Vec<String> = events
        .iter()
        .map(|e| e["token"]["text"].as_str().unwrap().to_owned())
        .collect();
    let full: String = texts.concat();
    // Token k (k >= 3) and k+1 both non-empty: stop = last char of k + first char of k+1.
    let k = (3..texts.len() - 2)
        .find(|&k| {
            !texts[k].is_empty()
                && !texts[k + 1].is_empty()
                && !texts[k].contains('\u{FFFD}')
                && !texts[k + 1].contains('\u{FFFD}')
        })
        .expect("two consecutive tokens with text");
    let stop = format!(
        "{}{}",
        texts[k].chars().last().unwrap(),
        texts[k + 1].chars().next().unwrap()
    );
    let at = full.find(&stop).expect("the stop string is in the text");
    let expected = &full[..at];
    // The token that completes the first occurrence ends the generation.
    let stop_end = at + stop.len();
    let mut end = 0;
    let mut tokens_needed = 0;
    for (i, t) in texts.iter().enumerate() {
        end += t.len();
        if end >= stop_end {
            tokens_needed = i + 1;
            break;
        }
    }
    let params = json!({"max_new_tokens": 30, "ignore_eos": true, "stop": ["zzzz-not-there", stop], "details": true});
    let v = s
        .generate(&json!({"inputs": inputs, "parameters": params}))
        .await;
    assert_eq!(v["generated_text"], expected, "stop {stop:?} in {full:?}");
    assert_eq!(v["details"]["finish_reason"], "stop_sequence");
    assert_eq!(
        v["details"]["generated_tokens"], tokens_needed,
        "stop {stop:?} in {full:?}"
    );

    let (events, _) = s
        .stream(
            "/generate_stream",
            &json!({"inputs": inputs, "parameters": params}),
        )
        .await
        .collect_json()
        .await;
    let joined: String = events
        .iter()
        .map(|e| e["token"]["text"].as_str().unwrap())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["generated_text"], expected);
    assert_eq!(
        joined, expected,
        "streamed texts never show the stop sequence"
    );
    assert_eq!(last["details"]["finish_reason"], "stop_sequence");
    assert_eq!(events.len(), tokens_needed);

    // OpenAI: same prompt through /v1/completions.
    let (status, c) = s
        .post(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": inputs, "max_tokens": 30, "temperature": 0,
                    "ignore_eos": true, "stop": stop}),
        )
        .await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["choices"][0]["text"], expected);
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    assert_eq!(c["usage"]["completion_tokens"], tokens_needed);
}

/// Nothing the checks above did leaves KV blocks allocated.
async fn blocks_released(s: &Server) {
    let (used, ok) = s
        .wait_metric("tessera_kv_blocks_used", Duration::from_secs(5), |v| {
            v == 0.0
        })
        .await;
    assert!(ok, "tessera_kv_blocks_used = {used} with nothing running");
}

#[tokio::test]
async fn routes_and_shapes() {
    within("routes_and_shapes", Duration::from_secs(300), async {
        let server = Server::start(MODEL, &[]).await;
        let s = &server;
        let mut checks = Checks::new();
        checks.run("health", CHECK_LIMIT, health(s)).await;
        checks.run("info", CHECK_LIMIT, info(s)).await;
        checks.run("tokenize", CHECK_LIMIT, tokenize(s)).await;
        checks
            .run("POST /generate", CHECK_LIMIT, native_generate(s))
            .await;
        checks
            .run("POST /generate_stream", CHECK_LIMIT, native_stream(s))
            .await;
        checks.run("GET /v1/models", CHECK_LIMIT, models(s)).await;
        checks.run("chat completions", CHECK_LIMIT, chat(s)).await;
        checks.run("completions", CHECK_LIMIT, completions(s)).await;
        checks
            .run("constrained output", CHECK_LIMIT, constrained_output(s))
            .await;
        checks
            .run(
                "stream detokenization",
                CHECK_LIMIT,
                stream_detokenization(s),
            )
            .await;
        checks
            .run("stop sequences", CHECK_LIMIT, stop_sequences(s))
            .await;
        checks.run("GET /metrics", CHECK_LIMIT, metrics(s)).await;
        checks
            .run("KV blocks released", CHECK_LIMIT, blocks_released(s))
            .await;
        checks.finish();
    })
    .await;
}
