//! The GGUF parser: header, metadata, tensor infos. Every read is bounds-checked against the
//! file, and every count is checked against the bytes that remain before anything is
//! allocated, so a corrupt file yields an error naming the problem, never a panic or a huge
//! allocation.

use std::collections::HashMap;
use std::path::Path;

use super::metadata::MetadataValue;
use super::types::GgmlType;
use crate::FormatError;

/// GGUF's default data alignment when `general.alignment` is absent.
pub(crate) const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: usize = 4;
/// Arrays nested deeper than this are rejected (real files nest at most 2 levels).
const MAX_ARRAY_DEPTH: usize = 8;

/// Where one tensor lives in the file and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions as GGUF stores them, innermost (contiguous) first.
    pub dims: Vec<usize>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the file.
    pub start: usize,
    /// Size of the data in bytes.
    pub n_bytes: usize,
    /// Which file of a split GGUF holds the data (0: the first, or the only one).
    pub part: usize,
}

impl TensorInfo {
    /// Number of values.
    pub fn elements(&self) -> usize {
        self.dims.iter().product()
    }
}

/// Everything in a GGUF file but the tensor data.
pub(crate) struct Parsed {
    pub version: u32,
    pub metadata: Vec<(String, MetadataValue)>,
    pub metadata_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: usize,
    pub data_offset: usize,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn invalid(&self, message: impl Into<String>) -> FormatError {
        FormatError::invalid(self.path, message)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes; `what` describes them for the truncation message.
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], FormatError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let bytes = &self.buf[self.pos..end];
                self.pos = end;
                Ok(bytes)
            }
            None => Err(self.invalid(format!(
                "truncated: {} needs bytes {}..{} but the file has {}",
                what(),
                self.pos,
                self.pos as u128 + n as u128,
                self.buf.len()
            ))),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], FormatError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, FormatError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed string; the length is checked against the file before copying.
    fn string_bytes(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8], FormatError> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        // `take` checks the length against the file before anything is copied.
        self.take(usize::try_from(len).unwrap_or(usize::MAX), what)
    }

    /// A string that must be UTF-8 (keys and tensor names).
    fn name(&mut self, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let bytes = self.string_bytes(what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.invalid(format!("{} is not valid UTF-8", what())))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what remains.
    fn check_count(
        &self,
        count: u64,
        min_size: usize,
        what: &dyn Fn() -> String,
    ) -> Result<usize, FormatError> {
        let needed = (count as u128) * (min_size as u128);
        if needed > self.remaining() as u128 {
            return Err(self.invalid(format!(
                "truncated or corrupt: {} declares {count} entries, which need at least {needed} \
                 bytes, but only {} bytes remain after offset {}",
                what(),
                self.remaining(),
                self.pos
            )));
        }
        Ok(count as usize)
    }

    fn value(
        &mut self,
        value_type: u32,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<MetadataValue, FormatError> {
        use MetadataValue as V;
        Ok(match value_type {
            0 => V::U8(u8::from_le_bytes(self.array(what)?)),
            1 => V::I8(i8::from_le_bytes(self.array(what)?)),
            2 => V::U16(u16::from_le_bytes(self.array(what)?)),
            3 => V::I16(i16::from_le_bytes(self.array(what)?)),
            4 => V::U32(u32::from_le_bytes(self.array(what)?)),
            5 => V::I32(i32::from_le_bytes(self.array(what)?)),
            6 => V::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => V::Bool(false),
                1 => V::Bool(true),
                b => return Err(self.invalid(format!("{} is a bool with value {b}", what()))),
            },
            8 => V::String(String::from_utf8_lossy(self.string_bytes(what)?).into_owned()),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.invalid(format!(
                        "{} nests arrays deeper than {MAX_ARRAY_DEPTH} levels",
                        what()
                    )));
                }
                let elem_type = self.u32(&|| format!("the element type of {}", what()))?;
                let min_size = min_value_size(elem_type).ok_or_else(|| {
                    self.invalid(format!("{} has unknown element type {elem_type}", what()))
                })?;
                let count = self.u64(&|| format!("the length of {}", what()))?;
                let count = self.check_count(count, min_size, what)?;
                let mut items = Vec::with_capacity(count);
                for i in 0..count {
                    items.push(self.value(elem_type, depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                V::Array(items)
            }
            10 => V::U64(u64::from_le_bytes(self.array(what)?)),
            11 => V::I64(i64::from_le_bytes(self.array(what)?)),
            12 => V::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(self.invalid(format!("{} has unknown value type {other}", what())));
            }
        })
    }
}

/// The fewest bytes a value of this GGUF type can occupy, or `None` for an unknown type.
fn min_value_size(value_type: u32) -> Option<usize> {
    match value_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        8 | 10..=12 => Some(8),
        9 => Some(12),
        _ => None,
    }
}

/// Parses everything up to the data section and checks every tensor against the file size.
pub(crate) fn parse(buf: &[u8], path: &Path) -> Result<Parsed, FormatError> {
    let mut r = Reader { buf, pos: 0, path };
    let version = read_version(&mut r)?;
    let tensor_count = r.u64(&|| "the tensor count".into())?;
    let kv_count = r.u64(&|| "the metadata count".into())?;
    // A key/value needs at least an 8-byte key length, a 4-byte type and a 1-byte value.
    let kv_count = r.check_count(kv_count, 13, &|| "the header's metadata count".into())?;
    let (metadata, metadata_index) = read_metadata(&mut r, kv_count)?;
    let alignment = metadata_alignment(&r, &metadata, &metadata_index)?;
    // A tensor info needs at least an 8-byte name length, n_dims, a type and an offset.
    let tensor_count = r.check_count(tensor_count, 24, &|| "the header's tensor count".into())?;
    let (infos, tensor_index) = read_tensor_infos(&mut r, tensor_count, alignment)?;
    let data_offset = r.pos.div_ceil(alignment) * alignment;
    let tensors = locate_tensors(&r, infos, data_offset)?;
    Ok(Parsed {
        version,
        metadata,
        metadata_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

/// Checks the GGUF magic and returns the version, naming why an unreadable version is.
fn read_version(r: &mut Reader<'_>) -> Result<u32, FormatError> {
    let magic = r.array::<4>(&|| "the GGUF magic".into())?;
    if &magic != b"GGUF" {
        return Err(r.invalid(format!(
            "not a GGUF file: expected magic \"GGUF\", found {:?}",
            String::from_utf8_lossy(&magic)
        )));
    }
    let version = r.u32(&|| "the GGUF version".into())?;
    match version {
        2 | 3 => Ok(version),
        1 => Err(r.invalid(
            "GGUF version 1 is not supported (Tessera reads versions 2 and 3); \
             re-convert the model with a current llama.cpp",
        )),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => Err(r.invalid(format!(
            "big-endian GGUF (version {}) is not supported; use a little-endian file",
            v.swap_bytes()
        ))),
        v => Err(r.invalid(format!(
            "unsupported GGUF version {v} (Tessera reads versions 2 and 3)"
        ))),
    }
}

/// Metadata entries in file order, and each key's position among them.
type MetadataTable = (Vec<(String, MetadataValue)>, HashMap<String, usize>);

/// Reads `kv_count` metadata entries, rejecting a key that appears twice.
fn read_metadata(r: &mut Reader<'_>, kv_count: usize) -> Result<MetadataTable, FormatError> {
    let mut metadata = Vec::with_capacity(kv_count);
    let mut metadata_index = HashMap::with_capacity(kv_count);
    for i in 0..kv_count {
        let key = r.name(&|| format!("the key of metadata entry #{i}"))?;
        let value_type = r.u32(&|| format!("the type of metadata {key}"))?;
        let value = r.value(value_type, 0, &|| format!("metadata {key}"))?;
        if metadata_index.insert(key.clone(), i).is_some() {
            return Err(r.invalid(format!("metadata key {key} appears twice")));
        }
        metadata.push((key, value));
    }
    Ok((metadata, metadata_index))
}

/// `general.alignment`, or [`DEFAULT_ALIGNMENT`] when absent.
fn metadata_alignment(
    r: &Reader<'_>,
    metadata: &[(String, MetadataValue)],
    metadata_index: &HashMap<String, usize>,
) -> Result<usize, FormatError> {
    let Some(&i) = metadata_index.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let value = &metadata[i].1;
    match value.as_u64() {
        Some(a) if a.is_power_of_two() && a <= 1 << 20 => Ok(a as usize),
        _ => Err(r.invalid(format!(
            "general.alignment must be a power of two up to 1 MiB, found {value:?}"
        ))),
    }
}

/// A tensor info as the file states it, its offset still relative to the data section.
struct TensorEntry {
    name: String,
    dims: Vec<usize>,
    ggml_type: GgmlType,
    offset: u64,
    n_bytes: usize,
}

/// Reads `tensor_count` tensor infos, checking each one's type, shape, alignment and name.
fn read_tensor_infos(
    r: &mut Reader<'_>,
    tensor_count: usize,
    alignment: usize,
) -> Result<(Vec<TensorEntry>, HashMap<String, usize>), FormatError> {
    let mut infos = Vec::with_capacity(tensor_count);
    let mut tensor_index = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let name = r.name(&|| format!("the name of tensor #{i}"))?;
        let (dims, type_id, offset) = tensor_header(r, &name)?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            r.invalid(format!(
                "tensor {name} has unknown ggml type {type_id}; this reader knows the types of \
                 ggml as of 2025 and converts {}",
                GgmlType::SUPPORTED
            ))
        })?;
        let n_bytes = tensor_bytes(&dims, ggml_type)
            .map_err(|message| r.invalid(format!("tensor {name}: {message}")))?;
        if offset % alignment as u64 != 0 {
            return Err(r.invalid(format!(
                "tensor {name}: data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        if tensor_index.insert(name.clone(), i).is_some() {
            return Err(r.invalid(format!("tensor {name} appears twice")));
        }
        infos.push(TensorEntry {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        });
    }
    Ok((infos, tensor_index))
}

/// Places each tensor after the data section's start, checking that its bytes are in the file.
fn locate_tensors(
    r: &Reader<'_>,
    infos: Vec<TensorEntry>,
    data_offset: usize,
) -> Result<Vec<TensorInfo>, FormatError> {
    let buf = r.buf;
    let mut tensors = Vec::with_capacity(infos.len());
    for TensorEntry {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes,
    } in infos
    {
        let start = data_offset as u128 + offset as u128;
        let end = start + n_bytes as u128;
        if end > buf.len() as u128 {
            return Err(r.invalid(format!(
                "truncated: tensor {name} needs bytes {start}..{end} but the file has {}",
                buf.len()
            )));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            start: start as usize,
            n_bytes,
            part: 0,
        });
    }
    Ok(tensors)
}

/// Reads a tensor info's dimensions, type id and offset.
fn tensor_header(r: &mut Reader<'_>, name: &str) -> Result<(Vec<usize>, u32, u64), FormatError> {
    let n_dims = r.u32(&|| format!("the dimension count of tensor {name}"))? as usize;
    if n_dims > MAX_DIMS {
        return Err(r.invalid(format!(
            "tensor {name} has {n_dims} dimensions; ggml allows at most {MAX_DIMS}"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims);
    for d in 0..n_dims {
        let dim = r.u64(&|| format!("dimension {d} of tensor {name}"))?;
        let dim = usize::try_from(dim)
            .ok()
            .filter(|&d| d <= i64::MAX as usize);
        dims.push(
            dim.ok_or_else(|| r.invalid(format!("tensor {name}: dimension {d} is out of range")))?,
        );
    }
    let type_id = r.u32(&|| format!("the type of tensor {name}"))?;
    let offset = r.u64(&|| format!("the data offset of tensor {name}"))?;
    Ok((dims, type_id, offset))
}

/// The byte size of a tensor, or why its shape does not fit its type.
fn tensor_bytes(dims: &[usize], ggml_type: GgmlType) -> Result<usize, String> {
    let elements = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("dimensions {dims:?} overflow"))?;
    let block = ggml_type.block_elements();
    let inner = dims.first().copied().unwrap_or(1);
    if inner % block != 0 {
        return Err(format!(
            "innermost dimension {inner} is not a multiple of the {ggml_type} block size {block}"
        ));
    }
    (elements / block)
        .checked_mul(ggml_type.block_bytes())
        .ok_or_else(|| format!("dimensions {dims:?} overflow"))
}
