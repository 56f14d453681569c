//! Router ↔ wire: a step into `tessera.v1` messages (its requests' parameters through
//! `tessera-proto`'s conversions), the shards' answers back into the router's types. The only
//! place in the router that builds or reads step messages.

use tessera_proto::v1 as pb;

use crate::pooling::{ModelFacts, Pool, PoolingAsk};

use super::{Generation, NewRequest, SampledToken, ShardStep, StepAnswer, StepTimings};

pub(super) fn step_request(step: &ShardStep<'_>) -> pb::StepRequest {
    pb::StepRequest {
        new_requests: step.new.iter().map(new_request).collect(),
        running: step
            .running
            .iter()
            .map(|r| pb::RunningRequest {
                id: r.id,
                new_blocks: r.new_blocks.clone(),
                chunk_len: r.chunk_len as u32,
            })
            .collect(),
        finished: step.finished.to_vec(),
        preempted: step.preempted.to_vec(),
    }
}

fn new_request(r: &NewRequest<'_>) -> pb::NewRequest {
    let w = r.work;
    pb::NewRequest {
        id: w.id,
        input_ids: w.input_ids.clone(),
        sampling: Some(r.sampling.into()),
        constraint: r.constraint.map(pb::OutputConstraint::from),
        prefill_logprobs: r.prefill_logprobs,
        blocks: w.blocks.clone(),
        cache_len: w.cache_len as u32,
        chunk_len: w.chunk_len as u32,
        generated_len: w.generated_len as u32,
        pooling: r.pooling.map(pooling),
    }
}

fn pool_kind(pool: Pool) -> pb::PoolKind {
    match pool {
        Pool::Last => pb::PoolKind::Last,
        Pool::Mean => pb::PoolKind::Mean,
        Pool::Cls => pb::PoolKind::Cls,
    }
}

impl From<&pb::InfoResponse> for ModelFacts {
    fn from(info: &pb::InfoResponse) -> Self {
        ModelFacts {
            // An unknown kind (a newer shard) reads as none.
            pooling: match info.pooling() {
                pb::PoolKind::None => None,
                pb::PoolKind::Last => Some(Pool::Last),
                pb::PoolKind::Mean => Some(Pool::Mean),
                pb::PoolKind::Cls => Some(Pool::Cls),
            },
            normalize: info.normalize,
            score_labels: info.score_labels,
            hidden_size: info.hidden_size,
        }
    }
}

fn pooling(p: &PoolingAsk) -> pb::Pooling {
    let kind = match p {
        PoolingAsk::Embed(pool) => pb::pooling::Kind::Embed(pool_kind(*pool) as i32),
        PoolingAsk::Classify { label_tokens } => pb::pooling::Kind::Classify(pb::Classify {
            label_tokens: label_tokens.clone(),
        }),
    };
    pb::Pooling { kind: Some(kind) }
}

pub(super) fn step_answer(r: pb::StepResponse) -> StepAnswer {
    StepAnswer {
        generations: r.generations.into_iter().map(generation).collect(),
        timings: r.timings.map(|t| StepTimings {
            forward_ns: t.forward_ns,
            sampling_ns: t.sampling_ns,
        }),
    }
}

fn generation(g: pb::Generation) -> Generation {
    let tokens = g.tokens.unwrap_or_default();
    let mut top = g.top_tokens.into_iter();
    Generation {
        request_id: g.request_id,
        prefill: g
            .prefill_tokens
            .map(|p| p.ids.into_iter().zip(p.logprobs).collect()),
        tokens: tokens
            .ids
            .into_iter()
            .zip(tokens.logprobs)
            .map(|(id, logprob)| SampledToken {
                id,
                logprob,
                top: top
                    .next()
                    .map(|t| t.ids.into_iter().zip(t.logprobs).collect())
                    .unwrap_or_default(),
            })
            .collect(),
        proposed: g.proposed as usize,
        pooled: (!g.pooled.is_empty()).then_some(g.pooled),
    }
}
