//! The batching loop: continuous batching over the shards.
//!
//! One task owns the waiting queue, the running requests and the KV block pool. Each
//! iteration admits what fits from the queue and sends the scheduler's plan to the shards as
//! one `Step`: newcomers whole, running requests as deltas, and the ids that left since the
//! last step. Generated tokens are turned into client events; finished or cancelled requests
//! give their blocks back at once and leave the shards' table with the next step.

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

use metrics::{counter, histogram};
use tessera_text::ModelTokenizer;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::client::{ClientError, Generation, NewRequest, ShardStep, ShardedClient, StepAnswer};
use crate::infer::{Entry, InferError, InferStreamResponse};
use crate::metrics::names;
use crate::state::HealthCheck;
pub use scheduler::SchedulerLimits;
pub(crate) use scheduler::{NewWork, RunningWork};
use scheduler::{Scheduler, StepPlan};
use stream::{OutputStream, SpecialTokens};

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
    crate::metrics::record_cache_config(config.block_size, config.num_blocks.saturating_sub(1));
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
    /// Requests the shards may still hold that ended since the last step.
    finished: Vec<u64>,
    next_request_id: u64,
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
            finished: Vec::new(),
            next_request_id: 0,
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
        let pools_every_token =
            (entry.request.pooling.as_ref()).is_some_and(|ask| !ask.reads_last_token_only());
        self.scheduler.add(
            id,
            entry.request.input_ids.clone(),
            !wants_prefill_logprobs && !pools_every_token,
        );
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
        crate::metrics::record_scheduler(
            self.scheduler.num_waiting(),
            self.scheduler.num_running(),
            pool.in_use() * pool.block_size(),
        );
        crate::metrics::record_kv_blocks(pool.available(), pool.in_use(), pool.total());
    }

    /// Requests whose client went away (or whose deadline passed) leave before the next step;
    /// their streams count the failure.
    fn drop_cancelled(&mut self) {
        let gone: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| l.entry.response_tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.finish(id);
        }
    }

    fn finish(&mut self, id: u64) {
        self.live.remove(&id);
        if self.scheduler.remove(id) {
            self.finished.push(id);
        }
    }

    async fn step(&mut self) {
        let plan = self.scheduler.schedule();
        crate::metrics::record_preemptions(plan.preempted.len());
        crate::metrics::record_prefix_cache(plan.prefix_queried_tokens, plan.prefix_hit_tokens);
        if plan.is_empty() {
            if self.scheduler.num_running() == 0 {
                // Nothing runs and the oldest request still does not fit: it never will.
                self.fail_waiting_head();
            }
            return;
        }
        crate::metrics::record_step(
            plan.new.len() + plan.running.len(),
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
                .chain(plan.running.iter().map(|r| r.id))
                .filter_map(|id| self.live.get(&id))
                .map(|l| &l.entry.span),
        );
        self.health.step_running(true);
        let result = self.execute(&plan).instrument(span).await;
        self.health.step_running(false);
        counter!(names::BATCH_INFERENCE, "method" => method).increment(1);
        match result {
            Ok(StepAnswer {
                generations,
                timings,
            }) => {
                self.health.record(true);
                self.scheduler.complete(&plan);
                histogram!(names::BATCH_INFERENCE_DURATION, "method" => method)
                    .record(started.elapsed().as_secs_f64());
                if let Some(t) = timings {
                    histogram!(names::BATCH_FORWARD_DURATION, "method" => method)
                        .record(Duration::from_nanos(t.forward_ns).as_secs_f64());
                    histogram!(names::BATCH_SAMPLING_DURATION, "method" => method)
                        .record(Duration::from_nanos(t.sampling_ns).as_secs_f64());
                }
                self.deliver(generations);
            }
            Err(e) => {
                counter!(names::BATCH_INFERENCE_FAILURE, "method" => method).increment(1);
                self.health.record(false);
                self.fail_all(e);
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

    /// Sends the plan to the shards, with the ids that left since the last step.
    async fn execute(&mut self, plan: &StepPlan) -> Result<StepAnswer, ClientError> {
        let mut new = Vec::with_capacity(plan.new.len());
        for w in &plan.new {
            let Some(l) = self.live.get_mut(&w.id) else {
                continue;
            };
            if l.output.first_prefill() {
                crate::metrics::record_dequeued(&l.entry);
            }
            let prefill_logprobs = std::mem::take(&mut l.wants_prefill_logprobs);
            new.push((w, prefill_logprobs));
        }
        let finished = std::mem::take(&mut self.finished);
        let step = ShardStep {
            new: new
                .into_iter()
                .filter_map(|(w, prefill_logprobs)| {
                    let request = &self.live.get(&w.id)?.entry.request;
                    Some(NewRequest {
                        work: w,
                        sampling: &request.parameters,
                        constraint: request.constraint.as_ref(),
                        prefill_logprobs,
                        pooling: request.pooling.as_ref(),
                    })
                })
                .collect(),
            running: &plan.running,
            finished: &finished,
            preempted: &plan.preempted,
        };
        self.client.step(&step).await
    }

    /// Sends each generation to its client; finished requests leave.
    fn deliver(&mut self, generations: Vec<Generation>) {
        for g in generations {
            let id = g.request_id;
            let Some(live) = self.live.get_mut(&id) else {
                continue;
            };
            if let Some(values) = g.pooled {
                let event = InferStreamResponse::Pooled {
                    values,
                    queued: live.entry.queued,
                    start: live.output.started().unwrap_or(live.entry.queued),
                };
                let _ = live.entry.response_tx.send(Ok(event));
                self.finish(id);
                continue;
            }
            let mut done = false;
            if let Some(prefill) = &g.prefill {
                let event = live.output.prefill_event(prefill);
                done |= live.entry.response_tx.send(Ok(event)).is_err();
            }
            if g.proposed > 0 {
                let accepted = g.tokens.len().saturating_sub(1);
                crate::metrics::record_speculation(g.proposed, accepted);
                live.output.speculated(accepted);
            }
            for token in g.tokens {
                if done {
                    break;
                }
                self.scheduler.append(id, token.id);
                match live.output.push(token) {
                    Ok((event, end)) => {
                        done |= live.entry.response_tx.send(Ok(event)).is_err();
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

    /// A shard call failed: every request gets the error, and leaves the shards' table with
    /// the next step (a failed step empties it already; this covers a rank that did not fail).
    fn fail_all(&mut self, error: ClientError) {
        tracing::error!(%error, "shard call failed; failing every request");
        for (_, l) in self.live.drain() {
            // A stream already gone counted itself as cancelled.
            let _ = l
                .entry
                .response_tx
                .send(Err(InferError::ShardFailure(error.to_string())));
        }
        self.finished.extend(self.scheduler.reset());
    }
}
