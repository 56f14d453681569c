//! The engine computes what Hugging Face transformers computes, on every fixture family,
//! and a sequence's result does not depend on batching or chunking.

mod common;

use std::sync::Arc;

use common::{Schedule, assert_close_under_schedules, assert_goldens, load_fixture};
use tessera_shard::{Op, OpTimes};

const FIXTURES: [&str; 3] = ["tiny-llama", "tiny-qwen2", "tiny-mistral"];

#[test]
fn logits_and_greedy_tokens_match_transformers() {
    for name in FIXTURES {
        let (model, golden) = load_fixture(name);
        assert_goldens(name, &model, &golden, 1e-4);
    }
}

#[test]
fn results_do_not_depend_on_batching_or_chunking() {
    for name in FIXTURES {
        let (model, golden) = load_fixture(name);
        assert_close_under_schedules(
            name,
            &model,
            &golden.prompt_ids(),
            &[
                (Schedule::Together, usize::MAX),
                (Schedule::Together, 1),
                (Schedule::Together, 7),
                (Schedule::Together, 64),
                (Schedule::Staggered, 7),
                (Schedule::OneAtATime, 7),
            ],
            1e-5,
        );
    }
}

#[test]
fn counting_operation_times_counts_every_pass_and_changes_no_result() {
    let name = FIXTURES[0];
    let (mut model, golden) = load_fixture(name);
    let times = Arc::new(OpTimes::new());
    model.set_op_times(Some(times.clone()));
    assert_goldens(name, &model, &golden, 1e-4);
    let s = times.snapshot();
    assert!(s.passes > 0, "no pass counted");
    for (op, d) in &s.ops {
        // One process, one rank: nothing to all-reduce.
        assert_eq!(d.is_zero(), *op == Op::AllReduce, "{op:?}: {d:?}");
    }
    let ops: std::time::Duration = s.ops.iter().map(|(_, d)| *d).sum();
    assert!(
        ops <= s.total,
        "operations {ops:?} outlast their passes {:?}",
        s.total
    );
    model.set_op_times(None);
    times.reset();
    assert_goldens(name, &model, &golden, 1e-4);
    assert_eq!(times.snapshot().passes, 0, "counted after being detached");
}
