//! Fuzz target `gguf`: see [`tessera_fuzz::gguf`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_fuzz::gguf(data));
