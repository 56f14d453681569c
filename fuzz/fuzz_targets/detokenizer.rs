//! Fuzz target `detokenizer`: see [`tessera_fuzz::detokenizer`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_fuzz::detokenizer(data));
