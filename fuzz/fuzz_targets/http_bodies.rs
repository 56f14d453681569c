//! Fuzz target `http_bodies`: see [`tessera_fuzz::http_bodies`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_fuzz::http_bodies(data));
