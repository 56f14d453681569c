//! The KV block pool of the shards, owned by the router: reference-counted blocks, and a
//! prefix cache of full blocks identified by a hash chained over their tokens.
//!
//! A block is in one of three states: in use (`ref_count > 0`), cached (`ref_count == 0`,
//! holds the K/V of a known token prefix, evictable), or empty. Allocation takes empty
//! blocks first and evicts cached ones least-recently-released first, so shared prefixes
//! survive as long as the pool allows. Block 0 is never handed out: the shards' health check
//! writes into it.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// Identity of a full block: the hash of its parent block's key and its own tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct BlockHash(u64);

impl BlockHash {
    /// The root a sequence's first block chains onto when its K/V depend on more than its
    /// tokens (a `salt`, e.g. the rotary frequencies its length chose), so that it never
    /// shares blocks with sequences of another salt.
    pub(crate) fn root(salt: u64) -> Self {
        let mut h = DefaultHasher::new();
        "root".hash(&mut h);
        salt.hash(&mut h);
        Self(h.finish())
    }

    /// Chains `tokens` (one full block) onto `parent` (`None` for the first block).
    pub(crate) fn chain(parent: Option<BlockHash>, tokens: &[u32]) -> Self {
        let mut h = DefaultHasher::new();
        parent.map(|p| p.0).hash(&mut h);
        tokens.hash(&mut h);
        Self(h.finish())
    }
}

#[derive(Debug, Clone)]
struct CachedKey {
    hash: BlockHash,
    parent: Option<BlockHash>,
    tokens: Vec<u32>,
}

#[derive(Debug)]
pub(crate) struct BlockPool {
    block_size: usize,
    ref_count: Vec<u32>,
    /// Key of each block that holds a cached prefix.
    key: Vec<Option<CachedKey>>,
    by_hash: HashMap<BlockHash, u32>,
    /// Blocks holding nothing worth keeping.
    empty: Vec<u32>,
    /// Cached blocks nobody uses, by release time (oldest first).
    evictable: BTreeMap<u64, u32>,
    /// Release time of each evictable block (to find it in `evictable`).
    released_at: Vec<u64>,
    clock: u64,
}

impl BlockPool {
    pub(crate) fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            ref_count: vec![0; num_blocks],
            key: vec![None; num_blocks],
            by_hash: HashMap::new(),
            // Reversed so that low block ids are handed out first.
            empty: (1..num_blocks as u32).rev().collect(),
            evictable: BTreeMap::new(),
            released_at: vec![0; num_blocks],
            clock: 0,
        }
    }

    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks that can be handed out (block 0 excluded).
    pub(crate) fn total(&self) -> usize {
        self.ref_count.len().saturating_sub(1)
    }

    /// Blocks that an allocation can take now (empty or evictable).
    pub(crate) fn available(&self) -> usize {
        self.empty.len() + self.evictable.len()
    }

    /// Blocks referenced by at least one sequence.
    pub(crate) fn in_use(&self) -> usize {
        self.total() - self.available()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub(crate) fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// One block with a reference count of 1, or `None` when the pool is exhausted.
    pub(crate) fn allocate(&mut self) -> Option<u32> {
        let block = match self.empty.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                if let Some(key) = self.key[b as usize].take() {
                    self.by_hash.remove(&key.hash);
                }
                b
            }
        };
        self.ref_count[block as usize] = 1;
        Some(block)
    }

    /// Drops one reference; a block nobody uses becomes evictable (if cached) or empty.
    pub(crate) fn release(&mut self, block: u32) {
        let b = block as usize;
        debug_assert!(self.ref_count[b] > 0, "block {block} released twice");
        self.ref_count[b] = self.ref_count[b].saturating_sub(1);
        if self.ref_count[b] == 0 {
            if self.key[b].is_some() {
                self.clock += 1;
                self.released_at[b] = self.clock;
                self.evictable.insert(self.clock, block);
            } else {
                self.empty.push(block);
            }
        }
    }

    /// Full blocks at the start of `tokens` whose K/V are cached, each with a new reference;
    /// at most `max_blocks` of them. The first block chains onto `root`.
    pub(crate) fn lookup(
        &mut self,
        root: Option<BlockHash>,
        tokens: &[u32],
        max_blocks: usize,
    ) -> Vec<u32> {
        let mut found = Vec::new();
        let mut parent = root;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let hash = BlockHash::chain(parent, chunk);
            let Some(&block) = self.by_hash.get(&hash) else {
                break;
            };
            let same = self.key[block as usize]
                .as_ref()
                .is_some_and(|k| k.parent == parent && k.tokens == chunk);
            if !same {
                break;
            }
            self.take_ref(block);
            found.push(block);
            parent = Some(hash);
        }
        found
    }

    fn take_ref(&mut self, block: u32) {
        let b = block as usize;
        if self.ref_count[b] == 0 {
            self.evictable.remove(&self.released_at[b]);
        }
        self.ref_count[b] += 1;
    }

    /// Records that `block` (in use) holds the full block `tokens` following `parent`.
    /// Returns the block's hash, for chaining the next one. If another block already holds
    /// the same prefix, this one stays unregistered.
    pub(crate) fn register(
        &mut self,
        block: u32,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> BlockHash {
        let hash = BlockHash::chain(parent, tokens);
        let b = block as usize;
        if self.key[b].is_none() && !self.by_hash.contains_key(&hash) {
            self.by_hash.insert(hash, block);
            self.key[b] = Some(CachedKey {
                hash,
                parent,
                tokens: tokens.to_vec(),
            });
        }
        hash
    }

    /// Forgets every cached prefix (the shards lost their K/V).
    pub(crate) fn clear_cache(&mut self) {
        self.by_hash.clear();
        for (_, b) in std::mem::take(&mut self.evictable) {
            self.empty.push(b);
        }
        for k in &mut self.key {
            *k = None;
        }
    }

    /// Reference count of a block (tests).
    #[cfg(test)]
    pub(crate) fn ref_count(&self, block: u32) -> u32 {
        self.ref_count[block as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_hands_out_block_zero_and_conserves_blocks() {
        let mut p = BlockPool::new(5, 4);
        assert_eq!(p.total(), 4);
        let got: Vec<u32> = (0..4).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert!(p.allocate().is_none());
        for b in got {
            p.release(b);
        }
        assert_eq!(p.available(), 4);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn cached_prefix_is_found_and_evicted_lru() {
        let mut p = BlockPool::new(4, 2);
        let tokens = [1, 2, 3, 4, 5];
        let (a, b) = (p.allocate().unwrap(), p.allocate().unwrap());
        let h = p.register(a, None, &tokens[0..2]);
        p.register(b, Some(h), &tokens[2..4]);
        p.release(a);
        p.release(b);
        assert_eq!(p.available(), 3);
        // Found again, with references.
        assert_eq!(p.lookup(None, &tokens, 10), vec![a, b]);
        assert_eq!(p.ref_count(a), 1);
        assert_eq!(p.lookup(None, &tokens, 1), vec![a]);
        assert_eq!(p.ref_count(a), 2);
        // A different first block shares nothing.
        assert!(p.lookup(None, &[9, 9, 3, 4], 10).is_empty());
        p.release(a);
        p.release(a);
        p.release(b);
        // Empty blocks go first, then the least recently released cached block (a).
        let c = p.allocate().unwrap();
        assert!(c != a && c != b);
        assert_eq!(p.allocate(), Some(a));
        assert!(
            p.lookup(None, &tokens, 10).is_empty(),
            "a's prefix was evicted"
        );
        assert_eq!(p.allocate(), Some(b));
        assert_eq!(p.allocate(), None);
    }

    #[test]
    fn duplicate_prefix_stays_unregistered() {
        let mut p = BlockPool::new(4, 2);
        let (a, b) = (p.allocate().unwrap(), p.allocate().unwrap());
        p.register(a, None, &[1, 2]);
        p.register(b, None, &[1, 2]);
        p.release(b);
        assert_eq!(p.available(), 2, "b was never cached, so it is empty again");
        assert_eq!(p.lookup(None, &[1, 2, 3], 5), vec![a]);
    }

    #[test]
    fn blocks_under_another_root_are_not_shared() {
        let mut p = BlockPool::new(4, 2);
        let a = p.allocate().unwrap();
        let root = Some(BlockHash::root(1));
        p.register(a, root, &[1, 2]);
        p.release(a);
        assert!(p.lookup(None, &[1, 2, 3], 5).is_empty());
        assert!(p.lookup(Some(BlockHash::root(2)), &[1, 2, 3], 5).is_empty());
        assert_eq!(p.lookup(root, &[1, 2, 3], 5), vec![a]);
    }
}
