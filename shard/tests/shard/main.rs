//! The engine's integration tests, one module per area, in one test binary (one link, not one
//! per area, after a change); `common` is their shared harness.

mod bf16_activations;
mod common;
mod constrained_output;
mod cuda_engine;
mod draft_heads;
mod eagle_head;
mod golden;
mod kv_bf16;
mod pooling;
mod sampling_props;
mod smollm2;
mod smollm2_draft_heads;
mod speculative;
mod tensor_parallel;
