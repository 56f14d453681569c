//! The collectives over the segment: each is a run of steps that copy into this rank's
//! buffer and read every rank's.

use std::sync::atomic::Ordering;

use half::bf16;
use rayon::prelude::*;

use super::ShmComm;
use super::segment::H_ABORT;
use super::step::Op;
use super::wait::process_alive;
use crate::comm::{CommError, Communicator, check_gather, check_root};

/// Sums of more values than this are split over the thread pool.
const PARALLEL_VALUES: usize = 1 << 16;

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
