//! Collectives between the shard processes of one tensor-parallel group.
//!
//! Every rank calls the same collectives in the same order (the router sends every step to
//! all shards, and a step's control flow depends only on its inputs). Results are
//! bit-identical on every rank: reductions add the ranks' contributions in rank order.
//!
//! - [`LocalComm`]: one shard, every collective is the identity.
//! - [`ShmComm`]: shard processes on one host, over a shared-memory segment in `/dev/shm`
//!   synchronised by atomics and futexes (no sockets on the hot path).
//! - `NcclComm` (feature `cuda`): NCCL through cudarc, one communicator per process and device.

#[cfg(feature = "cuda")]
mod nccl;
mod partition;
mod shm;

use half::bf16;

#[cfg(feature = "cuda")]
pub use nccl::NcclComm;
pub use partition::{HeadSplit, Partition, PartitionError, allowed_shard_counts};
pub use shm::{ShmComm, ShmConfig};

/// Why a collective failed. After any error the communicator is poisoned: the ranks may no
/// longer agree on which collective comes next, so every later call fails too.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// A peer process exited.
    #[error("rank {rank} (pid {pid}) is gone")]
    PeerDied {
        /// The peer's rank.
        rank: usize,
        /// Its process id.
        pid: u32,
    },
    /// A peer did not arrive in time.
    #[error("timed out after {seconds:.1} s waiting for rank {rank} in {op}")]
    Timeout {
        /// The slowest peer.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// How long this rank waited.
        seconds: f64,
    },
    /// The ranks called different collectives (or the same with different sizes).
    #[error("rank {rank} called {theirs} while this rank called {ours}: the ranks diverged")]
    Mismatch {
        /// The peer that disagrees.
        rank: usize,
        /// What this rank called.
        ours: String,
        /// What the peer called.
        theirs: String,
    },
    /// An earlier collective failed (here or on a peer).
    #[error("the communicator failed earlier ({0}); restart the shard group")]
    Poisoned(String),
    /// Setting the communicator up failed.
    #[error("communicator setup: {0}")]
    Setup(String),
    /// Arguments that cannot work (sizes, roots).
    #[error("invalid collective: {0}")]
    Invalid(String),
}

/// The collectives tensor parallelism needs. Implementations are safe to share between
/// threads, but the collectives of one communicator must be called by one thread at a time.
pub trait Communicator: Send + Sync {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Replaces `data` on every rank by the element-wise sum over ranks (added in rank order).
    fn all_reduce_f32(&self, data: &mut [f32]) -> Result<(), CommError>;
    /// As [`Communicator::all_reduce_f32`] for bf16: the sum is accumulated in f32 in rank
    /// order and rounded once.
    fn all_reduce_bf16(&self, data: &mut [bf16]) -> Result<(), CommError>;
    /// Concatenates every rank's `local` in rank order into `out`; rank `r` contributes
    /// `counts[r]` values (`local.len() == counts[rank]`, `out.len() == sum(counts)`).
    fn all_gather_f32(
        &self,
        local: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError>;
    /// Copies `root`'s `data` to every rank.
    fn broadcast_f32(&self, data: &mut [f32], root: usize) -> Result<(), CommError>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), CommError>;
    /// Whether every peer is still alive and the communicator usable, without a collective
    /// (safe to call out of step with the other ranks, e.g. for health checks).
    fn check_peers(&self) -> Result<(), CommError>;
}

/// The communicator of a single shard: every collective is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalComm;

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_f32(&self, _: &mut [f32]) -> Result<(), CommError> {
        Ok(())
    }
    fn all_reduce_bf16(&self, _: &mut [bf16]) -> Result<(), CommError> {
        Ok(())
    }
    fn all_gather_f32(
        &self,
        local: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        check_gather(0, local, counts, out)?;
        out.copy_from_slice(local);
        Ok(())
    }
    fn broadcast_f32(&self, _: &mut [f32], root: usize) -> Result<(), CommError> {
        check_root(root, 1)
    }
    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }
    fn check_peers(&self) -> Result<(), CommError> {
        Ok(())
    }
}

pub(crate) fn check_gather(
    rank: usize,
    local: &[f32],
    counts: &[usize],
    out: &[f32],
) -> Result<(), CommError> {
    let total: usize = counts.iter().sum();
    if counts.get(rank) != Some(&local.len()) || out.len() != total {
        return Err(CommError::Invalid(format!(
            "all-gather: rank {rank} gives {} values, counts {counts:?}, output {}",
            local.len(),
            out.len()
        )));
    }
    Ok(())
}

pub(crate) fn check_root(root: usize, world_size: usize) -> Result<(), CommError> {
    if root >= world_size {
        return Err(CommError::Invalid(format!(
            "broadcast root {root} outside {world_size} ranks"
        )));
    }
    Ok(())
}
