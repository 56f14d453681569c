//! gpt-oss's harmony format through the real binaries, on `fixtures/tiny-gpt-oss-harmony`
//! (tiny-gpt-oss with gpt-oss's template and a tokenizer that has the harmony tokens): calls
//! come back as OpenAI tool calls, reasoning as `reasoning_content`, answers as `content`,
//! whole and streamed alike, with no marker of the format in any field; the Responses and
//! Messages APIs read the same channels. The weights are random, so every well-formed call and
//! JSON answer here is the grammar's doing.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_e2e::{Checks, Server, within};

const CHECK_LIMIT: Duration = Duration::from_secs(120);

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"enum": ["Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "ping", "description": "Is it up?",
            "parameters": {"type": "object", "properties": {}}}}
    ])
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Weather in Oslo?"}],
                          "max_tokens": 120, "temperature": 0});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    body
}

/// What a choice said, whole or put together from its stream's deltas.
#[derive(Debug, Default, PartialEq)]
struct Said {
    reasoning: String,
    content: String,
    /// (name, arguments) of each call.
    calls: Vec<(String, String)>,
    finish: String,
}

impl Said {
    fn whole(body: &Value) -> Self {
        let choice = &body["choices"][0];
        let m = &choice["message"];
        assert_eq!(m["reasoning"], m["reasoning_content"], "{body}");
        Self {
            reasoning: m["reasoning_content"].as_str().unwrap_or("").to_owned(),
            content: m["content"].as_str().unwrap_or("").to_owned(),
            calls: calls(&m["tool_calls"]),
            finish: choice["finish_reason"].as_str().unwrap_or("").to_owned(),
        }
    }

    fn streamed(chunks: &[Value]) -> Self {
        let mut said = Self::default();
        for c in chunks {
            let choice = &c["choices"][0];
            let d = &choice["delta"];
            said.reasoning
                .push_str(d["reasoning_content"].as_str().unwrap_or(""));
            said.content.push_str(d["content"].as_str().unwrap_or(""));
            for call in d["tool_calls"].as_array().into_iter().flatten() {
                if let Some(name) = call["function"]["name"].as_str() {
                    said.calls.push((name.to_owned(), String::new()));
                }
                if let Some(last) = said.calls.last_mut() {
                    last.1
                        .push_str(call["function"]["arguments"].as_str().unwrap_or(""));
                }
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                said.finish = f.to_owned();
            }
        }
        said
    }

    /// No field carries the format's markers.
    fn assert_clean(&self) {
        for text in [&self.reasoning, &self.content] {
            assert!(!text.contains("<|"), "{self:?}");
        }
    }
}

fn calls(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["function"]["name"].as_str().unwrap_or("").to_owned(),
                c["function"]["arguments"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The same request whole and streamed: what each said.
async fn both(s: &Server, body: &Value) -> Said {
    let (st, b) = s.post("/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{b}");
    let whole = Said::whole(&b);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (chunks, done) = s
        .stream("/v1/chat/completions", &streamed)
        .await
        .collect_json()
        .await;
    assert!(done);
    assert_eq!(Said::streamed(&chunks), whole, "stream and whole differ");
    whole.assert_clean();
    whole
}

fn assert_weather_call(said: &Said) {
    assert_eq!(said.calls.len(), 1, "{said:?}");
    let (name, arguments) = &said.calls[0];
    assert_eq!(name, "get_weather");
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{e}: {said:?}"));
    assert!(["Oslo", "Lima"].contains(&args["city"].as_str().unwrap_or("")));
    assert!(args["days"].as_i64().is_some_and(|d| (1..=7).contains(&d)));
    assert_eq!(said.finish, "tool_calls");
}

async fn named_and_required_calls(s: &Server) {
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for seed in 0..3 {
        let body = chat(
            json!({"tools": tools(), "tool_choice": named, "temperature": 1.0,
                               "seed": seed}),
        );
        let said = both(s, &body).await;
        assert_weather_call(&said);
        assert!(
            said.content.is_empty() && said.reasoning.is_empty(),
            "{said:?}"
        );
    }
    let said = both(
        s,
        &chat(json!({"tools": tools(), "tool_choice": "required"})),
    )
    .await;
    assert_eq!(said.calls.len(), 1, "{said:?}");
    assert_eq!(said.finish, "tool_calls");
}

/// With `auto` the model may reason, then answers or calls: whatever it does, every field is
/// read from its channel, and some seed reasons (the fixture's random weights favour long
/// analysis; answers and calls are checked above and below, under constraints).
async fn auto_reads_every_channel(s: &Server) {
    let mut seen = Said::default();
    for seed in 0..4 {
        let body = chat(json!({"tools": tools(), "temperature": 1.0, "seed": seed,
                               "max_tokens": 40}));
        let said = both(s, &body).await;
        for (name, arguments) in &said.calls {
            assert!(name == "get_weather" || name == "ping", "{said:?}");
            serde_json::from_str::<Value>(arguments).unwrap_or_else(|e| panic!("{e}: {said:?}"));
        }
        seen.reasoning.push_str(&said.reasoning);
        seen.content.push_str(&said.content);
        seen.calls.extend(said.calls);
    }
    assert!(!seen.reasoning.is_empty(), "no seed reasoned: {seen:?}");
}

async fn json_answers_validate(s: &Server) {
    let schema = json!({"type": "object", "properties": {
        "answer": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["answer"]});
    let format = json!({"type": "json_schema",
                        "json_schema": {"name": "a", "strict": true, "schema": schema}});
    for seed in 0..3 {
        let body = chat(json!({"response_format": format, "temperature": 1.0, "seed": seed}));
        let said = both(s, &body).await;
        let v: Value =
            serde_json::from_str(&said.content).unwrap_or_else(|e| panic!("{e}: {said:?}"));
        assert!(
            v["answer"].as_i64().is_some_and(|a| (0..=9).contains(&a)),
            "{v}"
        );
        assert_eq!(said.finish, "stop");
    }
    let body = chat(json!({"guided_regex": "[a-z]+"}));
    let (st, b) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 400, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("harmony")),
        "{b}"
    );
}

async fn a_tool_round_trip_renders(s: &Server) {
    let first = chat(json!({"tools": tools(), "tool_choice": "required"}));
    let (_, b) = s.post("/v1/chat/completions", &first).await;
    let call = b["choices"][0]["message"]["tool_calls"][0].clone();
    assert!(call["id"].is_string(), "{b}");
    let messages = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "reasoning_content": "Look it up.",
         "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "{\"temp\": 3}"}
    ]);
    let (st, b) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "tools": tools(), "max_tokens": 8}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    let before = first_prompt_tokens(s).await;
    assert!(
        b["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > before,
        "the history renders: {b}"
    );
}

async fn first_prompt_tokens(s: &Server) -> u64 {
    let (_, b) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"tools": tools(), "max_tokens": 1})),
        )
        .await;
    b["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
}

async fn reasoning_effort_reaches_the_template(s: &Server) {
    let tokens = |b: &Value| b["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    let (st, medium) = s
        .post("/v1/chat/completions", &chat(json!({"max_tokens": 1})))
        .await;
    assert_eq!(st, 200, "{medium}");
    let (st, high) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"max_tokens": 1, "reasoning_effort": "high"})),
        )
        .await;
    assert_eq!(st, 200, "{high}");
    // "Reasoning: medium" and "Reasoning: high" are different text in the system message.
    assert_ne!(tokens(&medium), tokens(&high), "{medium} {high}");
    let (st, b) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"reasoning_effort": "extreme"})),
        )
        .await;
    assert_eq!(st, 400, "{b}");
    assert_eq!(b["error"]["param"], "reasoning_effort", "{b}");
}

async fn responses_read_the_channels(s: &Server) {
    let body = json!({"input": "Weather in Oslo?", "max_output_tokens": 150, "temperature": 0,
        "tools": [{"type": "function", "name": "get_weather",
                   "parameters": tools()[0]["function"]["parameters"]}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "reasoning": {"effort": "low"}});
    let (st, b) = s.post("/v1/responses", &body).await;
    assert_eq!(st, 200, "{b}");
    let calls: Vec<&Value> = b["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{b}");
    assert_eq!(calls[0]["name"], "get_weather", "{b}");
}

async fn messages_read_the_channels(s: &Server) {
    let body = json!({"max_tokens": 150, "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"name": "get_weather", "description": "Weather.",
                   "input_schema": tools()[0]["function"]["parameters"]}],
        "tool_choice": {"type": "tool", "name": "get_weather"}});
    let (st, b) = s.post("/v1/messages", &body).await;
    assert_eq!(st, 200, "{b}");
    let uses: Vec<&Value> = b["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{b}");
    assert_eq!(uses[0]["name"], "get_weather", "{b}");
    assert!(uses[0]["input"]["days"].is_i64(), "{b}");
    assert_eq!(b["stop_reason"], "tool_use", "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harmony_output_comes_back_in_the_openai_fields() {
    within("harmony", Duration::from_secs(600), async {
        let server = Server::start("tiny-gpt-oss-harmony", &[]).await;
        let mut checks = Checks::new();
        checks
            .run(
                "named and required calls",
                CHECK_LIMIT,
                named_and_required_calls(&server),
            )
            .await;
        checks
            .run(
                "auto reads every channel",
                CHECK_LIMIT,
                auto_reads_every_channel(&server),
            )
            .await;
        checks
            .run(
                "json answers validate",
                CHECK_LIMIT,
                json_answers_validate(&server),
            )
            .await;
        checks
            .run(
                "a tool round trip renders",
                CHECK_LIMIT,
                a_tool_round_trip_renders(&server),
            )
            .await;
        checks
            .run(
                "reasoning effort reaches the template",
                CHECK_LIMIT,
                reasoning_effort_reaches_the_template(&server),
            )
            .await;
        checks
            .run(
                "responses read the channels",
                CHECK_LIMIT,
                responses_read_the_channels(&server),
            )
            .await;
        checks
            .run(
                "messages read the channels",
                CHECK_LIMIT,
                messages_read_the_channels(&server),
            )
            .await;
        checks.finish();
    })
    .await;
}
