//! The scheduler: a pure step function over the waiting and running requests and the KV
//! block pool (vLLM V1's model, no I/O).
//!
//! There are no prefill and decode phases. Each step has a token budget
//! (`max_batch_prefill_tokens`); every running request wants its pending tokens computed
//! (one after a sampled token, or the rest of its prompt), and waiting requests join while
//! the budget, the batch size and the pool allow:
//!
//! 1. running requests, oldest first, take what they need from the budget (decodes first in
//!    practice, since they need one token each and were admitted earlier); a long prompt
//!    takes what is left, so it is spread over several steps (chunked prefill);
//! 2. a running request that needs a block when none is free preempts the newest running
//!    request: its blocks are released (its tokens kept) and it goes back to the front of
//!    the queue, to be recomputed later, usually from its own cached blocks;
//! 3. waiting requests join first come, first served: their prompt's cached full blocks are
//!    reused (prefix caching) and only the rest is prefilled.
//!
//! Blocks are given to a request as it grows; full blocks are registered in the prefix
//! cache once their K/V are computed.

use std::collections::{HashMap, VecDeque};

use tessera_params::LengthDependentRope;

use super::blocks::{BlockHash, BlockPool};

/// Limits of one step.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerLimits {
    /// Tokens computed per step (prompt chunks plus one per decoding request).
    pub max_batch_prefill_tokens: usize,
    /// Most requests running at once.
    pub max_batch_size: usize,
    /// Reuse cached blocks of shared prompt prefixes.
    pub prefix_caching: bool,
    /// Tokens the shards may propose per decoding request (speculative decoding); blocks for
    /// them are given when free, never by preempting.
    pub speculate: usize,
    /// How a prompt's length chooses its rotary frequencies, which cached prefixes must match
    /// (`None`: it does not).
    pub rope: Option<LengthDependentRope>,
}

/// The root a prompt of `len` tokens chains its blocks onto: prompts share cached blocks only
/// when their lengths chose the same rotary frequencies (its prompt's tokens rotate by the
/// prompt's length, later ones by the length they are decoded at). A block of generated
/// tokens past the threshold stays under its prompt's root, which only a prompt as long as the
/// tokens before it could share; such a prompt takes other frequencies, and another root.
fn prefix_root(rope: Option<LengthDependentRope>, len: usize) -> Option<BlockHash> {
    match rope? {
        LengthDependentRope::Switches { threshold } if len > threshold => Some(BlockHash::root(1)),
        LengthDependentRope::Grows { threshold } if len > threshold => {
            Some(BlockHash::root(len as u64))
        }
        _ => None,
    }
}

fn seq_is_decoding(seq: &Sequence) -> bool {
    seq.computed >= seq.prompt_len && seq.tokens.len() - seq.computed == 1
}

#[derive(Debug)]
struct Sequence {
    /// Prompt followed by the generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose K/V are in the shards' cache.
    computed: usize,
    blocks: Vec<u32>,
    /// Whether the shards hold this request's state.
    on_shard: bool,
    /// Blocks the shards know of.
    blocks_sent: usize,
    /// May reuse cached prefixes (not when prompt logprobs are wanted).
    lookup_prefix: bool,
    /// Full blocks registered in the prefix cache, and the hash of the last one.
    registered: usize,
    last_hash: Option<BlockHash>,
    /// What the first block chains onto ([`prefix_root`]).
    root: Option<BlockHash>,
}

/// A request the shards have not seen (new, or resumed after preemption).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewWork {
    pub(crate) id: u64,
    pub(crate) input_ids: Vec<u32>,
    pub(crate) blocks: Vec<u32>,
    pub(crate) cache_len: usize,
    pub(crate) chunk_len: usize,
    pub(crate) generated_len: usize,
}

/// A request the shards hold that computes tokens in this step: what changed for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunningWork {
    pub(crate) id: u64,
    /// Blocks given since the shards last heard of it.
    pub(crate) new_blocks: Vec<u32>,
    pub(crate) chunk_len: usize,
}

/// What to run in one step.
#[derive(Debug, Default)]
pub(crate) struct StepPlan {
    pub(crate) new: Vec<NewWork>,
    /// Requests already on the shards that compute tokens, oldest first; the others wait.
    pub(crate) running: Vec<RunningWork>,
    /// Requests the shards hold but that were preempted: they drop them first.
    pub(crate) preempted: Vec<u64>,
    pub(crate) prefill_tokens: usize,
    pub(crate) decode_tokens: usize,
    pub(crate) prefix_hit_tokens: usize,
    pub(crate) prefix_queried_tokens: usize,
}

impl StepPlan {
    pub(crate) fn is_empty(&self) -> bool {
        self.new.is_empty() && self.running.is_empty()
    }
}

#[derive(Debug)]
pub(crate) struct Scheduler {
    limits: SchedulerLimits,
    pool: BlockPool,
    seqs: HashMap<u64, Sequence>,
    waiting: VecDeque<u64>,
    /// Oldest first.
    running: Vec<u64>,
    preemptions: u64,
}

impl Scheduler {
    pub(crate) fn new(limits: SchedulerLimits, num_blocks: usize, block_size: usize) -> Self {
        Self {
            limits,
            pool: BlockPool::new(num_blocks, block_size),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
        }
    }

    pub(crate) fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub(crate) fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub(crate) fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Total preemptions so far.
    #[cfg(test)]
    pub(crate) fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Queues a request.
    pub(crate) fn add(&mut self, id: u64, prompt: Vec<u32>, lookup_prefix: bool) {
        let root = prefix_root(self.limits.rope, prompt.len());
        self.seqs.insert(
            id,
            Sequence {
                prompt_len: prompt.len(),
                tokens: prompt,
                computed: 0,
                blocks: Vec::new(),
                on_shard: false,
                blocks_sent: 0,
                lookup_prefix: lookup_prefix && self.limits.prefix_caching,
                registered: 0,
                last_hash: root,
                root,
            },
        );
        self.waiting.push_back(id);
    }

    /// Removes a request (finished or cancelled), releasing its blocks. Returns whether the
    /// shards held it.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        let Some(seq) = self.seqs.remove(&id) else {
            return false;
        };
        for b in seq.blocks {
            self.pool.release(b);
        }
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        seq.on_shard
    }

    /// Whether the request is waiting (not running).
    pub(crate) fn is_waiting(&self, id: u64) -> bool {
        self.waiting.contains(&id)
    }

    /// The shards lost their state (a failed call): every request is forgotten by the
    /// caller, and the prefix cache is emptied.
    pub(crate) fn reset(&mut self) -> Vec<u64> {
        let ids: Vec<u64> = self.seqs.keys().copied().collect();
        for id in &ids {
            self.remove(*id);
        }
        self.pool.clear_cache();
        ids
    }

    /// Plans the next step.
    pub(crate) fn schedule(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.limits.max_batch_prefill_tokens.max(1);
        let mut scheduled: Vec<(u64, usize)> = Vec::new();
        let preemptions_before = self.preemptions;

        let mut i = 0;
        while i < self.running.len() {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let n = (seq.tokens.len() - seq.computed).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let target = seq.computed + n;
            if !self.grow(id, target, &mut plan) {
                // `id` preempted itself: it was the newest, the loop is over.
                break;
            }
            if self.limits.speculate > 0 && n == 1 && seq_is_decoding(&self.seqs[&id]) {
                self.grow_if_free(id, target + self.limits.speculate);
            }
            scheduled.push((id, n));
            budget -= n;
            i += 1;
        }

        // Nothing new joins in a step that had to preempt: memory is short.
        let preempted_any = self.preemptions != preemptions_before;
        while !preempted_any && budget > 0 && self.running.len() < self.limits.max_batch_size {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(n) = self.admit(id, budget, &mut plan) else {
                break;
            };
            self.waiting.pop_front();
            self.running.push(id);
            scheduled.push((id, n));
            budget -= n;
        }

        let scheduled: HashMap<u64, usize> = scheduled.into_iter().collect();
        for &id in &self.running {
            let seq = &self.seqs[&id];
            let n = scheduled.get(&id).copied().unwrap_or(0);
            if n > 0 {
                if seq_is_decoding(seq) {
                    plan.decode_tokens += 1;
                } else {
                    plan.prefill_tokens += n;
                }
            }
            if seq.on_shard && n > 0 {
                plan.running.push(RunningWork {
                    id,
                    new_blocks: seq.blocks[seq.blocks_sent..].to_vec(),
                    chunk_len: n,
                });
            } else if !seq.on_shard && n > 0 {
                plan.new.push(NewWork {
                    id,
                    input_ids: seq.tokens.clone(),
                    blocks: seq.blocks.clone(),
                    cache_len: seq.computed,
                    chunk_len: n,
                    generated_len: seq.tokens.len() - seq.prompt_len,
                });
            }
        }
        plan
    }

    /// Gives `id` blocks up to `target` tokens, preempting the newest running requests when
    /// the pool is short. Returns false when `id` itself had to be preempted.
    fn grow(&mut self, id: u64, target: usize, plan: &mut StepPlan) -> bool {
        let needed = self.pool.blocks_for(target);
        while self.seqs[&id].blocks.len() < needed {
            match self.pool.allocate() {
                Some(b) => {
                    if let Some(seq) = self.seqs.get_mut(&id) {
                        seq.blocks.push(b);
                    }
                }
                None => {
                    let Some(&victim) = self.running.last() else {
                        return false;
                    };
                    self.preempt(victim, plan);
                    if victim == id {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Gives `id` blocks up to `target` tokens as long as the pool has free ones.
    fn grow_if_free(&mut self, id: u64, target: usize) {
        let needed = self.pool.blocks_for(target);
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        while seq.blocks.len() < needed {
            match self.pool.allocate() {
                Some(b) => seq.blocks.push(b),
                None => break,
            }
        }
    }

    fn preempt(&mut self, id: u64, plan: &mut StepPlan) {
        self.running.retain(|&r| r != id);
        self.waiting.push_front(id);
        self.preemptions += 1;
        if let Some(seq) = self.seqs.get_mut(&id) {
            for b in seq.blocks.drain(..) {
                self.pool.release(b);
            }
            if seq.on_shard {
                plan.preempted.push(id);
            }
            seq.on_shard = false;
            seq.computed = 0;
            seq.blocks_sent = 0;
            seq.registered = 0;
            seq.last_hash = seq.root;
        }
    }

    /// Takes a waiting request in if its first chunk fits; returns the chunk length.
    fn admit(&mut self, id: u64, budget: usize, plan: &mut StepPlan) -> Option<usize> {
        let bs = self.pool.block_size();
        let seq = self.seqs.get_mut(&id)?;
        let hits = if seq.lookup_prefix {
            // The last token is always computed, so that the request gets logits.
            let max_blocks = (seq.tokens.len() - 1) / bs;
            plan.prefix_queried_tokens += seq.tokens.len();
            self.pool.lookup(seq.root, &seq.tokens, max_blocks)
        } else {
            Vec::new()
        };
        let mut parent = seq.root;
        for chunk in seq.tokens.chunks_exact(bs).take(hits.len()) {
            parent = Some(BlockHash::chain(parent, chunk));
        }
        seq.computed = hits.len() * bs;
        seq.registered = hits.len();
        seq.last_hash = parent;
        seq.blocks = hits;
        let n = (seq.tokens.len() - seq.computed).min(budget);
        let needed = self.pool.blocks_for(seq.computed + n);
        while seq.blocks.len() < needed {
            match self.pool.allocate() {
                Some(b) => seq.blocks.push(b),
                None => {
                    for b in seq.blocks.drain(..) {
                        self.pool.release(b);
                    }
                    seq.computed = 0;
                    seq.registered = 0;
                    seq.last_hash = seq.root;
                    return None;
                }
            }
        }
        plan.prefix_hit_tokens += seq.computed;
        Some(n)
    }

    /// Records that the plan ran: computed tokens advance, the shards hold the requests,
    /// and newly full blocks enter the prefix cache.
    pub(crate) fn complete(&mut self, plan: &StepPlan) {
        let done = plan
            .new
            .iter()
            .map(|w| (w.id, w.chunk_len))
            .chain(plan.running.iter().map(|r| (r.id, r.chunk_len)));
        let bs = self.pool.block_size();
        for (id, n) in done {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            seq.computed += n;
            seq.on_shard = true;
            seq.blocks_sent = seq.blocks.len();
            if self.limits.prefix_caching {
                let full = seq.computed / bs;
                while seq.registered < full {
                    let r = seq.registered;
                    let block = seq.blocks[r];
                    let tokens = &seq.tokens[r * bs..(r + 1) * bs];
                    seq.last_hash = Some(self.pool.register(block, seq.last_hash, tokens));
                    seq.registered += 1;
                }
            }
        }
    }

    /// Appends a token the shards sampled for `id`. Every token before the newest one has
    /// its K/V computed (with speculation, the accepted proposals were computed in the pass
    /// that verified them).
    pub(crate) fn append(&mut self, id: u64, token: u32) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.tokens.push(token);
            seq.computed = seq.computed.max(seq.tokens.len() - 1);
        }
    }

    /// Checks the pool's bookkeeping against the requests (tests).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut refs: HashMap<u32, u32> = HashMap::new();
        for seq in self.seqs.values() {
            let mut seen = std::collections::HashSet::new();
            for &b in &seq.blocks {
                assert!(b != 0, "block 0 handed out");
                assert!(seen.insert(b), "block {b} twice in one request");
                *refs.entry(b).or_default() += 1;
            }
            assert!(seq.blocks.len() * self.pool.block_size() >= seq.computed);
        }
        for (&b, &n) in &refs {
            assert_eq!(self.pool.ref_count(b), n, "block {b}: ref count vs owners");
        }
        assert_eq!(self.pool.in_use(), refs.len(), "blocks in use vs owned");
        for id in &self.waiting {
            assert!(
                self.seqs[id].blocks.is_empty(),
                "waiting request {id} holds blocks"
            );
        }
        assert!(self.running.len() <= self.limits.max_batch_size);
    }
}
