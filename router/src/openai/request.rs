//! The OpenAI request bodies, as sent: chat and completions requests and the fields they
//! share. `crate::validation` checks them.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StopSpec {
    /// One stop sequence.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and `"usage": null` in the others).
    pub include_usage: Option<bool>,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ResponseFormat {
    /// `text`, `json_object` (JSON mode) or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema of a `json_schema` format.
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`: a named schema the output must validate against.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct JsonSchemaFormat {
    /// The schema's name (required by OpenAI; not used for decoding).
    pub name: Option<String>,
    /// What the schema is for (not used for decoding).
    pub description: Option<String>,
    /// The JSON Schema; absent means any JSON value.
    pub schema: Option<serde_json::Value>,
    /// Accepted; outputs always follow the schema exactly.
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: one constraint of the kinds it names.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct StructuredOutputs {
    /// A JSON Schema (object or text).
    pub json: Option<serde_json::Value>,
    /// A regular expression.
    pub regex: Option<serde_json::Value>,
    /// A list of strings.
    pub choice: Option<serde_json::Value>,
    /// A Lark grammar.
    pub grammar: Option<serde_json::Value>,
    /// `true`: any JSON object.
    pub json_object: Option<bool>,
}

/// Requests for constrained output, shared by chat and completions; at most one may be given.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct OutputConstraints {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", ...}`.
    pub response_format: Option<ResponseFormat>,
    /// vLLM extension: the output validates against this JSON Schema.
    pub guided_json: Option<serde_json::Value>,
    /// vLLM extension: the output is a string this regular expression matches.
    pub guided_regex: Option<serde_json::Value>,
    /// vLLM extension: the output is one of these strings.
    pub guided_choice: Option<serde_json::Value>,
    /// vLLM extension: the output is derived by this Lark grammar.
    pub guided_grammar: Option<serde_json::Value>,
    /// vLLM extension (its newer form of the `guided_*` fields).
    pub structured_outputs: Option<StructuredOutputs>,
}

/// The sampling fields shared by chat and completions requests.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct SamplingFields {
    /// In [0, 2]; default 1; 0 is greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Number of independent samples (choices).
    pub n: Option<usize>,
    pub stop: Option<StopSpec>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string) to bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Extension (vLLM): keep the k most likely tokens; -1 or absent is off.
    pub top_k: Option<i64>,
    /// Extension (vLLM).
    pub min_p: Option<f32>,
    /// Extension (vLLM).
    pub repetition_penalty: Option<f32>,
    /// Extension (vLLM).
    pub ignore_eos: Option<bool>,
    /// Extension (vLLM); default true.
    pub skip_special_tokens: Option<bool>,
    /// Extension (vLLM): token ids that end the generation.
    pub stop_token_ids: Option<Vec<u32>>,
}

/// A chat message's content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Parts; only `{"type": "text", "text": ...}` is supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    /// `"text"` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// A chat message as sent.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct RequestMessage {
    /// `system`, `developer` (treated as `system`), `user`, `assistant` or `tool`.
    pub role: String,
    /// The content (null for an assistant message with only tool calls).
    pub content: Option<MessageContent>,
    /// An assistant's earlier tool calls (`arguments` as JSON text).
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's call id.
    pub tool_call_id: Option<String>,
    /// A tool message's function name (or a participant's name).
    pub name: Option<String>,
    /// An assistant's earlier thinking, as vLLM now names it.
    pub reasoning: Option<String>,
    /// The same under its earlier name.
    pub reasoning_content: Option<String>,
}

impl RequestMessage {
    /// A message of `role` with `content` as text (none: an assistant's calls only) and
    /// nothing else, as the Responses and Messages APIs translate their turns.
    pub(crate) fn text(role: &str, content: Option<String>) -> Self {
        Self {
            role: role.to_owned(),
            content: content.map(MessageContent::Text),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning: None,
            reasoning_content: None,
        }
    }
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionRequest {
    /// Any name, or none: a server serves one model, so every name means it (as TGI).
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<RequestMessage>,
    /// Deprecated alias of `max_completion_tokens`.
    pub max_tokens: Option<u32>,
    /// Most tokens to generate; default: what the context allows.
    pub max_completion_tokens: Option<u32>,
    /// Return the generated tokens' logprobs.
    pub logprobs: Option<bool>,
    /// Alternatives per token, 0..=20 (with `logprobs`).
    pub top_logprobs: Option<u32>,
    /// Function tools the model may call.
    pub tools: Option<Vec<serde_json::Value>>,
    /// `"none"`, `"auto"` (the default with tools), `"required"`, or a named function.
    pub tool_choice: Option<serde_json::Value>,
    /// `false`: at most one call.
    pub parallel_tool_calls: Option<bool>,
    /// Deprecated form of `tools`.
    pub functions: Option<Vec<serde_json::Value>>,
    /// Deprecated form of `tool_choice`.
    pub function_call: Option<serde_json::Value>,
    /// How much the model reasons: `low`, `medium` or `high`, handed to the chat template
    /// (gpt-oss states it in its system message).
    pub reasoning_effort: Option<String>,
    /// Extra variables for the chat template (e.g. `enable_thinking`).
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Sampling fields.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Constrained output: JSON mode, `guided_choice`, `guided_regex` (the rest is refused).
    #[serde(flatten)]
    pub constraints: OutputConstraints,
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of those.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PromptInput {
    /// One prompt.
    Text(String),
    /// One choice (or n) per prompt.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    /// Any name, or none: a server serves one model, so every name means it (as TGI).
    pub model: Option<String>,
    /// The prompt(s).
    pub prompt: PromptInput,
    /// Most tokens to generate; default 16 (as OpenAI).
    pub max_tokens: Option<u32>,
    /// Alternatives per token, 0..=5; any value returns the tokens' logprobs.
    pub logprobs: Option<u32>,
    /// Prepend the prompt to the text (and its logprobs with `logprobs`).
    pub echo: Option<bool>,
    /// Samples per prompt, of which the `n` with the highest cumulative logprob are returned
    /// (not with `stream`).
    pub best_of: Option<usize>,
    /// Not supported.
    pub suffix: Option<String>,
    /// Sampling fields.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Constrained output: JSON mode, `guided_choice`, `guided_regex` (the rest is refused).
    #[serde(flatten)]
    pub constraints: OutputConstraints,
}
