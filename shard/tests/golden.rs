//! The engine computes what Hugging Face transformers computes, on every fixture family,
//! and a sequence's result does not depend on batching or chunking.

mod common;

use common::{Schedule, load_fixture, max_abs_diff, run};

const FIXTURES: [&str; 3] = ["tiny-llama", "tiny-qwen2", "tiny-mistral"];

#[test]
fn logits_and_greedy_tokens_match_transformers() {
    for name in FIXTURES {
        let (model, golden) = load_fixture(name);
        let prompts = golden.prompt_ids();
        let outcomes = run(&model, &prompts, 20, usize::MAX, Schedule::OneAtATime);
        for (p, o) in golden.prompts.iter().zip(&outcomes) {
            let diff = max_abs_diff(&o.prompt_logits, &p.last_logits);
            assert!(
                diff <= 1e-4,
                "{name} {:?}: max |logit - golden| = {diff}",
                p.text
            );
            assert_eq!(
                o.tokens, p.greedy_ids,
                "{name} {:?}: greedy tokens differ",
                p.text
            );
        }
    }
}

#[test]
fn results_do_not_depend_on_batching_or_chunking() {
    for name in FIXTURES {
        let (model, golden) = load_fixture(name);
        let prompts = golden.prompt_ids();
        let alone = run(&model, &prompts, 20, usize::MAX, Schedule::OneAtATime);
        for (schedule, chunk) in [
            (Schedule::Together, usize::MAX),
            (Schedule::Together, 1),
            (Schedule::Together, 7),
            (Schedule::Together, 64),
            (Schedule::Staggered, 7),
            (Schedule::OneAtATime, 7),
        ] {
            let other = run(&model, &prompts, 20, chunk, schedule);
            for (i, (a, b)) in alone.iter().zip(&other).enumerate() {
                let diff = max_abs_diff(&a.prompt_logits, &b.prompt_logits);
                assert!(
                    diff <= 1e-5,
                    "{name} prompt {i} {schedule:?} chunk {chunk}: logits differ by {diff}"
                );
                assert_eq!(
                    a.tokens, b.tokens,
                    "{name} prompt {i} {schedule:?} chunk {chunk}"
                );
            }
        }
    }
}
