//! The prompt: a conversation rendered with the chat template, text tokenized (both off the
//! async runtime), token ids checked against the vocabulary, then truncated and measured.

use tessera_text::{ChatMessage, RenderOptions};

use super::{Validation, ValidationError};

/// The prompt of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text to tokenize.
    Text {
        /// The text.
        text: String,
        /// Whether the tokenizer adds the model's special tokens (BOS). Chat prompts come
        /// from the template, which writes them itself.
        add_special_tokens: bool,
    },
    /// Token ids given by the client.
    Ids(Vec<u32>),
}

/// A prompt as text and as token ids.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TokenizedPrompt {
    /// The text (decoded from the ids when the client gave ids).
    pub(super) text: String,
    /// The token ids.
    pub(super) ids: Vec<u32>,
}

impl Validation {
    /// Renders a conversation with the model's chat template (generation prompt added).
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, ValidationError> {
        self.render_conversation(messages, None, None)
    }

    /// Renders a conversation with tool definitions and extra template variables.
    fn render_conversation(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        extra: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ValidationError> {
        if messages.is_empty() {
            return Err(ValidationError::EmptyInput("messages"));
        }
        let template = self
            .tokenizer
            .chat_template
            .as_ref()
            .ok_or(ValidationError::NoChatTemplate)?;
        let options = RenderOptions {
            add_generation_prompt: true,
            tools,
            extra,
        };
        template
            .render_with(messages, &options)
            .map_err(|e| ValidationError::ChatTemplate(e.to_string()))
    }

    /// [`Validation::apply_chat_template`] with tools and extra variables, off the async
    /// runtime (templates loop over client-sized conversations).
    pub(super) async fn render_chat(
        &self,
        messages: Vec<ChatMessage>,
        tools: Option<serde_json::Value>,
        extra: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ValidationError> {
        let validation = self.clone();
        tokio::task::spawn_blocking(move || {
            validation.render_conversation(&messages, tools.as_ref(), extra.as_ref())
        })
        .await
        .map_err(|e| ValidationError::Internal(e.to_string()))?
    }

    /// The prompt's text and ids: text tokenized off the async runtime, ids checked against
    /// the vocabulary and decoded.
    pub(super) async fn tokenize(
        &self,
        prompt: Prompt,
    ) -> Result<TokenizedPrompt, ValidationError> {
        match prompt {
            Prompt::Text {
                text,
                add_special_tokens,
            } => {
                if text.is_empty() {
                    return Err(ValidationError::EmptyInput("inputs"));
                }
                let tokenizer = self.tokenizer.clone();
                tokio::task::spawn_blocking(move || {
                    let ids = tokenizer
                        .encode(&text, add_special_tokens)
                        .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
                    Ok::<_, ValidationError>(TokenizedPrompt { text, ids })
                })
                .await
                .map_err(|e| ValidationError::Tokenizer(e.to_string()))?
            }
            Prompt::Ids(ids) => {
                self.check_ids("prompt", &ids)?;
                let text = self
                    .tokenizer
                    .decode(&ids, false)
                    .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
                Ok(TokenizedPrompt { text, ids })
            }
        }
    }

    fn check_ids(&self, param: &'static str, ids: &[u32]) -> Result<(), ValidationError> {
        let vocab_size = self.tokenizer.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab_size) {
            Some(id) => Err(ValidationError::TokenId {
                param,
                token: id.to_string(),
                vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// Keeps the last `truncate` tokens (when given), then checks the prompt is neither empty
    /// nor longer than `max_input_tokens`.
    pub(super) fn check_prompt_length(
        &self,
        input_ids: &mut Vec<u32>,
        truncate: Option<usize>,
    ) -> Result<(), ValidationError> {
        let max = self.config.max_input_tokens;
        if let Some(t) = truncate {
            if t == 0 || t > max {
                return Err(ValidationError::out_of_range(
                    "truncate",
                    "in [1, max_input_tokens]",
                    t,
                ));
            }
            let drop = input_ids.len().saturating_sub(t);
            input_ids.drain(..drop);
        }
        if input_ids.is_empty() {
            return Err(ValidationError::EmptyInput("inputs"));
        }
        if input_ids.len() > max {
            return Err(ValidationError::InputLength {
                max,
                given: input_ids.len(),
            });
        }
        Ok(())
    }
}
