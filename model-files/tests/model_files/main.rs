//! The model-file readers' integration tests, one module per area, in one test binary (one
//! link, not one per area, after a change).

mod gguf_smollm2;
mod smollm2_tokenizer;
