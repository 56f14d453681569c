//! The Messages API's event stream, as the Anthropic SDK accumulates it: `message_start` (the
//! message without content), `ping`, then per content block `content_block_start`, its
//! deltas (`text_delta`, `thinking_delta`, `input_json_delta`) and `content_block_stop`, then
//! `message_delta` (stop reason, output tokens) and `message_stop`. A failure is an `error`
//! event, which ends the stream.

use axum::response::sse::Event;
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use super::error::{AnthropicError, AnthropicErrorDetail};
use super::response::{ContentBlock, Message, MessageShell, StopReason, stop_reason, tool_use};
use crate::assistant::{OutputReading, OutputSplitter, Piece};
use crate::infer::{InferError, InferStreamResponse};

/// One event of a Messages stream; its SSE `event:` name is its `type`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessageStreamEvent {
    /// The message, without content or stop reason.
    MessageStart {
        /// The message so far.
        message: Message,
    },
    /// Sent once after `message_start`.
    Ping,
    /// A block opens (text and thinking empty, a tool's `input` `{}`).
    ContentBlockStart {
        /// The block's index in `content`.
        index: usize,
        /// The block.
        content_block: ContentBlock,
    },
    /// More of the open block.
    ContentBlockDelta {
        /// The block's index.
        index: usize,
        /// What it adds.
        delta: BlockDelta,
    },
    /// The block is whole.
    ContentBlockStop {
        /// The block's index.
        index: usize,
    },
    /// The message's end: why, and the token counts.
    MessageDelta {
        /// The stop reason and sequence.
        delta: MessageDelta,
        /// The token counts.
        usage: DeltaUsage,
    },
    /// The last event.
    MessageStop,
    /// The request failed; nothing follows.
    Error {
        /// What failed.
        error: AnthropicErrorDetail,
    },
}

/// `delta` of a `content_block_delta`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    /// Text of a `text` block.
    TextDelta {
        /// The text.
        text: String,
    },
    /// Text of a `thinking` block.
    ThinkingDelta {
        /// The text.
        thinking: String,
    },
    /// JSON text of a `tool_use` block's input (the fragments joined parse as the input).
    InputJsonDelta {
        /// The fragment.
        partial_json: String,
    },
}

/// `delta` of a `message_delta`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct MessageDelta {
    /// Why the message ended.
    pub stop_reason: StopReason,
    /// The stop sequence that ended it, if one did.
    pub stop_sequence: Option<String>,
}

/// `usage` of a `message_delta`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DeltaUsage {
    /// Tokens of the rendered prompt.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
}

impl MessageStreamEvent {
    /// The event's `type`, which is also its SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::Ping => "ping",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
            Self::Error { .. } => "error",
        }
    }

    /// The event as SSE.
    pub(super) fn sse(&self) -> Event {
        // Serializing these types cannot fail (string keys, no custom impls).
        let data = serde_json::to_string(self).unwrap_or_default();
        Event::default().event(self.name()).data(data)
    }
}

/// The kind of the open block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
}

/// Turns pieces of output into block events, numbering the blocks.
#[derive(Debug, Default)]
pub(super) struct BlockEvents {
    open: Option<Open>,
    /// Blocks opened so far (the next block's index).
    blocks: usize,
    called: bool,
}

impl BlockEvents {
    /// The events `piece` adds.
    pub(super) fn piece(&mut self, piece: Piece) -> Vec<MessageStreamEvent> {
        match piece {
            Piece::Reasoning(thinking) => {
                self.text(Open::Thinking, BlockDelta::ThinkingDelta { thinking })
            }
            Piece::Content(text) => self.text(Open::Text, BlockDelta::TextDelta { text }),
            Piece::Call(call) => {
                let mut out = self.close();
                let ContentBlock::ToolUse { id, name, input } = tool_use(call) else {
                    return out;
                };
                self.called = true;
                let index = self.next_index();
                let partial_json = serde_json::to_string(&input).unwrap_or_default();
                let content_block = ContentBlock::ToolUse {
                    id,
                    name,
                    input: json!({}),
                };
                out.push(MessageStreamEvent::ContentBlockStart {
                    index,
                    content_block,
                });
                out.push(MessageStreamEvent::ContentBlockDelta {
                    index,
                    delta: BlockDelta::InputJsonDelta { partial_json },
                });
                out.push(MessageStreamEvent::ContentBlockStop { index });
                out
            }
        }
    }

    /// Closes the open block, if any.
    pub(super) fn close(&mut self) -> Vec<MessageStreamEvent> {
        match self.open.take() {
            Some(_) => vec![MessageStreamEvent::ContentBlockStop {
                index: self.blocks - 1,
            }],
            None => Vec::new(),
        }
    }

    /// Whether a tool was called.
    pub(super) fn called(&self) -> bool {
        self.called
    }

    fn next_index(&mut self) -> usize {
        self.blocks += 1;
        self.blocks - 1
    }

    fn text(&mut self, kind: Open, delta: BlockDelta) -> Vec<MessageStreamEvent> {
        let mut out = Vec::new();
        if self.open != Some(kind) {
            out.extend(self.close());
            let index = self.next_index();
            let content_block = match kind {
                Open::Text => ContentBlock::Text {
                    text: String::new(),
                },
                Open::Thinking => ContentBlock::Thinking {
                    thinking: String::new(),
                    signature: String::new(),
                },
            };
            out.push(MessageStreamEvent::ContentBlockStart {
                index,
                content_block,
            });
            self.open = Some(kind);
        }
        out.push(MessageStreamEvent::ContentBlockDelta {
            index: self.blocks - 1,
            delta,
        });
        out
    }
}

/// The events of one message, from its output's events (the permits are held to the end).
pub(super) fn events<S>(
    shell: MessageShell,
    permits: Vec<OwnedSemaphorePermit>,
    mut output: S,
    reading: OutputReading,
) -> impl Stream<Item = MessageStreamEvent> + Send
where
    S: Stream<Item = Result<InferStreamResponse, InferError>> + Unpin + Send + 'static,
{
    async_stream::stream! {
        let _permits = permits;
        let mut blocks = BlockEvents::default();
        let mut splitter = OutputSplitter::new(reading);
        yield MessageStreamEvent::MessageStart { message: shell.started() };
        yield MessageStreamEvent::Ping;
        while let Some(event) = output.next().await {
            let (text, end) = match event {
                // A generation request never pools.
                Ok(InferStreamResponse::Prefill(_) | InferStreamResponse::Pooled { .. }) => continue,
                Ok(InferStreamResponse::Intermediate { token, .. }) => (token.text, None),
                Ok(InferStreamResponse::End { token, generated_text, .. }) => {
                    (token.text, Some(generated_text))
                }
                Err(e) => {
                    yield MessageStreamEvent::Error { error: AnthropicError::from(e).detail() };
                    return;
                }
            };
            let mut pieces = splitter.push(&text);
            if end.is_some() {
                pieces.extend(splitter.finish());
            }
            for piece in pieces {
                for e in blocks.piece(piece) {
                    yield e;
                }
            }
            if let Some(generated) = end {
                for e in blocks.close() {
                    yield e;
                }
                let (stop_reason, stop_sequence) = stop_reason(&generated, blocks.called());
                let usage = DeltaUsage {
                    input_tokens: shell.input_tokens(),
                    output_tokens: generated.generated_tokens,
                };
                yield MessageStreamEvent::MessageDelta {
                    delta: MessageDelta { stop_reason, stop_sequence },
                    usage,
                };
                yield MessageStreamEvent::MessageStop;
                return;
            }
        }
        let error = AnthropicError::from(InferError::IncompleteGeneration).detail();
        yield MessageStreamEvent::Error { error };
    }
}
