//! Dequantization against goldens from gguf-py (`scripts/make_quant_goldens.py`).

use tessera_blocks::{QuantFormat, dequantize};

const GOLDENS: &str = include_str!("data/quant_goldens.txt");

struct Golden {
    format: QuantFormat,
    bytes: Vec<u8>,
    expected: Vec<f32>,
}

fn parse_hex_bytes(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex byte"))
        .collect()
}

fn goldens() -> Vec<Golden> {
    let mut lines = GOLDENS.lines().filter(|l| !l.starts_with('#'));
    let mut out = Vec::new();
    while let Some(head) = lines.next() {
        let (name, hex) = head.split_once(' ').expect("'<FORMAT> <hex>' line");
        let format = QuantFormat::from_name(name).expect("known format");
        let values = lines.next().expect("values line");
        let expected = values
            .split(' ')
            .map(|v| f32::from_bits(u32::from_str_radix(v, 16).expect("hex f32")))
            .collect();
        out.push(Golden {
            format,
            bytes: parse_hex_bytes(hex),
            expected,
        });
    }
    out
}

#[test]
fn every_format_has_a_golden() {
    let formats: Vec<_> = goldens().iter().map(|g| g.format).collect();
    for f in QuantFormat::ALL {
        assert!(formats.contains(&f), "no golden for {f}");
    }
}

#[test]
fn dequantize_matches_gguf_py_exactly() {
    for g in goldens() {
        let mut out = vec![f32::NAN; g.expected.len()];
        dequantize(g.format, &g.bytes, &mut out).expect("lengths match");
        for (i, (got, want)) in out.iter().zip(&g.expected).enumerate() {
            // gguf-py computes in f32 with the same operation order as ggml; we expect
            // bit-identical results (+0.0 and -0.0 compare equal).
            assert!(
                got == want,
                "{}: value {i}: got {got:e}, want {want:e}",
                g.format
            );
        }
    }
}

#[test]
fn dequantize_unaligned_input_matches() {
    for g in goldens() {
        let mut shifted = vec![0u8; g.bytes.len() + 1];
        shifted[1..].copy_from_slice(&g.bytes);
        let mut out = vec![f32::NAN; g.expected.len()];
        dequantize(g.format, &shifted[1..], &mut out).expect("lengths match");
        assert!(
            out.iter().zip(&g.expected).all(|(a, b)| a == b),
            "{}",
            g.format
        );
    }
}

#[test]
fn dequantize_large_input_in_parallel_matches() {
    // Repeat the golden blocks past the parallel threshold, unaligned and aligned.
    for g in goldens() {
        let reps = (1 << 19) / g.expected.len() + 3;
        let bytes: Vec<u8> = std::iter::repeat_n(&g.bytes, reps)
            .flatten()
            .copied()
            .collect();
        let mut out = vec![f32::NAN; g.expected.len() * reps];
        dequantize(g.format, &bytes, &mut out).expect("lengths match");
        for chunk in out.chunks_exact(g.expected.len()) {
            assert!(
                chunk.iter().zip(&g.expected).all(|(a, b)| a == b),
                "{}",
                g.format
            );
        }
    }
}
