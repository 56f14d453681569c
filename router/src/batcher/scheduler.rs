//! Admission: which waiting requests join the running batch at the next step. Pure logic,
//! no I/O.

use std::collections::VecDeque;

use super::blocks::BlockAllocator;

/// Limits of one step.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerLimits {
    /// Most prompt tokens prefilled in one step.
    pub max_batch_prefill_tokens: usize,
    /// Most requests in the running batch.
    pub max_batch_size: usize,
}

/// What admission needs to know about a waiting request.
pub(crate) trait Admissible {
    /// Prompt tokens to prefill.
    fn prompt_tokens(&self) -> usize;
    /// Tokens the request may hold at most (prompt + max_new_tokens).
    fn max_tokens(&self) -> usize;
}

/// Takes requests from the front of `waiting`, first come first served, while the step's
/// prefill budget, the batch size and the free blocks allow; returns each with its blocks.
/// Blocks for the whole request (prompt + max_new_tokens) are reserved up front, so a
/// running request never runs out of KV memory.
pub(crate) fn admit<T: Admissible>(
    waiting: &mut VecDeque<T>,
    running: usize,
    limits: SchedulerLimits,
    blocks: &mut BlockAllocator,
) -> Vec<(T, Vec<u32>)> {
    let mut admitted = Vec::new();
    let mut prefill_tokens = 0;
    while let Some(next) = waiting.front() {
        if running + admitted.len() >= limits.max_batch_size {
            break;
        }
        let prompt = next.prompt_tokens();
        // The first request of a step may exceed the budget alone; validation keeps it sane.
        if !admitted.is_empty() && prefill_tokens + prompt > limits.max_batch_prefill_tokens {
            break;
        }
        let Some(allocation) = blocks.allocate(blocks.blocks_for(next.max_tokens())) else {
            break;
        };
        prefill_tokens += prompt;
        if let Some(entry) = waiting.pop_front() {
            admitted.push((entry, allocation));
        }
    }
    admitted
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Req(usize, usize);
    impl Admissible for Req {
        fn prompt_tokens(&self) -> usize {
            self.0
        }
        fn max_tokens(&self) -> usize {
            self.1
        }
    }

    fn limits(prefill: usize, size: usize) -> SchedulerLimits {
        SchedulerLimits {
            max_batch_prefill_tokens: prefill,
            max_batch_size: size,
        }
    }

    #[test]
    fn fcfs_within_prefill_budget() {
        let mut blocks = BlockAllocator::new(100, 4);
        let mut waiting: VecDeque<Req> = [Req(10, 20), Req(10, 20), Req(30, 40), Req(1, 2)].into();
        let a = admit(&mut waiting, 0, limits(25, 8), &mut blocks);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].1.len(), 5);
        // The third does not fit the budget, and the fourth may not overtake it.
        assert_eq!(waiting.len(), 2);
    }

    #[test]
    fn batch_size_and_blocks_bound_admission() {
        let mut blocks = BlockAllocator::new(11, 4);
        let mut waiting: VecDeque<Req> = (0..5).map(|_| Req(4, 16)).collect();
        let a = admit(&mut waiting, 1, limits(1000, 3), &mut blocks);
        assert_eq!(a.len(), 2);
        let b = admit(&mut waiting, 0, limits(1000, 8), &mut blocks);
        assert_eq!(b.len(), 0, "only 2 blocks are free, a request needs 4");
        for (_, blk) in a {
            blocks.free(blk);
        }
        assert_eq!(
            admit(&mut waiting, 0, limits(1000, 8), &mut blocks).len(),
            2
        );
    }

    #[test]
    fn an_oversized_first_request_still_runs() {
        let mut blocks = BlockAllocator::new(100, 4);
        let mut waiting: VecDeque<Req> = [Req(50, 60), Req(1, 2)].into();
        let a = admit(&mut waiting, 0, limits(10, 8), &mut blocks);
        assert_eq!(a.len(), 1);
    }
}
