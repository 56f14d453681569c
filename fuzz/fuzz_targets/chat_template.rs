//! Fuzz target `chat_template`: see [`tessera_fuzz::chat_template`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_fuzz::chat_template(data));
