//! A Messages request as the chat request it means, and the requests refused by name.

use serde_json::{Value, json};

use super::super::request::{CountTokensRequest, MAX_BLOCKS, MessagesRequest};
use crate::openai::{ChatCompletionRequest, MessageContent, RequestMessage, StopSpec};
use crate::validation::ValidationError;

fn conversation(body: Value) -> CountTokensRequest {
    serde_json::from_value(body).expect("a conversation")
}

fn chat(body: Value) -> ChatCompletionRequest {
    conversation(body).to_chat().expect("translates")
}

fn refused(body: Value) -> String {
    conversation(body)
        .to_chat()
        .expect_err("refused")
        .to_string()
}

fn text(m: &RequestMessage) -> &str {
    match &m.content {
        Some(MessageContent::Text(t)) => t,
        other => panic!("not text: {other:?}"),
    }
}

fn roles(chat: &ChatCompletionRequest) -> Vec<&str> {
    chat.messages.iter().map(|m| m.role.as_str()).collect()
}

#[test]
fn system_and_text_turns() {
    let c = chat(json!({
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.",
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]
    }));
    assert_eq!(roles(&c), ["system", "user", "assistant", "user"]);
    assert_eq!(text(&c.messages[0]), "Be brief.\n\nBe kind.");
    assert_eq!(text(&c.messages[3]), "a\n\nb");
    assert!(c.tools.is_none() && c.tool_choice.is_none());
    assert!(c.chat_template_kwargs.is_none());
    let c = chat(json!({"system": "S", "messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(text(&c.messages[0]), "S");
    let c = chat(json!({"system": [], "messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(roles(&c), ["user"], "an empty system prompt is none");
}

#[test]
fn a_tool_round_trip_is_chat_calls_and_tool_messages() {
    let c = chat(json!({"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_2", "name": "ping", "input": {}}
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 degrees"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
             "content": [{"type": "text", "text": "timeout"}]},
            {"type": "text", "text": "And tomorrow?"}
        ]}
    ]}));
    assert_eq!(roles(&c), ["user", "assistant", "tool", "tool", "user"]);
    let assistant = &c.messages[1];
    assert_eq!(text(assistant), "Let me look.");
    assert_eq!(
        assistant.reasoning.as_deref(),
        Some("hmm"),
        "thinking rides along"
    );
    let calls = assistant.tool_calls.as_ref().expect("calls");
    assert_eq!(
        calls[0],
        json!({"id": "toolu_1", "type": "function",
               "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})
    );
    assert_eq!(calls[1]["function"]["name"], "ping");
    let (first, second) = (&c.messages[2], &c.messages[3]);
    assert_eq!(text(first), "3 degrees");
    assert_eq!(first.tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(first.name.as_deref(), Some("get_weather"));
    assert_eq!(text(second), "Error: timeout");
    assert_eq!(second.name.as_deref(), Some("ping"));
    assert_eq!(text(&c.messages[4]), "And tomorrow?");
}

#[test]
fn consecutive_turns_of_a_role_are_joined() {
    let c = chat(json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "user", "content": [{"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "only this"}]},
        {"role": "user", "content": []},
        {"role": "user", "content": "c"}
    ]}));
    assert_eq!(roles(&c), ["user"]);
    assert_eq!(text(&c.messages[0]), "a\n\nb\n\nc");
}

#[test]
fn tools_choices_and_thinking() {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let c = chat(json!({
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": schema},
                  {"type": "custom", "name": "ping", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "thinking": {"type": "enabled", "budget_tokens": 1024}
    }));
    let tools = c.tools.expect("tools");
    assert_eq!(
        tools[0],
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": schema}})
    );
    assert_eq!(tools[1]["function"]["name"], "ping");
    assert_eq!(c.tool_choice, Some(json!("required")));
    assert_eq!(c.parallel_tool_calls, Some(false));
    assert_eq!(
        Value::Object(c.chat_template_kwargs.expect("kwargs")),
        json!({"enable_thinking": true})
    );
    let choice = |choice: Value| {
        let c = chat(json!({"messages": [{"role": "user", "content": "x"}],
                            "tool_choice": choice}));
        (c.tool_choice, c.parallel_tool_calls)
    };
    assert_eq!(choice(json!({"type": "auto"})), (Some(json!("auto")), None));
    assert_eq!(choice(json!({"type": "none"})), (Some(json!("none")), None));
    assert_eq!(
        choice(json!({"type": "tool", "name": "f", "disable_parallel_tool_use": false})),
        (
            Some(json!({"type": "function", "function": {"name": "f"}})),
            Some(true)
        )
    );
    let off = chat(json!({"messages": [{"role": "user", "content": "x"}],
                          "thinking": {"type": "disabled"}}));
    assert_eq!(
        off.chat_template_kwargs.map(Value::Object),
        Some(json!({"enable_thinking": false}))
    );
}

#[test]
fn generation_fields_are_chat_sampling_fields() {
    let req: MessagesRequest = serde_json::from_value(json!({
        "model": "claude-sonnet-4-5", "max_tokens": 64,
        "messages": [{"role": "user", "content": "x"}],
        "stop_sequences": ["END"], "temperature": 0.5, "top_p": 0.9, "top_k": 5,
        "stream": true, "metadata": {"user_id": "u"}, "service_tier": "auto"
    }))
    .expect("a request");
    let c = req.to_chat().expect("translates");
    assert_eq!(c.max_tokens, Some(64));
    assert_eq!(c.model.as_deref(), Some("claude-sonnet-4-5"));
    assert!(matches!(&c.sampling.stop, Some(StopSpec::Many(s)) if s == &["END"]));
    assert_eq!(c.sampling.temperature, Some(0.5));
    assert_eq!(c.sampling.top_p, Some(0.9));
    assert_eq!(c.sampling.top_k, Some(5));
    assert_eq!(c.sampling.stream, Some(true));
    assert_eq!(c.sampling.n, None);
    let missing = serde_json::from_value::<MessagesRequest>(
        json!({"messages": [{"role": "user", "content": "x"}]}),
    );
    let missing = missing.expect_err("max_tokens is required").to_string();
    assert!(missing.contains("max_tokens"), "{missing}");
}

#[test]
fn unsupported_blocks_are_refused_by_name() {
    let user = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
    let image = json!({"type": "image", "source": {"type": "base64", "data": "AA=="}});
    let e = refused(user(json!([{"type": "text", "text": "look"}, image])));
    assert!(e.starts_with("`messages[0]`: `content[1]`:"), "{e}");
    assert!(e.contains("`image` are not supported"), "{e}");
    let e = refused(user(json!([{"type": "document", "source": {}}])));
    assert!(e.contains("`document`"), "{e}");
    let nested = json!([{"type": "tool_result", "tool_use_id": "t",
                         "content": [{"type": "image", "source": {}}]}]);
    let e = refused(user(nested));
    assert!(
        e.contains("`content[0]`: its `content` [0]:") && e.contains("`image`"),
        "{e}"
    );
    let e = refused(json!({"system": [{"type": "image"}],
                           "messages": [{"role": "user", "content": "x"}]}));
    assert!(
        e.starts_with("`system`: [0]:") && e.contains("`image`"),
        "{e}"
    );
    assert!(refused(user(json!([{"text": "no type"}]))).contains("needs a string `type`"));
    assert!(refused(user(json!([{"type": "text", "text": 5}]))).contains("string `text`"));
    assert!(refused(user(json!(5))).contains("string or a list"));
}

#[test]
fn blocks_in_the_wrong_turn_and_wrong_roles_are_refused() {
    let msgs = |messages: Value| json!({ "messages": messages });
    let call = json!({"type": "tool_use", "id": "t", "name": "f", "input": {}});
    let e = refused(msgs(json!([{"role": "user", "content": [call]}])));
    assert!(e.contains("belong to `assistant`"), "{e}");
    let result = json!({"type": "tool_result", "tool_use_id": "t"});
    let e = refused(msgs(json!([{"role": "user", "content": "x"},
                                {"role": "assistant", "content": [result]},
                                {"role": "user", "content": "y"}])));
    assert!(
        e.starts_with("`messages[1]`") && e.contains("belong to `user`"),
        "{e}"
    );
    let e = refused(msgs(json!([{"role": "system", "content": "x"}])));
    assert!(e.contains("top-level `system`"), "{e}");
    let bad_input = json!({"type": "tool_use", "id": "t", "name": "f", "input": [1]});
    let e = refused(msgs(json!([{"role": "user", "content": "x"},
                                {"role": "assistant", "content": [bad_input]},
                                {"role": "user", "content": "y"}])));
    assert!(e.contains("`input` must be an object"), "{e}");
    let e = refused(msgs(json!([{"role": "user", "content": "x"},
                                {"role": "assistant", "content": "{"}])));
    assert!(
        e.starts_with("`messages[1]`") && e.contains("prefill"),
        "{e}"
    );
}

#[test]
fn tools_and_choices_outside_the_chat_model_are_refused() {
    let with = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        refused(body)
    };
    let e = with(json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}));
    assert!(
        e.starts_with("`tools`: [0]:") && e.contains("web_search_20250305"),
        "{e}"
    );
    assert!(with(json!({"tool_choice": {"type": "function"}})).contains("`tool_choice`"));
    assert!(with(json!({"tool_choice": {"type": "tool"}})).contains("`name`"));
    let e = with(json!({"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}}));
    assert!(e.contains("boolean"), "{e}");
    assert!(with(json!({"thinking": {"type": "maybe"}})).starts_with("`thinking`"));
}

#[test]
fn block_counts_are_bounded_before_anything_is_read() {
    let many = vec![json!({"type": "text", "text": "x"}); MAX_BLOCKS + 1];
    let e = conversation(json!({"messages": [{"role": "user", "content": many}]}))
        .to_chat()
        .expect_err("too many blocks");
    assert!(
        matches!(
            e,
            ValidationError::OutOfRange {
                param: "messages",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains(&MAX_BLOCKS.to_string()), "{e}");
    // Empty messages count one each; nested results count too.
    let empty = vec![json!({"role": "user", "content": []}); MAX_BLOCKS + 1];
    assert!(
        conversation(json!({ "messages": empty }))
            .to_chat()
            .is_err()
    );
    let nested = vec![json!({"type": "text", "text": "x"}); MAX_BLOCKS];
    let result = json!([{"type": "tool_result", "tool_use_id": "t", "content": nested}]);
    let body = json!({"messages": [{"role": "user", "content": result}]});
    assert!(conversation(body).to_chat().is_err());
    let fits = vec![json!({"type": "text", "text": "x"}); MAX_BLOCKS];
    let body = json!({"messages": [{"role": "user", "content": fits}]});
    assert!(conversation(body).to_chat().is_ok());
}
