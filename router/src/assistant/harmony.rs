//! gpt-oss's harmony format read back. The model writes messages, each a header, then
//! `<|message|>`, the body, and an end (`<|end|>`, or `<|return|>` / `<|call|>`, which also
//! end generation). The header names the channel and, for a call, the recipient:
//!
//! ```text
//! <|channel|>analysis<|message|>Need the weather.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>
//! ```
//!
//! `analysis` is reasoning, `final` (and `commentary` to no one: a preamble) is the answer,
//! a message to `functions.NAME` is a call of that function with the body as arguments.
//! Messages to other recipients (the built-in browser and python tools, which the router does
//! not run) are the model's own work: reasoning.

use super::{ParsedCall, Piece, push_text};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
const ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];
/// Markers that open a header: a body they appear in has ended, even without its end marker.
const OPENS: [&str; 2] = [START, CHANNEL];

/// Longest header read; a longer run of text without `<|message|>` is not a header.
const MAX_HEADER: usize = 512;

/// Where a message's body goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call of this function; the arguments gather until the message ends.
    Call {
        name: String,
        arguments: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Between messages: reading a header.
    Header,
    Body(Body),
}

/// Splits one choice's harmony output as it arrives.
#[derive(Debug, Clone)]
pub(crate) struct HarmonyReader {
    state: State,
    pending: String,
    /// Whether the request has tools (calls to `functions.*` are calls).
    tools: bool,
    single_call: bool,
    calls: usize,
    /// The body being read had no header (the model wrote outside the format).
    headerless: bool,
}

impl HarmonyReader {
    pub(crate) fn new(tools: bool, single_call: bool) -> Self {
        Self {
            state: State::Header,
            pending: String::new(),
            tools,
            single_call,
            calls: 0,
            headerless: false,
        }
    }

    /// The pieces `text` completes.
    pub(crate) fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// The pieces left at the end of the output. A header cut short is dropped; so is a call
    /// whose arguments are not whole JSON (cut by `max_tokens`).
    pub(crate) fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        while self.step(&mut out) {}
        let rest = std::mem::take(&mut self.pending);
        match std::mem::replace(&mut self.state, State::Header) {
            State::Header if looks_like_header(&rest) => {}
            State::Header | State::Body(Body::Content) => push_text(&mut out, Piece::Content(rest)),
            State::Body(Body::Reasoning) => push_text(&mut out, Piece::Reasoning(rest)),
            State::Body(Body::Call {
                name,
                mut arguments,
            }) => {
                arguments.push_str(&rest);
                self.call(&mut out, name, arguments);
            }
        }
        out
    }

    /// Reads as far as the pending text allows; `true` if the state changed (read again).
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match &mut self.state {
            State::Header => {
                let message = self.pending.find(MESSAGE).filter(|&at| at <= MAX_HEADER);
                if let (Some(at), true) = (message, looks_like_header(&self.pending)) {
                    let header: String = self.pending.drain(..at + MESSAGE.len()).collect();
                    self.state = State::Body(self.body_of(&header[..at]));
                    self.headerless = false;
                    return true;
                }
                if self.pending.len() > MAX_HEADER || !looks_like_header(&self.pending) {
                    // Text outside any message: the model answered without the format.
                    self.state = State::Body(Body::Content);
                    self.headerless = true;
                    return true;
                }
                false
            }
            State::Body(body) => {
                // Text read without a header ends only at an end marker: a header's marker in
                // it is what overflowed a header.
                let opens: &[&str] = if self.headerless { &[] } else { &OPENS };
                let opens = opens
                    .iter()
                    .filter_map(|m| self.pending.find(m).map(|at| (at, 0)));
                let end = ENDS
                    .iter()
                    .filter_map(|m| self.pending.find(m).map(|at| (at, m.len())))
                    .chain(opens)
                    .min();
                let (text, ended) = match end {
                    Some((at, len)) => {
                        let text: String = self.pending.drain(..at).collect();
                        self.pending.drain(..len);
                        (text, true)
                    }
                    None => {
                        let keep = ENDS
                            .iter()
                            .chain(&OPENS)
                            .map(|m| super::held_back(&self.pending, m))
                            .max()
                            .unwrap_or(0);
                        let cut = self.pending.len() - keep;
                        (self.pending.drain(..cut).collect(), false)
                    }
                };
                match body {
                    Body::Reasoning => push_text(out, Piece::Reasoning(text)),
                    Body::Content => push_text(out, Piece::Content(text)),
                    Body::Call { arguments, .. } => arguments.push_str(&text),
                }
                if !ended {
                    return false;
                }
                if let State::Body(Body::Call { name, arguments }) =
                    std::mem::replace(&mut self.state, State::Header)
                {
                    self.call(out, name, arguments);
                }
                true
            }
        }
    }

    /// Where the body of the message with `header` goes.
    fn body_of(&self, header: &str) -> Body {
        let channel = word_after(header, CHANNEL);
        match word_after(header, "to=") {
            Some(recipient) => match recipient.strip_prefix("functions.") {
                Some(name) if self.tools && !name.is_empty() => Body::Call {
                    name: name.to_owned(),
                    arguments: String::new(),
                },
                _ => Body::Reasoning,
            },
            None if channel == Some("analysis") => Body::Reasoning,
            None => Body::Content,
        }
    }

    fn call(&mut self, out: &mut Vec<Piece>, name: String, arguments: String) {
        let arguments = arguments.trim();
        if serde_json::from_str::<serde_json::Value>(arguments).is_err() {
            return;
        }
        if self.single_call && self.calls > 0 {
            return;
        }
        self.calls += 1;
        out.push(Piece::Call(ParsedCall {
            name,
            arguments: arguments.to_owned(),
        }));
    }
}

/// The word after `key` in a header: up to blank space or the next marker.
fn word_after<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(key)? + key.len();
    let rest = &header[at..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Whether `text` is (the beginning of) a message header: it opens with a marker or with the
/// recipient (`to=…`, which may precede the channel).
fn looks_like_header(text: &str) -> bool {
    let text = text.trim_start();
    [START, CHANNEL, CONSTRAIN, MESSAGE, "to="]
        .iter()
        .any(|m| text.starts_with(m) || m.starts_with(text))
}

/// Whether a chat template writes the harmony format.
pub(crate) fn is_harmony_template(source: &str) -> bool {
    source.contains(CHANNEL) && source.contains(MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_by_pieces(text: &str, step: usize, tools: bool) -> Vec<Piece> {
        let mut reader = HarmonyReader::new(tools, false);
        let mut pieces = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(step) {
            pieces.extend(reader.push(&chunk.iter().collect::<String>()));
        }
        pieces.extend(reader.finish());
        merge(pieces)
    }

    /// Adjacent text pieces of one kind joined, as a client joins deltas.
    fn merge(pieces: Vec<Piece>) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        for p in pieces {
            match (out.last_mut(), p) {
                (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
                (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
                (_, p) => out.push(p),
            }
        }
        out
    }

    /// Every way of cutting `text` into deltas reads as a whole.
    fn read(text: &str, tools: bool) -> Vec<Piece> {
        let whole = read_by_pieces(text, usize::MAX, tools);
        for step in [1, 2, 3, 7] {
            assert_eq!(read_by_pieces(text, step, tools), whole, "step {step}");
        }
        whole
    }

    fn call(name: &str, arguments: &str) -> Piece {
        Piece::Call(ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        })
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let text = "<|channel|>analysis<|message|>User greets. Reply.<|end|>\
                    <|start|>assistant<|channel|>final<|message|>Hello! <b>Hi</b><|return|>";
        assert_eq!(
            read(text, false),
            vec![
                Piece::Reasoning("User greets. Reply.".into()),
                Piece::Content("Hello! <b>Hi</b>".into())
            ]
        );
    }

    #[test]
    fn calls_read_their_recipient_in_either_place() {
        let text = "<|channel|>analysis<|message|>Need weather.<|end|>\
                    <|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>";
        assert_eq!(
            read(text, true),
            vec![
                Piece::Reasoning("Need weather.".into()),
                call("get_weather", "{\"city\": \"Oslo\"}")
            ]
        );
        // As the template renders history: the recipient before the channel.
        let text = " to=functions.noop<|channel|>commentary json<|message|>{}<|call|>";
        assert_eq!(read(text, true), vec![call("noop", "{}")]);
    }

    #[test]
    fn the_end_token_may_be_absent_and_a_cut_call_is_dropped() {
        // Generation stopped on `<|call|>`, which the text need not carry.
        let text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": [1]}";
        assert_eq!(read(text, true), vec![call("f", "{\"a\": [1]}")]);
        let cut = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": [1";
        assert_eq!(read(cut, true), vec![]);
        let header_only = "<|channel|>analysis";
        assert_eq!(read(header_only, true), vec![]);
    }

    #[test]
    fn preambles_are_content_and_other_recipients_reasoning() {
        let text = "<|channel|>commentary<|message|>Let me check.<|end|>\
                    <|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>";
        assert_eq!(
            read(text, true),
            vec![
                Piece::Content("Let me check.".into()),
                Piece::Reasoning("{\"query\": \"x\"}".into())
            ]
        );
        // Without tools in the request a call is not one.
        let text = "<|channel|>commentary to=functions.f<|message|>{}<|call|>";
        assert_eq!(read(text, false), vec![Piece::Reasoning("{}".into())]);
    }

    #[test]
    fn a_new_header_ends_a_message_without_its_end_marker() {
        let text = "<|channel|>analysis<|message|>Think.<|start|>assistant<|channel|>final\
                    <|message|>Done.<|channel|>final<|message|> Again.";
        assert_eq!(
            read(text, false),
            vec![
                Piece::Reasoning("Think.".into()),
                Piece::Content("Done. Again.".into())
            ]
        );
    }

    /// Any text, however broken its format, is read to its end, and alike in any pieces.
    #[test]
    fn scrambled_format_reads_alike_whole_and_streamed() {
        use rand::{Rng, SeedableRng};
        let parts = [
            START,
            CHANNEL,
            MESSAGE,
            CONSTRAIN,
            "<|end|>",
            "<|call|>",
            "<|return|>",
            "analysis",
            "final",
            "commentary",
            " to=functions.f",
            " to=browser.x",
            "{}",
            "{\"a\": 1}",
            "x",
            "<",
            "|",
            " ",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..500 {
            let n = rng.random_range(0..24);
            let text: String = (0..n)
                .map(|_| parts[rng.random_range(0..parts.len())])
                .collect();
            read(&text, rng.random_bool(0.5));
        }
    }

    #[test]
    fn text_without_the_format_is_content() {
        assert_eq!(
            read("Plain words, <not> a header.", false),
            vec![Piece::Content("Plain words, <not> a header.".into())]
        );
        let long = format!("<|channel|>{}", "x".repeat(MAX_HEADER));
        assert_eq!(read(&long, false), vec![Piece::Content(long.clone())]);
    }

    #[test]
    fn one_call_is_kept_when_asked() {
        let two = "<|channel|>commentary to=functions.a<|message|>{}<|end|>\
                   <|start|>assistant<|channel|>commentary to=functions.b<|message|>{}<|call|>";
        assert_eq!(read(two, true), vec![call("a", "{}"), call("b", "{}")]);
        let mut single = HarmonyReader::new(true, true);
        let mut pieces = single.push(two);
        pieces.extend(single.finish());
        assert_eq!(pieces, vec![call("a", "{}")]);
    }

    #[test]
    fn harmony_templates_are_recognized() {
        assert!(is_harmony_template(
            "{{- '<|start|>assistant<|channel|>final<|message|>' }}"
        ));
        assert!(!is_harmony_template("<|im_start|>assistant"));
    }
}
