//! A whole message from pieces of output: its blocks, stop reason and JSON shape.

use serde_json::json;

use super::super::response::{
    ContentBlock, MessageShell, StopReason, TokenCount, blocks, stop_reason,
};
use crate::assistant::{ParsedCall, Piece};
use crate::infer::{FinishReason, GeneratedText};

fn generated(finish_reason: FinishReason, stop_sequence: Option<&str>) -> GeneratedText {
    GeneratedText {
        text: String::new(),
        generated_tokens: 7,
        finish_reason,
        stop_sequence: stop_sequence.map(str::to_owned),
        seed: None,
        accepted_per_step: Vec::new(),
    }
}

fn call(name: &str, arguments: &str) -> Piece {
    Piece::Call(ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    })
}

#[test]
fn pieces_become_blocks_in_the_order_written() {
    let out = blocks(vec![
        Piece::Reasoning("think".into()),
        Piece::Reasoning("ing".into()),
        Piece::Content("Hel".into()),
        Piece::Content("lo".into()),
        call("get_weather", r#"{"city": "Oslo"}"#),
        call("ping", "not json"),
    ]);
    assert_eq!(out.len(), 4, "{out:?}");
    assert_eq!(
        out[0],
        ContentBlock::Thinking {
            thinking: "thinking".into(),
            signature: String::new()
        }
    );
    assert_eq!(
        out[1],
        ContentBlock::Text {
            text: "Hello".into()
        }
    );
    let ContentBlock::ToolUse { id, name, input } = &out[2] else {
        panic!("{:?}", out[2]);
    };
    assert!(id.starts_with("toolu_") && id.len() > 20, "{id}");
    assert_eq!(name, "get_weather");
    assert_eq!(input, &json!({"city": "Oslo"}));
    let ContentBlock::ToolUse {
        id: other, input, ..
    } = &out[3]
    else {
        panic!("{:?}", out[3]);
    };
    assert_ne!(id, other, "each call has its own id");
    assert_eq!(input, &json!("not json"), "kept as the model wrote it");
    assert!(blocks(Vec::new()).is_empty());
}

#[test]
fn stop_reasons() {
    let cases = [
        (FinishReason::EosToken, None, false, StopReason::EndTurn),
        (FinishReason::EosToken, None, true, StopReason::ToolUse),
        (FinishReason::Length, None, true, StopReason::MaxTokens),
        (
            FinishReason::StopSequence,
            Some("END"),
            false,
            StopReason::StopSequence,
        ),
        // A stop token id is no sequence the client named.
        (FinishReason::StopSequence, None, false, StopReason::EndTurn),
    ];
    for (finish, sequence, called, want) in cases {
        let (reason, matched) = stop_reason(&generated(finish, sequence), called);
        assert_eq!(reason, want, "{finish:?} {sequence:?} {called}");
        let want_sequence = (want == StopReason::StopSequence).then(|| "END".to_owned());
        assert_eq!(matched, want_sequence);
    }
}

#[test]
fn a_whole_message_has_anthropics_shape() {
    let shell = MessageShell::named("tiny", 12);
    let content = blocks(vec![Piece::Content("Hi".into()), call("f", "{}")]);
    let message = shell.finished(content, &generated(FinishReason::EosToken, None));
    let v = serde_json::to_value(&message).expect("serializable");
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
        "{v}"
    );
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "tiny");
    assert_eq!(v["content"][0], json!({"type": "text", "text": "Hi"}));
    assert_eq!(v["content"][1]["type"], "tool_use");
    assert_eq!(v["content"][1]["input"], json!({}));
    assert_eq!(v["stop_reason"], "tool_use");
    assert!(v["stop_sequence"].is_null());
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 12, "output_tokens": 7, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0})
    );
    let started = serde_json::to_value(shell.started()).expect("serializable");
    assert_eq!(started["id"], v["id"], "one id for the whole stream");
    assert_eq!(started["content"], json!([]));
    assert!(started["stop_reason"].is_null());
    assert_eq!(started["usage"]["output_tokens"], 0);
    let stopped = shell.finished(
        Vec::new(),
        &generated(FinishReason::StopSequence, Some("###")),
    );
    let v = serde_json::to_value(stopped).expect("serializable");
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "###");
    assert_eq!(
        serde_json::to_value(TokenCount { input_tokens: 3 }).expect("serializable"),
        json!({"input_tokens": 3})
    );
}
