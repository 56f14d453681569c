//! The batching loop: continuous batching over the shards.
//!
//! One task owns the waiting queue, the running batch and the KV block pool. Each iteration
//! admits what fits from the queue and runs one step: a `Prefill` of the newcomers that
//! carries the running batch's next decode in the same forward pass, or a plain `Decode`.
//! Generated tokens are turned into client events; finished or cancelled requests leave the
//! batch (`FilterBatch`) and give their blocks back before the next step.

mod blocks;
#[cfg(test)]
mod pool_props;
mod scheduler;
#[cfg(test)]
mod scheduler_sim;
mod stream;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use tessera_formats::ModelTokenizer;
use tessera_proto::v1 as pb;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::client::{ClientError, ShardedClient};
use crate::infer::{Entry, InferError, ValidParameters};
use crate::metrics::names;
use crate::server::HealthCheck;
pub use scheduler::SchedulerLimits;
use scheduler::{NewWork, Scheduler, StepPlan};
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
        step_since: AtomicU64::new(0),
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
    /// Milliseconds since `epoch` when the running step started (0: no step running).
    step_since: AtomicU64,
    epoch: Instant,
}

/// A step running longer than this means a stalled shard.
const STALLED_STEP: Duration = Duration::from_secs(30);
/// How long the health RPC may take before the shards count as unhealthy.
const HEALTH_RPC_TIMEOUT: Duration = Duration::from_secs(5);

impl Health {
    fn record(&self, ok: bool) {
        self.failed.store(!ok, Ordering::Relaxed);
        if ok {
            let ms = self.epoch.elapsed().as_millis() as u64;
            self.last_success.store(ms.max(1), Ordering::Relaxed);
        }
    }

    fn now_ms(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64).max(1)
    }

    /// Marks a step as running (or finished), so that a health check during a long step
    /// does not queue behind it on the shards.
    fn step_running(&self, running: bool) {
        let value = if running { self.now_ms() } else { 0 };
        self.step_since.store(value, Ordering::Relaxed);
    }

    async fn check(&self) -> bool {
        let now = self.now_ms();
        let since = self.step_since.load(Ordering::Relaxed);
        if since > 0 {
            // The shards are busy with a step: healthy unless it has been stuck for long.
            return now - since < STALLED_STEP.as_millis() as u64;
        }
        let last = self.last_success.load(Ordering::Relaxed);
        if last > 0 && now - last < 5_000 && !self.failed.load(Ordering::Relaxed) {
            return true;
        }
        let ok = matches!(
            tokio::time::timeout(HEALTH_RPC_TIMEOUT, self.client.health()).await,
            Ok(Ok(()))
        );
        self.record(ok);
        ok
    }
}

/// A request between admission and its last event.
struct Live {
    entry: Entry,
    output: OutputStream,
    /// Whether the request still wants prompt logprobs (only on its first prefill).
    wants_prefill_logprobs: bool,
}

struct Batcher {
    client: ShardedClient,
    tokenizer: Arc<ModelTokenizer>,
    special: Arc<SpecialTokens>,
    scheduler: Scheduler,
    live: HashMap<u64, Live>,
    /// The shards' cached batch and the requests it holds.
    batch_id: Option<u64>,
    shard_ids: Vec<u64>,
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
            scheduler: Scheduler::new(config.limits, config.num_blocks, config.block_size),
            live: HashMap::new(),
            batch_id: None,
            shard_ids: Vec::new(),
            next_request_id: 0,
            next_batch_id: 0,
            health,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Entry>) {
        self.report_gauges();
        loop {
            if self.live.is_empty() {
                match rx.recv().await {
                    Some(entry) => self.enqueue(entry),
                    None => return,
                }
            }
            while let Ok(entry) = rx.try_recv() {
                self.enqueue(entry);
            }
            self.drop_cancelled();
            self.step().await;
            self.report_gauges();
        }
    }

    fn enqueue(&mut self, entry: Entry) {
        let id = self.next_request_id;
        self.next_request_id += 1;
        let wants_prefill_logprobs = entry.request.decoder_input_details;
        self.scheduler
            .add(id, entry.request.input_ids.clone(), !wants_prefill_logprobs);
        let output = OutputStream::new(
            &entry.request,
            self.tokenizer.clone(),
            self.special.clone(),
            entry.queued,
        );
        self.live.insert(
            id,
            Live {
                entry,
                output,
                wants_prefill_logprobs,
            },
        );
    }

    fn report_gauges(&self) {
        let pool = self.scheduler.pool();
        gauge!(names::QUEUE_REQUESTS).set(self.scheduler.num_waiting() as f64);
        gauge!(names::RUNNING_REQUESTS).set(self.scheduler.num_running() as f64);
        crate::metrics::record_kv_blocks(pool.available(), pool.in_use(), pool.total());
        gauge!(names::BATCH_KV_TOKENS).set((pool.in_use() * pool.block_size()) as f64);
    }

    /// Requests whose client went away leave before the next step.
    fn drop_cancelled(&mut self) {
        let gone: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| l.entry.response_tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.finish(id);
            crate::metrics::record_failure("cancelled");
        }
    }

    fn finish(&mut self, id: u64) {
        self.live.remove(&id);
        self.scheduler.remove(id);
    }

    /// Makes the shards' cached batch hold exactly the requests the scheduler has there.
    async fn sync_batch(&mut self) -> Result<(), ClientError> {
        let wanted = self.scheduler.on_shard();
        if wanted == self.shard_ids {
            return Ok(());
        }
        let Some(batch_id) = self.batch_id else {
            self.shard_ids = wanted;
            return Ok(());
        };
        if wanted.is_empty() {
            self.batch_id = None;
            self.shard_ids.clear();
            return self.client.clear_cache(Some(batch_id)).await;
        }
        self.client.filter_batch(batch_id, wanted.clone()).await?;
        self.shard_ids = wanted;
        Ok(())
    }

    async fn step(&mut self) {
        let plan = self.scheduler.schedule();
        if !plan.preempted.is_empty() {
            counter!(names::PREEMPTIONS).increment(plan.preempted.len() as u64);
        }
        crate::metrics::record_prefix_cache(plan.prefix_queried_tokens, plan.prefix_hit_tokens);
        if let Err(e) = self.sync_batch().await {
            self.fail_all(e).await;
            return;
        }
        if plan.is_empty() {
            if self.scheduler.num_running() == 0 {
                // Nothing runs and the oldest request still does not fit: it never will.
                self.fail_waiting_head();
            }
            return;
        }
        crate::metrics::record_step(
            plan.new.len() + plan.cached.iter().filter(|c| c.1 > 0).count(),
            plan.prefill_tokens,
            plan.decode_tokens,
        );
        let method = if plan.new.is_empty() {
            "decode"
        } else {
            "prefill"
        };
        let started = Instant::now();
        let span = crate::telemetry::step_span(
            method,
            (plan.new.iter().map(|w| w.id))
                .chain(plan.cached.iter().filter(|c| c.1 > 0).map(|c| c.0))
                .filter_map(|id| self.live.get(&id))
                .map(|l| &l.entry.span),
        );
        self.health.step_running(true);
        let result = self.execute(&plan).instrument(span).await;
        self.health.step_running(false);
        counter!(names::BATCH_INFERENCE, "method" => method).increment(1);
        match result {
            Ok((generations, timings)) => {
                self.health.record(true);
                self.scheduler.complete(&plan);
                self.shard_ids = self.scheduler.on_shard();
                histogram!(names::BATCH_INFERENCE_DURATION, "method" => method)
                    .record(started.elapsed().as_secs_f64());
                if let Some(t) = timings {
                    histogram!(names::BATCH_FORWARD_DURATION, "method" => method)
                        .record(Duration::from_nanos(t.forward_ns).as_secs_f64());
                    histogram!(names::BATCH_SAMPLING_DURATION, "method" => method)
                        .record(Duration::from_nanos(t.decode_ns).as_secs_f64());
                }
                self.deliver(generations);
            }
            Err(e) => {
                counter!(names::BATCH_INFERENCE_FAILURE, "method" => method).increment(1);
                self.health.record(false);
                self.fail_all(e).await;
            }
        }
    }

    fn fail_waiting_head(&mut self) {
        let head = self
            .live
            .keys()
            .copied()
            .filter(|&id| self.scheduler.is_waiting(id))
            .min();
        if let Some(id) = head {
            if let Some(l) = self.live.get(&id) {
                let _ = l.entry.response_tx.send(Err(InferError::GenerationError(
                    "the request needs more KV cache than the server has".into(),
                )));
            }
            self.finish(id);
        }
    }

    async fn execute(
        &mut self,
        plan: &StepPlan,
    ) -> Result<(Vec<pb::Generation>, Option<pb::Timings>), ClientError> {
        let chunk_limits: Vec<pb::ChunkLimit> = plan
            .cached
            .iter()
            .map(|&(request_id, n)| pb::ChunkLimit {
                request_id,
                max_tokens: n as u32,
            })
            .collect();
        let block_updates: Vec<pb::BlockUpdate> = plan
            .block_updates
            .iter()
            .map(|(request_id, blocks)| pb::BlockUpdate {
                request_id: *request_id,
                blocks: blocks.clone(),
            })
            .collect();
        if plan.new.is_empty() {
            let Some(id) = self.batch_id else {
                return Err(ClientError::Shard("no cached batch to decode".into()));
            };
            let r = self
                .client
                .decode(pb::DecodeRequest {
                    batches: vec![pb::CachedBatch {
                        id,
                        request_ids: self.shard_ids.clone(),
                    }],
                    block_updates,
                    chunk_limits,
                })
                .await?;
            return Ok((r.generations, r.timings));
        }
        let batch_id = self.next_batch_id;
        self.next_batch_id += 1;
        let requests = plan.new.iter().map(|w| self.request(w)).collect();
        let cached_batch = self
            .batch_id
            .filter(|_| !self.shard_ids.is_empty())
            .map(|id| pb::CachedBatch {
                id,
                request_ids: self.shard_ids.clone(),
            });
        for w in &plan.new {
            if let Some(l) = self.live.get_mut(&w.id) {
                if l.output.first_prefill() {
                    crate::metrics::record_dequeued(&l.entry);
                }
                l.wants_prefill_logprobs = false;
            }
        }
        let r = self
            .client
            .prefill(pb::PrefillRequest {
                batch: Some(pb::Batch {
                    id: batch_id,
                    requests,
                }),
                cached_batch,
                block_updates,
                chunk_limits,
            })
            .await?;
        self.batch_id = Some(batch_id);
        Ok((r.generations, r.timings))
    }

    fn request(&self, w: &NewWork) -> pb::Request {
        let live = self.live.get(&w.id);
        let default = ValidParameters::default();
        let p = live.map_or(&default, |l| &l.entry.request.parameters);
        pb::Request {
            id: w.id,
            input_ids: w.input_ids.clone(),
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
                json_object: p.json_object,
                one_of: p.one_of.clone(),
                pattern: p.pattern.clone(),
            }),
            top_n_tokens: p.top_n_tokens,
            prefill_logprobs: live.is_some_and(|l| l.wants_prefill_logprobs),
            blocks: w.blocks.clone(),
            cache_len: w.cache_len as u32,
            chunk_len: w.chunk_len as u32,
            generated_len: w.generated_len as u32,
        }
    }

    /// Sends each generation to its client; finished requests leave.
    fn deliver(&mut self, generations: Vec<pb::Generation>) {
        for g in generations {
            let id = g.request_id;
            let Some(live) = self.live.get_mut(&id) else {
                continue;
            };
            let mut done = false;
            if let Some(prefill) = &g.prefill_tokens {
                let event = live.output.prefill_event(&prefill.ids, &prefill.logprobs);
                done |= live.entry.response_tx.send(Ok(event)).is_err();
            }
            let tokens = g.tokens.unwrap_or_default();
            if g.proposed > 0 {
                let accepted = tokens.ids.len().saturating_sub(1);
                crate::metrics::record_speculation(g.proposed as usize, accepted);
            }
            for (i, (&token, &logprob)) in tokens.ids.iter().zip(&tokens.logprobs).enumerate() {
                if done {
                    break;
                }
                self.scheduler.append(id, token);
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
                match live.output.push(SampledToken {
                    id: token,
                    logprob,
                    top,
                }) {
                    Ok((event, end)) => {
                        if live.entry.response_tx.send(Ok(event)).is_err() {
                            counter!(names::REQUEST_FAILURE, "err" => "cancelled").increment(1);
                            done = true;
                        }
                        done |= end;
                    }
                    Err(e) => {
                        let _ = live.entry.response_tx.send(Err(e));
                        done = true;
                    }
                }
            }
            if done {
                self.finish(id);
            }
        }
    }

    /// A shard call failed: every request gets the error, and the shards' state is dropped.
    async fn fail_all(&mut self, error: ClientError) {
        tracing::error!(%error, "shard call failed; failing every request");
        for (_, l) in self.live.drain() {
            let sent = l
                .entry
                .response_tx
                .send(Err(InferError::ShardFailure(error.to_string())));
            if sent.is_err() {
                // Otherwise the request's stream counts the failure.
                crate::metrics::record_failure("cancelled");
            }
        }
        self.scheduler.reset();
        self.batch_id = None;
        self.shard_ids.clear();
        let _ = self.client.clear_cache(None).await;
    }
}
