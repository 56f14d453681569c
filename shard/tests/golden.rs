//! The engine computes what Hugging Face transformers computes, on every fixture family,
//! and a sequence's result does not depend on batching or chunking.

mod common;

use common::{Schedule, assert_close_under_schedules, assert_goldens, load_fixture};

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
