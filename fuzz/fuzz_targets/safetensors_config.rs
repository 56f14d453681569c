//! Fuzz target `safetensors_config`: see [`tessera_fuzz::safetensors_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_fuzz::safetensors_config(data));
