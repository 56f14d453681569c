//! The assistant's output as chat responses carry it: a whole message, or deltas as tokens
//! arrive, both read by one [`OutputSplitter`].

use super::response::{
    AssistantMessage, Delta, FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta,
};
use crate::assistant::{OutputReading, OutputSplitter, ParsedCall, Piece};
use crate::validation::random_u64;

/// `finish_reason` of a choice that made calls and ended on its own.
const TOOL_CALLS: &str = "tool_calls";

/// A fresh tool-call id.
fn call_id() -> String {
    format!("call_{:016x}{:08x}", random_u64(), random_u64() as u32)
}

/// A choice's whole message from its whole text, and its finish reason.
pub(super) fn whole_message(
    reading: OutputReading,
    text: &str,
    finish_reason: &'static str,
) -> (AssistantMessage, &'static str) {
    let pieces = OutputSplitter::read_whole(reading, text);
    let (mut content, mut reasoning, mut calls) = (None::<String>, None::<String>, Vec::new());
    for piece in pieces {
        match piece {
            Piece::Content(t) => content.get_or_insert_with(String::new).push_str(&t),
            Piece::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
            Piece::Call(ParsedCall { name, arguments }) => calls.push(ToolCall {
                id: call_id(),
                kind: "function",
                function: FunctionCall { name, arguments },
            }),
        }
    }
    let called = !calls.is_empty();
    let message = AssistantMessage {
        role: "assistant",
        content: if called {
            content
        } else {
            Some(content.unwrap_or_default())
        },
        reasoning_content: reasoning.clone(),
        reasoning,
        tool_calls: called.then_some(calls),
    };
    (message, reason(called, finish_reason))
}

/// A choice's deltas as its text arrives.
#[derive(Debug, Clone)]
pub(super) struct ChoiceDeltas {
    splitter: OutputSplitter,
    calls: usize,
}

impl ChoiceDeltas {
    pub(super) fn new(reading: OutputReading) -> Self {
        Self {
            splitter: OutputSplitter::new(reading),
            calls: 0,
        }
    }

    /// The deltas `text` completes.
    pub(super) fn push(&mut self, text: &str) -> Vec<Delta> {
        let pieces = self.splitter.push(text);
        self.deltas(pieces)
    }

    /// The deltas left at the end of the output.
    pub(super) fn finish(&mut self) -> Vec<Delta> {
        let pieces = self.splitter.finish();
        self.deltas(pieces)
    }

    /// The choice's finish reason, given the engine's.
    pub(super) fn finish_reason(&self, engine: &'static str) -> &'static str {
        reason(self.calls > 0, engine)
    }

    fn deltas(&mut self, pieces: Vec<Piece>) -> Vec<Delta> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Content(t) => out.push(Delta {
                    content: Some(t),
                    ..Delta::default()
                }),
                Piece::Reasoning(t) => out.push(Delta {
                    reasoning: Some(t.clone()),
                    reasoning_content: Some(t),
                    ..Delta::default()
                }),
                Piece::Call(ParsedCall { name, arguments }) => {
                    let index = self.calls;
                    self.calls += 1;
                    let call = |id, kind, name, arguments| Delta {
                        tool_calls: Some(vec![ToolCallDelta {
                            index,
                            id,
                            kind,
                            function: FunctionCallDelta { name, arguments },
                        }]),
                        ..Delta::default()
                    };
                    out.push(call(
                        Some(call_id()),
                        Some("function"),
                        Some(name),
                        String::new(),
                    ));
                    out.push(call(None, None, None, arguments));
                }
            }
        }
        out
    }
}

fn reason(called: bool, engine: &'static str) -> &'static str {
    if called && engine == "stop" {
        TOOL_CALLS
    } else {
        engine
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assistant::ReasoningFormat;

    fn qwen3() -> OutputReading {
        OutputReading {
            reasoning: Some(ReasoningFormat::Qwen3),
            ..OutputReading::default()
        }
    }

    /// Clients read thinking under vLLM's current name or its earlier one: both are sent.
    #[test]
    fn reasoning_is_sent_under_both_names() {
        let (message, _) = whole_message(qwen3(), "<think>Hmm.</think>Four.", "stop");
        let json = serde_json::to_value(&message).unwrap();
        assert_eq!(json["reasoning"], "Hmm.");
        assert_eq!(json["reasoning_content"], "Hmm.");
        assert_eq!(json["content"], "Four.");

        let mut deltas = ChoiceDeltas::new(qwen3());
        let mut sent = deltas.push("<think>Hm");
        sent.extend(deltas.push("m.</think>Four."));
        sent.extend(deltas.finish());
        let field = |name: &str| -> String {
            sent.iter()
                .map(|d| serde_json::to_value(d).unwrap())
                .filter_map(|d| d[name].as_str().map(str::to_owned))
                .collect()
        };
        assert_eq!(field("reasoning"), "Hmm.");
        assert_eq!(field("reasoning_content"), "Hmm.");
        assert_eq!(field("content"), "Four.");
    }
}
