//! Weights of a Hugging Face model directory: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`, memory-mapped and converted to f32 on request.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors, tensor::Metadata};
use serde::Deserialize;

mod bare;
mod mxfp4;
mod wrapped;

use crate::mmap::map_file;
use crate::weights::{bad_slice, split_at_dim};
use crate::{FormatError, HostTensor, NativeTensor, WeightSource};
use mxfp4::Mxfp4Parts;
use tessera_blocks::{QuantFormat, WeightFormat};

struct Shard {
    path: PathBuf,
    map: Mmap,
    data_start: usize,
    metadata: Metadata,
}

/// Safetensors weights of a model directory.
pub(crate) struct SafetensorsWeights {
    shards: Vec<Shard>,
    /// Tensor name (the decoder's own `*ForCausalLM` name, in a wrapped checkpoint or a bare
    /// base model) → where it is stored.
    index: HashMap<String, Stored>,
    /// Tensors of a wrapped checkpoint's other towers, which are not loaded.
    other_towers: usize,
}

/// Where a tensor is: which shard, under which name.
struct Stored {
    shard: usize,
    name: String,
}

#[derive(Deserialize)]
struct IndexFile {
    weight_map: HashMap<String, String>,
}

impl SafetensorsWeights {
    /// Opens `dir/model.safetensors` or the shards named by `dir/model.safetensors.index.json`.
    pub(crate) fn open(dir: &Path) -> Result<Self, FormatError> {
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let files: Vec<PathBuf> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| FormatError::io(&index_path, e))?;
            let index: IndexFile = serde_json::from_str(&text).map_err(|e| {
                FormatError::invalid(&index_path, format!("invalid safetensors index: {e}"))
            })?;
            let mut names: Vec<String> = index.weight_map.into_values().collect();
            names.sort();
            names.dedup();
            for name in &names {
                if name.contains('/') || name.contains("..") {
                    return Err(FormatError::invalid(
                        &index_path,
                        format!("shard file name {name:?} must be a plain file name"),
                    ));
                }
            }
            names.into_iter().map(|n| dir.join(n)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            return Err(FormatError::Missing {
                path: single,
                hint: "expected model.safetensors or model.safetensors.index.json".into(),
            });
        };
        Self::from_files(files)
    }

    /// Maps the safetensors files `files`, which hold distinct tensors.
    pub(crate) fn from_files(files: Vec<PathBuf>) -> Result<Self, FormatError> {
        let mut shards = Vec::with_capacity(files.len());
        for path in files {
            let map = map_file(&path)?;
            let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|e| {
                FormatError::invalid(&path, format!("truncated or corrupt safetensors file: {e}"))
            })?;
            shards.push(Shard {
                path,
                map,
                data_start: 8 + header_len,
                metadata,
            });
        }
        let stored: Vec<(usize, String)> = shards
            .iter()
            .enumerate()
            .flat_map(|(i, shard)| {
                shard
                    .metadata
                    .offset_keys()
                    .into_iter()
                    .map(move |n| (i, n))
            })
            .collect();
        let names: Vec<&str> = stored.iter().map(|(_, n)| n.as_str()).collect();
        let wrapped = wrapped::is_wrapped(names.iter().copied());
        let bare = bare::is_bare(&names);
        let mut index = HashMap::new();
        let mut other_towers = 0;
        for (shard, name) in stored {
            let key = if wrapped {
                match wrapped::role(&name) {
                    wrapped::Role::Decoder(decoder_name) => decoder_name,
                    wrapped::Role::OtherTower => {
                        other_towers += 1;
                        continue;
                    }
                }
            } else if bare {
                bare::decoder_name(&name)
            } else {
                name.clone()
            };
            index.insert(key, Stored { shard, name });
        }
        Ok(Self {
            shards,
            index,
            other_towers,
        })
    }

    /// How many tensors of a wrapped checkpoint's other towers (vision, projector) are set
    /// aside; 0 for a plain checkpoint.
    pub(crate) fn other_tower_tensors(&self) -> usize {
        self.other_towers
    }

    fn locate(
        &self,
        name: &str,
    ) -> Result<(&Shard, &safetensors::tensor::TensorInfo), FormatError> {
        let stored = self.index.get(name).ok_or_else(|| {
            let path = self
                .shards
                .first()
                .map(|s| s.path.clone())
                .unwrap_or_default();
            FormatError::tensor(path, name, "not found in the checkpoint")
        })?;
        let shard = &self.shards[stored.shard];
        let info = shard
            .metadata
            .info(&stored.name)
            .ok_or_else(|| FormatError::tensor(&shard.path, name, "not found in the shard"))?;
        Ok((shard, info))
    }

    /// A tensor's bytes as stored.
    fn bytes(&self, name: &str) -> Result<&[u8], FormatError> {
        let (shard, info) = self.locate(name)?;
        let (start, end) = info.data_offsets;
        // read_metadata validated the offsets against the file length.
        Ok(&shard.map[shard.data_start + start..shard.data_start + end])
    }

    /// `name`'s parts when it is the `_blocks` half of an MXFP4 tensor (bytes, with a
    /// `_scales` tensor of bytes beside it).
    fn mxfp4(&self, name: &str) -> Result<Option<Mxfp4Parts<'_>>, FormatError> {
        let Some(scales) = mxfp4::scales_name(name).filter(|s| self.index.contains_key(s)) else {
            return Ok(None);
        };
        let (shard, blocks_info) = self.locate(name)?;
        let (_, scales_info) = self.locate(&scales)?;
        if blocks_info.dtype != Dtype::U8 || scales_info.dtype != Dtype::U8 {
            return Ok(None);
        }
        let shape = mxfp4::values_shape(&blocks_info.shape, &scales_info.shape)
            .map_err(|m| FormatError::tensor(&shard.path, name, m))?;
        Ok(Some(Mxfp4Parts {
            blocks: self.bytes(name)?,
            scales: self.bytes(&scales)?,
            shape,
        }))
    }
}

impl WeightSource for SafetensorsWeights {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError> {
        if let Some(parts) = self.mxfp4(name)? {
            return Ok(parts.shape);
        }
        Ok(self.locate(name)?.1.shape.clone())
    }

    fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError> {
        if let Some(parts) = self.mxfp4(name)? {
            let mut data = vec![0.0; parts.shape.iter().product()];
            let path = &self.locate(name)?.0.path;
            tessera_blocks::dequantize(QuantFormat::MXFP4, &parts.ggml_bytes(), &mut data)
                .map_err(|e| FormatError::tensor(path, name, e.to_string()))?;
            return Ok(HostTensor {
                shape: parts.shape,
                data,
            });
        }
        let (shard, info) = self.locate(name)?;
        let bytes = self.bytes(name)?;
        let mut data = Vec::with_capacity(info.shape.iter().product());
        convert(info.dtype, bytes, &mut data)
            .map_err(|m| FormatError::tensor(&shard.path, name, m))?;
        Ok(HostTensor {
            shape: info.shape.clone(),
            data,
        })
    }

    fn load_f32_slice(
        &self,
        name: &str,
        dim: usize,
        range: Range<usize>,
    ) -> Result<HostTensor, FormatError> {
        if self.mxfp4(name)?.is_some() {
            let t = self.load_f32(name)?;
            return t
                .slice(dim, range.clone())
                .ok_or_else(|| bad_slice("", name, &t.shape, dim, &range));
        }
        let (shard, info) = self.locate(name)?;
        let (outer, len, inner) = split_at_dim(&info.shape, dim, &range)
            .ok_or_else(|| bad_slice(&shard.path, name, &info.shape, dim, &range))?;
        let width = info.dtype.bitsize() / 8;
        let tensor = &shard.map[shard.data_start + info.data_offsets.0..];
        let mut data = Vec::with_capacity(outer * range.len() * inner);
        // Only the bytes of the slice are touched: one contiguous run per outer index.
        for o in 0..outer {
            let first = (o * len + range.start) * inner * width;
            let last = (o * len + range.end) * inner * width;
            convert(info.dtype, &tensor[first..last], &mut data)
                .map_err(|m| FormatError::tensor(&shard.path, name, m))?;
        }
        let mut shape = info.shape.clone();
        shape[dim] = range.len();
        Ok(HostTensor { shape, data })
    }

    /// MXFP4 tensors only (as `[rows, values per row]`, rows being every outer index): the
    /// float dtypes are read as f32.
    fn load_native(&self, name: &str) -> Result<Option<NativeTensor>, FormatError> {
        let Some(parts) = self.mxfp4(name)? else {
            return Ok(None);
        };
        let cols = parts.shape.last().copied().unwrap_or(0);
        Ok(Some(NativeTensor {
            format: WeightFormat::MXFP4,
            shape: [parts.shape.iter().product::<usize>() / cols.max(1), cols],
            bytes: parts.ggml_bytes(),
        }))
    }
}

/// Appends the values of `bytes` (little-endian `dtype`) to `out` as f32.
fn convert(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) -> Result<(), String> {
    match dtype {
        Dtype::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        Dtype::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        Dtype::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        other => {
            return Err(format!(
                "dtype {other:?} is not supported; expected F32, F16 or BF16"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_safetensors(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| {
                (
                    n.to_string(),
                    safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    /// An MXFP4 pair reads under its `_blocks` name as values and as ggml blocks; its
    /// `_scales` half and a `_blocks` tensor without one read as they are stored.
    #[test]
    fn reads_mxfp4_blocks_with_their_scales() {
        let dir = tempfile::tempdir().unwrap();
        // Two rows of one block: row 0 holds index k % 16 at value k (checkpoint order: value
        // 2j in byte j's low nibble), row 1 index 1 (0.5) everywhere.
        let mut blocks: Vec<u8> = (0..16u8)
            .map(|j| ((2 * j) % 16) | (((2 * j + 1) % 16) << 4))
            .collect();
        blocks.extend([0x11u8; 16]);
        write_safetensors(
            &dir.path().join("model.safetensors"),
            &[
                ("e.w_blocks", Dtype::U8, vec![2, 1, 16], blocks),
                ("e.w_scales", Dtype::U8, vec![2, 1], vec![127, 129]),
                ("lone_blocks", Dtype::U8, vec![1, 1], vec![7]),
            ],
        );
        let w = SafetensorsWeights::open(dir.path()).unwrap();
        assert_eq!(w.shape("e.w_blocks").unwrap(), [2, 32]);
        let t = w.load_f32("e.w_blocks").unwrap();
        let fp4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let row0: Vec<f32> = (0..32)
            .map(|k| fp4[k % 8] * if k % 16 >= 8 { -1.0 } else { 1.0 })
            .collect();
        assert_eq!(&t.data[..32], &row0[..]);
        assert_eq!(&t.data[32..], &[2.0; 32][..], "0.5 · 2^(129 - 127)");
        let native = w.load_native("e.w_blocks").unwrap().unwrap();
        assert_eq!(
            (native.format, native.shape),
            (WeightFormat::MXFP4, [2, 32])
        );
        let mut values = vec![0.0; 64];
        tessera_blocks::dequantize(QuantFormat::MXFP4, &native.bytes, &mut values).unwrap();
        assert_eq!(values, t.data);
        let sliced = w.load_f32_slice("e.w_blocks", 1, 8..16).unwrap();
        assert_eq!(sliced.shape, [2, 8]);
        assert_eq!(&sliced.data[..8], &row0[8..16]);
        assert!(w.load_native("e.w_scales").unwrap().is_none());
        assert!(w.load_native("lone_blocks").unwrap().is_none());
        assert_eq!(w.shape("lone_blocks").unwrap(), [1, 1]);
    }

    #[test]
    fn reads_f32_f16_bf16() {
        let dir = tempfile::tempdir().unwrap();
        let f32s: Vec<u8> = [1.0f32, -2.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f16s: Vec<u8> = [f16::from_f32(0.5), f16::from_f32(3.0)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bf16s: Vec<u8> = [bf16::from_f32(-1.0), bf16::from_f32(8.0)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        write_safetensors(
            &dir.path().join("model.safetensors"),
            &[
                ("a", Dtype::F32, vec![2], f32s),
                ("b", Dtype::F16, vec![1, 2], f16s),
                ("c", Dtype::BF16, vec![2, 1], bf16s),
            ],
        );
        let w = SafetensorsWeights::open(dir.path()).unwrap();
        assert_eq!(w.load_f32("a").unwrap().data, vec![1.0, -2.5]);
        assert_eq!(w.load_f32("b").unwrap().data, vec![0.5, 3.0]);
        let c = w.load_f32("c").unwrap();
        assert_eq!((c.shape, c.data), (vec![2, 1], vec![-1.0, 8.0]));
        let err = w.load_f32("missing").unwrap_err().to_string();
        assert!(
            err.contains("missing") && err.contains("model.safetensors"),
            "{err}"
        );
    }

    #[test]
    fn slices_read_only_their_part() {
        let dir = tempfile::tempdir().unwrap();
        let vals: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let f32s: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf16s: Vec<u8> = vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        write_safetensors(
            &dir.path().join("model.safetensors"),
            &[
                ("a", Dtype::F32, vec![3, 4], f32s),
                ("b", Dtype::BF16, vec![3, 4], bf16s),
            ],
        );
        let w = SafetensorsWeights::open(dir.path()).unwrap();
        for name in ["a", "b"] {
            let full = w.load_f32(name).unwrap();
            for (dim, range) in [(0, 1..3), (1, 1..3), (1, 0..4), (0, 0..0)] {
                let s = w.load_f32_slice(name, dim, range.clone()).unwrap();
                assert_eq!(s, full.slice(dim, range).unwrap(), "{name} {dim}");
            }
            let err = w.load_f32_slice(name, 1, 3..5).unwrap_err().to_string();
            assert!(err.contains("3..5") && err.contains("[3, 4]"), "{err}");
        }
    }

    #[test]
    fn truncated_file_names_file_and_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let bytes: Vec<u8> = [1.0f32; 16].iter().flat_map(|v| v.to_le_bytes()).collect();
        write_safetensors(&path, &[("a", Dtype::F32, vec![16], bytes)]);
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&path, &full[..full.len() - 10]).unwrap();
        let err = SafetensorsWeights::open(dir.path())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("model.safetensors") && err.contains("truncated"),
            "{err}"
        );
        std::fs::write(&path, b"garbage").unwrap();
        let err = SafetensorsWeights::open(dir.path())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("corrupt"), "{err}");
    }

    #[test]
    fn unsupported_dtype_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write_safetensors(
            &dir.path().join("model.safetensors"),
            &[("i", Dtype::I32, vec![1], vec![0, 0, 0, 0])],
        );
        let w = SafetensorsWeights::open(dir.path()).unwrap();
        let err = w.load_f32("i").unwrap_err().to_string();
        assert!(err.contains("I32") && err.contains("\"i\""), "{err}");
    }

    #[test]
    fn missing_weights_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = SafetensorsWeights::open(dir.path())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("model.safetensors"), "{err}");
    }
}
