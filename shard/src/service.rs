//! The gRPC face of the shard: wire types in, [`Engine`] calls on a blocking thread, wire
//! types out. The conversions between the two live in `convert.rs`.

use std::sync::Arc;

use tessera_model_files::Pooler;
use tessera_params::LengthDependentRope;
use tessera_proto::v1 as pb;
use tessera_proto::v1::text_generation_service_server::TextGenerationService;
use tessera_text::TokenizerSource;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::EngineError;
use crate::convert;
use crate::core::Engine;

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
    /// How the model pools embeddings, when it says.
    pub pooler: Option<Pooler>,
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
    /// What `Tokenizer` answers: the model's tokenizer sources, or why there are none.
    tokenizer: Arc<Result<pb::TokenizerResponse, String>>,
}

impl ShardService {
    /// Serves `engine`.
    pub fn new(engine: Engine, info: ShardInfo, kv_cache_memory: u64) -> Self {
        Self {
            engine: Arc::new(Mutex::new(engine)),
            info: Arc::new(info),
            kv_cache_memory,
            memory_fraction: 0.9,
            tokenizer: Arc::new(Err("this shard was started without a tokenizer".into())),
        }
    }

    /// Serves `source` to `Tokenizer` calls, or `Err(why)` when the model's tokenizer files
    /// could not be read (the call then fails with that reason).
    pub fn with_tokenizer_source(mut self, source: Result<TokenizerSource, String>) -> Self {
        self.tokenizer = Arc::new(source.map(pb::TokenizerResponse::from));
        self
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

#[tonic::async_trait]
impl TextGenerationService for ShardService {
    async fn info(
        &self,
        _: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let engine = self.engine.lock().await;
        let c = engine.model().config();
        let (rope_length_threshold, rope_grows_with_length) = match c.length_dependent_rope() {
            Some(LengthDependentRope::Switches { threshold }) => (threshold as u32, false),
            Some(LengthDependentRope::Grows { threshold }) => (threshold as u32, true),
            None => (0, false),
        };
        Ok(Response::new(pb::InfoResponse {
            dtype: self.info.dtype.clone(),
            device_type: engine.model().device_type().into(),
            block_size: engine.block_size() as u32,
            window_size: c.sliding_window.map(|w| w as u32),
            speculate: engine.lookahead() as u32,
            supports_chunking: true,
            vocab_size: c.vocab_size as u32,
            max_position_embeddings: c.context_length() as u32,
            architecture: format!("{:?}", c.architecture).to_lowercase(),
            world_size: self.info.world_size,
            speculator: engine
                .speculator()
                .map(|s| s.name().to_owned())
                .unwrap_or_default(),
            rope_length_threshold,
            rope_grows_with_length,
            pooling: (self.info.pooler)
                .map_or(pb::PoolKind::None, |p| crate::convert::pool_kind(p.pooling))
                .into(),
            normalize: self.info.pooler.is_some_and(|p| p.normalize),
            score_labels: c.score_labels.unwrap_or(0) as u32,
            hidden_size: c.hidden_size as u32,
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
                // The CPU pool is taken whole (see `kv_cache`): refuse one that cannot fit
                // rather than be killed for it.
                let pool = num_blocks as u64 * per_block;
                if flag == "--kv-cache-memory"
                    && let Some(available) = crate::host_memory::available_bytes()
                    && pool > available
                {
                    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
                    return Err(EngineError::InvalidBatch(format!(
                        "--kv-cache-memory asks for {:.2} GiB of KV cache, but this machine \
                         (or container) has {:.2} GiB available: lower --kv-cache-memory",
                        gib(pool),
                        gib(available)
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

    async fn step(
        &self,
        request: Request<pb::StepRequest>,
    ) -> Result<Response<pb::StepResponse>, Status> {
        let plan = convert::step_plan(request.into_inner())?;
        let result = self.with_engine(move |e| e.step(plan)).await?;
        Ok(Response::new(convert::step_response(result)))
    }

    async fn tokenizer(
        &self,
        _: Request<pb::TokenizerRequest>,
    ) -> Result<Response<pb::TokenizerResponse>, Status> {
        match self.tokenizer.as_ref() {
            Ok(response) => Ok(Response::new(response.clone())),
            Err(why) => Err(Status::failed_precondition(format!(
                "the model's tokenizer: {why}"
            ))),
        }
    }
}
