//! The shared segment: its layout, and how rank 0 creates it and the other ranks open it.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapMut, MmapOptions};

use super::wait::process_alive;
use super::{ShmConfig, setup};
use crate::comm::CommError;

pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"TESSHM01");
pub(super) const LINE: usize = 128;

// Header fields (byte offsets from the segment start).
pub(super) const H_MAGIC: usize = 0;
pub(super) const H_WORLD: usize = 8;
pub(super) const H_SLOT: usize = 16;
pub(super) const H_CREATOR: usize = 24;
pub(super) const H_GO: usize = 28;
pub(super) const H_ABORT: usize = 32;

// Per-rank control fields (byte offsets from the rank's control line).
pub(super) const C_PID: usize = 0;
pub(super) const C_ARRIVE: usize = 4;
pub(super) const C_SLEEPERS: usize = 8;
/// Two descriptors (op, values) of 16 bytes, for even and odd epochs.
pub(super) const C_DESC: usize = 16;

/// The data region's offset and the segment's total size.
pub(super) fn layout(world_size: usize, slot_bytes: usize) -> (usize, usize) {
    let control_end = LINE + world_size * LINE;
    let data_offset = control_end.div_ceil(4096) * 4096;
    (data_offset, data_offset + world_size * 2 * slot_bytes)
}

/// Rank 0's side: a fresh, initialised segment of `total` bytes, published at `path` by a
/// rename (which replaces a stale one).
pub(super) fn create(
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

/// Another rank's side: waits for rank 0's segment at `path`, checks that it was made for this
/// group, and claims `rank`'s control line.
pub(super) fn open(
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
        if let Err(other) = claim.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire) {
            return Err(setup(format!(
                "rank {rank} of {} is already taken by pid {other}: two shards share a rank",
                path.display()
            )));
        }
        return Ok(map);
    }
}
