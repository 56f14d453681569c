//! One step of a collective: publish this rank's descriptor and arrival, wait for every
//! peer's, check that they called the same collective.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::ShmComm;
use super::segment::{C_ARRIVE, C_DESC, C_SLEEPERS, H_ABORT, LINE};
use super::wait::{LIVENESS_EVERY, SLEEP_SLICE, futex_wait, futex_wake, process_alive, reached};
use crate::comm::CommError;

/// Collective kinds, as written in descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
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

impl ShmComm {
    /// Publishes this rank's descriptor and arrival for `epoch` (its buffer is written).
    pub(super) fn arrive(&self, epoch: u32, op: Op, values: u64) {
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
    pub(super) fn wait_all(&self, epoch: u32, op: Op, values: u64) -> Result<(), CommError> {
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
    pub(super) fn run(
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
}
