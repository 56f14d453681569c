//! The gRPC face of the shard: wire types in, [`Engine`] calls on a blocking thread, wire
//! types out. All proto↔domain conversions live here.

use std::sync::Arc;

use tessera_proto::v1 as pb;
use tessera_proto::v1::text_generation_service_server::TextGenerationService;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::EngineError;
use crate::core::{Engine, NewSequence, StepOutput, StepTimings};
use crate::sampling::{SampledToken, SamplingParams};

/// Facts about this shard that `Info` and `ServiceDiscovery` report.
#[derive(Debug, Clone)]
pub struct ShardInfo {
    /// Storage format of most weight bytes (`float32`, `bfloat16`, `float16`, or a GGUF
    /// block type such as `Q4_1`), see `Model::weights_dtype`.
    pub dtype: String,
    /// This process's rank.
    pub rank: u32,
    /// Number of shards.
    pub world_size: u32,
    /// Socket paths of every shard, by rank.
    pub socket_paths: Vec<String>,
}

/// The service: an engine behind a lock (one call executes at a time, as the router sends
/// one at a time anyway).
#[derive(Clone)]
pub struct ShardService {
    engine: Arc<Mutex<Engine>>,
    info: Arc<ShardInfo>,
    /// Bytes the KV cache may use, for `Warmup` (CPU).
    kv_cache_memory: u64,
    /// Share of the GPU's free memory the KV cache may use, for `Warmup` (GPU).
    memory_fraction: f32,
}

impl ShardService {
    /// Serves `engine`.
    pub fn new(engine: Engine, info: ShardInfo, kv_cache_memory: u64) -> Self {
        Self {
            engine: Arc::new(Mutex::new(engine)),
            info: Arc::new(info),
            kv_cache_memory,
            memory_fraction: 0.9,
        }
    }

    /// Sizes a GPU model's KV cache at `Warmup` to `fraction` of the free device memory
    /// (after the weights and a worst-case pass's activations); 0.9 unless set.
    pub fn with_memory_fraction(mut self, fraction: f32) -> Self {
        self.memory_fraction = fraction;
        self
    }

    /// Runs `f` on the engine on a blocking thread (forward passes take milliseconds to
    /// seconds of CPU and must not stall the runtime).
    async fn with_engine<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Engine) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, Status> {
        let engine = self.engine.clone().lock_owned().await;
        tokio::task::spawn_blocking(move || {
            let mut engine = engine;
            f(&mut engine)
        })
        .await
        .map_err(|e| Status::internal(format!("engine task failed: {e}")))?
        .map_err(to_status)
    }
}

fn to_status(e: EngineError) -> Status {
    match e {
        EngineError::InvalidBatch(m) => Status::invalid_argument(m),
        other => Status::internal(other.to_string()),
    }
}

fn sequence(r: pb::Request) -> NewSequence {
    let p = r.parameters.unwrap_or_default();
    NewSequence {
        id: r.id,
        input_ids: r.input_ids,
        params: SamplingParams {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            typical_p: p.typical_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
            logit_bias: p
                .logit_bias
                .into_iter()
                .map(|b| (b.token_id, b.bias))
                .collect(),
            seed: p.seed,
            top_n_logprobs: r.top_n_tokens,
        },
        prefill_logprobs: r.prefill_logprobs,
        blocks: r.blocks,
        cache_len: r.cache_len as usize,
        chunk_len: (r.chunk_len > 0).then_some(r.chunk_len as usize),
        generated_len: r.generated_len as usize,
        json_object: p.json_object,
        one_of: p.one_of,
        pattern: p.pattern,
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
        .map(|t: &SampledToken| tokens(t.top_logprobs.iter().copied()))
        .collect();
    pb::Generation {
        request_id: o.request_id,
        prefill_tokens: o.prefill.map(tokens),
        tokens: Some(tokens(o.tokens.iter().map(|t| (t.id, t.logprob)))),
        top_tokens,
        proposed: o.proposed as u32,
    }
}

fn timings(t: StepTimings) -> pb::Timings {
    pb::Timings {
        forward_ns: t.forward_ns,
        decode_ns: t.decode_ns,
        total_ns: t.total_ns,
    }
}

fn updates(u: Vec<pb::BlockUpdate>) -> Vec<(u64, Vec<u32>)> {
    u.into_iter().map(|u| (u.request_id, u.blocks)).collect()
}

fn limits(l: Vec<pb::ChunkLimit>) -> Vec<(u64, usize)> {
    l.into_iter()
        .map(|l| (l.request_id, l.max_tokens as usize))
        .collect()
}

type StepResult = (Vec<StepOutput>, Vec<u64>, StepTimings);

fn cached(batch_id: u64, ids: Vec<u64>) -> Option<pb::CachedBatch> {
    (!ids.is_empty()).then_some(pb::CachedBatch {
        id: batch_id,
        request_ids: ids,
    })
}

#[tonic::async_trait]
impl TextGenerationService for ShardService {
    async fn info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let engine = self.engine.lock().await;
        let c = engine.model().config();
        Ok(Response::new(pb::InfoResponse {
            dtype: self.info.dtype.clone(),
            device_type: engine.model().device_type().into(),
            block_size: engine.block_size() as u32,
            window_size: c.sliding_window.map(|w| w as u32),
            speculate: engine.speculation_depth() as u32,
            supports_chunking: true,
            vocab_size: c.vocab_size as u32,
            max_position_embeddings: c.max_position_embeddings as u32,
            architecture: format!("{:?}", c.architecture).to_lowercase(),
            world_size: self.info.world_size,
        }))
    }

    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        self.with_engine(|e| e.health_check()).await?;
        Ok(Response::new(pb::HealthResponse {}))
    }

    async fn service_discovery(
        &self,
        _: Request<pb::ServiceDiscoveryRequest>,
    ) -> Result<Response<pb::ServiceDiscoveryResponse>, Status> {
        Ok(Response::new(pb::ServiceDiscoveryResponse {
            urls: self.info.socket_paths.clone(),
        }))
    }

    async fn clear_cache(
        &self,
        request: Request<pb::ClearCacheRequest>,
    ) -> Result<Response<pb::ClearCacheResponse>, Status> {
        let id = request.into_inner().id;
        self.engine.lock().await.clear(id);
        Ok(Response::new(pb::ClearCacheResponse {}))
    }

    async fn filter_batch(
        &self,
        request: Request<pb::FilterBatchRequest>,
    ) -> Result<Response<pb::FilterBatchResponse>, Status> {
        let r = request.into_inner();
        let kept = self
            .engine
            .lock()
            .await
            .filter(r.batch_id, &r.request_ids)
            .map_err(to_status)?;
        Ok(Response::new(pb::FilterBatchResponse {
            batch: Some(pb::CachedBatch {
                id: r.batch_id,
                request_ids: kept,
            }),
        }))
    }

    async fn warmup(
        &self,
        request: Request<pb::WarmupRequest>,
    ) -> Result<Response<pb::WarmupResponse>, Status> {
        let r = request.into_inner();
        let (bytes, fraction) = (self.kv_cache_memory, self.memory_fraction);
        let (num_blocks, block_size) = self
            .with_engine(move |engine| {
                let bs = engine.block_size();
                let per_block = engine.block_bytes() as u64;
                let prefill = r.max_batch_prefill_tokens as usize;
                let (budget, flag) = match engine.device_kv_budget(fraction, prefill)? {
                    Some(device) => (device, "--memory-fraction"),
                    None => (bytes, "--kv-cache-memory"),
                };
                let num_blocks = (budget / per_block) as usize;
                let needed = (r.max_total_tokens as usize).div_ceil(bs) + 1;
                if num_blocks < needed {
                    return Err(EngineError::InvalidBatch(format!(
                        "{flag} leaves {budget} bytes for the KV cache: {num_blocks} blocks of \
                         {bs} tokens ({per_block} bytes each); one request of \
                         --max-total-tokens {} needs {needed}: raise {flag} or lower \
                         --max-total-tokens",
                        r.max_total_tokens
                    )));
                }
                engine.resize_cache(num_blocks)?;
                // Worst case on CPU is compute, not memory: a bounded prefill warms the
                // thread pool and faults the weights in without delaying start-up for long.
                engine.warmup((r.max_batch_prefill_tokens as usize).min(256))?;
                Ok((num_blocks, bs))
            })
            .await?;
        Ok(Response::new(pb::WarmupResponse {
            num_blocks: num_blocks as u32,
            block_size: block_size as u32,
        }))
    }

    async fn prefill(
        &self,
        request: Request<pb::PrefillRequest>,
    ) -> Result<Response<pb::PrefillResponse>, Status> {
        let r = request.into_inner();
        let batch = r
            .batch
            .ok_or_else(|| Status::invalid_argument("prefill needs a batch"))?;
        let batch_id = batch.id;
        let new: Vec<NewSequence> = batch.requests.into_iter().map(sequence).collect();
        let cached_id = r.cached_batch.map(|c| c.id);
        let block_updates = updates(r.block_updates);
        let chunk_limits = limits(r.chunk_limits);
        let (outputs, ids, t): StepResult = self
            .with_engine(move |e| e.prefill(batch_id, new, cached_id, block_updates, chunk_limits))
            .await?;
        Ok(Response::new(pb::PrefillResponse {
            generations: outputs.into_iter().map(generation).collect(),
            batch: cached(batch_id, ids),
            timings: Some(timings(t)),
        }))
    }

    async fn decode(
        &self,
        request: Request<pb::DecodeRequest>,
    ) -> Result<Response<pb::DecodeResponse>, Status> {
        let r = request.into_inner();
        let batch_ids: Vec<u64> = r.batches.iter().map(|b| b.id).collect();
        let first = batch_ids.first().copied().unwrap_or_default();
        let block_updates = updates(r.block_updates);
        let chunk_limits = limits(r.chunk_limits);
        let (outputs, ids, t): StepResult = self
            .with_engine(move |e| e.decode(&batch_ids, block_updates, chunk_limits))
            .await?;
        Ok(Response::new(pb::DecodeResponse {
            generations: outputs.into_iter().map(generation).collect(),
            batch: cached(first, ids),
            timings: Some(timings(t)),
        }))
    }
}
