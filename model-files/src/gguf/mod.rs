//! GGUF files (versions 2 and 3) over a read-only memory map.
//!
//! [`GgufFile::open`] parses and bounds-checks the header, the metadata and every tensor
//! info; tensor data stays in the map until [`WeightSource::load_f32`] converts it. Weights
//! are addressed by their Hugging Face names and come back in Hugging Face layout: GGUF
//! names are translated, dimensions reversed, quantized blocks dequantized, and llama.cpp's
//! q/k row permutation undone for the `llama` (and `mistral`) architectures.
//!
//! ```no_run
//! use tessera_model_files::{WeightSource, gguf::GgufFile};
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref())?;
//! let config = file.model_config()?;
//! let q = file.load_f32("model.layers.0.self_attn.q_proj.weight")?;
//! assert_eq!(q.shape, [config.num_heads * config.head_dim, config.hidden_size]);
//! # Ok::<(), tessera_model_files::FormatError>(())
//! ```

mod config;
mod metadata;
mod names;
mod reader;
mod split;
#[cfg(test)]
mod tests;
mod types;

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use tessera_blocks as quant;

pub use metadata::MetadataValue;
pub use reader::TensorInfo;
pub use types::GgmlType;

use crate::weights::{NativeTensor, bad_slice, split_at_dim};
use crate::{Architecture, FormatError, HostTensor, WeightSource};

/// An open GGUF file: parsed metadata and tensor infos over a memory map of the data (of
/// every part, for a split file).
pub struct GgufFile {
    path: PathBuf,
    /// The file opened, then the other parts of a split file in order.
    parts: Vec<Mmap>,
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: usize,
    data_offset: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses a GGUF file; for the first part of a split file
    /// (`…-00001-of-00003.gguf`), the other parts beside it too. Truncated or corrupt files,
    /// version 1 files, tensors of unknown type and missing or misnumbered parts are errors
    /// naming the file and the problem.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let mmap = crate::mmap::map_file(path)?;
        let parsed = reader::parse(&mmap, path)?;
        let mut file = Self {
            path: path.to_path_buf(),
            parts: vec![mmap],
            version: parsed.version,
            metadata: parsed.metadata,
            metadata_index: parsed.metadata_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
        };
        file.open_other_parts()?;
        Ok(file)
    }

    /// Adds the tensors of a split file's other parts (the metadata is the first part's).
    fn open_other_parts(&mut self) -> Result<(), FormatError> {
        let count = self.split_key("split.count")?.unwrap_or(1);
        if count <= 1 {
            return Ok(());
        }
        if self.split_key("split.no")? != Some(0) {
            return Err(FormatError::invalid(
                &self.path,
                "one part of a split GGUF but not the first: open the -00001-of- file",
            ));
        }
        let paths = split::part_paths(&self.path, count).ok_or_else(|| {
            FormatError::invalid(
                &self.path,
                format!(
                    "split.count is {count} but the name is not NAME-00001-of-{count:05}.gguf, \
                     so the other parts cannot be found"
                ),
            )
        })?;
        for (no, part_path) in paths.iter().enumerate().skip(1) {
            let mmap = crate::mmap::map_file(part_path)?;
            let parsed = reader::parse(&mmap, part_path)?;
            let part_no = parsed
                .metadata_index
                .get("split.no")
                .and_then(|&i| parsed.metadata[i].1.as_u64());
            if part_no != Some(no as u64) {
                return Err(FormatError::invalid(
                    part_path,
                    format!(
                        "expected part {} of the split, found split.no {part_no:?}",
                        no + 1
                    ),
                ));
            }
            for mut info in parsed.tensors {
                info.part = self.parts.len();
                if self.tensor_index.contains_key(&info.name) {
                    return Err(FormatError::tensor(part_path, &info.name, "in two parts"));
                }
                self.tensor_index
                    .insert(info.name.clone(), self.tensors.len());
                self.tensors.push(info);
            }
            self.parts.push(mmap);
        }
        if let Some(expected) = self.split_key("split.tensors.count")?
            && expected != self.tensors.len()
        {
            return Err(FormatError::invalid(
                &self.path,
                format!(
                    "split.tensors.count is {expected} but the parts hold {}",
                    self.tensors.len()
                ),
            ));
        }
        Ok(())
    }

    fn split_key(&self, key: &str) -> Result<Option<usize>, FormatError> {
        match self.metadata(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                FormatError::invalid(&self.path, format!("{key} must be an integer"))
            }),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment (`general.alignment`, 32 by default).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Where the tensor data section starts.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// A metadata value by key.
    pub fn metadata(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All metadata, in file order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor info by GGUF name (`blk.0.attn_q.weight`).
    pub fn tensor_info(&self, gguf_name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(gguf_name).map(|&i| &self.tensors[i])
    }

    /// A tensor's raw bytes in the file (bounds were checked at open).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        self.parts
            .get(info.part)
            .and_then(|m| m.get(info.start..info.start + info.n_bytes))
            .unwrap_or_default()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, FormatError> {
        self.required_str("general.architecture")
    }

    /// A GGUF tensor converted to f32 in GGUF layout (no permutation undone), by GGUF name.
    pub fn load_gguf_f32(&self, gguf_name: &str) -> Result<Vec<f32>, FormatError> {
        let info = self
            .tensor_info(gguf_name)
            .ok_or_else(|| FormatError::tensor(&self.path, gguf_name, "not in the file"))?;
        let mut out = vec![0.0f32; info.elements()];
        self.convert(info, self.tensor_bytes(info), &mut out)?;
        Ok(out)
    }

    /// Converts `bytes` (whole rows of tensor `info`) to f32 into `out`.
    fn convert(&self, info: &TensorInfo, bytes: &[u8], out: &mut [f32]) -> Result<(), FormatError> {
        let result = match info.ggml_type {
            GgmlType::F32 => quant::f32_bytes_to_f32(bytes, out),
            GgmlType::F16 => quant::f16_bytes_to_f32(bytes, out),
            GgmlType::BF16 => quant::bf16_bytes_to_f32(bytes, out),
            other => match other.quant_format() {
                Some(format) => quant::dequantize(format, bytes, out),
                None => {
                    return Err(FormatError::tensor(
                        &self.path,
                        &info.name,
                        format!(
                            "tensor type {other} is not supported; supported: {}",
                            GgmlType::SUPPORTED
                        ),
                    ));
                }
            },
        };
        result.map_err(|e| FormatError::tensor(&self.path, &info.name, e.to_string()))
    }

    /// Bytes of one GGUF row (`dims[0]` values), when rows are whole blocks.
    fn row_bytes(info: &TensorInfo) -> Option<usize> {
        let (per, bytes) = (
            info.ggml_type.block_elements(),
            info.ggml_type.block_bytes(),
        );
        let row = *info.dims.first()?;
        (per > 0 && row.is_multiple_of(per)).then_some(row / per * bytes)
    }

    /// For a q/k projection whose rows llama.cpp permuted, the head count it used.
    fn permuted_heads(
        &self,
        name: &str,
        info: &TensorInfo,
        rows: usize,
    ) -> Result<Option<usize>, FormatError> {
        let Some(is_q) = names::permuted_projection(&info.name).filter(|_| self.permutes_qk())
        else {
            return Ok(None);
        };
        let arch = self.architecture()?;
        let heads_key = format!("{arch}.attention.head_count");
        let n_head = if is_q {
            self.required_usize(&heads_key)?
        } else {
            match self.optional_usize(&format!("{arch}.attention.head_count_kv"))? {
                Some(n) => n,
                None => self.required_usize(&heads_key)?,
            }
        };
        if n_head == 0 || !rows.is_multiple_of(2 * n_head) {
            return Err(FormatError::tensor(
                &self.path,
                name,
                format!(
                    "{rows} rows cannot be split into {n_head} heads of even size to undo \
                     llama.cpp's q/k permutation"
                ),
            ));
        }
        Ok(Some(n_head))
    }

    /// The GGUF tensor behind a Hugging Face name, if the name maps and the tensor exists: a
    /// whole tensor, or one expert's matrix of a stacked 3-D expert tensor (as a 2-D tensor
    /// of its bytes), or of older files its own tensor.
    fn resolve(&self, name: &str) -> Result<Cow<'_, TensorInfo>, FormatError> {
        if let Some(expert) = names::hf_expert_to_gguf(name) {
            if self.tensor_info(&expert.stacked).is_none()
                && let Some(single) = self.tensor_info(&expert.single)
            {
                return Ok(Cow::Borrowed(single));
            }
            return self
                .expert_slice(name, &expert.stacked, expert.expert)
                .map(Cow::Owned);
        }
        let gguf_name = names::hf_to_gguf(name, self.norms()).ok_or_else(|| {
            FormatError::tensor(
                &self.path,
                name,
                "no GGUF tensor corresponds to this name (Tessera maps model.embed_tokens, \
                 model.norm, lm_head and model.layers.N.{input_layernorm, \
                 post_attention_layernorm, pre_feedforward_layernorm, \
                 post_feedforward_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, \
                 self_attn.qkv_proj, mlp.{gate,up,down}_proj, mlp.gate_up_proj, mlp.gate, \
                 mlp.experts.E.*, block_sparse_moe.*})",
            )
        })?;
        self.tensor_info(&gguf_name)
            .map(Cow::Borrowed)
            .ok_or_else(|| {
                FormatError::tensor(
                    &self.path,
                    name,
                    format!("not in the file (looked for {gguf_name})"),
                )
            })
    }

    /// Expert `expert`'s matrix of the stacked tensor `gguf_name` (`[experts, rows, cols]`),
    /// or its vector of a stack of biases (`[experts, n]`).
    fn expert_slice(
        &self,
        name: &str,
        gguf_name: &str,
        expert: usize,
    ) -> Result<TensorInfo, FormatError> {
        let info = self.tensor_info(gguf_name).ok_or_else(|| {
            FormatError::tensor(
                &self.path,
                name,
                format!("not in the file (looked for {gguf_name})"),
            )
        })?;
        let (dims, rows, experts) = match *info.dims.as_slice() {
            [cols, rows, experts] => (vec![cols, rows], rows, experts),
            [n, experts] => (vec![n], 1, experts),
            _ => {
                return Err(FormatError::tensor(
                    &self.path,
                    gguf_name,
                    format!(
                        "expert tensors have 3 dimensions (2 for biases), not {}",
                        info.dims.len()
                    ),
                ));
            }
        };
        if expert >= experts {
            return Err(FormatError::tensor(
                &self.path,
                name,
                format!("expert {expert} is not in {gguf_name} ({experts} experts)"),
            ));
        }
        let matrix = TensorInfo {
            name: info.name.clone(),
            dims,
            ggml_type: info.ggml_type,
            start: info.start,
            n_bytes: 0,
            part: info.part,
        };
        let bytes = Self::row_bytes(&matrix)
            .map(|b| b * rows)
            .filter(|b| b * experts == info.n_bytes)
            .ok_or_else(|| {
                FormatError::tensor(
                    &self.path,
                    gguf_name,
                    "expert matrices are not whole blocks of equal size",
                )
            })?;
        Ok(TensorInfo {
            start: info.start + expert * bytes,
            n_bytes: bytes,
            ..matrix
        })
    }

    /// Where the converter put the norms around the MLP (which moves
    /// `post_attention_layernorm`).
    fn norms(&self) -> names::Norms {
        match self
            .architecture()
            .ok()
            .and_then(Architecture::from_gguf_name)
        {
            Some(Architecture::Gemma2 | Architecture::Gemma3) => names::Norms::Sandwich,
            Some(Architecture::GptOss) => names::Norms::GptOss,
            _ => names::Norms::Plain,
        }
    }

    /// Whether the converter permuted q/k rows (llama.cpp's `LlamaModel`, which also converts
    /// Mistral, Mistral 3 and SmolLM3 checkpoints); Qwen2 is converted without permutation.
    fn permutes_qk(&self) -> bool {
        matches!(
            self.architecture()
                .ok()
                .and_then(Architecture::from_gguf_name),
            Some(Architecture::Llama | Architecture::Mistral | Architecture::SmolLM3)
        )
    }
}

impl WeightSource for GgufFile {
    fn contains(&self, name: &str) -> bool {
        self.resolve(name).is_ok()
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError> {
        Ok(self.resolve(name)?.dims.iter().rev().copied().collect())
    }

    fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError> {
        let resolved = self.resolve(name)?;
        let info: &TensorInfo = &resolved;
        let shape: Vec<usize> = info.dims.iter().rev().copied().collect();
        let mut data = vec![0.0f32; info.elements()];
        self.convert(info, self.tensor_bytes(info), &mut data)?;
        let rows = shape.first().copied().unwrap_or(0);
        if let Some(n_head) = self.permuted_heads(name, info, rows)? {
            data = names::unpermute_rows(&data, rows, n_head);
        }
        Ok(HostTensor { shape, data })
    }

    /// Matrices of every type the kernels multiply directly (F16, BF16, Q8_0, Q4_0, Q4_1,
    /// Q4_K, Q5_K, Q6_K) as their bytes; permuted q/k rows are moved back whole (a row is a
    /// whole number of blocks, so this is exact).
    fn load_native(&self, name: &str) -> Result<Option<NativeTensor>, FormatError> {
        let resolved = self.resolve(name)?;
        let info: &TensorInfo = &resolved;
        let Some(rows) = info.dims.get(1).copied() else {
            return Ok(None);
        };
        self.load_native_slice(name, 0, 0..rows)
    }

    /// Rows are a byte range of the tensor (whole blocks); permuted q/k rows need the range
    /// to hold whole heads, as in [`Self::load_f32_slice`]. Columns are a byte range of every
    /// row when they start and end on block boundaries (`None` otherwise).
    fn load_native_slice(
        &self,
        name: &str,
        dim: usize,
        range: Range<usize>,
    ) -> Result<Option<NativeTensor>, FormatError> {
        let resolved = self.resolve(name)?;
        let info: &TensorInfo = &resolved;
        let Some(format) = info.ggml_type.weight_format() else {
            return Ok(None);
        };
        // Rows that are not whole blocks cannot be cut (the reader refuses such files), and
        // empty rows are not worth it.
        let row_bytes = Self::row_bytes(info).filter(|&b| b > 0);
        let (&[cols, rows], Some(row_bytes)) = (info.dims.as_slice(), row_bytes) else {
            return Ok(None);
        };
        let shape = [rows, cols];
        if split_at_dim(&shape, dim, &range).is_none() {
            return Err(bad_slice(&self.path, name, &shape, dim, &range));
        }
        let bytes = self.tensor_bytes(info);
        if bytes.len() != rows * row_bytes {
            return Err(FormatError::tensor(
                &self.path,
                name,
                format!("{} bytes for {rows} rows of {row_bytes}", bytes.len()),
            ));
        }
        let heads = self.permuted_heads(name, info, rows)?;
        let (shape, bytes) = if dim == 0 {
            let head_rows = heads.map_or(1, |n| rows / n);
            if !range.start.is_multiple_of(head_rows) || !range.len().is_multiple_of(head_rows) {
                return Ok(None);
            }
            let mut out = bytes[range.start * row_bytes..range.end * row_bytes].to_vec();
            if heads.is_some() {
                out = names::unpermute_rows(&out, range.len(), range.len() / head_rows);
            }
            ([range.len(), cols], out)
        } else {
            let (per, block) = (format.block_elements(), format.block_bytes());
            if !range.start.is_multiple_of(per) || !range.end.is_multiple_of(per) {
                return Ok(None);
            }
            let (b0, b1) = (range.start / per * block, range.end / per * block);
            let mut out = Vec::with_capacity(rows * (b1 - b0));
            for row in bytes.chunks_exact(row_bytes) {
                out.extend_from_slice(&row[b0..b1]);
            }
            if let Some(n_head) = heads {
                out = names::unpermute_rows(&out, rows, n_head);
            }
            ([rows, range.len()], out)
        };
        Ok(Some(NativeTensor {
            format,
            shape,
            bytes,
        }))
    }

    /// Rows of a matrix dequantize only their blocks. Columns dequantize every row (one at a
    /// time) and keep the wanted values, so a column slice of a quantized weight reads the
    /// whole tensor but never holds more than one row of it beyond the slice. Permuted q/k
    /// rows are sliced at head boundaries and unpermuted per head.
    fn load_f32_slice(
        &self,
        name: &str,
        dim: usize,
        range: Range<usize>,
    ) -> Result<HostTensor, FormatError> {
        let resolved = self.resolve(name)?;
        let info: &TensorInfo = &resolved;
        let shape: Vec<usize> = info.dims.iter().rev().copied().collect();
        if split_at_dim(&shape, dim, &range).is_none() {
            return Err(bad_slice(&self.path, name, &shape, dim, &range));
        }
        let row_bytes = Self::row_bytes(info);
        let (Some(row_bytes), 2) = (row_bytes, shape.len()) else {
            // Vectors (norms, biases) and unusual layouts: small enough to cut after loading.
            let full = self.load_f32(name)?;
            return full
                .slice(dim, range.clone())
                .ok_or_else(|| bad_slice(&self.path, name, &shape, dim, &range));
        };
        let (rows, cols) = (shape[0], shape[1]);
        let bytes = self.tensor_bytes(info);
        let heads = self.permuted_heads(name, info, rows)?;
        let mut out_shape = shape.clone();
        out_shape[dim] = range.len();
        if dim == 0 {
            let head_rows = heads.map_or(1, |n| rows / n);
            if !range.start.is_multiple_of(head_rows) || !range.len().is_multiple_of(head_rows) {
                let full = self.load_f32(name)?;
                return full
                    .slice(dim, range.clone())
                    .ok_or_else(|| bad_slice(&self.path, name, &shape, dim, &range));
            }
            let mut data = vec![0.0f32; range.len() * cols];
            self.convert(
                info,
                &bytes[range.start * row_bytes..range.end * row_bytes],
                &mut data,
            )?;
            if heads.is_some() {
                data = names::unpermute_rows(&data, range.len(), range.len() / head_rows);
            }
            return Ok(HostTensor {
                shape: out_shape,
                data,
            });
        }
        let mut row = vec![0.0f32; cols];
        let mut data = Vec::with_capacity(rows * range.len());
        for r in 0..rows {
            self.convert(info, &bytes[r * row_bytes..(r + 1) * row_bytes], &mut row)?;
            data.extend_from_slice(&row[range.clone()]);
        }
        if let Some(n_head) = heads {
            data = names::unpermute_rows(&data, rows, n_head);
        }
        Ok(HostTensor {
            shape: out_shape,
            data,
        })
    }
}
