//! The text crate's integration tests, one module per area, in one test binary (one link,
//! not one per area, after a change).

mod chat_template;
mod chat_template_goldens;
mod tokenizer_gguf;
mod tokenizer_hf_dir;
