//! Matrices kept in their file's format equal their f32 loads (through `WeightMatrix`).

use half::bf16;
use tessera_blocks::WeightFormat;
use tessera_kernels::cpu::WeightMatrix;

use super::*;

/// Bytes of `blocks` blocks (or values) of `format` with sane scales: what a GGUF of that
/// type holds.
fn native_bytes(format: WeightFormat, blocks: usize, seed: u32) -> Vec<u8> {
    let values = |n: usize| (0..n).map(move |i| ((i as u32 * 7 + seed) % 23) as f32 * 0.125 - 1.0);
    match format {
        WeightFormat::F16 => values(blocks)
            .flat_map(|v| f16::from_f32(v).to_le_bytes())
            .collect(),
        WeightFormat::Bf16 => values(blocks)
            .flat_map(|v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        other => {
            let q = QuantFormat::from_name(other.name()).expect("a block format");
            valid_blocks(q, blocks, seed)
        }
    }
}

/// (format, GGUF type id) of every type whose matrices stay native.
const NATIVE: [(WeightFormat, u32); 15] = [
    (WeightFormat::F16, 1),
    (WeightFormat::Bf16, 30),
    (WeightFormat::Q8_0, 8),
    (WeightFormat::Q4_0, 2),
    (WeightFormat::Q4_1, 3),
    (WeightFormat::Q5_0, 6),
    (WeightFormat::Q5_1, 7),
    (WeightFormat::Q4K, 12),
    (WeightFormat::Q5K, 13),
    (WeightFormat::Q6K, 14),
    (WeightFormat::Q2K, 10),
    (WeightFormat::Q3K, 11),
    (WeightFormat::IQ4NL, 20),
    (WeightFormat::IQ4XS, 23),
    (WeightFormat::MXFP4, 39),
];

/// q (8 rows in 2 heads, permuted under llama) and k (4 rows in 1 head) of `format`, `cols`
/// wide, plus a norm.
fn native_model(arch: &str, format: WeightFormat, id: u32, cols: usize) -> Writer {
    let per = format.block_elements();
    Writer::new()
        .kv("general.architecture", V::String(arch.into()))
        .kv(&format!("{arch}.attention.head_count"), V::U32(2))
        .kv(&format!("{arch}.attention.head_count_kv"), V::U32(1))
        .tensor(
            "blk.0.attn_q.weight",
            &[cols as u64, 8],
            id,
            native_bytes(format, 8 * cols / per, 1),
        )
        .tensor(
            "blk.0.attn_k.weight",
            &[cols as u64, 4],
            id,
            native_bytes(format, 4 * cols / per, 2),
        )
        .f32_tensor("blk.0.attn_norm.weight", &[cols as u64], &vec![1.0; cols])
}

#[test]
fn native_matrices_equal_their_f32_loads_with_q_and_k_unpermuted() {
    for (format, id) in NATIVE {
        // Two blocks per row (two 256-value super-blocks for the K-quants).
        let cols = 2 * format.block_elements().max(32);
        for arch in ["llama", "qwen2"] {
            let w = native_model(arch, format, id, cols);
            let written = w.tensors[0].3.clone();
            let file = open_bytes(&w.bytes().0).unwrap();
            for (name, rows) in [
                ("model.layers.0.self_attn.q_proj.weight", 8),
                ("model.layers.0.self_attn.k_proj.weight", 4),
            ] {
                let t = file.load_native(name).unwrap().expect("native");
                assert_eq!((t.format, t.shape), (format, [rows, cols]), "{arch} {name}");
                let m = WeightMatrix::from_bytes(t.format, rows, cols, &t.bytes).unwrap();
                assert_eq!(
                    m.to_f32(),
                    file.load_f32(name).unwrap().data,
                    "{arch} {format:?} {name}"
                );
                // Without the permutation, the bytes are the file's (a round trip).
                if arch == "qwen2" && rows == 8 {
                    assert_eq!(t.bytes, written, "{format:?}");
                }
            }
            let norm = "model.layers.0.input_layernorm.weight";
            assert_eq!(file.load_native(norm).unwrap(), None);
        }
    }
    // Types that are not kept native load as f32.
    let w = Writer::new()
        .kv("general.architecture", V::String("qwen2".into()))
        .f32_tensor("blk.0.ffn_up.weight", &[32, 2], &[0.5; 64]);
    let file = open_bytes(&w.bytes().0).unwrap();
    let up = "model.layers.0.mlp.up_proj.weight";
    assert_eq!(file.load_native(up).unwrap(), None);
    assert_eq!(file.load_native_slice(up, 0, 0..1).unwrap(), None);
}

#[test]
fn native_slices_equal_f32_slices() {
    for (format, id) in NATIVE {
        let per = format.block_elements().max(32);
        let cols = 2 * per;
        for arch in ["llama", "qwen2"] {
            let file = open_bytes(&native_model(arch, format, id, cols).bytes().0).unwrap();
            let q = "model.layers.0.self_attn.q_proj.weight";
            // Head-aligned rows (4 per head), block-aligned columns: native.
            for (dim, range) in [(0, 0..4), (0, 4..8), (0, 0..8), (1, 0..per), (1, per..cols)] {
                let t = file
                    .load_native_slice(q, dim, range.clone())
                    .unwrap()
                    .unwrap_or_else(|| panic!("{arch} {format:?} {dim} {range:?}"));
                let [rows, c] = t.shape;
                let m = WeightMatrix::from_bytes(t.format, rows, c, &t.bytes).unwrap();
                let want = file.load_f32_slice(q, dim, range.clone()).unwrap();
                assert_eq!(want.shape, [rows, c]);
                assert_eq!(m.to_f32(), want.data, "{arch} {format:?} {dim} {range:?}");
            }
            // Rows inside a permuted head, and columns that cut blocks, fall back to f32
            // (unless each value is its own block).
            let rows_1_3 = file.load_native_slice(q, 0, 1..3).unwrap();
            assert_eq!(rows_1_3.is_none(), arch == "llama", "{arch} {format:?}");
            let odd = file.load_native_slice(q, 1, 3..per).unwrap();
            assert_eq!(odd.is_none(), format.block_elements() > 1, "{format:?}");
            let err = file.load_native_slice(q, 0, 6..9).unwrap_err().to_string();
            assert!(err.contains("6..9"), "{err}");
        }
    }
}

#[test]
fn k_quant_rows_that_are_not_whole_super_blocks_are_refused() {
    // A Q4_K row of 96 values cannot be stored: the file is refused when opened.
    let w = Writer::new()
        .kv("general.architecture", V::String("qwen2".into()))
        .tensor("blk.0.ffn_up.weight", &[96, 2], 12, vec![0; 2 * 144]);
    expect_error(
        &w.bytes().0,
        "tensor blk.0.ffn_up.weight: innermost dimension 96 is not a multiple of the Q4_K \
         block size 256",
    );
}
