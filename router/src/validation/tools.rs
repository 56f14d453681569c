//! A chat request's tools: their definitions and `tool_choice` checked, the conversation's
//! earlier calls and results read, the grammar that holds the model's calls to the tools'
//! schemas, and, for chat templates that render no tools, the prompt that shows them.

use serde_json::{Value, json};
use tessera_params::OutputConstraint;
use tessera_text::{ChatMessage, ModelTokenizer};

use super::ValidationError;
use super::constraint::MAX_GRAMMAR_BYTES;
use crate::assistant::{ToolCallFormat, ToolChoice, ToolSpec, tool_grammar};

/// Most tools a request may define.
pub(super) const MAX_TOOLS: usize = 128;

/// Deepest nesting of a tool's parameter schema.
const MAX_SCHEMA_DEPTH: usize = 32;

/// The tools a request lets the model call, and how.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ToolUse {
    /// The definitions as the template sees them (OpenAI's `tools` list).
    pub(super) definitions: Value,
    /// The grammar the output follows.
    pub(super) constraint: OutputConstraint,
    /// The format calls are written in.
    pub(super) format: ToolCallFormat,
    /// `parallel_tool_calls: false`.
    pub(super) single_call: bool,
    /// The format's start is a special token, which the text must keep to be read.
    pub(super) keeps_special_tokens: bool,
}

/// The fields a chat request gives tools with, under the names it used.
pub(super) struct ToolFields<'a> {
    pub(super) tools: Option<&'a [Value]>,
    pub(super) choice: Option<&'a Value>,
    pub(super) parallel: Option<bool>,
    /// Whether the deprecated `functions` / `function_call` were used.
    pub(super) legacy: bool,
}

impl ToolFields<'_> {
    fn tools_param(&self) -> &'static str {
        if self.legacy { "functions" } else { "tools" }
    }

    fn choice_param(&self) -> &'static str {
        if self.legacy {
            "function_call"
        } else {
            "tool_choice"
        }
    }

    /// The tools the model may call, or `None` when it may call none (no tools, or `"none"`).
    pub(super) fn tool_use(
        &self,
        format: ToolCallFormat,
        tokenizer: &ModelTokenizer,
    ) -> Result<Option<ToolUse>, ValidationError> {
        let specs = self.specs()?;
        let choice = self.choice(&specs)?;
        let (Some(choice), false) = (choice, specs.is_empty()) else {
            return Ok(None);
        };
        let terms = GrammarTerms::of(tokenizer);
        // A named function is called once, as OpenAI and vLLM answer it: the structured-output
        // modes of instructor and LangChain read exactly one call.
        let single_call = self.parallel == Some(false) || matches!(choice, ToolChoice::Named(_));
        let grammar = tool_grammar(format, &specs, &choice, single_call, &|t| terms.term(t));
        if grammar.len() > MAX_GRAMMAR_BYTES {
            return Err(ValidationError::Constraint {
                param: self.tools_param(),
                message: format!(
                    "the tools' schemas take {} bytes; at most {MAX_GRAMMAR_BYTES} are accepted",
                    grammar.len()
                ),
            });
        }
        let definitions = specs
            .iter()
            .zip(self.tools.into_iter().flatten())
            .map(|(spec, raw)| {
                let description = function_of(raw)
                    .and_then(|f| f.get("description"))
                    .filter(|d| !d.is_null())
                    .cloned();
                // gpt-oss's template prints a description as a string, given or not.
                let missing = match format {
                    ToolCallFormat::Harmony => Value::from(""),
                    _ => Value::Null,
                };
                json!({"type": "function", "function": {
                    "name": spec.name,
                    "description": description.unwrap_or(missing),
                    "parameters": spec.parameters,
                }})
            })
            .collect();
        Ok(Some(ToolUse {
            definitions: Value::Array(definitions),
            constraint: OutputConstraint::Lark(grammar),
            format,
            single_call,
            keeps_special_tokens: terms.is_special(format.start()),
        }))
    }

    /// The tool definitions, checked.
    fn specs(&self) -> Result<Vec<ToolSpec>, ValidationError> {
        let param = self.tools_param();
        let tools = self.tools.unwrap_or_default();
        if tools.len() > MAX_TOOLS {
            return Err(ValidationError::TooMany {
                param,
                max: MAX_TOOLS,
                given: tools.len(),
            });
        }
        let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
        for (i, tool) in tools.iter().enumerate() {
            let bad = |message: String| ValidationError::Constraint {
                param,
                message: format!("[{i}]: {message}"),
            };
            if !self.legacy && tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(
                    "only tools of `\"type\": \"function\"` are supported".into()
                ));
            }
            let function = function_of(tool).ok_or_else(|| bad("no `function` object".into()))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("the function has no `name`".into()))?;
            if !is_function_name(name) {
                return Err(bad(format!(
                    "the function name `{}` is not 1 to 64 letters, digits, `_` or `-`",
                    name.chars().take(80).collect::<String>()
                )));
            }
            if specs.iter().any(|s| s.name == name) {
                return Err(bad(format!("the function name `{name}` is defined twice")));
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => return Err(bad("`parameters` must be a JSON Schema object".into())),
            };
            if depth(&parameters) > MAX_SCHEMA_DEPTH {
                return Err(bad(format!(
                    "`parameters` nest deeper than {MAX_SCHEMA_DEPTH} levels"
                )));
            }
            specs.push(ToolSpec {
                name: name.to_owned(),
                parameters,
            });
        }
        Ok(specs)
    }

    /// What `tool_choice` asks for (`None`: no calls). Without it, `auto` when there are tools.
    fn choice(&self, specs: &[ToolSpec]) -> Result<Option<ToolChoice>, ValidationError> {
        let param = self.choice_param();
        let bad = |message: String| ValidationError::Constraint { param, message };
        let choice = match self.choice {
            None => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => return Ok(None),
                "auto" => ToolChoice::Auto,
                "required" | "any" => ToolChoice::Required,
                other => {
                    return Err(bad(format!(
                        "unknown choice `{other}`; expected `none`, `auto`, `required` or \
                         `{{\"type\": \"function\", \"function\": {{\"name\": …}}}}`"
                    )));
                }
            },
            Some(v) => {
                let name = function_of(v)
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a named choice needs `function.name`".into()))?;
                if !specs.iter().any(|s| s.name == name) {
                    return Err(bad(format!("`{name}` is not one of the request's tools")));
                }
                ToolChoice::Named(name.to_owned())
            }
        };
        if specs.is_empty() && choice != ToolChoice::Auto {
            return Err(bad(
                "a call is required but the request defines no tools".into()
            ));
        }
        Ok(Some(choice))
    }
}

/// How a grammar names the markers of a vocabulary: a special token by its id (text cannot
/// reach it), anything else as a quoted literal.
pub(super) struct GrammarTerms {
    special: std::collections::HashMap<String, u32>,
}

impl GrammarTerms {
    pub(super) fn of(tokenizer: &ModelTokenizer) -> Self {
        let special = tokenizer
            .tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (t.content, id))
            .collect();
        Self { special }
    }

    pub(super) fn term(&self, text: &str) -> String {
        match self.special.get(text) {
            Some(id) => format!("<[{id}]>"),
            None => Value::from(text).to_string(),
        }
    }

    fn is_special(&self, text: &str) -> bool {
        self.special.contains_key(text)
    }
}

/// A tool's function object (`tools[i].function`, or a legacy `functions[i]` itself).
fn function_of(v: &Value) -> Option<&serde_json::Map<String, Value>> {
    v.get("function").unwrap_or(v).as_object()
}

/// OpenAI's rule for function names.
fn is_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// How deep `v` nests (a scalar is 0), without recursing past the limit.
fn depth(v: &Value) -> usize {
    let mut deepest = 0;
    let mut todo = vec![(v, 0usize)];
    while let Some((v, d)) = todo.pop() {
        deepest = deepest.max(d);
        if d > MAX_SCHEMA_DEPTH {
            break;
        }
        match v {
            Value::Array(items) => todo.extend(items.iter().map(|i| (i, d + 1))),
            Value::Object(map) => todo.extend(map.values().map(|i| (i, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// An assistant message's `tool_calls` as templates read them: `arguments` parsed from their
/// JSON text (templates print them with `tojson`), as vLLM hands them over.
pub(super) fn history_calls(calls: &[Value]) -> Result<Vec<Value>, String> {
    calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let function = call
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("`tool_calls[{i}]` has no `function` object"))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("`tool_calls[{i}].function` has no `name`"))?;
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                    format!("`tool_calls[{i}].function.arguments` is not JSON: {e}")
                })?,
                Some(other) => other.clone(),
            };
            Ok(json!({
                "id": call.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }))
        })
        .collect()
}

/// The conversation for a template that renders no tools: the tools shown in the system
/// message, earlier calls written in the Hermes format the model is asked for, and tool
/// results as user turns, as Qwen2.5's template does it.
pub(super) fn show_tools(messages: Vec<ChatMessage>, definitions: &Value) -> Vec<ChatMessage> {
    let tools: Vec<String> = definitions
        .as_array()
        .into_iter()
        .flatten()
        .map(Value::to_string)
        .collect();
    let instructions = format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
         {}\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": \
         <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        tools.join("\n")
    );
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut messages = messages.into_iter().peekable();
    match messages.peek() {
        Some(first) if first.role == "system" => {
            let system = messages.next().map(|m| m.content).unwrap_or_default();
            out.push(ChatMessage::new(
                "system",
                format!("{system}\n\n{instructions}"),
            ));
        }
        _ => out.push(ChatMessage::new("system", instructions)),
    }
    for m in messages {
        out.push(match (m.role.as_str(), &m.tool_calls) {
            ("assistant", Some(calls)) => {
                let mut text = m.content.clone();
                for call in calls {
                    let body = json!({"name": call["function"]["name"],
                                      "arguments": call["function"]["arguments"]});
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("<tool_call>\n{body}\n</tool_call>"));
                }
                ChatMessage::new("assistant", text)
            }
            ("tool", _) => ChatMessage::new(
                "user",
                format!("<tool_response>\n{}\n</tool_response>", m.content),
            ),
            _ => m,
        });
    }
    out
}
