//! The engine computes what Hugging Face transformers computes, on every fixture family,
//! and a sequence's result does not depend on batching or chunking, bit for bit.

use crate::common;

use std::sync::Arc;

use common::{
    FIXTURES, Schedule, assert_close_under_schedules, assert_goldens, golden, load_fixture,
    repo_root,
};
use tessera_model_files::ModelFiles;
use tessera_shard::{Model, Op, OpTimes, WeightLayout};

/// GGUF files of the fixtures, written as llama.cpp writes each family (and, for Mixtral, as
/// it wrote MoE files before it stacked experts; for Qwen3 also split into parts), checked
/// against the same goldens.
const GGUF_FILES: [&str; 15] = [
    "tiny-qwen3/model.gguf",
    "tiny-gemma2/model.gguf",
    "tiny-gemma3/model.gguf",
    "tiny-phi3/model.gguf",
    "tiny-llama-yarn/model.gguf",
    "tiny-qwen3-moe/model.gguf",
    "tiny-mixtral/model.gguf",
    "tiny-mixtral/model-per-expert.gguf",
    "tiny-qwen2-moe/model.gguf",
    "tiny-gemma3-vision/model.gguf",
    "tiny-mistral3/model.gguf",
    "tiny-smollm3/model.gguf",
    "tiny-qwen3/split/model-00001-of-00004.gguf",
    "tiny-gpt-oss/model.gguf",
    "tiny-gpt-oss-mxfp4/model.gguf",
];

#[test]
fn logits_and_greedy_tokens_match_transformers() {
    for name in FIXTURES {
        // Exact products (f32 over the stored values), as transformers computes in f32.
        let files = common::fixture_files(name);
        let model = Model::load_with(&files, WeightLayout::Exact).unwrap();
        assert_goldens(name, &model, &golden(name), 1e-4);
    }
}

/// Block-format checkpoints (MXFP4 experts) are multiplied with 8-bit activations by default
/// (as llama.cpp does): close to the goldens, with the same greedy tokens.
#[test]
fn int8_products_of_block_formats_stay_close_to_transformers() {
    for file in ["tiny-gpt-oss-mxfp4", "tiny-gpt-oss-mxfp4/model.gguf"] {
        let files = ModelFiles::open(&repo_root().join("fixtures").join(file)).unwrap();
        let model = Model::load(&files).unwrap();
        assert_goldens(file, &model, &golden("tiny-gpt-oss-mxfp4"), 5e-3);
    }
}

#[test]
fn gguf_files_match_transformers() {
    for file in GGUF_FILES {
        let path = repo_root().join("fixtures").join(file);
        let name = file.split('/').next().unwrap_or(file);
        let files = ModelFiles::open(&path).unwrap();
        let hf = ModelFiles::open(&repo_root().join("fixtures").join(name)).unwrap();
        // The converter stores Gemma's norms as `1 + w`: the one difference there may be.
        let hf_family = tessera_model_files::Family {
            norm_weight_offset: files.config.family.norm_weight_offset,
            ..hf.config.family.clone()
        };
        assert_eq!(
            files.config.family, hf_family,
            "{name}: the GGUF metadata describes other layers than config.json"
        );
        let model = Model::load_with(&files, WeightLayout::Exact).unwrap();
        assert_goldens(file, &model, &golden(name), 1e-4);
    }
}

#[test]
fn results_do_not_depend_on_batching_or_chunking() {
    for name in FIXTURES {
        let (model, golden) = load_fixture(name);
        let schedules = [
            (Schedule::Together, usize::MAX),
            (Schedule::Together, 1),
            (Schedule::Together, 7),
            (Schedule::Together, 64),
            (Schedule::Staggered, 7),
            (Schedule::OneAtATime, 7),
        ];
        assert_close_under_schedules(name, &model, &golden.prompt_ids(), &schedules, 0.0);
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
