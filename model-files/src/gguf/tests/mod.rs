//! GGUF reader tests over files written by a small test-only writer.

mod corrupt;
mod metadata;
mod model;
mod native;
mod tensors;

use std::path::PathBuf;

use half::f16;
use tessera_blocks::QuantFormat;

use super::*;

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
            QuantFormat::MXFP4 => &[],
        };
        for &o in scale_offsets {
            block[o..o + 2].copy_from_slice(&scale);
        }
        if format == QuantFormat::MXFP4 {
            // Its E8M0 scale byte: 2^-7.
            block[0] = 121;
        }
        out.extend(block);
    }
    out
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
