//! Tensors of every supported type load as f32 with their Hugging Face shape, and slice as
//! the cut full tensor; unsupported ones are clear errors.

use half::bf16;
use tessera_blocks::dequantize;

use super::*;

#[test]
fn every_supported_type_loads_with_hf_shape() {
    let ids = [
        (QuantFormat::Q8_0, 8),
        (QuantFormat::Q4_0, 2),
        (QuantFormat::Q4_1, 3),
        (QuantFormat::Q5_0, 6),
        (QuantFormat::Q5_1, 7),
        (QuantFormat::Q4K, 12),
        (QuantFormat::Q5K, 13),
        (QuantFormat::Q6K, 14),
        (QuantFormat::Q2K, 10),
        (QuantFormat::Q3K, 11),
        (QuantFormat::IQ4NL, 20),
        (QuantFormat::IQ4XS, 23),
        (QuantFormat::MXFP4, 39),
    ];
    for (format, id) in ids {
        // A [rows=2, cols=2 blocks] matrix: HF shape [2, 2 * block_elements].
        let cols = 2 * format.block_elements();
        let bytes = valid_blocks(format, 4, id);
        let mut expected = vec![0.0; 2 * cols];
        dequantize(format, &bytes, &mut expected).unwrap();
        let w = Writer::new()
            .kv("general.architecture", V::String("qwen2".into()))
            .tensor("blk.0.ffn_up.weight", &[cols as u64, 2], id, bytes);
        let file = open_bytes(&w.bytes().0).unwrap();
        let name = "model.layers.0.mlp.up_proj.weight";
        assert!(file.contains(name));
        assert_eq!(file.shape(name).unwrap(), [2, cols]);
        let t = file.load_f32(name).unwrap();
        assert_eq!(t.shape, [2, cols], "{format}");
        assert_eq!(t.data, expected, "{format}");
    }
    // F16 and BF16.
    let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let halves = x
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    let brains = x
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let w = Writer::new()
        .kv("general.architecture", V::String("qwen2".into()))
        .tensor("token_embd.weight", &[4, 3], 1, halves)
        .tensor("output.weight", &[4, 3], 30, brains);
    let file = open_bytes(&w.bytes().0).unwrap();
    let embed = file.load_f32("model.embed_tokens.weight").unwrap();
    assert_eq!(
        (embed.shape.as_slice(), embed.data.as_slice()),
        ([3, 4].as_slice(), x.as_slice())
    );
    assert_eq!(file.load_f32("lm_head.weight").unwrap().data, x);
}

#[test]
fn unsupported_and_unmapped_tensors_are_clear_errors() {
    let w = Writer::new()
        .kv("general.architecture", V::String("llama".into()))
        .tensor("blk.0.ffn_up.weight", &[256, 1], 16, vec![0; 66]); // IQ2_XXS
    let (bytes, _) = w.bytes();
    let file = write_file(&bytes);
    let gguf = GgufFile::open(&file.path).unwrap();
    let err = gguf
        .load_f32("model.layers.0.mlp.up_proj.weight")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("IQ2_XXS") && err.contains("not supported"),
        "{err}"
    );
    assert!(err.contains(&file.path.display().to_string()), "{err}");
    let err = gguf
        .load_f32("model.layers.0.mlp.down_proj.weight")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("blk.0.ffn_down.weight") && err.contains("not in the file"),
        "{err}"
    );
    let err = gguf
        .load_f32("model.rotary_emb.inv_freq")
        .unwrap_err()
        .to_string();
    assert!(err.contains("no GGUF tensor corresponds"), "{err}");
    assert!(!gguf.contains("lm_head.weight"));
    assert!(gguf.shape("lm_head.weight").is_err());
}

#[test]
fn slices_match_the_cut_full_tensor() {
    // Quantized rows and columns.
    for (format, id) in [(QuantFormat::Q4_1, 3), (QuantFormat::Q6K, 14)] {
        let cols = 2 * format.block_elements();
        let w = Writer::new()
            .kv("general.architecture", V::String("qwen2".into()))
            .tensor(
                "blk.0.ffn_up.weight",
                &[cols as u64, 4],
                id,
                valid_blocks(format, 8, id),
            );
        let file = open_bytes(&w.bytes().0).unwrap();
        let name = "model.layers.0.mlp.up_proj.weight";
        let full = file.load_f32(name).unwrap();
        for (dim, range) in [(0, 1..3), (0, 0..4), (1, 3..cols - 5), (1, 0..cols)] {
            let s = file.load_f32_slice(name, dim, range.clone()).unwrap();
            assert_eq!(s, full.slice(dim, range).unwrap(), "{format} {dim}");
        }
        let err = file.load_f32_slice(name, 0, 2..5).unwrap_err().to_string();
        assert!(err.contains("2..5"), "{err}");
    }
    // Permuted q/k: head-aligned rows, any columns, vectors, and unaligned rows.
    for arch in ["llama", "qwen2"] {
        let (w, _, _) = tiny_model(arch, true, true);
        let file = open_bytes(&w.bytes().0).unwrap();
        for name in [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.q_proj.bias",
        ] {
            let full = file.load_f32(name).unwrap();
            let rows = full.shape[0];
            let mut cases = vec![(0, 0..rows / 2), (0, rows / 2..rows), (0, 1..3)];
            if full.shape.len() == 2 {
                cases.push((1, 2..6));
            }
            for (dim, range) in cases {
                let s = file.load_f32_slice(name, dim, range.clone()).unwrap();
                assert_eq!(s, full.slice(dim, range).unwrap(), "{arch} {name} {dim}");
            }
        }
    }
}
