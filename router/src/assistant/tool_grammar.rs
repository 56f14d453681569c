//! The Lark grammar (llguidance's dialect) that holds tool calls to their tools' schemas: with
//! `tool_choice` `required` or a named function the output is calls only; with `auto` it is
//! free text, or text up to the format's start and calls from there on.

use serde_json::{Value, json};

use super::ToolCallFormat;
use super::harmony_grammar::{Term, call_grammar};

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolSpec {
    /// The function's name.
    pub(crate) name: String,
    /// The JSON Schema of its arguments (an object schema).
    pub(crate) parameters: Value,
}

/// Which calls the output must make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// The model chooses between text and calls.
    Auto,
    /// At least one call.
    Required,
    /// Calls of this function only.
    Named(String),
}

/// JSON layout of the calls: as Python's `json.dumps` writes it, which is how the templates
/// show calls to the model.
pub(super) const LAYOUT: &str =
    r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;

/// The grammar of an output that calls `tools` in `format` as `choice` says; `term` is how the
/// grammar names a marker (a quoted literal, or `<[id]>` when it is a special token).
pub(crate) fn tool_grammar(
    format: ToolCallFormat,
    tools: &[ToolSpec],
    choice: &ToolChoice,
    single_call: bool,
    term: Term<'_>,
) -> String {
    let callable: Vec<&ToolSpec> = match choice {
        ToolChoice::Named(name) => tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    };
    let mut rules = Vec::new();
    let names: Vec<String> = callable
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            rules.push(format!("fn_{i}: %json {}", call_schema(format, tool)));
            format!("fn_{i}")
        })
        .collect();
    rules.push(format!("body: {}", names.join(" | ")));
    let lit = |s: &str| Value::from(s).to_string();
    let more = |sep: &str, item: &str| {
        if single_call {
            String::new()
        } else {
            format!(" ({} {item})*", lit(sep))
        }
    };
    let start = match format {
        ToolCallFormat::Hermes => {
            rules.push(format!(
                "call: {} body {}",
                lit("<tool_call>\n"),
                lit("\n</tool_call>")
            ));
            let first = format!("{} body {}", lit("\n"), lit("\n</tool_call>"));
            match choice {
                ToolChoice::Auto => {
                    rules.push(format!(
                        "FREE: /(?s:.*)/ & ~/(?s:.*{}.*)/",
                        regex_escape(format.start())
                    ));
                    rules.push(format!("lead[stop={}]: /(?s:.*)/", lit(format.start())));
                    format!("FREE | lead {first}{}", more("\n", "call"))
                }
                _ => format!("call{}", more("\n", "call")),
            }
        }
        ToolCallFormat::Llama3Json => {
            let calls = format!("body{}", more("; ", "body"));
            match choice {
                ToolChoice::Auto => {
                    rules.push(r"FREE: /(?s:.*)/ & ~/(?s:[ \t\r\n]*\{.*)/".to_owned());
                    format!("FREE | {calls}")
                }
                _ => calls,
            }
        }
        ToolCallFormat::Mistral => {
            let calls = format!(
                "{} {} body{} {}",
                term(format.start()),
                lit("["),
                more(", ", "body"),
                lit("]")
            );
            match choice {
                ToolChoice::Auto => {
                    rules.push(format!(
                        "FREE: /(?s:.*)/ & ~/(?s:.*{}.*)/",
                        regex_escape(format.start())
                    ));
                    format!("FREE | {calls}")
                }
                _ => calls,
            }
        }
        ToolCallFormat::Harmony => return call_grammar(tools, choice, term),
    };
    let mut grammar = format!("start: {start}\n");
    for rule in rules {
        grammar.push_str(&rule);
        grammar.push('\n');
    }
    grammar
}

/// The schema of one call's JSON: the name, then the arguments under the format's key. The
/// arguments' `$defs` move to the root, where their `#/$defs/…` references point.
fn call_schema(format: ToolCallFormat, tool: &ToolSpec) -> String {
    let mut parameters = tool.parameters.clone();
    tessera_text::close_declared_objects(&mut parameters);
    let mut root = json!({
        "type": "object",
        "properties": {
            "name": {"const": tool.name},
        },
        "required": ["name", format.arguments_key()],
        "additionalProperties": false,
    });
    if let (Some(params), Some(root)) = (parameters.as_object_mut(), root.as_object_mut()) {
        for key in ["$defs", "definitions"] {
            if let Some(defs) = params.remove(key) {
                root.insert(key.to_owned(), defs);
            }
        }
    }
    root["properties"][format.arguments_key()] = parameters;
    root["x-guidance"] = serde_json::from_str(LAYOUT).unwrap_or_default();
    root.to_string()
}

/// `text` as a regular expression that matches it literally.
pub(super) fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use tessera_text::{GrammarCompiler, GrammarMatcher, GrammarSource};

    use super::*;

    const EOS: u32 = 0;

    /// Id 0 ends generation; id `b + 1` is byte `b`.
    fn compiler() -> GrammarCompiler {
        let mut tokens = vec![None];
        tokens.extend((0..=255u8).map(|b| Some(vec![b])));
        GrammarCompiler::new(&tokens, &[EOS]).unwrap()
    }

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "additionalProperties": false,
                    "properties": {"city": {"$ref": "#/$defs/City"}},
                    "required": ["city"],
                    "$defs": {"City": {"type": "string", "enum": ["Oslo", "Lima"]}}}),
            },
            ToolSpec {
                name: "noop".into(),
                parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
            },
        ]
    }

    /// Whether the grammar accepts `text` whole (each byte allowed, then the end).
    fn accepts(m: &mut GrammarMatcher, text: &str) -> bool {
        for b in text.bytes() {
            let set = m.allowed().unwrap();
            let id = u32::from(b) + 1;
            if set[id as usize / 64] & (1 << (id % 64)) == 0 || !m.consume(id) {
                return false;
            }
        }
        m.allowed().unwrap()[0] & 1 != 0
    }

    fn check(format: ToolCallFormat, choice: ToolChoice, single: bool, yes: &[&str], no: &[&str]) {
        let c = compiler();
        let quoted = |text: &str| Value::from(text).to_string();
        let grammar = tool_grammar(format, &tools(), &choice, single, &quoted);
        for text in yes {
            let mut m = c.compile(GrammarSource::Lark(&grammar)).unwrap();
            assert!(
                accepts(&mut m, text),
                "{format:?} {choice:?} refused {text:?}\n{grammar}"
            );
        }
        for text in no {
            let mut m = c.compile(GrammarSource::Lark(&grammar)).unwrap();
            assert!(
                !accepts(&mut m, text),
                "{format:?} {choice:?} accepted {text:?}"
            );
        }
    }

    const OSLO: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    const NOOP: &str = "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>";

    #[test]
    fn hermes_required_calls_validate_against_their_schemas() {
        let two = format!("{OSLO}\n{NOOP}");
        check(
            ToolCallFormat::Hermes,
            ToolChoice::Required,
            false,
            &[OSLO, &two],
            &[
                "Hello",
                "",
                &OSLO.replace("Oslo", "Paris"),
                &OSLO.replace("get_weather", "get_time"),
            ],
        );
        check(
            ToolCallFormat::Hermes,
            ToolChoice::Required,
            true,
            &[OSLO],
            &[&two],
        );
        check(
            ToolCallFormat::Hermes,
            ToolChoice::Named("noop".into()),
            false,
            &[NOOP],
            &[OSLO],
        );
    }

    #[test]
    fn hermes_auto_allows_text_or_text_then_calls() {
        let after = format!("Checking.\n{OSLO}");
        check(
            ToolCallFormat::Hermes,
            ToolChoice::Auto,
            false,
            &["Hello there.", "", &after, OSLO],
            &[&OSLO.replace("Oslo", "Paris"), "Hi <tool_call>\nnot json"],
        );
    }

    #[test]
    fn llama3_and_mistral_grammars_hold_their_formats() {
        let llama = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}";
        let llama_two = format!("{llama}; {{\"name\": \"noop\", \"parameters\": {{}}}}");
        check(
            ToolCallFormat::Llama3Json,
            ToolChoice::Required,
            false,
            &[llama, &llama_two],
            &["text"],
        );
        check(
            ToolCallFormat::Llama3Json,
            ToolChoice::Auto,
            false,
            &["Plain.", llama],
            &[" {oops"],
        );
        let mistral = "[TOOL_CALLS][{\"name\": \"noop\", \"arguments\": {}}]";
        check(
            ToolCallFormat::Mistral,
            ToolChoice::Required,
            false,
            &[mistral],
            &["[]"],
        );
        check(
            ToolCallFormat::Mistral,
            ToolChoice::Auto,
            false,
            &["Plain.", mistral],
            &[],
        );
    }
}
