//! What shape the output must take, when the client asks for one.

use serde::{Deserialize, Serialize};

/// An output constraint: at most one per request, since the kinds exclude each other. The
/// shard masks, at every step, the tokens that cannot continue a valid output, and allows the
/// end of generation only once the output is complete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputConstraint {
    /// JSON mode: the output is one JSON object.
    JsonObject,
    /// The output is exactly one of these strings (vLLM's `guided_choice`).
    OneOf(Vec<String>),
    /// The output is a whole match of this regular expression (vLLM's `guided_regex`, TGI's
    /// regex grammar).
    Pattern(String),
    /// The output is a JSON value this JSON Schema accepts (the schema's text): OpenAI's
    /// `json_schema` response format, vLLM's `guided_json`, TGI's `json` grammar.
    JsonSchema(String),
    /// The output is a string this Lark grammar derives (llguidance's dialect, which can
    /// embed JSON schemas): vLLM's `guided_grammar`, and the tool-call grammars.
    Lark(String),
}
