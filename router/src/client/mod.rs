//! The sharded gRPC client: every call goes to all shards at once (they run the same step
//! in lockstep) and rank 0's answer is the one returned. Wire types stay in here
//! (`convert.rs`); the rest of the router speaks [`ShardStep`] and [`StepAnswer`].

mod convert;

use futures::future::try_join_all;
use hyper_util::rt::TokioIo;
use tessera_params::{OutputConstraint, SamplingParams};
use tessera_proto::v1 as pb;
use tessera_proto::v1::text_generation_service_client::TextGenerationServiceClient;
use tessera_text::TokenizerSource;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::batcher::{NewWork, RunningWork};
use crate::pooling::PoolingAsk;
pub use pb::{InfoResponse as ShardFacts, WarmupRequest, WarmupResponse};

/// One scheduler step as the shards receive it.
#[derive(Debug)]
pub(crate) struct ShardStep<'a> {
    /// Requests that join the shards' table, with their parameters.
    pub(crate) new: Vec<NewRequest<'a>>,
    /// Requests the shards hold that compute tokens in this step.
    pub(crate) running: &'a [RunningWork],
    /// Requests that ended since the last step.
    pub(crate) finished: &'a [u64],
    /// Requests preempted by this step's plan.
    pub(crate) preempted: &'a [u64],
}

/// A request that joins the shards' table.
#[derive(Debug)]
pub(crate) struct NewRequest<'a> {
    pub(crate) work: &'a NewWork,
    pub(crate) sampling: &'a SamplingParams,
    pub(crate) constraint: Option<&'a OutputConstraint>,
    /// Report the prompt tokens' logprobs (only on a request's first computation).
    pub(crate) prefill_logprobs: bool,
    /// Pool the prompt instead of generating.
    pub(crate) pooling: Option<&'a PoolingAsk>,
}

/// What the shards answered to a step.
#[derive(Debug, Default)]
pub(crate) struct StepAnswer {
    pub(crate) generations: Vec<Generation>,
    pub(crate) timings: Option<StepTimings>,
}

/// Where a step's time went on the shard.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepTimings {
    pub(crate) forward_ns: u64,
    pub(crate) sampling_ns: u64,
}

/// What one request produced in a step.
#[derive(Debug)]
pub(crate) struct Generation {
    pub(crate) request_id: u64,
    /// `(token, logprob)` of every prompt token (the first logprob is NaN), when asked.
    pub(crate) prefill: Option<Vec<(u32, f32)>>,
    /// The new tokens (several under speculation; none while a prompt is being chunked).
    pub(crate) tokens: Vec<SampledToken>,
    /// Tokens the speculator proposed (the accepted ones are `tokens` minus one).
    pub(crate) proposed: usize,
    /// A pooling request's result (its vector, or its label logits), once its prompt is
    /// computed.
    pub(crate) pooled: Option<Vec<f32>>,
}

/// A generated token as the shards report it.
#[derive(Debug, Clone)]
pub(crate) struct SampledToken {
    pub(crate) id: u32,
    pub(crate) logprob: f32,
    /// Its most likely alternatives, when asked.
    pub(crate) top: Vec<(u32, f32)>,
}

/// Why a call to the shards failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// A shard could not be reached.
    #[error("cannot connect to shard at {path}: {message}")]
    Connection {
        /// The socket path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// A shard answered with an error or went away during the call.
    #[error("shard error: {0}")]
    Shard(String),
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        Self::Shard(format!("{}: {}", status.code(), status.message()))
    }
}

type Client = TextGenerationServiceClient<Channel>;

async fn connect(path: &str) -> Result<Client, ClientError> {
    let socket = path.to_string();
    // The URI is a placeholder; the connector ignores it and dials the unix socket.
    let channel = Endpoint::try_from("http://[::]:50051")
        .map_err(|e| ClientError::Connection {
            path: path.into(),
            message: e.to_string(),
        })?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .map_err(|e| ClientError::Connection {
            path: path.into(),
            message: e.to_string(),
        })?;
    // Far above tonic's 4 MiB default: the tokenizer's sources are tens of MB for a
    // 250k-token vocabulary, and a step's logprobs can be large too.
    Ok(TextGenerationServiceClient::new(channel)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20))
}

/// Clients of every shard, rank 0 first.
#[derive(Debug, Clone)]
pub struct ShardedClient {
    clients: Vec<Client>,
}

macro_rules! broadcast {
    ($self:ident, $method:ident, $request:expr) => {{
        let calls = $self.clients.iter().map(|c| {
            let mut c = c.clone();
            let request = crate::telemetry::grpc_request($request.clone());
            async move { c.$method(request).await.map(|r| r.into_inner()) }
        });
        let mut answers = try_join_all(calls).await?;
        answers.swap_remove(0)
    }};
}

impl ShardedClient {
    /// Connects to the shard at `master_path`, asks it for every shard's socket, and
    /// connects to all of them.
    pub async fn connect(master_path: &str) -> Result<Self, ClientError> {
        let mut master = connect(master_path).await?;
        let urls = master
            .service_discovery(pb::ServiceDiscoveryRequest {})
            .await?
            .into_inner()
            .urls;
        let mut clients = vec![master];
        for url in urls.iter().skip(1) {
            clients.push(connect(url).await?);
        }
        Ok(Self { clients })
    }

    /// Number of shards.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Always false: a client has at least the master shard.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Model and engine facts.
    pub async fn info(&self) -> Result<ShardFacts, ClientError> {
        Ok(broadcast!(self, info, pb::InfoRequest {}))
    }

    /// A forward pass on the reserved health block of every shard.
    pub async fn health(&self) -> Result<(), ClientError> {
        broadcast!(self, health, pb::HealthRequest {});
        Ok(())
    }

    /// Sizes the KV cache and runs a warm-up pass.
    pub async fn warmup(&self, request: WarmupRequest) -> Result<WarmupResponse, ClientError> {
        Ok(broadcast!(self, warmup, request))
    }

    /// What the model's tokenizer is built from, as rank 0 read it from the model's files
    /// (every shard reads the same files).
    pub async fn tokenizer_source(&self) -> Result<TokenizerSource, ClientError> {
        let mut master = self.clients[0].clone();
        let request = crate::telemetry::grpc_request(pb::TokenizerRequest {});
        let response = master.tokenizer(request).await?.into_inner();
        TokenizerSource::try_from(response).map_err(|e| ClientError::Shard(e.to_string()))
    }

    /// Runs one step on every shard.
    pub(crate) async fn step(&self, step: &ShardStep<'_>) -> Result<StepAnswer, ClientError> {
        let request = convert::step_request(step);
        Ok(convert::step_answer(broadcast!(self, step, request)))
    }
}
