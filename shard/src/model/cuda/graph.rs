//! CUDA graphs for decode steps: a step of a few hundred small kernels costs more in launches
//! than in work on a large GPU, so each common decode shape is captured once into a graph and
//! replayed, as vLLM and TGI do.
//!
//! A graph is specific to its shapes and addresses: the batch is padded to a bucket size
//! (1, 2, 4 … 64 sequences), the block tables to a power-of-two width, and the index arrays
//! live in buffers the graph owns, refilled before every replay. Padding sequences write no K/V
//! (slot -1) and read one position of block 0; their logits are dropped. The decode kernel is
//! sized for the longest context the tables can address and skips the partitions a sequence
//! does not reach, so one graph serves every context length up to that. A shape is captured
//! the second time it is seen (the first runs kernel by kernel, which loads the kernels and
//! warms cuBLAS), and only under one rank (the all-reduce goes through the host). If a capture
//! fails, graphs are turned off for the model and every step runs kernel by kernel;
//! [`super::CudaOptions::graphs`] (the shard's `TESSERA_CUDA_GRAPHS=0`) turns them off from
//! the start.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tessera_kernels::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use tessera_kernels::cuda::cudarc::driver::{CudaGraph, CudaSlice};

use super::super::batch::FlatBatch;
use super::super::forward;
use super::{CudaBackend, CudaPages, DeviceElem, GpuBatch};
use crate::EngineError;

/// Batch sizes with a graph; larger decode batches run kernel by kernel.
const BATCH_BUCKETS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Narrowest block-table width of a graph (wider ones are powers of two).
const MIN_TABLE_WIDTH: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    /// The cache the graph's attention reads and writes ([`CudaPages::id`]).
    kv: u64,
    seqs: usize,
    max_blocks: usize,
}

struct DecodeGraph<T> {
    graph: SerialGraph,
    /// The index arrays the graph reads.
    batch: GpuBatch,
    /// `[seqs, local vocab]`, where the graph leaves the logits.
    logits: CudaSlice<T>,
}

/// A graph that moves between threads: the engine runs on whichever blocking thread the
/// service hands it, one call at a time.
struct SerialGraph(CudaGraph);

// SAFETY: CUDA requires calls on one graph to be serialised, not made from one thread; every
// use goes through `DecodeGraphs::state`'s mutex.
#[allow(unsafe_code)]
unsafe impl Send for SerialGraph {}

/// The captured graphs of one model.
pub(crate) struct DecodeGraphs<T> {
    enabled: AtomicBool,
    replays: AtomicU64,
    state: Mutex<State<T>>,
}

struct State<T> {
    graphs: HashMap<Key, DecodeGraph<T>>,
    seen: HashSet<Key>,
}

impl<T> DecodeGraphs<T> {
    pub(crate) fn new(enabled: bool) -> Self {
        DecodeGraphs {
            enabled: AtomicBool::new(enabled),
            replays: AtomicU64::new(0),
            state: Mutex::new(State {
                graphs: HashMap::new(),
                seen: HashSet::new(),
            }),
        }
    }

    /// Decode steps that ran as a graph replay.
    pub(crate) fn replays(&self) -> u64 {
        self.replays.load(Ordering::Relaxed)
    }
}

fn device_error(e: impl std::fmt::Display) -> EngineError {
    EngineError::Device(e.to_string())
}

/// `values` padded with `fill` to `len`.
fn padded(values: &[i32], len: usize, fill: i32) -> Vec<i32> {
    let mut v = values.to_vec();
    v.resize(len, fill);
    v
}

impl<T: DeviceElem> CudaBackend<T> {
    /// Runs `batch` through its graph when it is a decode step of a graphed shape (capturing
    /// it on its second sighting); `None` when the step should run kernel by kernel.
    pub(super) fn graphed_decode(
        &self,
        layers: usize,
        batch: &FlatBatch<'_>,
        kv: &mut CudaPages<T>,
    ) -> Result<Option<Vec<f32>>, EngineError> {
        let graphs = self.graphs();
        if !graphs.enabled.load(Ordering::Relaxed) || self.world_size() > 1 {
            return Ok(None);
        }
        // Only decode steps of a graphed size; anything else builds its index once, eagerly.
        let n = batch.seqs.len();
        let Some(&seqs) = BATCH_BUCKETS.iter().find(|&&b| b >= n) else {
            return Ok(None);
        };
        if n == 0 || batch.seqs.iter().any(|q| q.rows != 1) {
            return Ok(None);
        }
        let index = batch.kernel_index()?;
        let key = Key {
            kv: kv.id,
            seqs,
            max_blocks: index.max_blocks.next_power_of_two().max(MIN_TABLE_WIDTH),
        };
        let mut state = graphs.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.graphs.contains_key(&key) {
            if state.seen.insert(key) {
                return Ok(None);
            }
            // Graphs of caches that are gone only hold memory.
            state.graphs.retain(|k, _| k.kv == kv.id);
            match self.capture(layers, key, batch.block_size, kv) {
                Ok(g) => {
                    tracing::debug!(seqs, max_blocks = key.max_blocks, "captured a decode graph");
                    state.graphs.insert(key, g);
                }
                Err(e) => {
                    tracing::warn!(
                        "capturing a CUDA graph failed ({e}); decode steps run kernel by kernel"
                    );
                    graphs.enabled.store(false, Ordering::Relaxed);
                    state.graphs.clear();
                    return Ok(None);
                }
            }
        }
        let g = state
            .graphs
            .get_mut(&key)
            .ok_or_else(|| EngineError::Device("a captured graph vanished".into()))?;
        let s = self.stream();
        let mut tables = vec![0i32; seqs * key.max_blocks];
        for (row, src) in tables
            .chunks_exact_mut(key.max_blocks)
            .zip(index.block_tables.chunks_exact(index.max_blocks))
        {
            row[..src.len()].copy_from_slice(src);
        }
        let b = &mut g.batch;
        s.memcpy_htod(&padded(&index.ids, seqs, 0), &mut b.ids)
            .map_err(device_error)?;
        s.memcpy_htod(&padded(&index.positions, seqs, 0), &mut b.positions)
            .map_err(device_error)?;
        s.memcpy_htod(&padded(&index.slots, seqs, -1), &mut b.slots)
            .map_err(device_error)?;
        s.memcpy_htod(&padded(&index.context_lens, seqs, 1), &mut b.context_lens)
            .map_err(device_error)?;
        s.memcpy_htod(&tables, &mut b.block_tables)
            .map_err(device_error)?;
        g.graph.0.launch().map_err(device_error)?;
        graphs.replays.fetch_add(1, Ordering::Relaxed);
        let host: Vec<T> = s
            .clone_dtoh(&g.logits.slice(..n * self.local_vocab()))
            .map_err(device_error)?;
        Ok(Some(host.into_iter().map(|v| v.to_f32()).collect()))
    }

    /// Records one decode step of `key`'s shape on the stream into a graph.
    fn capture(
        &self,
        layers: usize,
        key: Key,
        block_size: usize,
        kv: &mut CudaPages<T>,
    ) -> Result<DecodeGraph<T>, EngineError> {
        let s = self.stream();
        let seqs = key.seqs;
        let zeros = |n: usize| s.alloc_zeros::<i32>(n).map_err(device_error);
        let batch = GpuBatch {
            ids: zeros(seqs)?,
            positions: zeros(seqs)?,
            slots: zeros(seqs)?,
            block_tables: zeros(seqs * key.max_blocks)?,
            max_blocks: key.max_blocks,
            num_seqs: seqs,
            tokens: seqs,
            block_size,
            decode: true,
            context_lens: zeros(seqs)?,
            // The longest context the tables address: the kernel is split for it, and skips
            // what a shorter context does not reach.
            max_context: key.max_blocks * block_size,
            cu_seqlens: zeros(seqs + 1)?,
            first_pos: zeros(seqs)?,
            max_rows: 1,
            logit_runs: vec![(0, seqs)],
        };
        let width = seqs * self.local_vocab();
        let mut logits = s.alloc_zeros::<T>(width).map_err(device_error)?;
        s.synchronize().map_err(device_error)?;
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(device_error)?;
        let recorded = (|| {
            let out = forward::run(self, self.dims, layers, &batch, seqs, seqs, kv)?;
            s.memcpy_dtod(&out.logits.slice(..width), &mut logits)
                .map_err(device_error)
        })();
        // Capture must end whatever happened, or the stream stays unusable.
        let ended = s.end_capture(CUgraphInstantiate_flags(0));
        recorded?;
        let graph = ended
            .map_err(device_error)?
            .ok_or_else(|| EngineError::Device("stream capture recorded nothing".into()))?;
        graph.upload().map_err(device_error)?;
        Ok(DecodeGraph {
            graph: SerialGraph(graph),
            batch,
            logits,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::padded;

    #[test]
    fn padding_fills_to_the_bucket() {
        assert_eq!(padded(&[3, 4], 4, -1), vec![3, 4, -1, -1]);
        assert_eq!(padded(&[], 2, 1), vec![1, 1]);
    }
}
