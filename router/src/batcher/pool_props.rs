//! Property tests of the KV block pool and its prefix cache: random sequences
//! of operations, as the scheduler issues them, checked against a plain model.
//!
//! Operations: admit a sequence (look up its cached prefix, allocate the rest, register its
//! full blocks), release a sequence, allocate a loose block, clear the cache. After every
//! operation:
//! - blocks are conserved: `available + in_use == total`, and `in_use` is the number of
//!   distinct referenced blocks;
//! - block 0 is never handed out, and no block is handed out while referenced;
//! - each reference count equals the model's;
//! - allocation fails only when nothing is available, and takes an empty block before
//!   evicting a cached one;
//! - a lookup only returns blocks that hold exactly the looked-up prefix;
//! - when every sequence is released, nothing is in use.

use std::collections::HashMap;

use proptest::prelude::*;

use super::blocks::{BlockHash, BlockPool};

const BLOCK_SIZE: usize = 2;

/// Prompts sharing prefixes, so the cache gets hits.
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 2, 3, 4, 5, 6, 7, 8],
        vec![1, 2, 3, 4, 9, 9],
        vec![1, 2, 7, 7, 7, 7, 7],
        vec![5, 5, 5, 5],
        vec![1, 2, 3, 4, 5, 6, 0, 0, 1],
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Admit(usize),
    Release(usize),
    AllocateLoose,
    ReleaseLoose(usize),
    ClearCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..prompts().len()).prop_map(Op::Admit),
        3 => any::<usize>().prop_map(Op::Release),
        1 => Just(Op::AllocateLoose),
        1 => any::<usize>().prop_map(Op::ReleaseLoose),
        1 => Just(Op::ClearCache),
    ]
}

/// What the test believes about the pool.
#[derive(Default)]
struct Model {
    refs: HashMap<u32, u32>,
    /// The full token prefix each cached block holds.
    content: HashMap<u32, Vec<u32>>,
    /// Admitted sequences: their blocks.
    sequences: Vec<Vec<u32>>,
    loose: Vec<u32>,
}

impl Model {
    fn take(&mut self, pool: &mut BlockPool) -> Option<u32> {
        let empty_exists = (1..=pool.total() as u32).any(|b| {
            self.refs.get(&b).copied().unwrap_or(0) == 0 && !self.content.contains_key(&b)
        });
        let got = pool.allocate();
        match got {
            None => assert_eq!(
                pool.available(),
                0,
                "allocation failed with blocks available"
            ),
            Some(b) => {
                assert_ne!(b, 0, "block 0 handed out");
                assert_eq!(
                    self.refs.get(&b).copied().unwrap_or(0),
                    0,
                    "block {b} handed out while referenced"
                );
                if empty_exists {
                    assert!(
                        !self.content.contains_key(&b),
                        "evicted cached block {b} while empty blocks remained"
                    );
                }
                // Evicted (or empty): it holds nothing any more.
                self.content.remove(&b);
                self.refs.insert(b, 1);
            }
        }
        got
    }

    fn admit(&mut self, pool: &mut BlockPool, tokens: &[u32]) {
        let needed = pool.blocks_for(tokens.len());
        let full = tokens.len() / BLOCK_SIZE;
        let mut blocks = pool.lookup(None, tokens, full);
        for (i, &b) in blocks.iter().enumerate() {
            assert_eq!(
                self.content.get(&b).map(Vec::as_slice),
                Some(&tokens[..(i + 1) * BLOCK_SIZE]),
                "lookup returned block {b} for the wrong prefix"
            );
            *self.refs.entry(b).or_insert(0) += 1;
        }
        let cached = blocks.len();
        while blocks.len() < needed {
            match self.take(pool) {
                Some(b) => blocks.push(b),
                None => {
                    // Not admitted: give everything back, as the scheduler does.
                    for b in blocks {
                        self.release(pool, b);
                    }
                    return;
                }
            }
        }
        let mut parent: Option<BlockHash> = None;
        for (i, chunk) in tokens.chunks_exact(BLOCK_SIZE).enumerate() {
            let b = blocks[i];
            if i >= cached {
                let prefix = tokens[..(i + 1) * BLOCK_SIZE].to_vec();
                let taken = self.content.values().any(|p| *p == prefix);
                if !self.content.contains_key(&b) && !taken {
                    self.content.insert(b, prefix);
                }
            }
            parent = Some(pool.register(b, parent, chunk));
        }
        self.sequences.push(blocks);
    }

    fn release(&mut self, pool: &mut BlockPool, block: u32) {
        pool.release(block);
        let r = self
            .refs
            .get_mut(&block)
            .expect("released a block the model does not hold");
        *r -= 1;
    }

    fn check(&self, pool: &BlockPool) {
        assert_eq!(pool.available() + pool.in_use(), pool.total());
        let in_use = self.refs.values().filter(|&&r| r > 0).count();
        assert_eq!(pool.in_use(), in_use, "in_use differs from the model");
        for (&b, &r) in &self.refs {
            assert_eq!(pool.ref_count(b), r, "ref count of block {b}");
        }
        assert_eq!(pool.ref_count(0), 0);
    }
}

fn run(num_blocks: usize, ops: &[Op]) {
    let mut pool = BlockPool::new(num_blocks, BLOCK_SIZE);
    let mut model = Model::default();
    let prompts = prompts();
    for op in ops {
        match op {
            Op::Admit(i) => model.admit(&mut pool, &prompts[*i]),
            Op::Release(i) => {
                if !model.sequences.is_empty() {
                    let blocks = model.sequences.swap_remove(i % model.sequences.len());
                    for b in blocks {
                        model.release(&mut pool, b);
                    }
                }
            }
            Op::AllocateLoose => {
                if let Some(b) = model.take(&mut pool) {
                    model.loose.push(b);
                }
            }
            Op::ReleaseLoose(i) => {
                if !model.loose.is_empty() {
                    let b = model.loose.swap_remove(i % model.loose.len());
                    model.release(&mut pool, b);
                }
            }
            Op::ClearCache => {
                pool.clear_cache();
                model.content.clear();
            }
        }
        model.check(&pool);
    }
    // Idle: everything comes back.
    for blocks in std::mem::take(&mut model.sequences) {
        for b in blocks {
            model.release(&mut pool, b);
        }
    }
    for b in std::mem::take(&mut model.loose) {
        model.release(&mut pool, b);
    }
    model.check(&pool);
    assert_eq!(pool.in_use(), 0, "blocks still in use when idle");
    assert_eq!(pool.available(), pool.total());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(num_blocks in 2usize..24, ops in prop::collection::vec(op(), 0..80)) {
        run(num_blocks, &ops);
    }
}
