//! A stream's events from a sequence of pieces and of engine events: their order, block
//! indices and payloads.

use std::time::Instant;

use futures::StreamExt;
use serde_json::{Value, json};

use super::super::response::{ContentBlock, MessageShell, StopReason};
use super::super::stream::{BlockDelta, BlockEvents, MessageStreamEvent, events};
use crate::assistant::{OutputReading, ParsedCall, Piece, ToolCallFormat};
use crate::infer::{FinishReason, GeneratedText, InferError, InferStreamResponse, Token};

fn names(events: &[MessageStreamEvent]) -> Vec<&'static str> {
    events.iter().map(MessageStreamEvent::name).collect()
}

fn block_events(pieces: Vec<Piece>) -> Vec<MessageStreamEvent> {
    let mut blocks = BlockEvents::default();
    let mut out: Vec<_> = pieces.into_iter().flat_map(|p| blocks.piece(p)).collect();
    out.extend(blocks.close());
    out
}

#[test]
fn pieces_open_deltas_and_close_blocks_in_order() {
    let events = block_events(vec![
        Piece::Reasoning("a".into()),
        Piece::Reasoning("b".into()),
        Piece::Content("c".into()),
        Piece::Call(ParsedCall {
            name: "f".into(),
            arguments: r#"{"x": [1, 2]}"#.into(),
        }),
        Piece::Content("d".into()),
    ]);
    assert_eq!(
        names(&events),
        [
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
        ]
    );
    let indices: Vec<usize> = events
        .iter()
        .map(|e| match e {
            MessageStreamEvent::ContentBlockStart { index, .. }
            | MessageStreamEvent::ContentBlockDelta { index, .. }
            | MessageStreamEvent::ContentBlockStop { index } => *index,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(indices, [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
    let start = serde_json::to_value(&events[0]).expect("serializable");
    assert_eq!(
        start,
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
    );
    let delta = serde_json::to_value(&events[2]).expect("serializable");
    assert_eq!(
        delta,
        json!({"type": "content_block_delta", "index": 0,
               "delta": {"type": "thinking_delta", "thinking": "b"}})
    );
    let MessageStreamEvent::ContentBlockStart {
        content_block: ContentBlock::ToolUse { id, name, input },
        ..
    } = &events[7]
    else {
        panic!("{:?}", events[7]);
    };
    assert!(id.starts_with("toolu_"));
    assert_eq!((name.as_str(), input), ("f", &json!({})));
    let MessageStreamEvent::ContentBlockDelta {
        delta: BlockDelta::InputJsonDelta { partial_json },
        ..
    } = &events[8]
    else {
        panic!("{:?}", events[8]);
    };
    let input: Value = serde_json::from_str(partial_json).expect("JSON");
    assert_eq!(input, json!({"x": [1, 2]}));
    assert!(block_events(Vec::new()).is_empty());
}

fn token(text: &str) -> Token {
    Token {
        id: 1,
        text: text.into(),
        logprob: -0.5,
        special: false,
        piece: text.into(),
    }
}

fn end(text: &str, finish_reason: FinishReason, stop: Option<&str>) -> InferStreamResponse {
    InferStreamResponse::End {
        token: token(text),
        top_tokens: Vec::new(),
        generated_text: GeneratedText {
            text: String::new(),
            generated_tokens: 9,
            finish_reason,
            stop_sequence: stop.map(str::to_owned),
            seed: None,
            accepted_per_step: Vec::new(),
        },
        queued: Instant::now(),
        start: Instant::now(),
    }
}

fn intermediate(text: &str) -> InferStreamResponse {
    InferStreamResponse::Intermediate {
        token: token(text),
        top_tokens: Vec::new(),
    }
}

async fn run(
    output: Vec<Result<InferStreamResponse, InferError>>,
    reading: OutputReading,
) -> Vec<MessageStreamEvent> {
    let shell = MessageShell::named("tiny", 5);
    let output = futures::stream::iter(output);
    events(shell, Vec::new(), output, reading).collect().await
}

#[tokio::test]
async fn a_stream_with_text_and_a_call_is_framed_as_the_sdk_reads_it() {
    let reading = OutputReading {
        tools: Some(ToolCallFormat::Hermes),
        ..OutputReading::default()
    };
    let events = run(
        vec![
            Ok(intermediate("Sure. <tool")),
            Ok(intermediate("_call>\n{\"name\": \"f\", ")),
            Ok(intermediate("\"arguments\": {\"a\": 1}}\n</tool_call>")),
            Ok(end("", FinishReason::EosToken, None)),
        ],
        reading,
    )
    .await;
    assert_eq!(
        names(&events),
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let start = serde_json::to_value(&events[0]).expect("serializable");
    assert_eq!(start["message"]["content"], json!([]));
    assert_eq!(start["message"]["usage"]["input_tokens"], 5);
    assert!(start["message"]["stop_reason"].is_null());
    assert_eq!(
        serde_json::to_value(&events[3]).expect("serializable")["delta"],
        json!({"type": "text_delta", "text": "Sure."})
    );
    let delta = serde_json::to_value(&events[8]).expect("serializable");
    assert_eq!(
        delta,
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
               "usage": {"input_tokens": 5, "output_tokens": 9}})
    );
}

#[tokio::test]
async fn a_stop_sequence_and_the_length_limit_end_a_stream() {
    let events = run(
        vec![
            Ok(intermediate("one ")),
            Ok(end("two", FinishReason::StopSequence, Some("three"))),
        ],
        OutputReading::default(),
    )
    .await;
    let Some(MessageStreamEvent::MessageDelta { delta, .. }) = events.iter().rev().nth(1) else {
        panic!("{events:?}");
    };
    assert_eq!(delta.stop_reason, StopReason::StopSequence);
    assert_eq!(delta.stop_sequence.as_deref(), Some("three"));
    let texts: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            MessageStreamEvent::ContentBlockDelta {
                delta: BlockDelta::TextDelta { text },
                ..
            } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts.concat(), "one two");
    let events = run(
        vec![Ok(end("", FinishReason::Length, None))],
        OutputReading::default(),
    )
    .await;
    assert_eq!(
        names(&events),
        ["message_start", "ping", "message_delta", "message_stop"],
        "no output, no blocks"
    );
}

#[tokio::test]
async fn a_failure_mid_stream_is_an_error_event_that_ends_it() {
    let events = run(
        vec![
            Ok(intermediate("par")),
            Err(InferError::ShardFailure("gone".into())),
            Ok(intermediate("never")),
        ],
        OutputReading::default(),
    )
    .await;
    assert_eq!(
        names(&events),
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "error"
        ]
    );
    let error = serde_json::to_value(events.last()).expect("serializable");
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("gone")),
        "{error}"
    );
    let cut = run(vec![Ok(intermediate("x"))], OutputReading::default()).await;
    assert_eq!(cut.last().map(MessageStreamEvent::name), Some("error"));
}
