//! Rotary position embeddings in the "rotate half" layout used by transformers' Llama.

/// Cosines and sines for each position: two `[positions.len(), inv_freq.len()]` tables.
pub fn cos_sin(inv_freq: &[f32], positions: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for &f in inv_freq {
            // transformers computes the angle in f32, then cos/sin in f32.
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// Rotates every head of every token in place. `x` is `[tokens, heads, head_dim]` with rows
/// of `row_stride` values (so q and k can be rotated inside a fused qkv buffer), heads starting
/// at `offset` within each row; `cos`/`sin` come from [`cos_sin`] with `head_dim / 2` columns,
/// or fewer: then only each head's first `2 · columns` values rotate (partial rotary).
pub fn apply_rope(
    x: &mut [f32],
    row_stride: usize,
    offset: usize,
    heads: usize,
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
) {
    let tokens = x.len() / row_stride.max(1);
    let Some(half) = cos.len().checked_div(tokens) else {
        return;
    };
    assert!(2 * half <= head_dim && cos.len() == tokens * half);
    for t in 0..tokens {
        let c = &cos[t * half..(t + 1) * half];
        let s = &sin[t * half..(t + 1) * half];
        let row = &mut x[t * row_stride + offset..t * row_stride + offset + heads * head_dim];
        for head in row.chunks_exact_mut(head_dim) {
            rotate_head(&mut head[..2 * half], c, s);
        }
    }
}

/// Rotates one head (`head_dim = 2 · cos.len()` values) in place by one position's angles.
#[inline]
pub fn rotate_head(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (lo, hi) = head.split_at_mut(half);
    for i in 0..half {
        let (a, b) = (lo[i], hi[i]);
        lo[i] = a * cos[i] - b * sin[i];
        hi[i] = b * cos[i] + a * sin[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_rotation_keeps_norm() {
        let inv_freq = [1.0f32, 0.1];
        let (cos, sin) = cos_sin(&inv_freq, &[0, 3]);
        let mut x = vec![1.0f32, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0];
        apply_rope(&mut x, 4, 0, 1, 4, &cos, &sin);
        assert_eq!(&x[..4], &[1.0, 2.0, 3.0, 4.0]);
        let n0: f32 = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| v * v).sum();
        let n1: f32 = x[4..].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-5);
        // Pair (x[0], x[2]) rotates by 3 rad.
        assert!((x[4] - (3f32.cos() - 3.0 * 3f32.sin())).abs() < 1e-6);
    }

    #[test]
    fn partial_rotary_rotates_the_leading_dimensions_only() {
        let (cos, sin) = cos_sin(&[1.0, 0.1], &[5]);
        let x: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let mut got = x.clone();
        // Heads of 8, of which the first 4 rotate.
        apply_rope(&mut got, 8, 0, 1, 8, &cos, &sin);
        let mut want = x[..4].to_vec();
        rotate_head(&mut want, &cos, &sin);
        assert_eq!(&got[..4], &want[..]);
        assert_eq!(&got[4..], &x[4..]);
    }
}
