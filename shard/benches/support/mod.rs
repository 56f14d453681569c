//! Passes the engine benchmarks time: prompts, prefill and greedy decode over a shared cache.

use std::hint::black_box;

use tessera_shard::{ForwardOutput, HiddenStates, KvCache, LogitsWanted, Model, SequenceChunk};

/// `n` token ids spread over the vocabulary (never 0), different for each `seed`.
pub(crate) fn tokens(n: usize, seed: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729 + 17) % (vocab - 1)) as u32 + 1)
        .collect()
}

/// The first index of the largest value.
pub(crate) fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 { (i, x) } else { best }
        })
        .0
}

/// Prefills each prompt from position 0 into its block table, in one pass; the last token's
/// logits of each.
pub(crate) fn prefill(
    model: &Model,
    cache: &mut KvCache,
    prompts: &[Vec<u32>],
    tables: &[Vec<u32>],
) -> ForwardOutput {
    let chunks: Vec<SequenceChunk<'_>> = prompts
        .iter()
        .zip(tables)
        .map(|(p, t)| SequenceChunk {
            tokens: p,
            start_position: 0,
            block_table: t,
            logits: LogitsWanted::Last,
            tree: None,
            prompt_len: p.len(),
        })
        .collect();
    black_box(
        model
            .forward(&chunks, cache, HiddenStates::None)
            .expect("prefill"),
    )
}

/// `steps` greedy decode passes for `tables.len()` sequences whose prompts of `ctx` tokens
/// are cached.
pub(crate) fn decode(
    model: &Model,
    cache: &mut KvCache,
    ctx: usize,
    steps: usize,
    tables: &[Vec<u32>],
) {
    let mut last: Vec<u32> = (0..tables.len()).map(|b| 1 + b as u32).collect();
    for s in 0..steps {
        let chunks: Vec<SequenceChunk<'_>> = tables
            .iter()
            .zip(&last)
            .map(|(t, tok)| SequenceChunk {
                tokens: std::slice::from_ref(tok),
                start_position: ctx + s,
                block_table: t,
                logits: LogitsWanted::Last,
                tree: None,
                prompt_len: ctx,
            })
            .collect();
        let out = model
            .forward(&chunks, cache, HiddenStates::None)
            .expect("decode");
        for (b, l) in last.iter_mut().enumerate() {
            *l = argmax(out.last(b).expect("logits")) as u32;
        }
    }
}
