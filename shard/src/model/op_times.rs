//! Where the CPU forward passes spend their time, operation by operation: what tells a slow
//! step's products from its attention, and both from the glue between them.
//!
//! Off unless a caller attaches an [`OpTimes`] ([`super::Model::set_op_times`]); then each
//! operation of a pass reads the clock twice (tens of nanoseconds, a few microseconds per
//! SmolLM2 pass).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One operation of a CPU forward pass (all layers' calls of it together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Embedding lookup and the rotary tables of the pass's positions.
    Embed,
    /// RMSNorms, with the residual adds fused into them.
    Norm,
    /// The fused q/k/v projection.
    Qkv,
    /// RoPE on the queries, the keys and values written into the cache, and attention.
    Attention,
    /// `o_proj`.
    O,
    /// The fused gate/up projection.
    GateUp,
    /// SiLU(gate) · up.
    SiluMul,
    /// `down_proj`.
    Down,
    /// All-reduces (tensor parallelism).
    AllReduce,
    /// The final norm and the LM head, for the rows that want logits.
    Logits,
}

impl Op {
    /// Every operation, in the order of a pass.
    pub const ALL: [Op; 10] = [
        Op::Embed,
        Op::Norm,
        Op::Qkv,
        Op::Attention,
        Op::O,
        Op::GateUp,
        Op::SiluMul,
        Op::Down,
        Op::AllReduce,
        Op::Logits,
    ];

    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Embed => "embed",
            Op::Norm => "norm",
            Op::Qkv => "qkv",
            Op::Attention => "attention",
            Op::O => "o",
            Op::GateUp => "gate_up",
            Op::SiluMul => "silu_mul",
            Op::Down => "down",
            Op::AllReduce => "all_reduce",
            Op::Logits => "logits",
        }
    }
}

/// Time spent per [`Op`] and in whole passes, summed over the passes since the last
/// [`OpTimes::reset`]. Shared between threads; every figure is wall-clock time of the thread
/// that ran the pass.
#[derive(Debug, Default)]
pub struct OpTimes {
    nanos: [AtomicU64; Op::ALL.len()],
    pass_nanos: AtomicU64,
    passes: AtomicU64,
}

/// A reading of [`OpTimes`].
#[derive(Debug, Clone, PartialEq)]
pub struct OpTimesSnapshot {
    /// Passes counted.
    pub passes: u64,
    /// Time of whole passes.
    pub total: Duration,
    /// Time per operation, in [`Op::ALL`]'s order.
    pub ops: Vec<(Op, Duration)>,
}

impl OpTimesSnapshot {
    /// Pass time outside every [`Op`]: allocating and zeroing activations, the pass's setup.
    pub fn other(&self) -> Duration {
        let ops: Duration = self.ops.iter().map(|(_, d)| *d).sum();
        self.total.saturating_sub(ops)
    }
}

impl OpTimes {
    /// Zero counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f`, counting its time against `op`.
    pub(crate) fn time<R>(&self, op: Op, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.nanos[op as usize].fetch_add(nanos(start), Ordering::Relaxed);
        r
    }

    /// Counts one whole pass that began at `start`.
    pub(crate) fn pass(&self, start: Instant) {
        self.pass_nanos.fetch_add(nanos(start), Ordering::Relaxed);
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    /// The sums so far.
    pub fn snapshot(&self) -> OpTimesSnapshot {
        let load = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        OpTimesSnapshot {
            passes: self.passes.load(Ordering::Relaxed),
            total: load(&self.pass_nanos),
            ops: Op::ALL
                .iter()
                .map(|&op| (op, load(&self.nanos[op as usize])))
                .collect(),
        }
    }

    /// Zeroes every sum.
    pub fn reset(&self) {
        for a in self.nanos.iter().chain([&self.pass_nanos, &self.passes]) {
            a.store(0, Ordering::Relaxed);
        }
    }
}

fn nanos(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_per_op_and_leaves_the_rest_as_other() {
        let times = OpTimes::new();
        let start = Instant::now();
        let x = times.time(Op::Qkv, || {
            std::thread::sleep(Duration::from_millis(2));
            7
        });
        assert_eq!(x, 7);
        std::thread::sleep(Duration::from_millis(2));
        times.pass(start);
        let s = times.snapshot();
        assert_eq!(s.passes, 1);
        let qkv = s.ops.iter().find(|(op, _)| *op == Op::Qkv).map(|p| p.1);
        assert!(qkv.is_some_and(|d| d >= Duration::from_millis(2)));
        assert!(
            s.ops
                .iter()
                .filter(|(op, _)| *op != Op::Qkv)
                .all(|(_, d)| d.is_zero())
        );
        assert!(s.other() >= Duration::from_millis(2));
        times.reset();
        assert_eq!(times.snapshot().passes, 0);
        assert!(times.snapshot().total.is_zero());
    }
}
