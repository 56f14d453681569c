//! The KV block pool of the shards, owned by the router. Block 0 is never handed out: the
//! shards' health check writes into it.

/// Free-list allocator over blocks `1..num_blocks`.
#[derive(Debug)]
pub(crate) struct BlockAllocator {
    free: Vec<u32>,
    total: usize,
    block_size: usize,
}

impl BlockAllocator {
    pub(crate) fn new(num_blocks: usize, block_size: usize) -> Self {
        // Reversed so that low block ids are handed out first.
        let free = (1..num_blocks as u32).rev().collect();
        Self {
            free,
            total: num_blocks.saturating_sub(1),
            block_size,
        }
    }

    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks that can be handed out (block 0 excluded).
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    pub(crate) fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub(crate) fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// `n` blocks, or `None` (and nothing taken) when fewer are free.
    pub(crate) fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        Some(
            self.free
                .split_off(self.free.len() - n)
                .into_iter()
                .rev()
                .collect(),
        )
    }

    pub(crate) fn free(&mut self, blocks: Vec<u32>) {
        self.free.extend(blocks.into_iter().rev());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_hands_out_block_zero_and_conserves_blocks() {
        let mut a = BlockAllocator::new(5, 16);
        assert_eq!(a.total(), 4);
        let x = a.allocate(3).unwrap();
        assert_eq!(x, vec![1, 2, 3]);
        assert!(a.allocate(2).is_none());
        assert_eq!(a.free_blocks(), 1);
        let y = a.allocate(1).unwrap();
        assert_eq!(y, vec![4]);
        a.free(x);
        a.free(y);
        assert_eq!(a.free_blocks(), 4);
        let mut all = a.allocate(4).unwrap();
        all.sort();
        assert_eq!(all, vec![1, 2, 3, 4]);
        assert_eq!(a.blocks_for(33), 3);
    }
}
