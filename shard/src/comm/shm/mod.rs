//! Collectives between processes on one host over a shared-memory segment, the way vLLM's
//! CPU backend does it: no sockets on the hot path, only memory copies and atomics.
//!
//! # Segment layout
//!
//! ```text
//! [ header: magic, world size, slot size, ready/go/abort flags, creator pid ]  128 bytes
//! [ rank 0 control: pid, arrival epoch, sleepers, descriptors[2] ]            128 bytes
//! [ rank 1 control ] ...
//! [ data: rank 0 buffer 0 | rank 0 buffer 1 | rank 1 buffer 0 | ... ]         slot_bytes each
//! ```
//!
//! # Protocol
//!
//! Every collective is cut into steps of at most `slot_bytes` per rank. In step `e` (an epoch
//! counted identically on every rank) a rank writes its part into its buffer `e % 2`, writes
//! a descriptor (which collective, how many values) and publishes `arrival = e` with a
//! release store; then it waits until every peer's arrival reaches `e`, checks that their
//! descriptors match its own, and reads their buffers `e % 2`. A rank can be at most one
//! step ahead of the slowest (it waits for everyone at each step), so while it writes buffer
//! `(e + 1) % 2` the others may still be reading buffer `e % 2`, never the one it writes:
//! one counter per rank and two buffers suffice, with no second barrier.
//!
//! Waiting spins briefly, then sleeps on a futex on the peer's arrival word (the writer wakes
//! sleepers after publishing). Each sleep is short, and between sleeps the waiter checks
//! that the peer process still exists and that no rank has aborted, so a dead peer is an
//! error within a fraction of a second, and a stuck one after the configured timeout, never
//! a hang. After any error the communicator is poisoned (locally and in the segment).
//!
//! Reductions add the ranks' values in rank order on every rank, so every rank holds
//! bit-identical results.
#![allow(unsafe_code)]

mod collectives;
mod segment;
mod step;
#[cfg(test)]
mod tests;
mod wait;

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use super::CommError;
use segment::{C_PID, H_CREATOR, H_GO, LINE, layout};
use wait::process_alive;

/// Sizes and patience of a shared-memory communicator. Every rank must use the same
/// `slot_bytes`.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// Bytes each rank can publish per step (two such buffers per rank); larger messages
    /// take several steps.
    pub slot_bytes: usize,
    /// Longest wait for a peer inside a collective.
    pub timeout: Duration,
    /// Longest wait for every rank to join (they may load weights at different speeds).
    pub join_timeout: Duration,
    /// How long to spin before sleeping on a futex.
    pub spin: Duration,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            slot_bytes: 8 << 20,
            timeout: Duration::from_secs(60),
            join_timeout: Duration::from_secs(600),
            spin: Duration::from_micros(50),
        }
    }
}

struct State {
    epoch: u32,
    poisoned: Option<String>,
}

/// A shared-memory communicator between the processes (or threads) of one host.
pub struct ShmComm {
    /// Keeps the mapping alive; accessed only through `base`.
    _map: MmapMut,
    base: *mut u8,
    rank: usize,
    world_size: usize,
    slot_bytes: usize,
    data_offset: usize,
    config: ShmConfig,
    pids: Vec<u32>,
    state: Mutex<State>,
}

// SAFETY: `base` points into `_map`, which lives as long as the struct and is never moved or
// remapped. Shared fields are only touched through atomics; data buffers are written only by
// their owner rank and read by others after an acquire of the owner's arrival, as the
// protocol above describes. Collectives are serialised by the `state` mutex.
unsafe impl Send for ShmComm {}
// SAFETY: see `Send`; every method takes `&self` and synchronises through `state`.
unsafe impl Sync for ShmComm {}

impl std::fmt::Debug for ShmComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmComm")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("slot_bytes", &self.slot_bytes)
            .finish()
    }
}

/// A setup error with `message`.
fn setup(message: impl Into<String>) -> CommError {
    CommError::Setup(message.into())
}

impl ShmComm {
    /// Joins the group whose segment is `path` (for example `/dev/shm/tessera-29500-…`).
    /// Rank 0 creates the segment (replacing a stale one) and removes its name once every
    /// rank has mapped it; the others wait for it to appear. Returns once all `world_size`
    /// ranks have joined, or an error after `config.join_timeout`.
    pub fn join(
        path: &Path,
        rank: usize,
        world_size: usize,
        config: ShmConfig,
    ) -> Result<Self, CommError> {
        if world_size == 0 || rank >= world_size || world_size > 1024 {
            return Err(setup(format!("rank {rank} of {world_size} ranks")));
        }
        if config.slot_bytes < 64 || !config.slot_bytes.is_multiple_of(64) {
            return Err(setup(format!(
                "slot size {} must be a positive multiple of 64 bytes",
                config.slot_bytes
            )));
        }
        let (data_offset, total) = layout(world_size, config.slot_bytes);
        let mut map = if rank == 0 {
            segment::create(path, world_size, config.slot_bytes, total)?
        } else {
            segment::open(path, rank, world_size, config.slot_bytes, total, &config)?
        };
        let base = map.as_mut_ptr();
        let mut comm = Self {
            _map: map,
            base,
            rank,
            world_size,
            slot_bytes: config.slot_bytes,
            data_offset,
            config,
            pids: Vec::new(),
            state: Mutex::new(State {
                epoch: 0,
                poisoned: None,
            }),
        };
        let start = Instant::now();
        if rank == 0 {
            // Wait for every rank to claim its control line, then let them go and drop the
            // name: nothing is left in /dev/shm even if a process is killed later.
            loop {
                let missing: Vec<usize> = (1..world_size)
                    .filter(|&r| comm.control(r, C_PID).load(Ordering::Acquire) == 0)
                    .collect();
                if missing.is_empty() {
                    break;
                }
                if start.elapsed() > comm.config.join_timeout {
                    let _ = std::fs::remove_file(path);
                    return Err(setup(format!(
                        "ranks {missing:?} did not join {} within {:?}",
                        path.display(),
                        comm.config.join_timeout
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = std::fs::remove_file(path);
            comm.header(H_GO).store(1, Ordering::Release);
        } else {
            while comm.header(H_GO).load(Ordering::Acquire) == 0 {
                let creator = comm.header(H_CREATOR).load(Ordering::Relaxed);
                if !process_alive(creator) {
                    return Err(setup(format!(
                        "rank 0 (pid {creator}) exited before every rank joined"
                    )));
                }
                if start.elapsed() > comm.config.join_timeout {
                    return Err(setup(format!(
                        "rank 0 did not start the group within {:?}",
                        comm.config.join_timeout
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        comm.pids = (0..world_size)
            .map(|r| comm.control(r, C_PID).load(Ordering::Acquire))
            .collect();
        Ok(comm)
    }

    fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: every offset passed here is 4-byte aligned and inside the control region of
        // the mapping, which lives as long as `self`; the memory is only ever accessed
        // atomically.
        unsafe { AtomicU32::from_ptr(self.base.add(offset).cast::<u32>()) }
    }

    fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: as for `atomic_u32`, with 8-byte aligned offsets.
        unsafe { AtomicU64::from_ptr(self.base.add(offset).cast::<u64>()) }
    }

    fn header(&self, field: usize) -> &AtomicU32 {
        self.atomic_u32(field)
    }

    fn control(&self, rank: usize, field: usize) -> &AtomicU32 {
        self.atomic_u32(LINE + rank * LINE + field)
    }

    fn slot(&self, rank: usize, epoch: u32) -> *mut u8 {
        let index = rank * 2 + (epoch % 2) as usize;
        // SAFETY: `index < 2 * world_size`, so the buffer lies inside the mapping.
        unsafe { self.base.add(self.data_offset + index * self.slot_bytes) }
    }

    fn values_per_step<T>(&self) -> usize {
        self.slot_bytes / std::mem::size_of::<T>()
    }
}
