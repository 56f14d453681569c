//! Fuzz target `tokenizer_roundtrip`: see [`tessera_fuzz::tokenizer_roundtrip`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_fuzz::tokenizer_roundtrip(data));
