//! What agents and SDKs send, against the real binaries: JSON-schema outputs (also under
//! speculation, with several choices, whole and streamed), tool calls
//! (required, named, single, streamed, with a tool result in the history), the Responses API,
//! TGI's JSON grammar, and requests naming any model or none. The fixtures have random
//! weights, so every valid output here is the constraint's doing, never the model's. Their
//! context is 256 tokens, so the test template (`fixtures/templates/hermes-tools.jinja`) shows
//! the tools by name only and the schemas are small.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_e2e::{Checks, Server, within};

const CHECK_LIMIT: Duration = Duration::from_secs(90);

fn template() -> String {
    tessera_e2e::workspace_root()
        .join("fixtures/templates/hermes-tools.jinja")
        .display()
        .to_string()
}

/// A schema with what strict schemas use: enums, integer bounds, bounded arrays, nested
/// objects and `$ref` to `$defs`.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 4},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "role": {"enum": ["admin", "user"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
            "home": {"$ref": "#/$defs/Address"}
        },
        "required": ["name", "age", "role", "tags", "home"],
        "additionalProperties": false,
        "$defs": {"Address": {
            "type": "object",
            "properties": {"zip": {"type": "integer", "minimum": 1000, "maximum": 9999}},
            "required": ["zip"], "additionalProperties": false
        }}
    })
}

fn assert_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"));
    assert_eq!(o.len(), 5, "{v}");
    assert!(
        v["name"].as_str().is_some_and(|n| n.chars().count() <= 6),
        "{v}"
    );
    assert!(
        v["age"].as_i64().is_some_and(|a| (18..=99).contains(&a)),
        "{v}"
    );
    assert!(
        ["admin", "user"].contains(&v["role"].as_str().unwrap_or("")),
        "{v}"
    );
    let tags = v["tags"].as_array().unwrap_or_else(|| panic!("{v}"));
    assert!(
        (1..=3).contains(&tags.len()) && tags.iter().all(Value::is_boolean),
        "{v}"
    );
    let zip = v["home"]["zip"].as_i64().unwrap_or(0);
    assert!(
        (1000..=9999).contains(&zip) && v["home"].as_object().unwrap().len() == 1,
        "{v}"
    );
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
         "strict": true, "parameters": {"type": "object", "additionalProperties": false,
            "properties": {"city": {"enum": ["Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object",
            "properties": {}, "additionalProperties": false}}}
    ])
}

fn assert_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {call}"));
    match call["function"]["name"].as_str() {
        Some("get_weather") => {
            assert!(
                ["Oslo", "Lima"].contains(&args["city"].as_str().unwrap_or("")),
                "{args}"
            );
            assert!(
                args["days"].as_i64().is_some_and(|d| (1..=7).contains(&d)),
                "{args}"
            );
            assert_eq!(args.as_object().map(|o| o.len()), Some(2), "{args}");
        }
        Some("ping") => assert_eq!(args, json!({})),
        other => panic!("unknown function {other:?}"),
    }
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Weather in Oslo?"}],
                          "max_tokens": 100, "temperature": 0});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    body
}

async fn json_schema_outputs_validate(s: &Server) {
    let format = json!({"type": "json_schema",
                        "json_schema": {"name": "person", "strict": true, "schema": person_schema()}});
    for (temperature, seed) in [(0.0, 0), (1.0, 1), (1.0, 2), (1.5, 3)] {
        let (st, b) = s
            .post(
                "/v1/chat/completions",
                &chat(
                    json!({"response_format": format, "temperature": temperature,
                             "seed": seed, "max_tokens": 150}),
                ),
            )
            .await;
        assert_eq!(st, 200, "{b}");
        assert_eq!(b["choices"][0]["finish_reason"], "stop", "{b}");
        assert_person(b["choices"][0]["message"]["content"].as_str().unwrap_or(""));
    }
    // vLLM's and TGI's spellings of the same constraint.
    let (st, b) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"guided_json": person_schema(), "max_tokens": 150})),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_person(b["choices"][0]["message"]["content"].as_str().unwrap_or(""));
    let (st, b) = s
        .post(
            "/generate",
            &json!({"inputs": "A person:", "parameters": {"max_new_tokens": 150,
                    "grammar": {"type": "json", "value": person_schema()}}}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_person(b["generated_text"].as_str().unwrap_or(""));
}

async fn required_and_named_calls_validate(s: &Server) {
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let (st, b) = s
            .post(
                "/v1/chat/completions",
                &chat(json!({"tools": tools(), "tool_choice": choice})),
            )
            .await;
        assert_eq!(st, 200, "{b}");
        let choice0 = &b["choices"][0];
        let calls = choice0["message"]["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("{b}"));
        assert!(!calls.is_empty());
        calls.iter().for_each(assert_call);
        if choice0["finish_reason"] == "tool_calls" {
            assert!(choice0["message"]["content"].is_null(), "{b}");
        }
    }
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let (_, b) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"tools": tools(), "tool_choice": named})),
        )
        .await;
    for call in b["choices"][0]["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert_eq!(call["function"]["name"], "get_weather");
    }
    let (st, b) = s
        .post(
            "/v1/chat/completions",
            &chat(
                json!({"tools": tools(), "tool_choice": "required", "parallel_tool_calls": false}),
            ),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(
        b["choices"][0]["message"]["tool_calls"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "{b}"
    );
    assert_eq!(b["choices"][0]["finish_reason"], "tool_calls", "{b}");
}

async fn streamed_calls_arrive_as_deltas(s: &Server) {
    let body = chat(
        json!({"tools": tools(), "tool_choice": "required", "stream": true,
                           "parallel_tool_calls": false}),
    );
    let (chunks, done) = s
        .stream("/v1/chat/completions", &body)
        .await
        .collect_json()
        .await;
    assert!(done);
    let (mut id, mut name, mut arguments, mut finish) = (None, None, String::new(), None);
    for c in &chunks {
        for d in c["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(d["index"], 0);
            if let Some(i) = d["id"].as_str() {
                assert!(id.is_none(), "the id comes once");
                id = Some(i.to_owned());
                name = d["function"]["name"].as_str().map(str::to_owned);
            }
            arguments.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = c["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    assert_call(&json!({"id": id, "type": "function",
                        "function": {"name": name, "arguments": arguments}}));
}

async fn a_tool_result_is_answered(s: &Server) {
    let messages = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"}
    ]);
    let (st, b) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "tools": tools(), "max_tokens": 8, "temperature": 0}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert!(b["choices"][0]["message"].is_object(), "{b}");
    // Arguments that are not JSON are the client's mistake, named.
    let mut bad = messages.clone();
    bad[1]["tool_calls"][0]["function"]["arguments"] = json!("{oops");
    let (st, b) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": bad, "max_tokens": 4}),
        )
        .await;
    assert_eq!(st, 400, "{b}");
    assert_eq!(b["error"]["param"], "messages", "{b}");
}

async fn responses_text_and_calls(s: &Server) {
    let (st, b) = s
        .post(
            "/v1/responses",
            &json!({"input": "Hi", "max_output_tokens": 6, "temperature": 0}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["object"], "response");
    assert_eq!(b["output"][0]["type"], "message", "{b}");
    assert_eq!(b["output"][0]["content"][0]["type"], "output_text", "{b}");
    assert_eq!(b["usage"]["output_tokens"], 6, "{b}");
    assert_eq!(b["status"], "incomplete", "{b}");
    let tools = json!([{"type": "function", "name": "get_weather",
                        "parameters": tools()[0]["function"]["parameters"]}]);
    let body = json!({"input": [{"role": "user", "content": "Weather?"}], "tools": tools,
                      "tool_choice": "required", "parallel_tool_calls": false,
                      "instructions": "Be brief.", "max_output_tokens": 100});
    let (st, b) = s.post("/v1/responses", &body).await;
    assert_eq!(st, 200, "{b}");
    let call = b["output"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["type"] == "function_call");
    let call = call.unwrap_or_else(|| panic!("no call in {b}"));
    assert_call(&json!({"id": "call_x", "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]}}));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (events, _) = s
        .stream("/v1/responses", &streamed)
        .await
        .collect_json()
        .await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"response.completed"), "{kinds:?}");
    assert!(
        kinds.contains(&"response.function_call_arguments.done"),
        "{kinds:?}"
    );
    let numbers: Vec<u64> = events
        .iter()
        .filter_map(|e| e["sequence_number"].as_u64())
        .collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    let (st, b) = s
        .post(
            "/v1/responses",
            &json!({"input": "Hi", "previous_response_id": "resp_1"}),
        )
        .await;
    assert_eq!(st, 400, "{b}");
    assert_eq!(b["error"]["param"], "previous_response_id", "{b}");
}

async fn any_model_name_or_none(s: &Server) {
    for model in [json!("gpt-4o"), Value::Null] {
        let mut body = json!({"prompt": "The", "max_tokens": 2});
        if !model.is_null() {
            body["model"] = model;
        }
        let (st, b) = s.post("/v1/completions", &body).await;
        assert_eq!(st, 200, "{b}");
        let (st, b) = s
            .post("/v1/chat/completions", &chat(json!({"max_tokens": 2})))
            .await;
        assert_eq!(st, 200, "{b}");
    }
}

/// `best_of` keeps the likeliest samples; `stop_token_ids` end generation at their token.
async fn best_of_and_stop_token_ids(s: &Server) {
    let (st, b) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "The", "max_tokens": 4, "n": 2, "best_of": 3, "seed": 1,
                    "ignore_eos": true}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["choices"].as_array().map(Vec::len), Some(2), "{b}");
    assert_eq!(
        b["usage"]["completion_tokens"], 12,
        "every sample counts: {b}"
    );
    let ids = s.greedy_ids("The", 4).await;
    let first = ids.iter().position(|&t| t == ids[1]).unwrap_or(1) as u64 + 1;
    let (st, b) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "The", "max_tokens": 4, "temperature": 0,
                    "stop_token_ids": [ids[1]]}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["choices"][0]["finish_reason"], "stop", "{b}");
    assert_eq!(b["usage"]["completion_tokens"], first, "{b}");
}

#[tokio::test]
async fn agent_calls_on_a_template_with_tools() {
    within("agents", Duration::from_secs(600), async {
        let server = Server::start("tiny-qwen2", &["--chat-template", &template()]).await;
        let s = &server;
        let mut checks = Checks::new();
        checks
            .run("json schema", CHECK_LIMIT, json_schema_outputs_validate(s))
            .await;
        checks
            .run(
                "required and named calls",
                CHECK_LIMIT,
                required_and_named_calls_validate(s),
            )
            .await;
        checks
            .run(
                "streamed calls",
                CHECK_LIMIT,
                streamed_calls_arrive_as_deltas(s),
            )
            .await;
        checks
            .run("tool result", CHECK_LIMIT, a_tool_result_is_answered(s))
            .await;
        checks
            .run("responses", CHECK_LIMIT, responses_text_and_calls(s))
            .await;
        checks
            .run("any model", CHECK_LIMIT, any_model_name_or_none(s))
            .await;
        checks
            .run(
                "best_of and stop_token_ids",
                CHECK_LIMIT,
                best_of_and_stop_token_ids(s),
            )
            .await;
        checks.finish();
    })
    .await;
}

/// Under n-gram speculation, with `n = 4` sampled choices, whole and streamed: every choice
/// that ends on its own (`stop`) is JSON its schema accepts.
#[tokio::test]
async fn schemas_hold_under_speculation_and_several_choices() {
    within("speculation", Duration::from_secs(600), async {
        let server = Server::start(
            "tiny-qwen2",
            &["--chat-template", &template(), "--speculate", "3"],
        )
        .await;
        let s = &server;
        let format = json!({"type": "json_schema",
                            "json_schema": {"name": "person", "schema": person_schema()}});
        let mut stopped = 0;
        for seed in 0..3 {
            let body = chat(
                json!({"response_format": format, "temperature": 1.0, "seed": seed,
                                   "n": 4, "max_tokens": 150}),
            );
            let (st, b) = s.post("/v1/chat/completions", &body).await;
            assert_eq!(st, 200, "{b}");
            for choice in b["choices"].as_array().into_iter().flatten() {
                if choice["finish_reason"] == "stop" {
                    assert_person(choice["message"]["content"].as_str().unwrap_or(""));
                    stopped += 1;
                }
            }
            let mut streamed = body.clone();
            streamed["stream"] = json!(true);
            let (chunks, done) = s
                .stream("/v1/chat/completions", &streamed)
                .await
                .collect_json()
                .await;
            assert!(done);
            let mut texts = vec![String::new(); 4];
            let mut finishes = vec![None; 4];
            for c in &chunks {
                for choice in c["choices"].as_array().into_iter().flatten() {
                    let i = choice["index"].as_u64().unwrap_or(0) as usize;
                    texts[i].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
                    if let Some(f) = choice["finish_reason"].as_str() {
                        finishes[i] = Some(f.to_owned());
                    }
                }
            }
            for (text, finish) in texts.iter().zip(&finishes) {
                if finish.as_deref() == Some("stop") {
                    assert_person(text);
                    stopped += 1;
                }
            }
        }
        let metrics = s.metrics_text().await;
        let proposed = tessera_e2e::metric_value(
            &metrics,
            r#"tessera_speculative_proposed_tokens_total{speculator="ngram"}"#,
        );
        assert!(proposed.is_some_and(|p| p > 0.0), "nothing was proposed");
        assert!(
            stopped >= 12,
            "only {stopped} of 24 choices ended on their own"
        );
    })
    .await;
}
