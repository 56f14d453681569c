//! Which part of each weight a rank holds.
//!
//! Attention is split by KV groups (one KV head and the query heads that read it). With no
//! more ranks than KV heads, the groups are dealt out as evenly as possible (the first ranks
//! take one more when they do not divide: SmolLM2's 3 KV heads over 2 ranks give 2 + 1). With
//! more ranks than KV heads, each KV head is replicated on `N / num_kv_heads` consecutive
//! ranks that split its query heads, as vLLM does; that needs `N` to be a multiple of the KV
//! heads and the group's query heads to divide evenly. The MLP's intermediate rows and the
//! vocabulary are dealt out the same balanced way.

use std::ops::Range;

use tessera_model_files::ModelConfig;

/// A rank's place in the tensor-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
}

/// A dimension of the model that cannot be split over the requested shard count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot split {dimension} over {world_size} shards{detail}; allowed shard counts for this model: {}",
    allowed.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
)]
pub struct PartitionError {
    /// The config field that does not split (`num_key_value_heads`, …), with its value.
    pub dimension: String,
    /// The requested number of shards.
    pub world_size: usize,
    /// Why, when it is not obvious.
    pub detail: String,
    /// Shard counts that work for this model.
    pub allowed: Vec<usize>,
}

/// The attention heads a rank holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadSplit {
    /// Query heads.
    pub q: Range<usize>,
    /// KV heads (one replicated head when there are more ranks than KV heads).
    pub kv: Range<usize>,
}

impl Partition {
    /// The single-process partition.
    pub const SINGLE: Partition = Partition {
        rank: 0,
        world_size: 1,
    };

    /// Rank `rank` of `world_size`.
    pub fn new(rank: usize, world_size: usize) -> Self {
        Self { rank, world_size }
    }

    /// This rank's part of `0..n`: balanced, the first `n % N` ranks take one more.
    pub fn split(&self, n: usize) -> Range<usize> {
        split(n, self.world_size, self.rank)
    }

    /// The sizes of every rank's part of `0..n`, by rank.
    pub fn counts(&self, n: usize) -> Vec<usize> {
        (0..self.world_size)
            .map(|r| split(n, self.world_size, r).len())
            .collect()
    }

    /// Checks that every split dimension of `config` divides over this group.
    pub fn check(&self, config: &ModelConfig) -> Result<(), PartitionError> {
        let n = self.world_size;
        let error = |dimension: String, detail: String| PartitionError {
            dimension,
            world_size: n,
            detail,
            allowed: allowed_shard_counts(config),
        };
        if n == 0 || self.rank >= n {
            return Err(error(
                format!("rank {}", self.rank),
                " (the rank must be below the shard count)".into(),
            ));
        }
        let (nh, nkv) = (config.num_heads, config.num_kv_heads);
        if !heads_split(nh, nkv, n) {
            let detail = if n > nh {
                format!(" (more shards than the {nh} attention heads)")
            } else {
                format!(
                    " (more shards than KV heads needs a multiple of {nkv} shards that also \
                     divides each KV head's {} query heads)",
                    nh / nkv.max(1)
                )
            };
            return Err(error(format!("num_key_value_heads = {nkv}"), detail));
        }
        if n > config.intermediate_size {
            return Err(error(
                format!("intermediate_size = {}", config.intermediate_size),
                String::new(),
            ));
        }
        if n > config.vocab_size {
            return Err(error(
                format!("vocab_size = {}", config.vocab_size),
                String::new(),
            ));
        }
        Ok(())
    }

    /// The attention heads of this rank (call [`Partition::check`] first).
    pub fn heads(&self, config: &ModelConfig) -> HeadSplit {
        let (nh, nkv, n) = (config.num_heads, config.num_kv_heads, self.world_size);
        let group = nh / nkv.max(1);
        if n <= nkv {
            let kv = self.split(nkv);
            HeadSplit {
                q: kv.start * group..kv.end * group,
                kv,
            }
        } else {
            let replicas = n / nkv;
            let kv = self.rank / replicas;
            let per = group / replicas;
            let first = kv * group + (self.rank % replicas) * per;
            HeadSplit {
                q: first..first + per,
                kv: kv..kv + 1,
            }
        }
    }
}

fn split(n: usize, parts: usize, i: usize) -> Range<usize> {
    let (base, extra) = (n / parts, n % parts);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

fn heads_split(nh: usize, nkv: usize, n: usize) -> bool {
    if nkv == 0 || !nh.is_multiple_of(nkv) || n == 0 {
        return false;
    }
    n <= nkv || (n.is_multiple_of(nkv) && (nh / nkv).is_multiple_of(n / nkv))
}

/// Shard counts that split every dimension of `config`.
pub fn allowed_shard_counts(config: &ModelConfig) -> Vec<usize> {
    (1..=config.num_heads)
        .filter(|&n| {
            heads_split(config.num_heads, config.num_kv_heads, n)
                && n <= config.intermediate_size
                && n <= config.vocab_size
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model_files::Architecture;

    fn config(num_heads: usize, num_kv_heads: usize) -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Llama,
            vocab_size: 512,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 1,
            num_heads,
            num_kv_heads,
            head_dim: 16,
            rms_norm_eps: 1e-5,
            rope_theta: 1e4,
            rope_scaling: None,
            max_position_embeddings: 64,
            tie_word_embeddings: false,
            sliding_window: None,
            attention_bias: false,
            dtype: None,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            family: tessera_model_files::Family::llama(1, 16, None),
            score_labels: None,
        }
    }

    #[test]
    fn splits_are_balanced_and_cover_everything() {
        for n in [1, 2, 3, 7] {
            for len in [0, 1, 9, 49152, 1537] {
                let p = Partition::new(0, n);
                let parts: Vec<_> = (0..n).map(|r| Partition::new(r, n).split(len)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[n - 1].end, len);
                assert!(parts.windows(2).all(|w| w[0].end == w[1].start));
                let counts = p.counts(len);
                assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
            }
        }
    }

    #[test]
    fn heads_follow_groups_and_replicate_like_vllm() {
        let mut c = config(9, 3);
        let heads = |r, n| Partition::new(r, n).heads(&c);
        assert_eq!(heads(0, 2), HeadSplit { q: 0..6, kv: 0..2 });
        assert_eq!(heads(1, 2), HeadSplit { q: 6..9, kv: 2..3 });
        assert_eq!(heads(2, 3), HeadSplit { q: 6..9, kv: 2..3 });
        assert_eq!(heads(4, 9), HeadSplit { q: 4..5, kv: 1..2 });
        assert_eq!(allowed_shard_counts(&c), [1, 2, 3, 9]);
        let err = Partition::new(0, 6).check(&c).unwrap_err().to_string();
        assert!(
            err.contains("num_key_value_heads = 3") && err.contains("1, 2, 3, 9"),
            "{err}"
        );
        c = config(4, 2);
        assert_eq!(allowed_shard_counts(&c), [1, 2, 4]);
        assert_eq!(
            Partition::new(3, 4).heads(&c),
            HeadSplit { q: 3..4, kv: 1..2 }
        );
        assert!(Partition::new(0, 3).check(&c).is_err());
    }
}
