//! GGUF reader tests over files written by a small test-only writer.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use tessera_kernels::cpu::WeightFormat;
use tessera_kernels::quant::{QuantFormat, dequantize};

use super::*;
use crate::{Architecture, RopeScaling};

type V = MetadataValue;

/// A GGUF writer for tests: metadata, tensors (already-encoded bytes), version, alignment.
struct Writer {
    version: u32,
    kvs: Vec<(String, MetadataValue)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    alignment: usize,
}

/// Byte positions of a written file's sections.
#[derive(Debug)]
struct Layout {
    kv_start: usize,
    tensor_info_start: usize,
    data_start: usize,
}

fn value_type(v: &MetadataValue) -> u32 {
    match v {
        V::U8(_) => 0,
        V::I8(_) => 1,
        V::U16(_) => 2,
        V::I16(_) => 3,
        V::U32(_) => 4,
        V::I32(_) => 5,
        V::F32(_) => 6,
        V::Bool(_) => 7,
        V::String(_) => 8,
        V::Array(_) => 9,
        V::U64(_) => 10,
        V::I64(_) => 11,
        V::F64(_) => 12,
    }
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as u64).to_le_bytes());
    buf.extend(s.as_bytes());
}

fn put_payload(buf: &mut Vec<u8>, v: &MetadataValue) {
    match v {
        V::U8(x) => buf.extend(x.to_le_bytes()),
        V::I8(x) => buf.extend(x.to_le_bytes()),
        V::U16(x) => buf.extend(x.to_le_bytes()),
        V::I16(x) => buf.extend(x.to_le_bytes()),
        V::U32(x) => buf.extend(x.to_le_bytes()),
        V::I32(x) => buf.extend(x.to_le_bytes()),
        V::U64(x) => buf.extend(x.to_le_bytes()),
        V::I64(x) => buf.extend(x.to_le_bytes()),
        V::F32(x) => buf.extend(x.to_le_bytes()),
        V::F64(x) => buf.extend(x.to_le_bytes()),
        V::Bool(x) => buf.push(u8::from(*x)),
        V::String(s) => put_str(buf, s),
        V::Array(items) => {
            buf.extend(items.first().map_or(0, value_type).to_le_bytes());
            buf.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_payload(buf, item);
            }
        }
    }
}

impl Writer {
    fn new() -> Self {
        Self {
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
        }
    }

    fn kv(mut self, key: &str, value: MetadataValue) -> Self {
        self.kvs.push((key.into(), value));
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.into(), dims.to_vec(), ggml_type, data));
        self
    }

    fn f32_tensor(self, name: &str, dims: &[u64], data: &[f32]) -> Self {
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, dims, 0, bytes)
    }

    fn bytes(&self) -> (Vec<u8>, Layout) {
        let mut buf = b"GGUF".to_vec();
        buf.extend(self.version.to_le_bytes());
        buf.extend((self.tensors.len() as u64).to_le_bytes());
        buf.extend((self.kvs.len() as u64).to_le_bytes());
        let kv_start = buf.len();
        for (key, value) in &self.kvs {
            put_str(&mut buf, key);
            buf.extend(value_type(value).to_le_bytes());
            put_payload(&mut buf, value);
        }
        let tensor_info_start = buf.len();
        let mut offset = 0usize;
        for (name, dims, ggml_type, data) in &self.tensors {
            put_str(&mut buf, name);
            buf.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                buf.extend(d.to_le_bytes());
            }
            buf.extend(ggml_type.to_le_bytes());
            buf.extend((offset as u64).to_le_bytes());
            offset = (offset + data.len()).div_ceil(self.alignment) * self.alignment;
        }
        buf.resize(buf.len().div_ceil(self.alignment) * self.alignment, 0);
        let data_start = buf.len();
        for (_, _, _, data) in &self.tensors {
            buf.extend(data);
            let padded = (buf.len() - data_start).div_ceil(self.alignment) * self.alignment;
            buf.resize(data_start + padded, 0);
        }
        let layout = Layout {
            kv_start,
            tensor_info_start,
            data_start,
        };
        (buf, layout)
    }
}

struct TestFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn write_file(bytes: &[u8]) -> TestFile {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).expect("write");
    TestFile { _dir: dir, path }
}

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, FormatError> {
    let file = write_file(bytes);
    GgufFile::open(&file.path)
}

/// Opens `bytes`, expects an error, checks it names the file and contains `needle`.
fn expect_error(bytes: &[u8], needle: &str) -> String {
    let file = write_file(bytes);
    let err = GgufFile::open(&file.path).expect_err("corrupt file must not open");
    let text = err.to_string();
    assert!(
        text.contains(&file.path.display().to_string()),
        "error does not name the file: {text}"
    );
    assert!(text.contains(needle), "expected {needle:?} in: {text}");
    text
}

fn every_type_metadata() -> Vec<(&'static str, MetadataValue)> {
    vec![
        ("t.u8", V::U8(250)),
        ("t.i8", V::I8(-7)),
        ("t.u16", V::U16(65000)),
        ("t.i16", V::I16(-30000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f32", V::F32(1.5)),
        ("t.f64", V::F64(-2.25e100)),
        ("t.true", V::Bool(true)),
        ("t.false", V::Bool(false)),
        ("t.string", V::String("héllo ✓".into())),
        ("t.empty_string", V::String(String::new())),
        ("t.empty_array", V::Array(vec![])),
        (
            "t.strings",
            V::Array(vec![V::String("a".into()), V::String("bc".into())]),
        ),
        (
            "t.nested",
            V::Array(vec![
                V::Array(vec![V::I32(1), V::I32(2)]),
                V::Array(vec![V::I32(3)]),
            ]),
        ),
    ]
}

#[test]
fn reads_every_metadata_type_in_v2_and_v3() {
    for version in [2, 3] {
        let mut w = Writer::new();
        w.version = version;
        for (k, v) in every_type_metadata() {
            w = w.kv(k, v);
        }
        let (bytes, _) = w.bytes();
        let file = open_bytes(&bytes).expect("valid file");
        assert_eq!(file.version(), version);
        for (k, v) in every_type_metadata() {
            assert_eq!(file.metadata(k), Some(&v), "{k} (v{version})");
        }
        assert_eq!(file.metadata("t.missing"), None);
        assert_eq!(file.metadata_entries().count(), every_type_metadata().len());
        assert!(file.tensors().is_empty());
    }
}

#[test]
fn metadata_helpers_convert_between_numeric_types() {
    assert_eq!(V::U8(3).as_u64(), Some(3));
    assert_eq!(V::I32(-1).as_u64(), None);
    assert_eq!(V::I32(-1).as_i64(), Some(-1));
    assert_eq!(V::U64(u64::MAX).as_i64(), None);
    assert_eq!(V::F32(0.5).as_f64(), Some(0.5));
    assert_eq!(V::U32(7).as_f64(), Some(7.0));
    assert_eq!(V::String("x".into()).as_f64(), None);
    assert_eq!(V::String("x".into()).as_str(), Some("x"));
    assert_eq!(V::Bool(true).as_bool(), Some(true));
    assert_eq!(V::Array(vec![V::U8(1)]).as_array().map(<[_]>::len), Some(1));
    assert_eq!(V::U8(1).as_array(), None);
}

#[test]
fn tensors_respect_default_and_custom_alignment() {
    for alignment in [None, Some(64u32), Some(1)] {
        let mut w = Writer::new().kv("general.architecture", V::String("llama".into()));
        if let Some(a) = alignment {
            w = w.kv("general.alignment", V::U32(a));
            w.alignment = a as usize;
        }
        let a: Vec<f32> = (0..5).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..6).map(|i| -(i as f32)).collect();
        let w = w.f32_tensor("a", &[5], &a).f32_tensor("b", &[3, 2], &b);
        let (bytes, layout) = w.bytes();
        let file = open_bytes(&bytes).expect("valid file");
        let expected = alignment.map_or(32, |a| a as usize);
        assert_eq!(file.alignment(), expected);
        assert_eq!(file.data_offset(), layout.data_start);
        assert_eq!(file.data_offset() % expected, 0);
        for t in file.tensors() {
            assert_eq!((t.start - file.data_offset()) % expected, 0, "{}", t.name);
        }
        assert_eq!(file.load_gguf_f32("a").unwrap(), a);
        assert_eq!(file.load_gguf_f32("b").unwrap(), b);
        assert_eq!(file.tensor_info("b").unwrap().dims, [3, 2]);
    }
}

/// Random-ish bytes that are valid blocks of `format` (finite f16 scales).
fn valid_blocks(format: QuantFormat, n_blocks: usize, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state as u8
    };
    let scale = f16::from_f32(0.01).to_le_bytes();
    let mut out = Vec::new();
    for _ in 0..n_blocks {
        let mut block: Vec<u8> = (0..format.block_bytes()).map(|_| next()).collect();
        let scale_offsets: &[usize] = match format {
            QuantFormat::Q8_0
            | QuantFormat::Q4_0
            | QuantFormat::Q5_0
            | QuantFormat::IQ4NL
            | QuantFormat::IQ4XS => &[0],
            QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => &[0, 2],
            QuantFormat::Q6K => &[208],
            QuantFormat::Q2K => &[80, 82],
            QuantFormat::Q3K => &[108],
        };
        for &o in scale_offsets {
            block[o..o + 2].copy_from_slice(&scale);
        }
        out.extend(block);
    }
    out
}

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

/// llama.cpp's `LlamaModel.permute` on row-major `[rows, cols]` data.
fn llama_cpp_permute(w: &[f32], rows: usize, n_head: usize) -> Vec<f32> {
    let cols = w.len() / rows;
    let half = rows / n_head / 2;
    let mut out = vec![0.0; w.len()];
    for h in 0..n_head {
        for s in 0..2 {
            for j in 0..half {
                let dst = h * 2 * half + 2 * j + s;
                let src = h * 2 * half + s * half + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// A tiny llama-shaped model: hidden 8, 2 heads of 4, 1 kv head, 2 layers.
fn tiny_model(arch: &str, with_bias: bool, tied: bool) -> (Writer, Vec<f32>, Vec<f32>) {
    let q: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let k: Vec<f32> = (0..32).map(|i| 100.0 + i as f32).collect();
    let permute = arch == "llama" || arch == "mistral";
    let (q_file, k_file) = if permute {
        (llama_cpp_permute(&q, 8, 2), llama_cpp_permute(&k, 4, 1))
    } else {
        (q.clone(), k.clone())
    };
    let key = |k: &str| format!("{arch}.{k}");
    let tokens: Vec<V> = ["<unk>", "<s>", "</s>", "a", "b"]
        .iter()
        .map(|t| V::String((*t).into()))
        .collect();
    let mut w = Writer::new()
        .kv("general.architecture", V::String(arch.into()))
        .kv("general.file_type", V::U32(0))
        .kv(&key("context_length"), V::U32(128))
        .kv(&key("embedding_length"), V::U32(8))
        .kv(&key("feed_forward_length"), V::U32(16))
        .kv(&key("block_count"), V::U32(2))
        .kv(&key("attention.head_count"), V::U32(2))
        .kv(&key("attention.head_count_kv"), V::U32(1))
        .kv(&key("attention.layer_norm_rms_epsilon"), V::F32(1e-5))
        .kv(&key("rope.freq_base"), V::F32(500_000.0))
        .kv("tokenizer.ggml.model", V::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", V::String("smollm".into()))
        .kv("tokenizer.ggml.tokens", V::Array(tokens))
        .kv(
            "tokenizer.ggml.token_type",
            V::Array(vec![V::I32(2), V::I32(3), V::I32(3), V::I32(1), V::I32(1)]),
        )
        .kv(
            "tokenizer.ggml.merges",
            V::Array(vec![V::String("a b".into())]),
        )
        .kv("tokenizer.ggml.bos_token_id", V::U32(1))
        .kv("tokenizer.ggml.eos_token_id", V::U32(2))
        .kv("tokenizer.ggml.eot_token_id", V::U32(2))
        .kv("tokenizer.ggml.add_bos_token", V::Bool(false))
        .kv(
            "tokenizer.chat_template",
            V::String("{{ messages }}".into()),
        )
        .f32_tensor("token_embd.weight", &[8, 5], &[0.5; 40])
        .f32_tensor("blk.0.attn_q.weight", &[8, 8], &q_file)
        .f32_tensor("blk.0.attn_k.weight", &[8, 4], &k_file);
    if with_bias {
        let (qb, kb): (Vec<f32>, Vec<f32>) = (
            (0..8).map(|i| i as f32).collect(),
            (0..4).map(|i| i as f32).collect(),
        );
        let (qb_file, kb_file) = if permute {
            (llama_cpp_permute(&qb, 8, 2), llama_cpp_permute(&kb, 4, 1))
        } else {
            (qb, kb)
        };
        w = w
            .f32_tensor("blk.0.attn_q.bias", &[8], &qb_file)
            .f32_tensor("blk.0.attn_k.bias", &[4], &kb_file);
    }
    if !tied {
        w = w.f32_tensor("output.weight", &[8, 5], &[0.25; 40]);
    }
    (w, q, k)
}

#[test]
fn llama_q_and_k_are_unpermuted_to_hf_layout() {
    for arch in ["llama", "mistral", "qwen2"] {
        let (w, q, k) = tiny_model(arch, true, true);
        let file = open_bytes(&w.bytes().0).unwrap();
        let lq = file
            .load_f32("model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        assert_eq!(lq.shape, [8, 8]);
        assert_eq!(lq.data, q, "{arch} q");
        let lk = file
            .load_f32("model.layers.0.self_attn.k_proj.weight")
            .unwrap();
        assert_eq!(lk.shape, [4, 8]);
        assert_eq!(lk.data, k, "{arch} k");
        let qb = file
            .load_f32("model.layers.0.self_attn.q_proj.bias")
            .unwrap();
        assert_eq!(
            qb.data,
            (0..8).map(|i| i as f32).collect::<Vec<_>>(),
            "{arch} q bias"
        );
        let kb = file
            .load_f32("model.layers.0.self_attn.k_proj.bias")
            .unwrap();
        assert_eq!(kb.data, [0.0, 1.0, 2.0, 3.0], "{arch} k bias");
    }
}

#[test]
fn model_config_from_metadata() {
    let (w, _, _) = tiny_model("llama", false, true);
    let file = open_bytes(&w.bytes().0).unwrap();
    let c = file.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            c.num_layers
        ),
        (5, 8, 16, 2)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (2, 1, 4));
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, 500_000.0);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.max_position_embeddings, 128);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.dtype, Some(crate::DType::F32));
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, [2]);

    let (w, _, _) = tiny_model("qwen2", true, false);
    let w = w
        .kv("qwen2.vocab_size", V::U32(7))
        .kv("qwen2.attention.sliding_window", V::U32(64))
        .kv("qwen2.rope.scaling.type", V::String("linear".into()))
        .kv("qwen2.rope.scaling.factor", V::F32(2.0));
    let file = open_bytes(&w.bytes().0).unwrap();
    let c = file.model_config().unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_eq!(c.vocab_size, 7);
    assert!(!c.tie_word_embeddings);
    assert!(c.attention_bias);
    assert_eq!(c.sliding_window, Some(64));
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
}

#[test]
fn model_config_errors_name_the_problem() {
    let (w, _, _) = tiny_model("llama", false, true);
    let mut w2 = Writer::new();
    w2.kvs = w
        .kvs
        .iter()
        .filter(|(k, _)| k != "llama.block_count")
        .cloned()
        .collect();
    let file = open_bytes(&w2.bytes().0).unwrap();
    let err = file.model_config().unwrap_err().to_string();
    assert!(
        err.contains("missing metadata key llama.block_count"),
        "{err}"
    );

    let w3 = Writer::new().kv("general.architecture", V::String("gptneox".into()));
    let f = write_file(&w3.bytes().0);
    let err = GgufFile::open(&f.path).unwrap().model_config().unwrap_err();
    assert!(
        matches!(&err, FormatError::UnsupportedArchitecture { found, .. } if found == "gptneox"),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("gptneox")
            && text.contains("llama")
            && text.contains(&f.path.display().to_string())
    );

    let w4 = Writer::new();
    let err = open_bytes(&w4.bytes().0)
        .unwrap()
        .architecture()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing metadata key general.architecture"),
        "{err}"
    );

    let (w, _, _) = tiny_model("llama", false, true);
    let w = w.kv("llama.rope.scaling.type", V::String("yarn".into()));
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .model_config()
        .unwrap_err()
        .to_string();
    assert!(err.contains("unsupported rope scaling \"yarn\""), "{err}");

    let (w, _, _) = tiny_model("llama", false, true);
    let mut w = w;
    for (k, v) in &mut w.kvs {
        if k == "llama.attention.head_count" {
            *v = V::String("nine".into());
        }
    }
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .model_config()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "metadata llama.attention.head_count must be a non-negative integer, found string"
        ),
        "{err}"
    );
}

#[test]
fn tokenizer_spec_from_metadata() {
    let (w, _, _) = tiny_model("llama", false, true);
    let file = open_bytes(&w.bytes().0).unwrap();
    let spec = file.tokenizer_spec().unwrap();
    assert_eq!(spec.model, "gpt2");
    assert_eq!(spec.pre.as_deref(), Some("smollm"));
    assert_eq!(spec.tokens, ["<unk>", "<s>", "</s>", "a", "b"]);
    assert_eq!(spec.token_types, Some(vec![2, 3, 3, 1, 1]));
    assert_eq!(spec.merges, Some(vec!["a b".to_string()]));
    assert_eq!(spec.scores, None);
    assert_eq!(
        (spec.bos_id, spec.eos_id, spec.unk_id, spec.pad_id),
        (Some(1), Some(2), None, None)
    );
    assert_eq!((spec.add_bos, spec.add_eos), (Some(false), None));
    assert_eq!(spec.chat_template.as_deref(), Some("{{ messages }}"));

    let w = Writer::new()
        .kv("tokenizer.ggml.model", V::String("llama".into()))
        .kv("tokenizer.ggml.tokens", V::Array(vec![V::U32(3)]));
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .tokenizer_spec()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.ggml.tokens[0] must be an array of strings, found u32"),
        "{err}"
    );
}

/// Llama 3's divisors as llama.cpp's converter computes them (`generate_extra_tensors`).
fn llama3_divisors(
    head_dim: usize,
    theta: f64,
    factor: f64,
    low: f64,
    high: f64,
    orig: f64,
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (orig / low, orig / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

#[test]
fn llama3_rope_scaling_is_recovered_from_rope_freqs() {
    let (w, _, _) = tiny_model("llama", false, true);
    let mut w = w;
    // head_dim 128 like Llama 3.1 8B.
    for (k, v) in &mut w.kvs {
        if k == "llama.embedding_length" {
            *v = V::U32(256);
        }
    }
    let divisors = llama3_divisors(128, 500_000.0, 8.0, 1.0, 4.0, 8192.0);
    let w = w.f32_tensor("rope_freqs.weight", &[64], &divisors);
    let c = open_bytes(&w.bytes().0).unwrap().model_config().unwrap();
    let Some(RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    }) = c.rope_scaling
    else {
        panic!("expected llama3 scaling, got {:?}", c.rope_scaling);
    };
    assert_eq!(factor, 8.0);
    let refit = llama3_divisors(
        128,
        500_000.0,
        factor.into(),
        low_freq_factor.into(),
        high_freq_factor.into(),
        original_max_position_embeddings.into(),
    );
    for (a, b) in refit.iter().zip(&divisors) {
        assert!((a - b).abs() <= 1e-4 * b, "{a} vs {b}");
    }

    // Divisors that are not Llama 3's shape are refused with a reason.
    let (w, _, _) = tiny_model("llama", false, true);
    let w = w.f32_tensor("rope_freqs.weight", &[2], &[1.0, 3.0]);
    let err = open_bytes(&w.bytes().0)
        .unwrap()
        .model_config()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rope_freqs.weight is not Llama 3 rope scaling"),
        "{err}"
    );
}

// ---- corrupt files -------------------------------------------------------------------

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
const NATIVE: [(WeightFormat, u32); 14] = [
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
    use tessera_kernels::cpu::WeightMatrix;
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
    use tessera_kernels::cpu::WeightMatrix;
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
