//! A Messages request's tools, `tool_choice` and `thinking` as the chat fields they mean:
//! custom tools are function tools (chat checks them), choices are chat's choices, and
//! thinking is the chat template's `enable_thinking`.

use serde_json::{Map, Value, json};

use crate::validation::ValidationError;

/// Anthropic's custom tools as chat function tools (their rules are chat's); server tools
/// (a `type` other than `custom`) are refused.
pub(super) fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ValidationError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| match tool.get("type").and_then(Value::as_str) {
            None | Some("custom") => {
                let get = |key| tool.get(key).cloned().unwrap_or(Value::Null);
                Ok(json!({"type": "function", "function": {
                    "name": get("name"),
                    "description": get("description"),
                    "parameters": get("input_schema"),
                }}))
            }
            Some(kind) => Err(ValidationError::Constraint {
                param: "tools",
                message: format!(
                    "[{i}]: tools of type `{kind}` (Anthropic's server tools) are not supported; \
                     define a custom tool with `name`, `description` and `input_schema`"
                ),
            }),
        })
        .collect()
}

/// Anthropic's `tool_choice` as chat's `tool_choice` and `parallel_tool_calls`.
pub(super) fn chat_tool_choice(
    choice: &Value,
) -> Result<(Option<Value>, Option<bool>), ValidationError> {
    let bad = |message: &str| ValidationError::Constraint {
        param: "tool_choice",
        message: message.to_owned(),
    };
    let chat = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a `tool` choice needs the tool's `name`"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad("`type` must be `auto`, `any`, `tool` or `none`")),
    };
    let parallel = match choice.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(disable)) => Some(!disable),
        Some(_) => return Err(bad("`disable_parallel_tool_use` must be a boolean")),
    };
    Ok((Some(chat), parallel))
}

/// `thinking` as the chat template's `enable_thinking`.
pub(super) fn thinking_kwargs(thinking: &Value) -> Result<Map<String, Value>, ValidationError> {
    let enable = match thinking.get("type").and_then(Value::as_str) {
        Some("enabled") => Some(true),
        Some("disabled") => Some(false),
        Some("adaptive") => None,
        _ => {
            return Err(ValidationError::Constraint {
                param: "thinking",
                message: "`type` must be `enabled`, `disabled` or `adaptive`".into(),
            });
        }
    };
    let mut kwargs = Map::new();
    if let Some(enable) = enable {
        kwargs.insert("enable_thinking".into(), Value::Bool(enable));
    }
    Ok(kwargs)
}
