//! The OpenAI server-sent event streams: the events of every choice, merged, as chunks.

use std::convert::Infallible;

use axum::response::sse::Event;
use futures::StreamExt;

use super::Launched;
use super::assistant_reply::ChoiceDeltas;
use super::logprobs::{ChatLogprobs, CompletionLogprobs, chat_logprob};
use super::response::{ChunkChoice, CompletionChoice, Delta, Meta, Usage};
use crate::assistant::OutputReading;
use crate::error::ApiError;
use crate::infer::{InferError, InferStream, InferStreamResponse};
use crate::sse::{done_event, json_event};
use crate::validation::{ChoiceLayout, OpenAiReply};

/// An event of one of a request's choices.
struct ChoiceEvent {
    /// The choice's index.
    index: usize,
    /// The event.
    event: Result<InferStreamResponse, InferError>,
}

/// Streams of several choices, merged, each event tagged with its choice index.
fn merged(streams: Vec<InferStream>) -> impl futures::Stream<Item = ChoiceEvent> {
    futures::stream::select_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(index, s)| s.map(move |event| ChoiceEvent { index, event }).boxed()),
    )
}

/// The chat SSE stream: a role chunk per choice, content chunks, a finish chunk per choice,
/// the usage chunk (with `include_usage`; `prompt_tokens` is the prompt's length), then
/// `[DONE]`.
pub(super) fn chat_stream(
    meta: Meta,
    launched: Launched,
    reply: OpenAiReply,
    reading: OutputReading,
    prompt_tokens: u32,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    let usage_prompt_tokens = reply.include_usage.then_some(prompt_tokens);
    let usage_null = usage_prompt_tokens.map(|_| None);
    let logprobs = reply.logprobs;
    let Launched { permits, streams } = launched;
    let n = streams.len();
    let chunk = move |choices: Vec<ChunkChoice>, usage: Option<Option<Usage>>| {
        json_event(&meta.chat_chunk(choices, usage))
    };
    async_stream::stream! {
        let _permits = permits;
        let mut events = merged(streams);
        let mut readers = vec![ChoiceDeltas::new(reading); n];
        for index in 0..n {
            let delta = Delta { role: Some("assistant"), content: Some(String::new()), ..Delta::default() };
            let choice = ChunkChoice { index, delta, logprobs: None, finish_reason: None };
            yield Ok::<Event, Infallible>(chunk(vec![choice], usage_null));
        }
        let mut completion_tokens = 0;
        while let Some(ChoiceEvent { index, event }) = events.next().await {
            let (token, top, end) = match event {
                // A generation request never pools.
                Ok(InferStreamResponse::Prefill(_) | InferStreamResponse::Pooled { .. }) => continue,
                Ok(InferStreamResponse::Intermediate { token, top_tokens }) => (token, top_tokens, None),
                Ok(InferStreamResponse::End { token, top_tokens, generated_text, .. }) => {
                    completion_tokens += generated_text.generated_tokens;
                    (token, top_tokens, Some(generated_text.finish_reason.openai()))
                }
                Err(e) => {
                    yield Ok(json_event(&ApiError::from(e).openai_body()));
                    return;
                }
            };
            let reader = &mut readers[index];
            let mut deltas = reader.push(&token.text);
            if end.is_some() {
                deltas.extend(reader.finish());
            }
            let mut token_logprobs = logprobs.then(|| ChatLogprobs { content: vec![chat_logprob(&token, &top)] });
            if token_logprobs.is_some() && deltas.is_empty() {
                deltas.push(Delta::default());
            }
            for delta in deltas {
                let choice = ChunkChoice { index, logprobs: token_logprobs.take(), delta, finish_reason: None };
                yield Ok(chunk(vec![choice], usage_null));
            }
            if let Some(reason) = end {
                let finish_reason = Some(readers[index].finish_reason(reason));
                let choice = ChunkChoice { index, delta: Delta::default(), logprobs: None, finish_reason };
                yield Ok(chunk(vec![choice], usage_null));
            }
        }
        if let Some(prompt_tokens) = usage_prompt_tokens {
            yield Ok(chunk(Vec::new(), Some(Some(Usage::new(prompt_tokens, completion_tokens)))));
        }
        yield Ok(done_event());
    }
}

/// The completions SSE stream: text chunks per choice (the echoed prompt first), the last
/// with `finish_reason`, the usage chunk (with `include_usage`), then `[DONE]`.
pub(super) fn completion_stream(
    meta: Meta,
    launched: Launched,
    layout: ChoiceLayout,
    reply: OpenAiReply,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    let usage_prompt_tokens = reply.include_usage.then_some(layout.prompt_tokens);
    let usage_null = usage_prompt_tokens.map(|_| None);
    let logprobs = reply.logprobs;
    let Launched { permits, streams } = launched;
    let choices = streams.len();
    async_stream::stream! {
        let _permits = permits;
        let mut events = merged(streams);
        let mut offsets = vec![0usize; choices];
        let mut echoed = vec![false; choices];
        let mut completion_tokens = 0;
        while let Some(ChoiceEvent { index, event }) = events.next().await {
            let echo = layout.echo(index);
            let mut lp = CompletionLogprobs::default();
            let (text, finish_reason) = match event {
                Ok(InferStreamResponse::Prefill(prefill)) => {
                    lp.prefill(&prefill, &mut offsets[index]);
                    echoed[index] = true;
                    (echo.to_owned(), None)
                }
                // A generation request never pools.
                Ok(InferStreamResponse::Pooled { .. }) => continue,
                Ok(InferStreamResponse::Intermediate { token, top_tokens }) => {
                    lp.push(&token.text, Some(token.logprob), Some(&top_tokens), &mut offsets[index]);
                    (token.text, None)
                }
                Ok(InferStreamResponse::End { token, top_tokens, generated_text, .. }) => {
                    completion_tokens += generated_text.generated_tokens;
                    lp.push(&token.text, Some(token.logprob), Some(&top_tokens), &mut offsets[index]);
                    (token.text, Some(generated_text.finish_reason.openai()))
                }
                Err(e) => {
                    yield Ok::<Event, Infallible>(json_event(&ApiError::from(e).openai_body()));
                    return;
                }
            };
            // Without a prefill event (no logprobs), the echo goes before the first token.
            let text = if echoed[index] || echo.is_empty() {
                text
            } else {
                echoed[index] = true;
                format!("{echo}{text}")
            };
            if text.is_empty() && finish_reason.is_none() && !logprobs {
                continue;
            }
            let choice = CompletionChoice { text, index, logprobs: logprobs.then_some(lp), finish_reason };
            yield Ok(json_event(&meta.completion(vec![choice], usage_null)));
        }
        if let Some(prompt_tokens) = usage_prompt_tokens {
            let usage = Usage::new(prompt_tokens, completion_tokens);
            yield Ok(json_event(&meta.completion(Vec::new(), Some(Some(usage)))));
        }
        yield Ok(done_event());
    }
}
