//! MXFP4 tensors of a Hugging Face checkpoint (`quant_method: mxfp4`, gpt-oss's experts): a
//! tensor `{stem}_blocks` of bytes shaped `[..., groups, 16]` (two E2M1 values per byte) beside
//! `{stem}_scales` shaped `[..., groups]` (one E8M0 exponent per 32 values). Read under the
//! `_blocks` name, as a tensor of values shaped `[..., groups · 32]`.

use tessera_blocks::{BlockMXFP4, QK_MXFP4};

/// One MXFP4 tensor's two parts, as stored.
pub(super) struct Mxfp4Parts<'a> {
    pub(super) blocks: &'a [u8],
    pub(super) scales: &'a [u8],
    /// The values' shape: the blocks' shape with its last two dimensions multiplied out.
    pub(super) shape: Vec<usize>,
}

/// The `_scales` name beside an MXFP4 `_blocks` name, if `name` is one.
pub(super) fn scales_name(name: &str) -> Option<String> {
    name.strip_suffix("_blocks")
        .map(|stem| format!("{stem}_scales"))
}

/// The values' shape of blocks shaped `blocks` with scales shaped `scales`, or why they do
/// not pair.
pub(super) fn values_shape(blocks: &[usize], scales: &[usize]) -> Result<Vec<usize>, String> {
    match blocks.split_last() {
        Some((&16, outer)) if outer == scales && !outer.is_empty() => {
            let mut shape = outer.to_vec();
            if let Some(last) = shape.last_mut() {
                *last *= QK_MXFP4;
            }
            Ok(shape)
        }
        _ => Err(format!(
            "MXFP4 blocks shaped {blocks:?} do not pair with scales shaped {scales:?}: \
             expected [..., groups, 16] and [..., groups]"
        )),
    }
}

impl Mxfp4Parts<'_> {
    /// The tensor as ggml `block_mxfp4`s (GGUF's MXFP4 layout), block after block.
    pub(super) fn ggml_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.scales.len() * size_of::<BlockMXFP4>());
        for (packed, &scale) in self.blocks.chunks_exact(QK_MXFP4 / 2).zip(self.scales) {
            let mut bytes = [0u8; QK_MXFP4 / 2];
            bytes.copy_from_slice(packed);
            let block = BlockMXFP4::from_checkpoint(scale, &bytes);
            // `block_mxfp4`'s layout: the scale byte, then the indices.
            out.push(block.e);
            out.extend_from_slice(&block.qs);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_pair_only_as_transformers_writes_them() {
        assert_eq!(
            values_shape(&[4, 64, 2, 16], &[4, 64, 2]),
            Ok(vec![4, 64, 64])
        );
        assert!(values_shape(&[4, 64, 2, 8], &[4, 64, 2]).is_err());
        assert!(values_shape(&[4, 64, 2, 16], &[4, 64, 3]).is_err());
        assert!(values_shape(&[16], &[]).is_err());
        assert_eq!(
            scales_name("model.layers.0.mlp.experts.down_proj_blocks").as_deref(),
            Some("model.layers.0.mlp.experts.down_proj_scales")
        );
        assert_eq!(scales_name("model.norm.weight"), None);
    }
}
