//! The assistant's output read as a chat client expects it: the model's text split into
//! reasoning, content and tool calls, token by token (for streams) or all at once (one
//! implementation for both: a whole answer is a stream read to its end).
//!
//! Text that may be the beginning of a marker (`<tool_call>`, `</think>`) is held back until
//! the next text says whether it is one, so that no marker leaks into `content`. gpt-oss's
//! harmony format, where channels say what is what, has its own reader.

mod harmony;
mod harmony_grammar;
mod reasoning;
mod tool_format;
mod tool_grammar;

use self::harmony::HarmonyReader;
pub(crate) use self::harmony::is_harmony_template;
pub(crate) use self::harmony_grammar::answer_grammar as harmony_answer_grammar;
pub use self::reasoning::ReasoningFormat;
pub(crate) use self::tool_format::ParsedCall;
pub use self::tool_format::ToolCallFormat;
pub(crate) use self::tool_grammar::{ToolChoice, ToolSpec, tool_grammar};

/// A piece of the assistant's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Thinking (`reasoning`, also sent as `reasoning_content`).
    Reasoning(String),
    /// The answer (`content`).
    Content(String),
    /// A whole tool call.
    Call(ParsedCall),
}

/// How the output is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutputReading {
    /// The tool-call format, when the request has tools to call.
    pub(crate) tools: Option<ToolCallFormat>,
    /// Keep only the first call (`parallel_tool_calls: false`).
    pub(crate) single_call: bool,
    /// The reasoning format, when the server reads reasoning.
    pub(crate) reasoning: Option<ReasoningFormat>,
    /// The output is in the harmony format (gpt-oss): its channels say what is reasoning,
    /// answer and call, whatever `tools` and `reasoning` say.
    pub(crate) harmony: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing read yet: the output may open with `<think>`.
    Opening,
    Reasoning,
    Content,
    /// Inside tool calls (after the format's start).
    Calls,
}

/// Splits one choice's output as it arrives.
#[derive(Debug, Clone)]
pub(crate) struct OutputSplitter {
    reading: OutputReading,
    state: State,
    pending: String,
    /// Calls emitted so far.
    calls: usize,
    /// Whether any non-blank content was emitted (calls that must open the output cannot
    /// follow it).
    spoke: bool,
    /// Blank text held back from the content: emitted if more content follows, dropped if a
    /// call or the end does (the separators around calls are not the answer).
    blank: String,
    /// Drop the blank space that opens the content (after the reasoning).
    trim_lead: bool,
    /// The reader of harmony output, which then reads everything.
    harmony: Option<HarmonyReader>,
}

impl OutputSplitter {
    /// A splitter at the start of an output.
    pub(crate) fn new(reading: OutputReading) -> Self {
        let state = match reading.reasoning {
            Some(ReasoningFormat::DeepSeekR1) | Some(ReasoningFormat::Qwen3) => State::Opening,
            None => State::Content,
        };
        Self {
            reading,
            state,
            pending: String::new(),
            calls: 0,
            spoke: false,
            blank: String::new(),
            trim_lead: false,
            harmony: reading
                .harmony
                .then(|| HarmonyReader::new(reading.tools.is_some(), reading.single_call)),
        }
    }

    /// The pieces of a whole output `text`.
    pub(crate) fn read_whole(reading: OutputReading, text: &str) -> Vec<Piece> {
        let mut splitter = Self::new(reading);
        let mut pieces = splitter.push(text);
        pieces.extend(splitter.finish());
        pieces
    }

    /// The pieces `text` completes.
    pub(crate) fn push(&mut self, text: &str) -> Vec<Piece> {
        if let Some(harmony) = &mut self.harmony {
            return harmony.push(text);
        }
        self.pending.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The pieces left at the end of the output: held-back text, and calls that run to the
    /// end. A call cut short (by `max_tokens` or a stop sequence) is dropped, and so is the
    /// beginning of a call's marker: neither is the answer.
    pub(crate) fn finish(&mut self) -> Vec<Piece> {
        if let Some(harmony) = &mut self.harmony {
            return harmony.finish();
        }
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Opening | State::Content => self.content(&mut out, rest),
            State::Reasoning => push_text(&mut out, Piece::Reasoning(rest)),
            State::Calls => {
                if let Some(calls) = self.reading.tools.and_then(|f| f.parse(&rest)) {
                    self.emit_calls(&mut out, calls);
                }
            }
        }
        self.state = State::Content;
        out
    }

    /// Reads as far as the pending text allows; `true` if the state changed (read again).
    fn step(&mut self, out: &mut Vec<Piece>, at_end: bool) -> bool {
        match self.state {
            State::Opening => {
                let start = ReasoningFormat::START;
                let trimmed = self.pending.trim_start();
                if let Some(rest) = trimmed.strip_prefix(start) {
                    self.pending = rest.to_owned();
                    self.state = State::Reasoning;
                } else if start.starts_with(trimmed) && !at_end {
                    return false;
                } else {
                    self.state = match self.reading.reasoning {
                        Some(ReasoningFormat::DeepSeekR1) => State::Reasoning,
                        _ => State::Content,
                    };
                }
                true
            }
            State::Reasoning => {
                let end = ReasoningFormat::END;
                if let Some(at) = self.pending.find(end) {
                    let thought = self.pending[..at].to_owned();
                    let rest = self.pending[at + end.len()..].trim_start().to_owned();
                    push_text(out, Piece::Reasoning(thought));
                    self.pending = rest;
                    self.state = State::Content;
                    self.trim_lead = true;
                    return true;
                }
                let keep = held_back(&self.pending, end);
                let thought = self.pending.drain(..self.pending.len() - keep).collect();
                push_text(out, Piece::Reasoning(thought));
                false
            }
            State::Content => self.read_content(out, at_end),
            State::Calls => self.read_calls(out),
        }
    }

    fn read_content(&mut self, out: &mut Vec<Piece>, at_end: bool) -> bool {
        let Some(format) = self.reading.tools else {
            let text = std::mem::take(&mut self.pending);
            self.content(out, text);
            return false;
        };
        let start = format.start();
        if format.starts_output() {
            if self.spoke || self.calls > 0 {
                let text = std::mem::take(&mut self.pending);
                self.content(out, text);
                return false;
            }
            let trimmed = self.pending.trim_start();
            if trimmed.is_empty() && !at_end {
                return false;
            }
            if let Some(body) = trimmed.strip_prefix(start) {
                self.pending = body.to_owned();
                self.state = State::Calls;
                return true;
            }
            let text = std::mem::take(&mut self.pending);
            self.content(out, text);
            return false;
        }
        if let Some(at) = self.pending.find(start) {
            let before = self.pending[..at].to_owned();
            self.pending.drain(..at + start.len());
            self.content(out, before);
            self.blank.clear();
            self.state = State::Calls;
            return true;
        }
        let keep = held_back(&self.pending, start);
        let text = self.pending.drain(..self.pending.len() - keep).collect();
        self.content(out, text);
        if at_end {
            self.pending.clear();
        }
        false
    }

    fn read_calls(&mut self, out: &mut Vec<Piece>) -> bool {
        let Some(format) = self.reading.tools else {
            return false;
        };
        let Some(end) = format.end() else {
            return false;
        };
        let Some(at) = self.pending.find(end) else {
            return false;
        };
        let body = self.pending[..at].to_owned();
        self.pending.drain(..at + end.len());
        if let Some(calls) = format.parse(&body) {
            self.emit_calls(out, calls);
        }
        self.state = State::Content;
        true
    }

    fn emit_calls(&mut self, out: &mut Vec<Piece>, calls: Vec<ParsedCall>) {
        for call in calls {
            if self.reading.single_call && self.calls > 0 {
                break;
            }
            self.calls += 1;
            out.push(Piece::Call(call));
        }
    }

    /// Content, except blank space at its start after reasoning and, with tools, blank space
    /// before a call or the end.
    fn content(&mut self, out: &mut Vec<Piece>, text: String) {
        let mut text = text;
        if self.trim_lead {
            text = text.trim_start().to_owned();
            if text.is_empty() {
                return;
            }
            self.trim_lead = false;
        }
        if self.reading.tools.is_some() {
            let kept = text.trim_end().len();
            let tail = text.split_off(kept);
            if !text.is_empty() {
                text.insert_str(0, &std::mem::take(&mut self.blank));
            }
            self.blank.push_str(&tail);
        }
        if text.is_empty() {
            return;
        }
        self.spoke = true;
        push_text(out, Piece::Content(text));
    }
}

fn push_text(out: &mut Vec<Piece>, piece: Piece) {
    match &piece {
        Piece::Reasoning(t) | Piece::Content(t) if t.is_empty() => {}
        _ => out.push(piece),
    }
}

/// How many bytes at the end of `text` may begin `marker` (and so wait for more text).
fn held_back(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
