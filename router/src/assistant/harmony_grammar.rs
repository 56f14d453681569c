//! The Lark grammars (llguidance's dialect) that hold harmony output to a request's rules: the
//! answer's JSON in the `final` channel, calls in the `commentary` channel to
//! `functions.NAME` with arguments that follow the tool's schema.
//!
//! A constrained answer or a required call comes at once, without an analysis message first:
//! reasoning of unbounded length could reach `max_tokens` before the answer and leave it
//! empty. With `tool_choice: auto` the model reasons, then answers or calls.

use serde_json::Value;
use tessera_params::OutputConstraint;

use super::tool_grammar::{LAYOUT, ToolChoice, ToolSpec, regex_escape};

/// How a grammar names a marker: `<[id]>` for a special token, a quoted literal otherwise.
pub(crate) type Term<'a> = &'a dyn Fn(&str) -> String;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
const END: &str = "<|end|>";

/// The grammar of an answer in the `final` channel that meets `constraint`; `None` for the
/// constraints that cannot be put there (a regular expression or a whole grammar of the
/// request's own).
pub(crate) fn answer_grammar(constraint: &OutputConstraint, term: Term<'_>) -> Option<String> {
    let answer = match constraint {
        OutputConstraint::JsonObject => "%json {\"type\": \"object\"}".to_owned(),
        OutputConstraint::JsonSchema(schema) => {
            let schema: Value = serde_json::from_str(schema).ok()?;
            format!("%json {}", laid_out(schema))
        }
        OutputConstraint::OneOf(choices) => choices
            .iter()
            .map(|c| Value::from(c.as_str()).to_string())
            .collect::<Vec<_>>()
            .join(" | "),
        OutputConstraint::Pattern(_) | OutputConstraint::Lark(_) => return None,
    };
    Some(format!(
        "start: {} {} {} ({answer})\n",
        term(CHANNEL),
        lit("final"),
        term(MESSAGE)
    ))
}

/// The grammar of harmony output that calls `tools` as `choice` says.
pub(crate) fn call_grammar(tools: &[ToolSpec], choice: &ToolChoice, term: Term<'_>) -> String {
    let callable: Vec<&ToolSpec> = match choice {
        ToolChoice::Named(name) => tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.iter().collect(),
    };
    let mut rules = Vec::new();
    let names: Vec<String> = callable
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            rules.push(format!(
                "fn_{i}: {} {} {} {} {} %json {}",
                term(CHANNEL),
                lit(&format!("commentary to=functions.{} ", tool.name)),
                term(CONSTRAIN),
                lit("json"),
                term(MESSAGE),
                laid_out(tool.parameters.clone())
            ));
            format!("fn_{i}")
        })
        .collect();
    rules.push(format!("call: {}", names.join(" | ")));
    let start = match choice {
        ToolChoice::Auto => {
            rules.push(format!(
                "analysis: {} {} {} TEXT {} {} {}",
                term(CHANNEL),
                lit("analysis"),
                term(MESSAGE),
                term(END),
                term(START),
                lit("assistant")
            ));
            rules.push(format!(
                "final: {} {} {} TEXT",
                term(CHANNEL),
                lit("final"),
                term(MESSAGE)
            ));
            rules.push(text_rule(term));
            "analysis? (final | call)"
        }
        ToolChoice::Required | ToolChoice::Named(_) => "call",
    };
    let mut grammar = format!("start: {start}\n");
    for rule in rules {
        grammar.push_str(&rule);
        grammar.push('\n');
    }
    grammar
}

/// A message's free text: anything but the end marker (which, as a special token, text cannot
/// contain anyway).
fn text_rule(term: Term<'_>) -> String {
    let end = term(END);
    if end.starts_with("<[") {
        "TEXT: /(?s:.*)/".to_owned()
    } else {
        format!("TEXT: /(?s:.*)/ & ~/(?s:.*{}.*)/", regex_escape(END))
    }
}

/// `schema` with its objects closed and the JSON layout the template shows calls in.
fn laid_out(mut schema: Value) -> String {
    tessera_text::close_declared_objects(&mut schema);
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::from_str(LAYOUT).unwrap_or_default());
    }
    schema.to_string()
}

fn lit(text: &str) -> String {
    Value::from(text).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tessera_text::{GrammarCompiler, GrammarMatcher, GrammarSource};

    use super::*;

    /// Id 0 ends generation; ids 1..=256 are the bytes; then the harmony markers, special.
    const MARKERS: [&str; 5] = [START, CHANNEL, MESSAGE, CONSTRAIN, END];
    const EOS: u32 = 0;

    fn compiler() -> GrammarCompiler {
        let mut tokens = vec![None];
        tokens.extend((0..=255u8).map(|b| Some(vec![b])));
        tokens.extend(MARKERS.iter().map(|_| None));
        GrammarCompiler::new(&tokens, &[EOS]).unwrap()
    }

    fn special(text: &str) -> String {
        let at = MARKERS.iter().position(|m| *m == text).unwrap();
        format!("<[{}]>", 257 + at)
    }

    /// `text` as token ids: the markers as their special tokens, the rest byte by byte.
    fn ids(text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        'outer: while !rest.is_empty() {
            for (i, m) in MARKERS.iter().enumerate() {
                if let Some(after) = rest.strip_prefix(m) {
                    out.push(257 + i as u32);
                    rest = after;
                    continue 'outer;
                }
            }
            out.push(u32::from(rest.as_bytes()[0]) + 1);
            rest = &rest[1..];
        }
        out
    }

    fn accepts(m: &mut GrammarMatcher, text: &str) -> bool {
        for id in ids(text) {
            let set = m.allowed().unwrap();
            if set[id as usize / 64] & (1 << (id % 64)) == 0 || !m.consume(id) {
                return false;
            }
        }
        m.allowed().unwrap()[0] & 1 != 0
    }

    fn check(grammar: &str, yes: &[&str], no: &[&str]) {
        let c = compiler();
        for text in yes {
            let mut m = c.compile(GrammarSource::Lark(grammar)).unwrap();
            assert!(accepts(&mut m, text), "refused {text:?}\n{grammar}");
        }
        for text in no {
            let mut m = c.compile(GrammarSource::Lark(grammar)).unwrap();
            assert!(!accepts(&mut m, text), "accepted {text:?}\n{grammar}");
        }
    }

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]}),
            },
            ToolSpec {
                name: "noop".into(),
                parameters: json!({"type": "object", "properties": {}}),
            },
        ]
    }

    const OSLO: &str = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}";
    const NOOP: &str = "<|channel|>commentary to=functions.noop <|constrain|>json<|message|>{}";
    const THINK: &str = "<|channel|>analysis<|message|>Think <b>.<|end|><|start|>assistant";

    #[test]
    fn named_and_required_calls_come_at_once_and_validate() {
        let named = call_grammar(&tools(), &ToolChoice::Named("noop".into()), &special);
        check(&named, &[NOOP], &[OSLO, &format!("{THINK}{NOOP}"), ""]);
        let required = call_grammar(&tools(), &ToolChoice::Required, &special);
        check(
            &required,
            &[NOOP, OSLO],
            &[
                &OSLO.replace("\"Oslo\"", "1"),
                "<|channel|>final<|message|>Hi",
            ],
        );
    }

    #[test]
    fn auto_reasons_then_answers_or_calls() {
        let auto = call_grammar(&tools(), &ToolChoice::Auto, &special);
        let answer = "<|channel|>final<|message|>It is <warm>.";
        check(
            &auto,
            &[
                answer,
                OSLO,
                &format!("{THINK}{OSLO}"),
                &format!("{THINK}{answer}"),
            ],
            &[
                "plain text",
                &format!("{THINK}{THINK}{answer}"),
                &OSLO.replace("Oslo\"", "Oslo\", \"x\": 1"),
            ],
        );
    }

    #[test]
    fn constrained_answers_sit_in_the_final_channel() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                            "required": ["n"]});
        let grammar =
            answer_grammar(&OutputConstraint::JsonSchema(schema.to_string()), &special).unwrap();
        check(
            &grammar,
            &["<|channel|>final<|message|>{\"n\": 4}"],
            &["{\"n\": 4}", "<|channel|>final<|message|>{\"n\": \"4\"}"],
        );
        let one_of = OutputConstraint::OneOf(vec!["yes".into(), "no".into()]);
        let grammar = answer_grammar(&one_of, &special).unwrap();
        check(&grammar, &["<|channel|>final<|message|>no"], &["no"]);
        let pattern = OutputConstraint::Pattern("a+".into());
        assert_eq!(answer_grammar(&pattern, &special), None);
    }
}
