//! NCCL collectives through cudarc (feature `cuda`): one communicator per shard process and
//! device. Rank 0 creates the NCCL unique id and hands it to the others through a file next
//! to the shard sockets (written to a temporary name, then renamed, with rank 0's pid so a
//! stale file from an earlier run is ignored).
//!
//! [`Communicator`] takes host buffers, so each collective copies its buffer to the device,
//! runs NCCL there and copies the result back; passing device buffers would save both
//! copies. NCCL's ring all-reduce reduces each chunk once and forwards the
//! result, so every rank receives bit-identical sums.
//!
//! libcuda and libnccl are loaded at run time: a build with `cuda` starts on machines
//! without them, and choosing NCCL there is a clear error instead of a panic.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{Comm, Id, ReduceOp};
use half::bf16;

use super::{CommError, Communicator, check_gather, check_root};

struct Inner {
    comm: Comm,
    stream: Arc<CudaStream>,
    poisoned: Option<String>,
}

/// A communicator over NCCL.
pub struct NcclComm {
    inner: Mutex<Inner>,
    rank: usize,
    world_size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; every use goes through the `inner` mutex.
#[allow(unsafe_code)]
unsafe impl Send for Inner {}

fn setup(message: impl Into<String>) -> CommError {
    CommError::Setup(message.into())
}

fn nccl_error(what: &str, e: impl std::fmt::Debug) -> CommError {
    CommError::Poisoned(format!("NCCL {what} failed: {e:?}"))
}

/// Checks that the CUDA driver and NCCL can be loaded, without touching them otherwise.
pub(crate) fn check_libraries() -> Result<(), CommError> {
    // SAFETY: these only try to dlopen the libraries by name.
    #[allow(unsafe_code)]
    let (driver, nccl) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nccl::sys::is_culib_present(),
        )
    };
    if !driver {
        return Err(setup(
            "--comm nccl needs an NVIDIA GPU, but the CUDA driver (libcuda.so) is not on this \
             machine; use --comm shm for CPU shards",
        ));
    }
    if !nccl {
        return Err(setup(
            "--comm nccl: libnccl.so was not found (cudarc loads `libnccl.so`; install NCCL or \
             symlink libnccl.so.2 to libnccl.so on the library path)",
        ));
    }
    Ok(())
}

impl NcclComm {
    /// Joins the NCCL group of `world_size` ranks on CUDA device `device`, exchanging the
    /// unique id through `id_path`; waits up to `timeout` for rank 0's id.
    pub fn join(
        id_path: &Path,
        rank: usize,
        world_size: usize,
        device: usize,
        timeout: Duration,
    ) -> Result<Self, CommError> {
        check_libraries()?;
        let count = CudaContext::device_count()
            .map_err(|e| setup(format!("counting CUDA devices: {e:?}")))?;
        if device >= count.max(0) as usize {
            return Err(setup(format!(
                "rank {rank} wants CUDA device {device}, but this machine has {count}"
            )));
        }
        let ctx = CudaContext::new(device)
            .map_err(|e| setup(format!("opening CUDA device {device}: {e:?}")))?;
        let stream = ctx.default_stream();
        let id = if rank == 0 {
            let id = Id::new().map_err(|e| setup(format!("ncclGetUniqueId: {e:?}")))?;
            let mut bytes: Vec<u8> = std::process::id().to_le_bytes().to_vec();
            bytes.extend(id.internal().iter().map(|&c| c as u8));
            let tmp = id_path.with_extension("tmp");
            std::fs::write(&tmp, &bytes)
                .and_then(|()| std::fs::rename(&tmp, id_path))
                .map_err(|e| setup(format!("writing {}: {e}", id_path.display())))?;
            id
        } else {
            read_id(id_path, timeout)?
        };
        let comm = Comm::from_rank(stream.clone(), rank, world_size, id).map_err(|e| {
            setup(format!(
                "ncclCommInitRank (rank {rank} of {world_size}): {e:?}"
            ))
        });
        if rank == 0 {
            // Every rank has read the id once the init above returned.
            let _ = std::fs::remove_file(id_path);
        }
        Ok(Self {
            inner: Mutex::new(Inner {
                comm: comm?,
                stream,
                poisoned: None,
            }),
            rank,
            world_size,
        })
    }

    /// Runs `f` on the communicator, poisoning it on error.
    fn with<T>(
        &self,
        f: impl FnOnce(&Comm, &Arc<CudaStream>) -> Result<T, CommError>,
    ) -> Result<T, CommError> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| CommError::Poisoned("a collective panicked".into()))?;
        if let Some(why) = &inner.poisoned {
            return Err(CommError::Poisoned(why.clone()));
        }
        let result = f(&inner.comm, &inner.stream);
        if let Err(e) = &result {
            inner.poisoned = Some(e.to_string());
        }
        result
    }
}

fn read_id(id_path: &Path, timeout: Duration) -> Result<Id, CommError> {
    let start = Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(id_path)
            && bytes.len() == 4 + 128
        {
            let pid = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            if Path::new(&format!("/proc/{pid}")).exists() {
                let mut internal = [0 as std::ffi::c_char; 128];
                for (d, s) in internal.iter_mut().zip(&bytes[4..]) {
                    *d = *s as std::ffi::c_char;
                }
                return Ok(Id::uninit(internal));
            }
        }
        if start.elapsed() > timeout {
            return Err(setup(format!(
                "rank 0's NCCL id did not appear at {} within {timeout:?}",
                id_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_f32(&self, data: &mut [f32]) -> Result<(), CommError> {
        if data.is_empty() {
            return Ok(());
        }
        self.with(|comm, stream| {
            let mut buf = stream.clone_htod(data).map_err(|e| nccl_error("copy", e))?;
            comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum)
                .map_err(|e| nccl_error("all-reduce", e))?;
            stream
                .memcpy_dtoh(&buf, data)
                .map_err(|e| nccl_error("copy", e))?;
            stream.synchronize().map_err(|e| nccl_error("sync", e))
        })
    }

    fn all_reduce_bf16(&self, data: &mut [bf16]) -> Result<(), CommError> {
        if data.is_empty() {
            return Ok(());
        }
        self.with(|comm, stream| {
            let mut buf = stream.clone_htod(data).map_err(|e| nccl_error("copy", e))?;
            comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum)
                .map_err(|e| nccl_error("all-reduce", e))?;
            stream
                .memcpy_dtoh(&buf, data)
                .map_err(|e| nccl_error("copy", e))?;
            stream.synchronize().map_err(|e| nccl_error("sync", e))
        })
    }

    fn all_gather_f32(
        &self,
        local: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        if counts.len() != self.world_size {
            return Err(CommError::Invalid(format!(
                "all-gather needs {} counts, got {counts:?}",
                self.world_size
            )));
        }
        check_gather(self.rank, local, counts, out)?;
        // NCCL gathers equal pieces: pad every rank's to the largest.
        let max = counts.iter().copied().max().unwrap_or(0);
        if max == 0 {
            return Ok(());
        }
        let mut padded = local.to_vec();
        padded.resize(max, 0.0);
        let gathered = self.with(|comm, stream| {
            let send = stream
                .clone_htod(&padded)
                .map_err(|e| nccl_error("copy", e))?;
            let mut recv = stream
                .alloc_zeros::<f32>(max * self.world_size)
                .map_err(|e| nccl_error("alloc", e))?;
            comm.all_gather(&send, &mut recv)
                .map_err(|e| nccl_error("all-gather", e))?;
            let host = stream
                .clone_dtoh(&recv)
                .map_err(|e| nccl_error("copy", e))?;
            stream.synchronize().map_err(|e| nccl_error("sync", e))?;
            Ok(host)
        })?;
        let mut at = 0;
        for (r, &c) in counts.iter().enumerate() {
            out[at..at + c].copy_from_slice(&gathered[r * max..r * max + c]);
            at += c;
        }
        Ok(())
    }

    fn broadcast_f32(&self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        check_root(root, self.world_size)?;
        if data.is_empty() {
            return Ok(());
        }
        self.with(|comm, stream| {
            let mut buf = stream.clone_htod(data).map_err(|e| nccl_error("copy", e))?;
            comm.broadcast_in_place(&mut buf, root as i32)
                .map_err(|e| nccl_error("broadcast", e))?;
            stream
                .memcpy_dtoh(&buf, data)
                .map_err(|e| nccl_error("copy", e))?;
            stream.synchronize().map_err(|e| nccl_error("sync", e))
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.all_reduce_f32(&mut [0.0])
    }

    fn check_peers(&self) -> Result<(), CommError> {
        match self.inner.try_lock() {
            Ok(inner) => match &inner.poisoned {
                Some(why) => Err(CommError::Poisoned(why.clone())),
                None => Ok(()),
            },
            // A collective is running: the group is in use.
            Err(_) => Ok(()),
        }
    }
}
