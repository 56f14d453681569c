//! Wire ↔ engine: the step request into a [`StepPlan`] (its requests' parameters through
//! `tessera-proto`'s conversions), the engine's outputs into the step response. The only
//! place on the shard that reads or builds `tessera.v1` step messages.

use tessera_model_files::Pooling;
use tessera_params::OutputConstraint;
use tessera_proto::v1 as pb;
use tonic::Status;

use crate::PoolingTask;
use crate::core::{NewSequence, RunningUpdate, StepOutput, StepPlan, StepResult};

/// The plan of a step request. A request without sampling parameters is malformed.
pub(crate) fn step_plan(r: pb::StepRequest) -> Result<StepPlan, Status> {
    let new = r
        .new_requests
        .into_iter()
        .map(new_sequence)
        .collect::<Result<_, _>>()?;
    let running = r
        .running
        .into_iter()
        .map(|u| RunningUpdate {
            id: u.id,
            new_blocks: u.new_blocks,
            chunk_len: u.chunk_len as usize,
        })
        .collect();
    let mut leaving = r.finished;
    leaving.extend(r.preempted);
    Ok(StepPlan {
        new,
        running,
        leaving,
    })
}

fn new_sequence(r: pb::NewRequest) -> Result<NewSequence, Status> {
    let sampling = r.sampling.ok_or_else(|| {
        Status::invalid_argument(format!("request {}: no sampling parameters", r.id))
    })?;
    Ok(NewSequence {
        id: r.id,
        input_ids: r.input_ids,
        params: sampling.into(),
        constraint: r
            .constraint
            .and_then(|c| c.kind)
            .map(OutputConstraint::from),
        prefill_logprobs: r.prefill_logprobs,
        blocks: r.blocks,
        cache_len: r.cache_len as usize,
        chunk_len: (r.chunk_len > 0).then_some(r.chunk_len as usize),
        generated_len: r.generated_len as usize,
        pooling: r.pooling.map(|p| pooling_task(r.id, p)).transpose()?,
    })
}

fn pooling_task(id: u64, p: pb::Pooling) -> Result<PoolingTask, Status> {
    match p.kind {
        Some(pb::pooling::Kind::Embed(kind)) => match pb::PoolKind::try_from(kind) {
            Ok(pb::PoolKind::Last) => Ok(PoolingTask::Embed(Pooling::LastToken)),
            Ok(pb::PoolKind::Mean) => Ok(PoolingTask::Embed(Pooling::Mean)),
            Ok(pb::PoolKind::Cls) => Ok(PoolingTask::Embed(Pooling::Cls)),
            Ok(pb::PoolKind::None) | Err(_) => Err(Status::invalid_argument(format!(
                "request {id}: pooling kind {kind} is not one to embed with"
            ))),
        },
        Some(pb::pooling::Kind::Classify(c)) => Ok(PoolingTask::Classify {
            label_tokens: c.label_tokens,
        }),
        None => Err(Status::invalid_argument(format!(
            "request {id}: pooling without a kind"
        ))),
    }
}

/// The response to a step.
pub(crate) fn step_response(r: StepResult) -> pb::StepResponse {
    let t = r.timings;
    pb::StepResponse {
        generations: r.outputs.into_iter().map(generation).collect(),
        timings: Some(pb::Timings {
            forward_ns: t.forward_ns,
            sampling_ns: t.sampling_ns,
            total_ns: t.total_ns,
        }),
    }
}

fn tokens(pairs: impl IntoIterator<Item = (u32, f32)>) -> pb::Tokens {
    let (ids, logprobs) = pairs.into_iter().unzip();
    pb::Tokens { ids, logprobs }
}

fn generation(o: StepOutput) -> pb::Generation {
    let top_tokens = o
        .tokens
        .iter()
        .map(|t| tokens(t.top_logprobs.iter().copied()))
        .collect();
    pb::Generation {
        request_id: o.request_id,
        prefill_tokens: o.prefill.map(tokens),
        tokens: Some(tokens(o.tokens.iter().map(|t| (t.id, t.logprob)))),
        top_tokens,
        proposed: o.proposed as u32,
        pooled: o.pooled.unwrap_or_default(),
    }
}

/// The wire's name for a model's pooling.
pub(crate) fn pool_kind(pooling: Pooling) -> pb::PoolKind {
    match pooling {
        Pooling::LastToken => pb::PoolKind::Last,
        Pooling::Mean => pb::PoolKind::Mean,
        Pooling::Cls => pb::PoolKind::Cls,
    }
}
