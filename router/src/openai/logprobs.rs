//! Logprobs in OpenAI's two shapes: the chat shape (token, bytes, alternatives) and the
//! legacy completions shape (parallel lists with character offsets).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::infer::{PrefillToken, Token};

/// A token's logprob in the chat shape.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TopLogprob {
    /// Token text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// A generated token's logprob with its alternatives (chat shape).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChatLogprob {
    /// Token text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogprob>,
}

/// `choices[].logprobs` of chat responses.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<ChatLogprob>,
}

/// A generated token and its alternatives in the chat shape (the tokens' own text).
pub(super) fn chat_logprob(token: &Token, top: &[Token]) -> ChatLogprob {
    ChatLogprob {
        token: token.piece.clone(),
        logprob: token.logprob,
        bytes: token.piece.as_bytes().to_vec(),
        top_logprobs: top
            .iter()
            .map(|t| TopLogprob {
                token: t.piece.clone(),
                logprob: t.logprob,
                bytes: t.piece.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// Legacy logprobs of completions.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their logprobs (null for the first prompt token).
    pub token_logprobs: Vec<Option<f32>>,
    /// Alternatives per token, text → logprob.
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends a token at `offset` (characters into the choice's text), advancing it.
    pub(super) fn push(
        &mut self,
        text: &str,
        logprob: Option<f32>,
        top: Option<&[Token]>,
        offset: &mut usize,
    ) {
        self.tokens.push(text.to_owned());
        self.token_logprobs.push(logprob);
        self.top_logprobs
            .push(top.map(|t| t.iter().map(|t| (t.text.clone(), t.logprob)).collect()));
        self.text_offset.push(*offset);
        *offset += text.chars().count();
    }

    /// Appends the prompt tokens (the first without a logprob or alternatives).
    pub(super) fn prefill(&mut self, prefill: &[PrefillToken], offset: &mut usize) {
        for p in prefill {
            self.push(&p.text, p.logprob, p.logprob.map(|_| &[][..]), offset);
        }
    }
}
