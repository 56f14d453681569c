//! `POST /v1/completions`: text completions, several prompts and `n` choices each.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::logprobs::CompletionLogprobs;
use super::request::CompletionRequest;
use super::response::{CompletionChoice, Meta, Usage};
use super::streaming::completion_stream;
use super::{launch, run_all};
use crate::error::{OpenAiError, OpenAiJson};
use crate::infer::InferResponse;
use crate::sse::sse;
use crate::state::AppState;
use crate::validation::{ChoiceLayout, OpenAiReply};

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<CompletionRequest>,
) -> Result<Response, OpenAiError> {
    let received = Instant::now();
    let valid = state
        .validation()
        .validate_completion(&req)
        .instrument(tracing::info_span!("validation"))
        .await?;
    crate::metrics::record_validation(received);
    let meta = Meta::new(&state, "cmpl");
    if valid.reply.stream {
        let launched = launch(&state, valid.samples).await?;
        let stream = completion_stream(meta, launched, valid.choices, valid.reply);
        return Ok(sse(stream));
    }
    let outputs = run_all(&state, valid.samples).await?;
    let completion_tokens = outputs
        .iter()
        .map(|o| o.generated_text.generated_tokens)
        .sum();
    let usage = Usage::new(valid.choices.prompt_tokens, completion_tokens);
    let outputs = likeliest(&valid.choices, outputs);
    let choices = completion_choices(&valid.choices, valid.reply, outputs);
    Ok(Json(meta.completion(choices, Some(Some(usage)))).into_response())
}

/// Per prompt, the `n` of its `best_of` samples with the highest cumulative logprob, likeliest
/// first (all of them, in order, when `best_of` is `n`).
fn likeliest(layout: &ChoiceLayout, outputs: Vec<InferResponse>) -> Vec<InferResponse> {
    if layout.best_of <= layout.n {
        return outputs;
    }
    let mut chosen = Vec::with_capacity(outputs.len() / layout.best_of * layout.n);
    let mut outputs = outputs.into_iter().peekable();
    while outputs.peek().is_some() {
        let mut group: Vec<InferResponse> = outputs.by_ref().take(layout.best_of).collect();
        let score = |o: &InferResponse| o.tokens.iter().map(|t| f64::from(t.logprob)).sum::<f64>();
        group.sort_by(|a, b| score(b).total_cmp(&score(a)));
        chosen.extend(group.into_iter().take(layout.n));
    }
    chosen
}

/// The choices of a finished request, in order: each one's text after its prompt's echo,
/// with the legacy logprobs when asked for.
fn completion_choices(
    layout: &ChoiceLayout,
    reply: OpenAiReply,
    outputs: Vec<InferResponse>,
) -> Vec<CompletionChoice> {
    outputs
        .into_iter()
        .enumerate()
        .map(|(index, out)| {
            let echo = layout.echo(index);
            CompletionChoice {
                text: format!("{echo}{}", out.generated_text.text),
                index,
                logprobs: reply.logprobs.then(|| completion_logprobs(echo, &out)),
                finish_reason: Some(out.generated_text.finish_reason.openai()),
            }
        })
        .collect()
}

/// The logprobs of one choice: the echoed prompt's tokens (when echoed), then the generated
/// ones, offsets counted in characters of the choice's text.
fn completion_logprobs(echo: &str, out: &InferResponse) -> CompletionLogprobs {
    let mut lp = CompletionLogprobs::default();
    let mut offset = 0;
    if !echo.is_empty() {
        lp.prefill(&out.prefill, &mut offset);
        offset = echo.chars().count();
    }
    for (t, top) in out.tokens.iter().zip(&out.top_tokens) {
        lp.push(&t.text, Some(t.logprob), Some(top), &mut offset);
    }
    lp
}
