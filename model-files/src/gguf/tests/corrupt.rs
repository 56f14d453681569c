//! Corrupt files: every defect is an error that names it, never a panic.

use std::path::Path;

use super::*;

fn valid_file() -> (Vec<u8>, Layout) {
    let (w, _, _) = tiny_model("llama", true, false);
    w.bytes()
}

#[test]
fn bad_magic_and_versions_are_rejected() {
    let (mut bytes, _) = valid_file();
    bytes[..4].copy_from_slice(b"GGML");
    expect_error(
        &bytes,
        "not a GGUF file: expected magic \"GGUF\", found \"GGML\"",
    );
    let (mut bytes, _) = valid_file();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    expect_error(&bytes, "GGUF version 1 is not supported");
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect_error(&bytes, "big-endian GGUF");
    bytes[4..8].copy_from_slice(&4u32.to_le_bytes());
    expect_error(&bytes, "unsupported GGUF version 4");
    expect_error(
        b"",
        "truncated: the GGUF magic needs bytes 0..4 but the file has 0",
    );
}

#[test]
fn truncation_in_each_section_is_named() {
    let (bytes, layout) = valid_file();
    expect_error(
        &bytes[..10],
        "truncated: the tensor count needs bytes 8..16 but the file has 10",
    );
    // Too short for the declared metadata count.
    expect_error(
        &bytes[..layout.kv_start + 12],
        "truncated or corrupt: the header's metadata count declares 20 entries",
    );
    // Inside the first metadata key.
    let mut one_kv = header(3, 0, 1);
    one_kv.extend(&bytes[layout.kv_start..layout.kv_start + 16]);
    expect_error(
        &one_kv,
        "truncated: the key of metadata entry #0 needs bytes 32..52",
    );
    // Inside the metadata (the token list).
    let text = expect_error(&bytes[..layout.tensor_info_start - 100], "truncated");
    assert!(text.contains("metadata"), "{text}");
    // Inside the tensor infos.
    let text = expect_error(&bytes[..layout.tensor_info_start + 150], "truncated: ");
    assert!(
        text.contains("of tensor blk.0.attn_k.weight needs bytes"),
        "{text}"
    );
    // Inside the data of the last tensor (output.weight).
    let cut = bytes.len() - 40;
    let text = expect_error(&bytes[..cut], "truncated: tensor output.weight needs bytes");
    assert!(text.contains(&format!("but the file has {cut}")), "{text}");
}

#[test]
fn every_truncation_and_byte_flip_is_an_error_or_a_valid_file_never_a_panic() {
    let (bytes, _) = valid_file();
    for len in 0..bytes.len() {
        assert!(
            open_bytes(&bytes[..len]).is_err(),
            "truncated to {len} bytes opened"
        );
    }
    // Flip bytes through the header, metadata and tensor infos: the reader must either
    // refuse the file or load every tensor without panicking.
    let file = write_file(&bytes);
    let mut corrupt = bytes.clone();
    for i in (0..bytes.len()).step_by(7) {
        for flip in [0x80u8, 0xFF] {
            corrupt[i] ^= flip;
            std::fs::write(&file.path, &corrupt).unwrap();
            if let Ok(g) = GgufFile::open(&file.path) {
                for t in g.tensors().to_vec() {
                    let _ = g.load_gguf_f32(&t.name);
                }
                let _ = g.model_config();
                let _ = g.tokenizer_spec();
                let _ = g.load_f32("model.layers.0.self_attn.q_proj.weight");
            }
            corrupt[i] = bytes[i];
        }
    }
}

fn header(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(tensors.to_le_bytes());
    b.extend(kvs.to_le_bytes());
    b
}

#[test]
fn absurd_counts_and_lengths_fail_fast_without_allocating() {
    expect_error(
        &header(3, 0, u64::MAX),
        "declares 18446744073709551615 entries",
    );
    expect_error(
        &header(3, u64::MAX, 0),
        "the header's tensor count declares",
    );
    // A string key claiming 2^60 bytes.
    let mut b = header(3, 0, 1);
    b.extend((1u64 << 60).to_le_bytes());
    b.extend([0u8; 16]);
    expect_error(
        &b,
        "truncated: the key of metadata entry #0 needs bytes 32..1152921504606847008 but the file has 48",
    );
    // An array claiming 2^62 u32 elements.
    let mut b = header(3, 0, 1);
    put_str(&mut b, "big");
    b.extend(9u32.to_le_bytes());
    b.extend(4u32.to_le_bytes());
    b.extend((1u64 << 62).to_le_bytes());
    b.extend([0u8; 16]);
    expect_error(&b, "metadata big declares 4611686018427387904 entries");
    // Arrays nested past the depth limit.
    let mut b = header(3, 0, 1);
    put_str(&mut b, "deep");
    b.extend(9u32.to_le_bytes());
    for _ in 0..20 {
        b.extend(9u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
    }
    b.extend(0u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    expect_error(&b, "nests arrays deeper than 8 levels");
}

#[test]
fn malformed_values_and_tensor_infos_are_named() {
    let mut b = header(3, 0, 1);
    put_str(&mut b, "odd");
    b.extend(42u32.to_le_bytes());
    b.extend([0u8; 16]);
    expect_error(&b, "metadata odd has unknown value type 42");

    let mut b = header(3, 0, 1);
    put_str(&mut b, "flag");
    b.extend(7u32.to_le_bytes());
    b.extend([2u8; 16]);
    expect_error(&b, "metadata flag is a bool with value 2");

    let w = Writer::new().kv("a", V::U8(1)).kv("a", V::U8(2));
    expect_error(&w.bytes().0, "metadata key a appears twice");

    let w = Writer::new().kv("general.alignment", V::U32(24));
    expect_error(&w.bytes().0, "general.alignment must be a power of two");

    let w = Writer::new().tensor("t", &[4], 200, vec![0; 16]);
    expect_error(&w.bytes().0, "tensor t has unknown ggml type 200");

    let w = Writer::new().tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    expect_error(
        &w.bytes().0,
        "tensor t has 5 dimensions; ggml allows at most 4",
    );

    let w = Writer::new().tensor("t", &[16], 8, vec![0; 34]);
    expect_error(
        &w.bytes().0,
        "tensor t: innermost dimension 16 is not a multiple of the Q8_0 block size 32",
    );

    let w = Writer::new().tensor("t", &[1 << 40, 1 << 40], 0, vec![]);
    expect_error(
        &w.bytes().0,
        "tensor t: dimensions [1099511627776, 1099511627776] overflow",
    );

    let w = Writer::new()
        .f32_tensor("t", &[1], &[1.0])
        .f32_tensor("t", &[1], &[1.0]);
    expect_error(&w.bytes().0, "tensor t appears twice");

    let w = Writer::new().f32_tensor("t", &[4], &[0.0; 4]);
    let (mut bytes, layout) = w.bytes();
    // The offset is the last 8 bytes of the (only) tensor info.
    let info_end = layout.tensor_info_start + 8 + 1 + 4 + 8 + 4 + 8;
    bytes[info_end - 8..info_end].copy_from_slice(&5u64.to_le_bytes());
    expect_error(
        &bytes,
        "tensor t: data offset 5 is not a multiple of the alignment 32",
    );
    bytes[info_end - 8..info_end].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    expect_error(&bytes, "truncated: tensor t needs bytes");
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let err = GgufFile::open(Path::new("/nonexistent/model.gguf")).unwrap_err();
    assert!(matches!(err, FormatError::Io { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/model.gguf"));
}
