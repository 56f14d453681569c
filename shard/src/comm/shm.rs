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

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use half::bf16;
use memmap2::{MmapMut, MmapOptions};
use rayon::prelude::*;

use super::{CommError, Communicator, check_gather, check_root};

const MAGIC: u64 = u64::from_le_bytes(*b"TESSHM01");
const LINE: usize = 128;
/// How often a waiter re-checks that its peer is alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);
/// Longest single futex sleep.
const SLEEP_SLICE: Duration = Duration::from_millis(5);
/// Sums of more values than this are split over the thread pool.
const PARALLEL_VALUES: usize = 1 << 16;

// Header fields (byte offsets from the segment start).
const H_MAGIC: usize = 0;
const H_WORLD: usize = 8;
const H_SLOT: usize = 16;
const H_CREATOR: usize = 24;
const H_GO: usize = 28;
const H_ABORT: usize = 32;

// Per-rank control fields (byte offsets from the rank's control line).
const C_PID: usize = 0;
const C_ARRIVE: usize = 4;
const C_SLEEPERS: usize = 8;
/// Two descriptors (op, values) of 16 bytes, for even and odd epochs.
const C_DESC: usize = 16;

/// Collective kinds, as written in descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduceF32,
    AllReduceBf16,
    AllGather,
    Broadcast(usize),
    Barrier,
}

impl Op {
    fn code(self) -> u32 {
        match self {
            Op::AllReduceF32 => 1,
            Op::AllReduceBf16 => 2,
            Op::AllGather => 3,
            Op::Broadcast(root) => 4 | ((root as u32) << 8),
            Op::Barrier => 5,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::AllReduceF32 => "all-reduce f32",
            Op::AllReduceBf16 => "all-reduce bf16",
            Op::AllGather => "all-gather",
            Op::Broadcast(_) => "broadcast",
            Op::Barrier => "barrier",
        }
    }

    fn describe_code(code: u32, values: u64) -> String {
        let name = match code & 0xff {
            1 => "all-reduce f32".to_string(),
            2 => "all-reduce bf16".to_string(),
            3 => "all-gather".to_string(),
            4 => format!("broadcast from {}", code >> 8),
            5 => "barrier".to_string(),
            other => format!("unknown collective {other}"),
        };
        format!("{name} of {values} values")
    }
}

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

fn layout(world_size: usize, slot_bytes: usize) -> (usize, usize) {
    let control_end = LINE + world_size * LINE;
    let data_offset = control_end.div_ceil(4096) * 4096;
    (data_offset, data_offset + world_size * 2 * slot_bytes)
}

fn setup(message: impl Into<String>) -> CommError {
    CommError::Setup(message.into())
}

/// Whether process `pid` exists and is not a zombie.
fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X') | None
        ),
        Err(_) => false,
    }
}

/// Sleeps until `word` may differ from `expected` (or `timeout` passes, or a spurious wake).
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word` (valid for the call) and sleeps
    // while it equals `expected`; `ts` outlives the call. The futex is not private because
    // the word lives in a mapping shared between processes. Errors (EAGAIN, ETIMEDOUT,
    // EINTR) all mean "look again", which the caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of the aligned word as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Whether arrival `seen` has reached epoch `target` (wrapping).
fn reached(seen: u32, target: u32) -> bool {
    seen.wrapping_sub(target) as i32 >= 0
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
            Self::create(path, world_size, config.slot_bytes, total)?
        } else {
            Self::open(path, rank, world_size, config.slot_bytes, total, &config)?
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

    fn create(
        path: &Path,
        world_size: usize,
        slot_bytes: usize,
        total: usize,
    ) -> Result<MmapMut, CommError> {
        let tmp = PathBuf::from(format!("{}.{}.tmp", path.display(), std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| setup(format!("creating {}: {e}", tmp.display())))?;
        file.set_len(total as u64)
            .map_err(|e| setup(format!("sizing {} to {total} bytes: {e}", tmp.display())))?;
        // SAFETY: a fresh file of `total` bytes that only Tessera ranks map; its size never
        // changes after this point, so no access can fault.
        let mut map = unsafe { MmapOptions::new().len(total).map_mut(&file) }
            .map_err(|e| setup(format!("mapping {}: {e}", tmp.display())))?;
        map[H_MAGIC..H_MAGIC + 8].copy_from_slice(&MAGIC.to_le_bytes());
        map[H_WORLD..H_WORLD + 8].copy_from_slice(&(world_size as u64).to_le_bytes());
        map[H_SLOT..H_SLOT + 8].copy_from_slice(&(slot_bytes as u64).to_le_bytes());
        map[H_CREATOR..H_CREATOR + 4].copy_from_slice(&std::process::id().to_le_bytes());
        map[LINE + C_PID..LINE + C_PID + 4].copy_from_slice(&std::process::id().to_le_bytes());
        // The rename publishes a fully initialised segment (and replaces a stale one).
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            setup(format!("publishing {}: {e}", path.display()))
        })?;
        Ok(map)
    }

    fn open(
        path: &Path,
        rank: usize,
        world_size: usize,
        slot_bytes: usize,
        total: usize,
        config: &ShmConfig,
    ) -> Result<MmapMut, CommError> {
        let start = Instant::now();
        let pid = std::process::id();
        loop {
            if start.elapsed() > config.join_timeout {
                return Err(setup(format!(
                    "{} did not appear (or was stale) within {:?}; is rank 0 running with the \
                     same rendezvous?",
                    path.display(),
                    config.join_timeout
                )));
            }
            let Ok(file) = OpenOptions::new().read(true).write(true).open(path) else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            match file.metadata() {
                Ok(m) if m.len() == total as u64 => {}
                Ok(m) if m.len() >= LINE as u64 => {
                    // Possibly another group's (or a stale) segment: look at its header.
                }
                _ => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            }
            // SAFETY: as in `create`: the segment keeps its size (rank 0 sized it before the
            // rename made it visible, and a stale file is never resized).
            let mut map = unsafe { MmapOptions::new().map_mut(&file) }
                .map_err(|e| setup(format!("mapping {}: {e}", path.display())))?;
            let word = |at: usize| u64::from_le_bytes(map[at..at + 8].try_into().unwrap_or([0; 8]));
            let creator =
                u32::from_le_bytes(map[H_CREATOR..H_CREATOR + 4].try_into().unwrap_or([0; 4]));
            if word(H_MAGIC) != MAGIC || !process_alive(creator) {
                // Stale: rank 0 will replace it.
                drop(map);
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            if word(H_WORLD) != world_size as u64
                || word(H_SLOT) != slot_bytes as u64
                || map.len() != total
            {
                return Err(setup(format!(
                    "{} was made for {} ranks of {} bytes, this rank expects {world_size} of {slot_bytes}",
                    path.display(),
                    word(H_WORLD),
                    word(H_SLOT)
                )));
            }
            let line = LINE + rank * LINE;
            let claim = map[line + C_PID..line + C_PID + 4].as_mut_ptr();
            // SAFETY: the pointer is 4-byte aligned (the map is page-aligned, the offset a
            // multiple of 4) and within the map, which outlives this reference.
            let claim = unsafe { AtomicU32::from_ptr(claim.cast::<u32>()) };
            if let Err(other) = claim.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)
            {
                return Err(setup(format!(
                    "rank {rank} of {} is already taken by pid {other}: two shards share a rank",
                    path.display()
                )));
            }
            return Ok(map);
        }
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

    /// Publishes this rank's descriptor and arrival for `epoch` (its buffer is written).
    fn arrive(&self, epoch: u32, op: Op, values: u64) {
        let desc = LINE + self.rank * LINE + C_DESC + (epoch % 2) as usize * 16;
        self.atomic_u32(desc).store(op.code(), Ordering::Relaxed);
        self.atomic_u64(desc + 8).store(values, Ordering::Relaxed);
        let arrive = self.control(self.rank, C_ARRIVE);
        arrive.store(epoch, Ordering::SeqCst);
        if self.control(self.rank, C_SLEEPERS).load(Ordering::SeqCst) > 0 {
            futex_wake(arrive);
        }
    }

    /// Waits until every peer has arrived at `epoch`, and checks their descriptors.
    fn wait_all(&self, epoch: u32, op: Op, values: u64) -> Result<(), CommError> {
        let start = Instant::now();
        for peer in (0..self.world_size).filter(|&p| p != self.rank) {
            let arrive = self.control(peer, C_ARRIVE);
            let mut last_check = start;
            loop {
                let seen = arrive.load(Ordering::Acquire);
                if reached(seen, epoch) {
                    break;
                }
                if self.header(H_ABORT).load(Ordering::Relaxed) != 0 {
                    return Err(CommError::Poisoned(format!(
                        "rank {} aborted the group",
                        self.header(H_ABORT).load(Ordering::Relaxed) - 1
                    )));
                }
                let now = Instant::now();
                let waited = now - start;
                if waited < self.config.spin {
                    std::hint::spin_loop();
                    continue;
                }
                if waited > self.config.timeout {
                    return Err(CommError::Timeout {
                        rank: peer,
                        op: op.name(),
                        seconds: waited.as_secs_f64(),
                    });
                }
                if now - last_check > LIVENESS_EVERY {
                    last_check = now;
                    if !process_alive(self.pids[peer]) {
                        return Err(CommError::PeerDied {
                            rank: peer,
                            pid: self.pids[peer],
                        });
                    }
                }
                let sleepers = self.control(peer, C_SLEEPERS);
                sleepers.fetch_add(1, Ordering::SeqCst);
                if arrive.load(Ordering::SeqCst) == seen {
                    futex_wait(arrive, seen, SLEEP_SLICE);
                }
                sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            let desc = LINE + peer * LINE + C_DESC + (epoch % 2) as usize * 16;
            let (code, theirs) = (
                self.atomic_u32(desc).load(Ordering::Relaxed),
                self.atomic_u64(desc + 8).load(Ordering::Relaxed),
            );
            if code != op.code() || theirs != values {
                return Err(CommError::Mismatch {
                    rank: peer,
                    ours: Op::describe_code(op.code(), values),
                    theirs: Op::describe_code(code, theirs),
                });
            }
        }
        Ok(())
    }

    /// Runs a collective of `steps` steps: `write(step, own buffer)` fills this rank's buffer,
    /// `read(step, buffer of rank)` consumes everyone's once all have arrived. Poisons the
    /// communicator on error.
    fn run(
        &self,
        op: Op,
        values: u64,
        steps: usize,
        mut write: impl FnMut(usize, *mut u8),
        mut read: impl FnMut(usize, &dyn Fn(usize) -> *const u8),
    ) -> Result<(), CommError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| CommError::Poisoned("a collective panicked".into()))?;
        if let Some(why) = &state.poisoned {
            return Err(CommError::Poisoned(why.clone()));
        }
        let abort = self.header(H_ABORT).load(Ordering::Acquire);
        if abort != 0 {
            let why = format!("rank {} aborted the group", abort - 1);
            state.poisoned = Some(why.clone());
            return Err(CommError::Poisoned(why));
        }
        for step in 0..steps.max(1) {
            let epoch = state.epoch.wrapping_add(1);
            state.epoch = epoch;
            write(step, self.slot(self.rank, epoch));
            self.arrive(epoch, op, values);
            if let Err(e) = self.wait_all(epoch, op, values) {
                state.poisoned = Some(e.to_string());
                let _ = self.header(H_ABORT).compare_exchange(
                    0,
                    self.rank as u32 + 1,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                return Err(e);
            }
            read(step, &|rank| self.slot(rank, epoch).cast_const());
        }
        Ok(())
    }

    fn values_per_step<T>(&self) -> usize {
        self.slot_bytes / std::mem::size_of::<T>()
    }
}

/// Copies `src` into the raw buffer `dst`.
fn put<T: Copy>(dst: *mut u8, src: &[T]) {
    // SAFETY: callers pass their own step buffer, which holds `slot_bytes >= size_of_val(src)`
    // bytes, is suitably aligned (page-aligned base, slot sizes multiple of 64) and is not
    // read by any peer until this rank's next arrival.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.cast::<T>(), src.len()) }
}

/// Views `len` values of a peer's published buffer.
fn view<'a, T>(src: *const u8, len: usize) -> &'a [T] {
    // SAFETY: callers pass a buffer whose owner has published at least `len` values for the
    // current step (checked through the descriptor) and will not write it again before this
    // rank's next arrival; the slice is dropped before that.
    unsafe { std::slice::from_raw_parts(src.cast::<T>(), len) }
}

fn add_into(out: &mut [f32], src: &[f32]) {
    if out.len() >= PARALLEL_VALUES {
        out.par_chunks_mut(PARALLEL_VALUES / 4)
            .zip(src.par_chunks(PARALLEL_VALUES / 4))
            .for_each(|(o, s)| o.iter_mut().zip(s).for_each(|(o, s)| *o += *s));
    } else {
        out.iter_mut().zip(src).for_each(|(o, s)| *o += *s);
    }
}

impl Communicator for ShmComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_f32(&self, data: &mut [f32]) -> Result<(), CommError> {
        let per = self.values_per_step::<f32>();
        let steps = data.len().div_ceil(per);
        let (rank, world) = (self.rank, self.world_size);
        let data_ptr = data.as_mut_ptr();
        let len = data.len();
        self.run(
            Op::AllReduceF32,
            len as u64,
            steps,
            |step, dst| {
                let r = step * per..((step + 1) * per).min(len);
                // SAFETY: `r` lies within `data`, exclusively borrowed by this call.
                put(dst, unsafe {
                    std::slice::from_raw_parts(data_ptr.add(r.start), r.len())
                });
            },
            |step, slot| {
                let r = step * per..((step + 1) * per).min(len);
                // SAFETY: as above; no other reference to `data` is live during `read`.
                let out = unsafe { std::slice::from_raw_parts_mut(data_ptr.add(r.start), r.len()) };
                if rank != 0 {
                    out.copy_from_slice(view::<f32>(slot(0), r.len()));
                }
                for p in 1..world {
                    add_into(out, view::<f32>(slot(p), r.len()));
                }
            },
        )
    }

    fn all_reduce_bf16(&self, data: &mut [bf16]) -> Result<(), CommError> {
        let per = self.values_per_step::<bf16>();
        let steps = data.len().div_ceil(per);
        let world = self.world_size;
        let len = data.len();
        let data_ptr = data.as_mut_ptr();
        let mut acc = vec![0f32; per.min(len)];
        self.run(
            Op::AllReduceBf16,
            len as u64,
            steps,
            |step, dst| {
                let r = step * per..((step + 1) * per).min(len);
                // SAFETY: `r` lies within `data`, exclusively borrowed by this call.
                put(dst, unsafe {
                    std::slice::from_raw_parts(data_ptr.add(r.start), r.len())
                });
            },
            |step, slot| {
                let r = step * per..((step + 1) * per).min(len);
                let acc = &mut acc[..r.len()];
                for (a, v) in acc.iter_mut().zip(view::<bf16>(slot(0), r.len())) {
                    *a = v.to_f32();
                }
                for p in 1..world {
                    for (a, v) in acc.iter_mut().zip(view::<bf16>(slot(p), r.len())) {
                        *a += v.to_f32();
                    }
                }
                // SAFETY: as above; no other reference to `data` is live during `read`.
                let out = unsafe { std::slice::from_raw_parts_mut(data_ptr.add(r.start), r.len()) };
                for (o, a) in out.iter_mut().zip(acc.iter()) {
                    *o = bf16::from_f32(*a);
                }
            },
        )
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
        let per = self.values_per_step::<f32>();
        let steps = counts.iter().max().copied().unwrap_or(0).div_ceil(per);
        let offsets: Vec<usize> = counts
            .iter()
            .scan(0, |acc, &c| {
                let o = *acc;
                *acc += c;
                Some(o)
            })
            .collect();
        let piece =
            |count: usize, step: usize| (step * per).min(count)..((step + 1) * per).min(count);
        let total = out.len() as u64;
        self.run(
            Op::AllGather,
            total,
            steps,
            |step, dst| put(dst, &local[piece(local.len(), step)]),
            |step, slot| {
                for (p, (&count, &offset)) in counts.iter().zip(&offsets).enumerate() {
                    let r = piece(count, step);
                    out[offset + r.start..offset + r.end].copy_from_slice(view(slot(p), r.len()));
                }
            },
        )
    }

    fn broadcast_f32(&self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        check_root(root, self.world_size)?;
        let per = self.values_per_step::<f32>();
        let len = data.len();
        let steps = len.div_ceil(per);
        let is_root = root == self.rank;
        let data_ptr = data.as_mut_ptr();
        self.run(
            Op::Broadcast(root),
            len as u64,
            steps,
            |step, dst| {
                if is_root {
                    let r = step * per..((step + 1) * per).min(len);
                    // SAFETY: `r` lies within `data`, exclusively borrowed by this call.
                    put(dst, unsafe {
                        std::slice::from_raw_parts(data_ptr.add(r.start), r.len())
                    });
                }
            },
            |step, slot| {
                if !is_root {
                    let r = step * per..((step + 1) * per).min(len);
                    // SAFETY: as above.
                    let out =
                        unsafe { std::slice::from_raw_parts_mut(data_ptr.add(r.start), r.len()) };
                    out.copy_from_slice(view(slot(root), r.len()));
                }
            },
        )
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.run(Op::Barrier, 0, 1, |_, _| {}, |_, _| {})
    }

    fn check_peers(&self) -> Result<(), CommError> {
        if let Ok(state) = self.state.try_lock()
            && let Some(why) = &state.poisoned
        {
            return Err(CommError::Poisoned(why.clone()));
        }
        let abort = self.header(H_ABORT).load(Ordering::Relaxed);
        if abort != 0 {
            return Err(CommError::Poisoned(format!(
                "rank {} aborted the group",
                abort - 1
            )));
        }
        for (rank, &pid) in self.pids.iter().enumerate() {
            if !process_alive(pid) {
                return Err(CommError::PeerDied { rank, pid });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn group(world: usize, slot_bytes: usize) -> Vec<ShmComm> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let config = ShmConfig {
            slot_bytes,
            timeout: Duration::from_secs(5),
            join_timeout: Duration::from_secs(10),
            ..ShmConfig::default()
        };
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (path, config) = (path.clone(), config.clone());
                std::thread::spawn(move || ShmComm::join(&path, r, world, config).unwrap())
            })
            .collect();
        let comms = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(
            !path.exists(),
            "rank 0 removes the name once everyone joined"
        );
        comms
    }

    fn on_all<T: Send + 'static>(
        comms: Vec<ShmComm>,
        f: impl Fn(&ShmComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = f.clone();
                std::thread::spawn(move || f(&c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn collectives_agree_bitwise_across_steps() {
        for world in [2, 3] {
            // 256-byte slots: 64 f32 per step, so 1000 values take 16 steps.
            let results = on_all(group(world, 256), move |c| {
                let r = c.rank();
                let mut sums = Vec::new();
                for n in [0usize, 1, 63, 64, 65, 1000] {
                    let mut x: Vec<f32> = (0..n)
                        .map(|i| (i as f32 + 0.1) * (r as f32 + 1.3))
                        .collect();
                    c.all_reduce_f32(&mut x).unwrap();
                    let expected: Vec<f32> = (0..n)
                        .map(|i| {
                            (0..world).fold(0.0f32, |acc, q| {
                                let v = (i as f32 + 0.1) * (q as f32 + 1.3);
                                if q == 0 { v } else { acc + v }
                            })
                        })
                        .collect();
                    assert_eq!(x, expected);
                    sums.push(x);
                    let mut h: Vec<bf16> = (0..n)
                        .map(|i| bf16::from_f32(i as f32 * 0.5 + r as f32))
                        .collect();
                    c.all_reduce_bf16(&mut h).unwrap();
                    for (i, v) in h.iter().enumerate() {
                        let e: f32 = (0..world)
                            .map(|q| bf16::from_f32(i as f32 * 0.5 + q as f32).to_f32())
                            .sum();
                        assert_eq!(*v, bf16::from_f32(e));
                    }
                }
                // Uneven all-gather: rank q gives 70 + 30 q values equal to q.
                let counts: Vec<usize> = (0..world).map(|q| 70 + 30 * q).collect();
                let local = vec![r as f32; counts[r]];
                let mut out = vec![-1.0; counts.iter().sum()];
                c.all_gather_f32(&local, &counts, &mut out).unwrap();
                let expected: Vec<f32> = counts
                    .iter()
                    .enumerate()
                    .flat_map(|(q, &n)| vec![q as f32; n])
                    .collect();
                assert_eq!(out, expected);
                let mut b: Vec<f32> = (0..150).map(|i| (i * (r + 1)) as f32).collect();
                c.broadcast_f32(&mut b, world - 1).unwrap();
                assert_eq!(b, (0..150).map(|i| (i * world) as f32).collect::<Vec<_>>());
                c.barrier().unwrap();
                c.check_peers().unwrap();
                sums
            });
            assert!(results.windows(2).all(|w| w[0] == w[1]));
        }
    }

    #[test]
    fn mismatched_collectives_are_errors_and_poison_the_group() {
        let results = on_all(group(2, 256), |c| {
            let first = if c.rank() == 0 {
                c.all_reduce_f32(&mut [1.0; 10])
            } else {
                c.all_reduce_f32(&mut [1.0; 11])
            };
            (
                first.map_err(|e| e.to_string()),
                c.barrier().is_err(),
                c.check_peers().is_err(),
            )
        });
        for (first, later, health) in results {
            let err = first.unwrap_err();
            assert!(err.contains("diverged") || err.contains("aborted"), "{err}");
            assert!(later && health);
        }
    }

    #[test]
    fn a_missing_peer_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let config = ShmConfig {
            join_timeout: Duration::from_millis(200),
            ..ShmConfig::default()
        };
        let err = ShmComm::join(&path, 0, 2, config.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains("did not join"), "{err}");
        let err = ShmComm::join(&path, 1, 2, config).unwrap_err().to_string();
        assert!(err.contains("did not appear"), "{err}");

        let mut comms = group(2, 256);
        comms[0].config.timeout = Duration::from_millis(300);
        let start = Instant::now();
        let err = comms[0].barrier().unwrap_err();
        assert!(matches!(err, CommError::Timeout { rank: 1, .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(3));
        // The peer sees the abort instead of waiting out its own timeout.
        let err = comms[1].barrier().unwrap_err();
        assert!(matches!(err, CommError::Poisoned(_)), "{err}");
    }
}
