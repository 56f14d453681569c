//! The OpenAI-style constraint fields (`response_format`, vLLM's `guided_*` and
//! `structured_outputs`) into the one [`OutputConstraint`] a request may carry.

use tessera_params::OutputConstraint;

use super::ValidationError;
use super::constraint::{grammar_text, output_pattern, schema_text};
use crate::openai::{OutputConstraints, ResponseFormat};

/// Most `guided_choice` strings (the shard keeps the live ones as bits of a `u64`).
const MAX_GUIDED_CHOICES: usize = 64;

impl OutputConstraints {
    /// What the request asks for, under the name of the field that asked (for errors); an
    /// error for a malformed field or for two fields at once (naming the later one).
    pub(super) fn constrained(
        &self,
    ) -> Result<(&'static str, Option<OutputConstraint>), ValidationError> {
        let mut asked: Vec<(&'static str, OutputConstraint)> = Vec::new();
        if let Some(format) = &self.response_format {
            asked.extend(response_format(format)?.map(|c| ("response_format", c)));
        }
        if let Some(v) = &self.guided_json {
            asked.push(("guided_json", json_schema("guided_json", v)?));
        }
        if let Some(v) = &self.guided_choice {
            let choices = guided_choices("guided_choice", v)?;
            asked.push(("guided_choice", OutputConstraint::OneOf(choices)));
        }
        if let Some(v) = &self.guided_regex {
            let pattern = output_pattern("guided_regex", v)?;
            asked.push(("guided_regex", OutputConstraint::Pattern(pattern)));
        }
        if let Some(v) = &self.guided_grammar {
            let grammar = grammar_text("guided_grammar", v)?;
            asked.push(("guided_grammar", OutputConstraint::Lark(grammar)));
        }
        if let Some(s) = &self.structured_outputs {
            let param = "structured_outputs";
            if let Some(v) = &s.json {
                asked.push((param, json_schema(param, v)?));
            }
            if let Some(v) = &s.regex {
                asked.push((param, OutputConstraint::Pattern(output_pattern(param, v)?)));
            }
            if let Some(v) = &s.choice {
                asked.push((param, OutputConstraint::OneOf(guided_choices(param, v)?)));
            }
            if let Some(v) = &s.grammar {
                asked.push((param, OutputConstraint::Lark(grammar_text(param, v)?)));
            }
            if s.json_object == Some(true) {
                asked.push((param, OutputConstraint::JsonObject));
            }
        }
        match asked.len() {
            0 => Ok(("response_format", None)),
            1 => Ok(asked.pop().map(|(p, c)| (p, Some(c))).unwrap_or(("", None))),
            n => Err(ValidationError::Unsupported {
                param: asked[n - 1].0,
                reason: "exclusive with the other constraint fields (`response_format`, \
                         `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, \
                         `structured_outputs`): send one",
            }),
        }
    }
}

/// `response_format`: nothing for `text`, JSON mode, or a schema.
fn response_format(format: &ResponseFormat) -> Result<Option<OutputConstraint>, ValidationError> {
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(OutputConstraint::JsonObject)),
        "json_schema" => {
            let schema = format
                .json_schema
                .as_ref()
                .ok_or(ValidationError::Constraint {
                    param: "response_format",
                    message: "`json_schema` format without a `json_schema` object".into(),
                })?
                .schema
                .clone()
                .unwrap_or(serde_json::Value::Bool(true));
            Ok(Some(json_schema("response_format", &schema)?))
        }
        other => Err(ValidationError::Constraint {
            param: "response_format",
            message: format!(
                "unknown type `{other}`; expected `text`, `json_object` or `json_schema`"
            ),
        }),
    }
}

/// A JSON Schema constraint from a schema object or its text.
pub(super) fn json_schema(
    param: &'static str,
    v: &serde_json::Value,
) -> Result<OutputConstraint, ValidationError> {
    Ok(OutputConstraint::JsonSchema(schema_text(param, v)?))
}

/// A list of 1 to [`MAX_GUIDED_CHOICES`] non-empty strings.
fn guided_choices(
    param: &'static str,
    v: &serde_json::Value,
) -> Result<Vec<String>, ValidationError> {
    let strings: Option<Vec<String>> = v.as_array().and_then(|list| {
        list.iter()
            .map(|c| c.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
            .collect()
    });
    match strings {
        Some(s) if (1..=MAX_GUIDED_CHOICES).contains(&s.len()) => Ok(s),
        _ => Err(ValidationError::OutOfRange {
            param,
            bound: "a list of 1 to 64 non-empty strings",
            given: v.to_string().chars().take(80).collect(),
        }),
    }
}
