use super::*;

fn hermes() -> OutputReading {
    OutputReading {
        tools: Some(ToolCallFormat::Hermes),
        ..OutputReading::default()
    }
}

/// The pieces of `tokens` fed one by one, then the end, with adjacent texts of one kind
/// joined (streams may cut them anywhere).
fn split(reading: OutputReading, tokens: &[&str]) -> Vec<Piece> {
    let mut s = OutputSplitter::new(reading);
    let mut pieces: Vec<Piece> = tokens.iter().flat_map(|t| s.push(t)).collect();
    pieces.extend(s.finish());
    let mut joined: Vec<Piece> = Vec::new();
    for p in pieces {
        match (joined.last_mut(), p) {
            (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
            (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
            (_, p) => joined.push(p),
        }
    }
    joined
}

/// `text` cut into pieces of `n` bytes (on character boundaries).
fn chunks(text: &str, n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut at = n.min(rest.len());
        while !rest.is_char_boundary(at) {
            at += 1;
        }
        out.push(&rest[..at]);
        rest = &rest[at..];
    }
    out
}

fn call(name: &str, arguments: &str) -> Piece {
    Piece::Call(ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    })
}

fn content(t: &str) -> Piece {
    Piece::Content(t.into())
}

#[test]
fn plain_text_is_content_however_it_is_cut() {
    let text = "The answer is <b>42</b>, not <tool_cal.";
    for n in [1, 3, 7, 100] {
        assert_eq!(split(hermes(), &chunks(text, n)), [content(text)], "{n}");
    }
}

#[test]
fn one_call_and_several_calls_are_read_whatever_the_cut() {
    let one = "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let two = format!(
        "Let me check.\n{one}\n<tool_call>\n{{\"name\": \"f\", \"arguments\": {{}}}}\n</tool_call>"
    );
    for n in [1, 2, 5, 1000] {
        assert_eq!(
            split(hermes(), &chunks(one, n)),
            [call("get", r#"{"city":"Oslo"}"#)]
        );
        assert_eq!(
            split(hermes(), &chunks(&two, n)),
            [
                content("Let me check."),
                call("get", r#"{"city":"Oslo"}"#),
                call("f", "{}")
            ]
        );
    }
    let single = OutputReading {
        single_call: true,
        ..hermes()
    };
    assert_eq!(
        split(single, &[&two]),
        [content("Let me check."), call("get", r#"{"city":"Oslo"}"#)]
    );
}

#[test]
fn a_cut_or_malformed_call_never_reaches_the_content() {
    let cut = "Checking.\n<tool_call>\n{\"name\": \"get\", \"argum";
    for n in 1..cut.len() {
        assert_eq!(split(hermes(), &chunks(cut, n)), [content("Checking.")]);
    }
    let bad = "<tool_call>\n{name: get}\n</tool_call>";
    assert_eq!(split(hermes(), &[bad]), []);
    // The beginning of a marker, cut off by the end of the output.
    for marker_part in ["<", "\n<tool", "<tool_call"] {
        let text = format!("Sure.{marker_part}");
        assert_eq!(split(hermes(), &chunks(&text, 2)), [content("Sure.")]);
    }
    // A call whose closing tag was cut off but whose JSON is whole still counts.
    let unclosed = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n";
    assert_eq!(split(hermes(), &[unclosed]), [call("f", r#"{"a":1}"#)]);
}

#[test]
fn llama3_calls_open_the_output_or_are_not_calls() {
    let reading = OutputReading {
        tools: Some(ToolCallFormat::Llama3Json),
        ..OutputReading::default()
    };
    let calls =
        " {\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}";
    assert_eq!(
        split(reading, &chunks(calls, 3)),
        [call("a", r#"{"x":1}"#), call("b", "{}")]
    );
    let text = "Use {\"name\": \"a\"} like this.";
    assert_eq!(split(reading, &chunks(text, 3)), [content(text)]);
}

#[test]
fn mistral_calls_follow_their_marker() {
    let reading = OutputReading {
        tools: Some(ToolCallFormat::Mistral),
        ..OutputReading::default()
    };
    let out = "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]";
    assert_eq!(split(reading, &chunks(out, 2)), [call("a", "{}")]);
}

#[test]
fn reasoning_is_split_from_the_answer() {
    let qwen3 = OutputReading {
        reasoning: Some(ReasoningFormat::Qwen3),
        ..OutputReading::default()
    };
    let out = "<think>\nTwo and two.\n</think>\n\nFour.";
    for n in [1, 4, 100] {
        assert_eq!(
            split(qwen3, &chunks(out, n)),
            [
                Piece::Reasoning("\nTwo and two.\n".into()),
                content("Four.")
            ],
            "{n}"
        );
    }
    // Thinking switched off: no reasoning.
    assert_eq!(split(qwen3, &["Four."]), [content("Four.")]);
    // R1 distills start inside the reasoning.
    let r1 = OutputReading {
        reasoning: Some(ReasoningFormat::DeepSeekR1),
        ..OutputReading::default()
    };
    assert_eq!(
        split(r1, &chunks("Hmm.</think>Four.", 2)),
        [Piece::Reasoning("Hmm.".into()), content("Four.")]
    );
    // Reasoning, then a call.
    let both = OutputReading {
        reasoning: Some(ReasoningFormat::Qwen3),
        ..hermes()
    };
    let out =
        "<think>call it</think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    assert_eq!(
        split(both, &chunks(out, 3)),
        [Piece::Reasoning("call it".into()), call("f", "{}")]
    );
}
