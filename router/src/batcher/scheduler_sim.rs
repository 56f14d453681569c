//! Seeded random workloads run through the scheduler against a deterministic executor that
//! stands in for the shards: it keeps a KV cache of block slots and derives each sampled
//! token from the K/V the request's block table points at, so a wrong block, a wrong
//! prefix-cache hit or a lost token changes the output. Under length-dependent RoPE a slot
//! also records the frequencies its token rotated by, so a cached block reused by a prompt
//! whose length chose other ones is caught.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng as StdRng;

use tessera_params::LengthDependentRope;

use super::scheduler::{Scheduler, SchedulerLimits, StepPlan};

const VOCAB: u64 = 50;

fn prefix_hash(tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    tokens.hash(&mut h);
    h.finish()
}

fn next_token(tokens: &[u32]) -> u32 {
    (prefix_hash(tokens).rotate_left(17) % VOCAB) as u32
}

/// The shards' side: per-request token lists and K/V slots holding the hash of the prefix
/// they were computed for and of the rotary frequencies they took.
#[derive(Default)]
struct Executor {
    rope: Option<LengthDependentRope>,
    slots: HashMap<(u32, usize), u64>,
    seqs: HashMap<u64, (Vec<u32>, Vec<u32>, usize, usize)>, // tokens, blocks, computed, prompt
}

impl Executor {
    /// What the K/V at position `p` hold: the prefix up to it, and which frequencies a token
    /// there rotates by (the prompt's length for prompt tokens, else its own).
    fn kv(&self, tokens: &[u32], p: usize, prompt_len: usize) -> u64 {
        let len = prompt_len.max(p + 1);
        let freqs = match self.rope {
            None => 0,
            Some(LengthDependentRope::Switches { threshold }) => u64::from(len > threshold),
            Some(LengthDependentRope::Grows { threshold }) if len > threshold => len as u64,
            Some(LengthDependentRope::Grows { .. }) => 0,
        };
        prefix_hash(&tokens[..=p]) ^ freqs.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    fn run(&mut self, plan: &StepPlan, bs: usize) -> Vec<(u64, u32)> {
        for id in &plan.preempted {
            self.seqs.remove(id);
        }
        for r in &plan.running {
            self.seqs
                .get_mut(&r.id)
                .expect("update for a cached request")
                .1
                .extend(&r.new_blocks);
        }
        for w in &plan.new {
            assert!(
                !self.seqs.contains_key(&w.id),
                "request {} sent twice",
                w.id
            );
            let prompt_len = w.input_ids.len() - w.generated_len;
            self.seqs.insert(
                w.id,
                (
                    w.input_ids.clone(),
                    w.blocks.clone(),
                    w.cache_len,
                    prompt_len,
                ),
            );
        }
        let work: Vec<(u64, usize)> = plan
            .new
            .iter()
            .map(|w| (w.id, w.chunk_len))
            .chain(plan.running.iter().map(|r| (r.id, r.chunk_len)))
            .collect();
        let mut out = Vec::new();
        for (id, n) in work {
            if n == 0 {
                continue;
            }
            let (mut tokens, blocks, computed, prompt_len) =
                self.seqs.remove(&id).expect("work for an unknown request");
            let slot = |p: usize| (blocks[p / bs], p % bs);
            // Everything already computed must be what this request computed.
            for p in 0..computed {
                assert_eq!(
                    self.slots.get(&slot(p)),
                    Some(&self.kv(&tokens, p, prompt_len)),
                    "request {id}: K/V at position {p} belong to another prefix or rotation"
                );
            }
            for p in computed..computed + n {
                let kv = self.kv(&tokens, p, prompt_len);
                self.slots.insert(slot(p), kv);
            }
            let computed = computed + n;
            if computed == tokens.len() {
                let t = next_token(&tokens);
                tokens.push(t);
                out.push((id, t));
            }
            self.seqs.insert(id, (tokens, blocks, computed, prompt_len));
        }
        out
    }

    fn remove(&mut self, id: u64) {
        self.seqs.remove(&id);
    }
}

struct Req {
    prompt: Vec<u32>,
    max_new: usize,
    generated: Vec<u32>,
}

/// A prompt that starts with one of the `shared` prefixes more often than not, and a budget
/// that fits 80 tokens.
fn random_request(rng: &mut StdRng, shared: &[Vec<u32>]) -> Req {
    let mut prompt = if rng.random_bool(0.6) {
        shared[rng.random_range(0..shared.len())].clone()
    } else {
        Vec::new()
    };
    prompt.extend((0..rng.random_range(1..20)).map(|_| rng.random_range(0..VOCAB as u32)));
    let max_new = rng.random_range(1..=(80 - prompt.len()).min(30));
    Req {
        prompt,
        max_new,
        generated: Vec::new(),
    }
}

fn expected(prompt: &[u32], max_new: usize) -> Vec<u32> {
    let mut t = prompt.to_vec();
    for _ in 0..max_new {
        t.push(next_token(&t));
    }
    t[prompt.len()..].to_vec()
}

fn simulate(seed: u64, prefix_caching: bool, rope: Option<LengthDependentRope>) -> (u64, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let bs = 4;
    let num_blocks = 21; // 80 tokens: a tiny pool
    let limits = SchedulerLimits {
        max_batch_prefill_tokens: 16,
        max_batch_size: 8,
        prefix_caching,
        speculate: 0,
        rope,
    };
    let mut sched = Scheduler::new(limits, num_blocks, bs);
    let mut exec = Executor {
        rope,
        ..Executor::default()
    };
    let shared: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..rng.random_range(4..30))
                .map(|_| rng.random_range(0..VOCAB as u32))
                .collect()
        })
        .collect();
    let mut reqs: HashMap<u64, Req> = HashMap::new();
    let (mut next_id, total) = (0u64, 300u64);
    let mut cancelled = HashSet::new();
    let mut finished = 0;
    let mut hits = 0;
    for step in 0..200_000 {
        if next_id < total && rng.random_bool(0.5) {
            for _ in 0..rng.random_range(1..4) {
                let req = random_request(&mut rng, &shared);
                sched.add(next_id, req.prompt.clone(), true);
                reqs.insert(next_id, req);
                next_id += 1;
            }
        }
        // Random cancellations, of waiting and running requests alike.
        let live: Vec<u64> = reqs.keys().copied().collect();
        for id in live {
            if rng.random_bool(0.003) {
                if sched.remove(id) {
                    exec.remove(id);
                }
                reqs.remove(&id);
                cancelled.insert(id);
            }
        }
        let plan = sched.schedule();
        sched.check_invariants();
        hits += plan.prefix_hit_tokens;
        if plan.is_empty() {
            assert!(
                sched.num_running() == 0,
                "step {step}: running requests but nothing to do"
            );
            if next_id >= total && reqs.is_empty() {
                break;
            }
            assert!(
                sched.num_waiting() == 0 || next_id < total,
                "step {step}: waiting forever"
            );
            continue;
        }
        let outputs = exec.run(&plan, bs);
        sched.complete(&plan);
        for (id, token) in outputs {
            sched.append(id, token);
            let r = reqs.get_mut(&id).expect("output for a live request");
            r.generated.push(token);
            if r.generated.len() == r.max_new {
                assert_eq!(r.generated, expected(&r.prompt, r.max_new), "request {id}");
                sched.remove(id);
                exec.remove(id);
                reqs.remove(&id);
                finished += 1;
            }
        }
        sched.check_invariants();
    }
    assert!(reqs.is_empty(), "requests left: {}", reqs.len());
    assert_eq!(finished + cancelled.len() as u64, next_id);
    assert_eq!(sched.pool().in_use(), 0, "blocks leaked");
    assert_eq!(sched.pool().available(), num_blocks - 1);
    (sched.preemptions(), hits)
}

#[test]
fn random_workloads_keep_blocks_and_outputs_exact() {
    let mut preemptions = 0;
    let mut hits = 0;
    for seed in 0..8 {
        for caching in [true, false] {
            let (p, h) = simulate(seed, caching, None);
            preemptions += p;
            if caching {
                hits += h;
            } else {
                assert_eq!(h, 0);
            }
        }
    }
    assert!(preemptions > 0, "the tiny pool must force preemptions");
    assert!(hits > 0, "shared prefixes must hit the cache");
}

#[test]
fn length_dependent_rope_shares_only_blocks_of_the_same_rotation() {
    // Prompts of 1 to 49 tokens, on both sides of the threshold.
    for rope in [
        LengthDependentRope::Switches { threshold: 20 },
        LengthDependentRope::Grows { threshold: 20 },
    ] {
        let mut hits = 0;
        for seed in 0..8 {
            hits += simulate(seed, true, Some(rope)).1;
        }
        assert!(
            hits > 0,
            "{rope:?}: prompts of one rotation must still share prefixes"
        );
    }
}
