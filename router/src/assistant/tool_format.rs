//! How a model family writes tool calls, named as vLLM's `--tool-call-parser` names them:
//! where a call starts and ends in the output, and how a call's text reads.

use serde_json::Value;

/// A tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Hermes and Qwen: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, one block
    /// per call. Also the format of templates that render no tools (see `tool_prompt`).
    Hermes,
    /// Llama 3.x: the whole output is `{"name": …, "parameters": {…}}`, calls separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` then a JSON array of `{"name": …, "arguments": {…}}`.
    Mistral,
    /// gpt-oss's harmony format: a message in the `commentary` channel to `functions.NAME`
    /// whose body is the arguments (read by the harmony reader, with the rest of the output).
    Harmony,
}

/// A call as the model wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

impl ToolCallFormat {
    /// The formats as `--tool-call-parser` names them.
    pub const NAMES: &'static str = "hermes, llama3_json, mistral, openai";

    /// The format named `name` (vLLM's parser names).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "hermes" | "qwen" | "qwen2_5" => Some(Self::Hermes),
            "llama3_json" | "llama4_json" => Some(Self::Llama3Json),
            "mistral" => Some(Self::Mistral),
            "openai" => Some(Self::Harmony),
            _ => None,
        }
    }

    /// The format a chat template asks its model for; Hermes for templates that show none.
    pub fn detect(template: &str) -> Self {
        if super::is_harmony_template(template) {
            Self::Harmony
        } else if template.contains("[TOOL_CALLS]") {
            Self::Mistral
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\"") {
            Self::Llama3Json
        } else {
            Self::Hermes
        }
    }

    /// The text that opens the calls.
    pub fn start(self) -> &'static str {
        match self {
            Self::Hermes => "<tool_call>",
            Self::Llama3Json => "{",
            Self::Mistral => "[TOOL_CALLS]",
            Self::Harmony => "<|channel|>",
        }
    }

    /// Whether calls may only open the output (after blank space), not follow text.
    pub fn starts_output(self) -> bool {
        matches!(self, Self::Llama3Json)
    }

    /// The text that closes one call, when calls are closed one by one (otherwise they run to
    /// the end of the output).
    pub fn end(self) -> Option<&'static str> {
        match self {
            Self::Hermes => Some("</tool_call>"),
            Self::Harmony => Some("<|call|>"),
            Self::Llama3Json | Self::Mistral => None,
        }
    }

    /// The key under which a call's arguments are written.
    pub fn arguments_key(self) -> &'static str {
        match self {
            Self::Llama3Json => "parameters",
            Self::Hermes | Self::Mistral | Self::Harmony => "arguments",
        }
    }

    /// The calls in `body`: the text after [`Self::start`] up to [`Self::end`] (or to the end
    /// of the output), the start itself excluded. `None` if it does not read as calls
    /// (always for harmony, whose calls the harmony reader reads with their headers).
    pub fn parse(self, body: &str) -> Option<Vec<ParsedCall>> {
        let body = body.trim();
        let values: Vec<Value> = match self {
            Self::Harmony => return None,
            Self::Hermes => vec![serde_json::from_str(body).ok()?],
            Self::Llama3Json => {
                // `start` is the opening brace of the first call.
                let text = format!("{{{body}");
                json_values_separated_by(&text, ';')?
            }
            Self::Mistral => match serde_json::from_str(body).ok()? {
                Value::Array(calls) => calls,
                one @ Value::Object(_) => vec![one],
                _ => return None,
            },
        };
        values.iter().map(|v| self.call(v)).collect()
    }

    fn call(self, v: &Value) -> Option<ParsedCall> {
        let name = v.get("name")?.as_str()?.to_owned();
        let arguments = match v.get(self.arguments_key()).or_else(|| v.get("arguments")) {
            None => "{}".to_owned(),
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
        };
        Some(ParsedCall { name, arguments })
    }
}

/// JSON values written one after another with `sep` (and blank space) between them.
fn json_values_separated_by(text: &str, sep: char) -> Option<Vec<Value>> {
    let mut values = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        values.push(stream.next()?.ok()?);
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix(sep).unwrap_or(rest).trim_start();
    }
    Some(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn hermes_calls_read_their_name_and_arguments() {
        let f = ToolCallFormat::Hermes;
        assert_eq!(
            f.parse("\n{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}\n"),
            Some(vec![call("get", r#"{"city":"Oslo"}"#)])
        );
        // Arguments already given as text stay as they are.
        assert_eq!(
            f.parse(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#),
            Some(vec![call("f", r#"{"a": 1}"#)])
        );
        assert_eq!(f.parse("{\"name\": \"f\"}"), Some(vec![call("f", "{}")]));
        assert_eq!(f.parse("{\"name\": \"f\", \"arguments\": {"), None, "cut");
        assert_eq!(f.parse("not json"), None);
        assert_eq!(f.parse("{\"arguments\": {}}"), None, "no name");
    }

    #[test]
    fn llama3_calls_are_separated_by_semicolons() {
        let f = ToolCallFormat::Llama3Json;
        // The parser gets what follows the opening brace.
        assert_eq!(
            f.parse(r#""name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}"#),
            Some(vec![call("a", r#"{"x":1}"#), call("b", "{}")])
        );
        assert_eq!(f.parse(r#""name": "a", "parameters": {"x": 1"#), None);
    }

    #[test]
    fn mistral_calls_are_an_array() {
        let f = ToolCallFormat::Mistral;
        assert_eq!(
            f.parse(r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": [1]}}]"#),
            Some(vec![call("a", "{}"), call("b", r#"{"y":[1]}"#)])
        );
        assert_eq!(f.parse(r#"[{"name": "a", "arguments": {}}"#), None);
    }

    #[test]
    fn formats_are_detected_from_templates_and_named_as_vllm_names_them() {
        assert_eq!(
            ToolCallFormat::detect("{{- '<tool_call>\\n' }}"),
            ToolCallFormat::Hermes
        );
        assert_eq!(
            ToolCallFormat::detect("{{- '[TOOL_CALLS]' }}"),
            ToolCallFormat::Mistral
        );
        assert_eq!(
            ToolCallFormat::detect("<|python_tag|>"),
            ToolCallFormat::Llama3Json
        );
        assert_eq!(
            ToolCallFormat::detect("plain chatml"),
            ToolCallFormat::Hermes
        );
        for name in ToolCallFormat::NAMES.split(", ") {
            assert!(ToolCallFormat::from_name(name).is_some(), "{name}");
        }
        assert_eq!(
            ToolCallFormat::detect("<|start|>assistant<|channel|>final<|message|>"),
            ToolCallFormat::Harmony
        );
        assert_eq!(ToolCallFormat::from_name("pythonic"), None);
    }
}
