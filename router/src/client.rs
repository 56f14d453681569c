//! The sharded gRPC client: every call goes to all shards at once (they run the same step
//! in lockstep) and rank 0's answer is the one returned.

use futures::future::try_join_all;
use hyper_util::rt::TokioIo;
use tessera_proto::v1 as pb;
use tessera_proto::v1::text_generation_service_client::TextGenerationServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

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
    pub async fn info(&self) -> Result<pb::InfoResponse, ClientError> {
        Ok(broadcast!(self, info, pb::InfoRequest {}))
    }

    /// A forward pass on the reserved health block of every shard.
    pub async fn health(&self) -> Result<(), ClientError> {
        broadcast!(self, health, pb::HealthRequest {});
        Ok(())
    }

    /// Sizes the KV cache and runs a warm-up pass.
    pub async fn warmup(
        &self,
        request: pb::WarmupRequest,
    ) -> Result<pb::WarmupResponse, ClientError> {
        Ok(broadcast!(self, warmup, request))
    }

    /// Drops one cached batch, or all.
    pub async fn clear_cache(&self, id: Option<u64>) -> Result<(), ClientError> {
        broadcast!(self, clear_cache, pb::ClearCacheRequest { id });
        Ok(())
    }

    /// Keeps only `request_ids` of a cached batch.
    pub async fn filter_batch(
        &self,
        batch_id: u64,
        request_ids: Vec<u64>,
    ) -> Result<(), ClientError> {
        let request = pb::FilterBatchRequest {
            batch_id,
            request_ids,
        };
        broadcast!(self, filter_batch, request);
        Ok(())
    }

    /// Prefills `batch` (merged with `cached` in the same pass).
    pub async fn prefill(
        &self,
        request: pb::PrefillRequest,
    ) -> Result<pb::PrefillResponse, ClientError> {
        Ok(broadcast!(self, prefill, request))
    }

    /// One decode step of the cached batches.
    pub async fn decode(
        &self,
        request: pb::DecodeRequest,
    ) -> Result<pb::DecodeResponse, ClientError> {
        Ok(broadcast!(self, decode, request))
    }
}
