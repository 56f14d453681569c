//! The batching loop: continuous batching over the shards.
//!
//! One task owns the waiting queue, the running batch and the KV block pool. Each iteration
//! admits what fits from the queue and runs one step: a `Prefill` of the newcomers that
//! carries the running batch's next decode in the same forward pass, or a plain `Decode`.
//! Generated tokens are turned into client events; finished or cancelled requests leave the
//! batch (`FilterBatch`) and give their blocks back before the next step.

mod blocks;
mod scheduler;
mod stream;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use tessera_formats::ModelTokenizer;
use tessera_proto::v1 as pb;
use tokio::sync::mpsc;

use crate::client::{ClientError, ShardedClient};
use crate::infer::{Entry, InferError, InferStreamResponse};
use crate::metrics::names;
use crate::server::HealthCheck;
use blocks::BlockAllocator;
pub use scheduler::SchedulerLimits;
use scheduler::{Admissible, admit};
use stream::{OutputStream, SampledToken, SpecialTokens};

/// Everything the batcher needs to run.
pub struct BatcherConfig {
    /// The shards.
    pub client: ShardedClient,
    /// The model's tokenizer, for detokenization.
    pub tokenizer: Arc<ModelTokenizer>,
    /// KV blocks the shards have (block 0 is reserved).
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Step limits.
    pub limits: SchedulerLimits,
    /// Capacity of the channel from the HTTP layer.
    pub queue_capacity: usize,
}

/// Starts the batching task. Returns the sender the HTTP layer queues entries on, and a
/// health check that is true when the shards can generate.
pub fn spawn(config: BatcherConfig) -> (mpsc::Sender<Entry>, HealthCheck) {
    let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
    let health = Arc::new(Health {
        client: config.client.clone(),
        last_success: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        epoch: Instant::now(),
    });
    let batcher = Batcher::new(config, health.clone());
    tokio::spawn(batcher.run(rx));
    let check: HealthCheck = Arc::new(move || {
        let health = health.clone();
        Box::pin(async move { health.check().await })
    });
    (tx, check)
}

/// Health as the batcher last saw it, with a forward pass on the shards when it has no
/// recent evidence either way.
struct Health {
    client: ShardedClient,
    /// Milliseconds since `epoch` of the last successful step (0: never).
    last_success: AtomicU64,
    failed: AtomicBool,
    epoch: Instant,
}

impl Health {
    fn record(&self, ok: bool) {
        self.failed.store(!ok, Ordering::Relaxed);
        if ok {
            let ms = self.epoch.elapsed().as_millis() as u64;
            self.last_success.store(ms.max(1), Ordering::Relaxed);
        }
    }

    async fn check(&self) -> bool {
        let last = self.last_success.load(Ordering::Relaxed);
        let recent = last > 0 && self.epoch.elapsed().as_millis() as u64 - last < 5_000;
        if recent && !self.failed.load(Ordering::Relaxed) {
            return true;
        }
        let ok = self.client.health().await.is_ok();
        self.record(ok);
        ok
    }
}

struct Waiting(Entry);

impl Admissible for Waiting {
    fn prompt_tokens(&self) -> usize {
        self.0.request.input_ids.len()
    }
    fn max_tokens(&self) -> usize {
        self.0.request.input_ids.len() + self.0.request.stopping.max_new_tokens as usize
    }
}

struct Running {
    entry: Entry,
    blocks: Vec<u32>,
    output: OutputStream,
}

struct Batcher {
    client: ShardedClient,
    tokenizer: Arc<ModelTokenizer>,
    special: Arc<SpecialTokens>,
    blocks: BlockAllocator,
    limits: SchedulerLimits,
    waiting: VecDeque<Waiting>,
    running: HashMap<u64, Running>,
    /// The shards' cached batch holding every running request.
    batch_id: Option<u64>,
    next_request_id: u64,
    next_batch_id: u64,
    health: Arc<Health>,
}

impl Batcher {
    fn new(config: BatcherConfig, health: Arc<Health>) -> Self {
        Self {
            client: config.client,
            special: Arc::new(SpecialTokens::of(&config.tokenizer)),
            tokenizer: config.tokenizer,
            blocks: BlockAllocator::new(config.num_blocks, config.block_size),
            limits: config.limits,
            waiting: VecDeque::new(),
            running: HashMap::new(),
            batch_id: None,
            next_request_id: 0,
            next_batch_id: 0,
            health,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Entry>) {
        self.report_gauges();
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match rx.recv().await {
                    Some(entry) => self.waiting.push_back(Waiting(entry)),
                    None => return,
                }
            }
            while let Ok(entry) = rx.try_recv() {
                self.waiting.push_back(Waiting(entry));
            }
            self.waiting.retain(|w| !w.0.response_tx.is_closed());
            self.drop_cancelled().await;
            self.step().await;
            self.report_gauges();
        }
    }

    fn report_gauges(&self) {
        gauge!(names::QUEUE_SIZE).set(self.waiting.len() as f64);
        gauge!(names::BATCH_CURRENT_SIZE).set(self.running.len() as f64);
        gauge!(names::KV_BLOCKS_FREE).set(self.blocks.free_blocks() as f64);
        let used = self.blocks.total() - self.blocks.free_blocks();
        gauge!("tessera_kv_blocks_used").set(used as f64);
        gauge!("tessera_kv_blocks_total").set(self.blocks.total() as f64);
        gauge!(names::BATCH_CURRENT_MAX_TOKENS).set((used * self.blocks.block_size()) as f64);
    }

    /// Requests whose client went away leave the batch before the next step.
    async fn drop_cancelled(&mut self) {
        let gone: Vec<u64> = self
            .running
            .iter()
            .filter(|(_, r)| r.entry.response_tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        if gone.is_empty() {
            return;
        }
        for id in &gone {
            if let Some(r) = self.running.remove(id) {
                self.blocks.free(r.blocks);
            }
            counter!(names::REQUEST_FAILURE, "err" => "cancelled").increment(1);
        }
        self.sync_batch().await;
    }

    /// Tells the shards which requests are still running.
    async fn sync_batch(&mut self) {
        let Some(batch_id) = self.batch_id else {
            return;
        };
        let result = if self.running.is_empty() {
            self.batch_id = None;
            self.client.clear_cache(Some(batch_id)).await
        } else {
            self.client
                .filter_batch(batch_id, self.running.keys().copied().collect())
                .await
        };
        if let Err(e) = result {
            self.fail_all(e);
        }
    }

    async fn step(&mut self) {
        let admitted = admit(
            &mut self.waiting,
            self.running.len(),
            self.limits,
            &mut self.blocks,
        );
        let method = if admitted.is_empty() {
            "decode"
        } else {
            "prefill"
        };
        let started = Instant::now();
        let result = if admitted.is_empty() {
            let Some(batch_id) = self.batch_id else {
                if let Some(w) = self.waiting.pop_front() {
                    // Nothing runs and the oldest request still does not fit: it never will.
                    let _ = w.0.response_tx.send(Err(InferError::GenerationError(
                        "the request needs more KV cache than the server has".into(),
                    )));
                }
                return;
            };
            self.client
                .decode(pb::DecodeRequest {
                    batches: vec![pb::CachedBatch {
                        id: batch_id,
                        request_ids: self.running.keys().copied().collect(),
                    }],
                    block_updates: Vec::new(),
                })
                .await
                .map(|r| (r.generations, r.timings))
        } else {
            let request = self.prefill_request(admitted);
            self.client
                .prefill(request)
                .await
                .map(|r| (r.generations, r.timings))
        };
        counter!(names::BATCH_INFERENCE_COUNT, "method" => method).increment(1);
        match result {
            Ok((generations, timings)) => {
                self.health.record(true);
                histogram!(names::BATCH_INFERENCE_DURATION, "method" => method)
                    .record(started.elapsed().as_secs_f64());
                if let Some(t) = timings {
                    histogram!(names::BATCH_FORWARD_DURATION, "method" => method)
                        .record(Duration::from_nanos(t.forward_ns).as_secs_f64());
                    histogram!(names::BATCH_DECODE_DURATION, "method" => method)
                        .record(Duration::from_nanos(t.decode_ns).as_secs_f64());
                }
                let finished = self.deliver(generations);
                if finished {
                    self.sync_batch().await;
                }
            }
            Err(e) => {
                counter!(names::BATCH_INFERENCE_FAILURE, "method" => method).increment(1);
                self.health.record(false);
                self.fail_all(e);
                // The shards dropped the batch's state with the failed call.
                let _ = self.client.clear_cache(None).await;
            }
        }
    }

    /// Moves admitted entries into the running set and builds the prefill call.
    fn prefill_request(&mut self, admitted: Vec<(Waiting, Vec<u32>)>) -> pb::PrefillRequest {
        let batch_id = self.next_batch_id;
        self.next_batch_id += 1;
        let mut requests = Vec::with_capacity(admitted.len());
        for (Waiting(entry), blocks) in admitted {
            let id = self.next_request_id;
            self.next_request_id += 1;
            let r = &entry.request;
            let p = &r.parameters;
            requests.push(pb::Request {
                id,
                input_ids: r.input_ids.clone(),
                parameters: Some(pb::NextTokenChooserParameters {
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
                        .iter()
                        .map(|&(token_id, bias)| pb::LogitBias { token_id, bias })
                        .collect(),
                    seed: p.seed.unwrap_or(0),
                }),
                top_n_tokens: p.top_n_tokens,
                prefill_logprobs: r.decoder_input_details,
                blocks: blocks.clone(),
                cache_len: 0,
                chunk_len: 0,
                generated_len: 0,
            });
            histogram!(names::REQUEST_QUEUE_DURATION).record(entry.queued.elapsed().as_secs_f64());
            let output = OutputStream::new(
                r,
                self.tokenizer.clone(),
                self.special.clone(),
                entry.queued,
            );
            self.running.insert(
                id,
                Running {
                    entry,
                    blocks,
                    output,
                },
            );
        }
        let cached_batch = self.batch_id.map(|id| pb::CachedBatch {
            id,
            request_ids: Vec::new(),
        });
        self.batch_id = Some(batch_id);
        pb::PrefillRequest {
            batch: Some(pb::Batch {
                id: batch_id,
                requests,
            }),
            cached_batch,
            block_updates: Vec::new(),
        }
    }

    /// Sends each generation to its client. Returns whether any request left the batch.
    fn deliver(&mut self, generations: Vec<pb::Generation>) -> bool {
        let mut finished = false;
        for g in generations {
            let Some(running) = self.running.get_mut(&g.request_id) else {
                continue;
            };
            let mut done = false;
            if let Some(prefill) = &g.prefill_tokens {
                let event = running
                    .output
                    .prefill_event(&prefill.ids, &prefill.logprobs);
                done |= running.entry.response_tx.send(Ok(event)).is_err();
            }
            let tokens = g.tokens.unwrap_or_default();
            for (i, (&id, &logprob)) in tokens.ids.iter().zip(&tokens.logprobs).enumerate() {
                let top = g
                    .top_tokens
                    .get(i)
                    .map(|t| {
                        t.ids
                            .iter()
                            .copied()
                            .zip(t.logprobs.iter().copied())
                            .collect()
                    })
                    .unwrap_or_default();
                match running.output.push(SampledToken { id, logprob, top }) {
                    Ok((event, end)) => {
                        if let InferStreamResponse::End { generated_text, .. } = &event {
                            histogram!(names::REQUEST_GENERATED_TOKENS)
                                .record(generated_text.generated_tokens as f64);
                        }
                        done |= running.entry.response_tx.send(Ok(event)).is_err() || end;
                    }
                    Err(e) => {
                        let _ = running.entry.response_tx.send(Err(e));
                        done = true;
                    }
                }
                if done {
                    break;
                }
            }
            if done {
                if let Some(r) = self.running.remove(&g.request_id) {
                    self.blocks.free(r.blocks);
                }
                finished = true;
            }
        }
        finished
    }

    /// A shard call failed: every running request gets the error and leaves.
    fn fail_all(&mut self, error: ClientError) {
        tracing::error!(%error, "shard call failed; failing the running batch");
        for (_, r) in self.running.drain() {
            let _ = r
                .entry
                .response_tx
                .send(Err(InferError::ShardFailure(error.to_string())));
            self.blocks.free(r.blocks);
            counter!(names::REQUEST_FAILURE, "err" => "shard_failure").increment(1);
        }
        self.batch_id = None;
    }
}
