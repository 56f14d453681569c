//! Tessera shard.
