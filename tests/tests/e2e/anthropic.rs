//! Anthropic's Messages API against the real binaries, as the `anthropic` SDK uses it: a
//! message created, its stream's event order, a tool round trip (held to the tool's schema by
//! the grammar, streamed and not), a stop sequence named, `count_tokens` counting the prompt
//! the message was given, and a typed 400. The fixtures have random weights, so only the
//! protocol is checked, never the answer.

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

fn hello(max_tokens: u32) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": max_tokens, "temperature": 0,
           "system": [{"type": "text", "text": "Be brief."}],
           "messages": [{"role": "user", "content": "Hi"}]})
}

fn tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather in a city",
            "input_schema": {"type": "object", "additionalProperties": false,
               "properties": {"city": {"enum": ["Oslo", "Lima"]},
                              "days": {"type": "integer", "minimum": 1, "maximum": 7}},
               "required": ["city", "days"]}}])
}

fn assert_input(input: &Value) {
    assert!(
        ["Oslo", "Lima"].contains(&input["city"].as_str().unwrap_or("")),
        "{input}"
    );
    assert!(
        input["days"].as_i64().is_some_and(|d| (1..=7).contains(&d)),
        "{input}"
    );
}

/// `(event name, data)` of each event of an SSE body.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| e.lines().any(|l| l.starts_with("data:")))
        .map(|e| {
            let field = |name: &str| {
                e.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_owned())
                    .unwrap_or_else(|| panic!("no {name} in {e:?}"))
            };
            let data = field("data:");
            let data = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
            (field("event:"), data)
        })
        .collect()
}

/// POSTs a streamed request; the events in order, each event's name checked against its
/// data's `type`, and blocks checked to open, grow and close one at a time.
async fn stream(s: &Server, path: &str, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = s
        .client()
        .post(s.url(path))
        .header("x-api-key", "unused")
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap_or_default();
    let events = events(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
    assert_eq!(names[names.len() - 2], "message_delta", "{names:?}");
    let mut open: Option<u64> = None;
    let mut next = 0;
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "{data}");
        let index = data["index"].as_u64();
        match name.as_str() {
            "content_block_start" => {
                assert_eq!((open, index), (None, Some(next)), "{names:?}");
                open = index;
                next += 1;
            }
            "content_block_delta" => assert_eq!(index, open, "{names:?}"),
            "content_block_stop" => assert_eq!(open.take(), index, "{names:?}"),
            _ => assert_eq!(open, None, "{name} inside a block: {names:?}"),
        }
    }
    events.into_iter().map(|(_, d)| d).collect()
}

async fn a_message_and_its_token_count(s: &Server) {
    let (st, b) = s.post("/v1/messages", &hello(6)).await;
    assert_eq!(st, 200, "{b}");
    assert!(
        b["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
        "{b}"
    );
    assert_eq!(b["type"], "message");
    assert_eq!(b["role"], "assistant");
    for block in b["content"].as_array().unwrap_or_else(|| panic!("{b}")) {
        assert_eq!(block["type"], "text", "{b}");
        assert!(block["text"].is_string(), "{b}");
    }
    assert!(
        ["end_turn", "max_tokens"].contains(&b["stop_reason"].as_str().unwrap_or("")),
        "{b}"
    );
    assert!(b["stop_sequence"].is_null(), "{b}");
    assert!(
        b["usage"]["output_tokens"]
            .as_u64()
            .is_some_and(|n| (1..=6).contains(&n)),
        "{b}"
    );
    let (st, count) = s.post("/v1/messages/count_tokens", &hello(6)).await;
    assert_eq!(st, 200, "{count}");
    assert_eq!(
        count["input_tokens"], b["usage"]["input_tokens"],
        "{count} {b}"
    );
    // Greedy decoding repeats itself: a piece of the last answer ends the next one there.
    let text = b["content"][0]["text"].as_str().unwrap_or("");
    let stop: String = text.trim_start().chars().take(2).collect();
    if !stop.is_empty() {
        let mut body = hello(6);
        body["stop_sequences"] = json!([stop]);
        let (st, b) = s.post("/v1/messages", &body).await;
        assert_eq!(st, 200, "{b}");
        assert_eq!(b["stop_reason"], "stop_sequence", "{b}");
        assert_eq!(b["stop_sequence"], stop.as_str(), "{b}");
    }
}

async fn a_stream_is_framed(s: &Server) {
    let events = stream(s, "/v1/messages", &hello(6)).await;
    let start = &events[0]["message"];
    assert_eq!(start["content"], json!([]), "{start}");
    assert!(
        start["usage"]["input_tokens"]
            .as_u64()
            .is_some_and(|n| n > 0)
    );
    let end = &events[events.len() - 2];
    assert!(end["delta"]["stop_reason"].is_string(), "{end}");
    assert!(
        end["usage"]["output_tokens"]
            .as_u64()
            .is_some_and(|n| (1..=6).contains(&n))
    );
}

async fn a_tool_round_trip(s: &Server) {
    let mut body = hello(100);
    body["tools"] = tools();
    body["tool_choice"] = json!({"type": "any", "disable_parallel_tool_use": true});
    let (st, b) = s.post("/v1/messages", &body).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["stop_reason"], "tool_use", "{b}");
    let content = b["content"].as_array().cloned().unwrap_or_default();
    let calls: Vec<&Value> = content.iter().filter(|c| c["type"] == "tool_use").collect();
    assert_eq!(calls.len(), 1, "{b}");
    let call = calls[0];
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("toolu_")),
        "{call}"
    );
    assert_eq!(call["name"], "get_weather");
    assert_input(&call["input"]);
    // The answer goes back as it came, with the result.
    let mut next = body.clone();
    next["tool_choice"] = json!({"type": "auto"});
    next["max_tokens"] = json!(8);
    let history = next["messages"].as_array_mut().expect("messages");
    history.push(json!({"role": "assistant", "content": content}));
    history.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "content": "3 degrees"}]}));
    let (st, b) = s.post("/v1/messages", &next).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["type"], "message", "{b}");
    let (st, count) = s.post("/v1/messages/count_tokens", &next).await;
    assert_eq!(st, 200, "{count}");
    assert_eq!(
        count["input_tokens"], b["usage"]["input_tokens"],
        "{count} {b}"
    );
    // Streamed: the input arrives as JSON text that parses to the schema.
    let events = stream(s, "/v1/messages", &body).await;
    let partial: String = events
        .iter()
        .filter(|e| e["delta"]["type"] == "input_json_delta")
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    let input: Value = serde_json::from_str(&partial).unwrap_or_else(|e| panic!("{e}: {partial}"));
    assert_input(&input);
    let start = events
        .iter()
        .find(|e| e["content_block"]["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block in {events:?}"));
    assert_eq!(start["content_block"]["input"], json!({}));
    assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], "tool_use");
}

async fn unsupported_content_is_a_typed_400(s: &Server) {
    let mut body = hello(4);
    body["messages"][0]["content"] = json!([{"type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]);
    let (st, b) = s.post("/v1/messages", &body).await;
    assert_eq!(st, 400, "{b}");
    assert_eq!(b["type"], "error", "{b}");
    assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`image`")),
        "{b}"
    );
}

#[tokio::test]
async fn the_messages_api_on_a_template_with_tools() {
    within("anthropic", Duration::from_secs(600), async {
        let server = Server::start("tiny-qwen2", &["--chat-template", &template()]).await;
        let s = &server;
        let mut checks = Checks::new();
        checks
            .run(
                "create and count",
                CHECK_LIMIT,
                a_message_and_its_token_count(s),
            )
            .await;
        checks
            .run("stream", CHECK_LIMIT, a_stream_is_framed(s))
            .await;
        checks
            .run("tool round trip", CHECK_LIMIT, a_tool_round_trip(s))
            .await;
        checks
            .run(
                "refused content",
                CHECK_LIMIT,
                unsupported_content_is_a_typed_400(s),
            )
            .await;
        checks.finish();
    })
    .await;
}
