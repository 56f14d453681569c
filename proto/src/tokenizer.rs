//! The tokenizer's sources on the wire, both ways: what a shard reads from the model's files
//! and the router builds its tokenizer from.
//!
//! Paths travel as text (a path that is not UTF-8 is sent lossily): they only name files in
//! errors, the receiver never opens them.

use std::path::PathBuf;

use tessera_text::{GgufTokenizerSpec, HfTokenizerFiles, TokenizerSource};

use crate::v1 as pb;

/// A `TokenizerResponse` that holds no source (neither `hf_files` nor `gguf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the shard's TokenizerResponse holds no source (neither hf_files nor gguf)")]
pub struct MissingTokenizerSource;

impl From<TokenizerSource> for pb::TokenizerResponse {
    fn from(source: TokenizerSource) -> Self {
        let source = match source {
            TokenizerSource::HfFiles(files) => {
                pb::tokenizer_response::Source::HfFiles(pb::HfTokenizerFiles {
                    dir: files.dir.to_string_lossy().into_owned(),
                    tokenizer_json: files.tokenizer_json,
                    tokenizer_config_json: files.tokenizer_config_json,
                    chat_template_jinja: files.chat_template_jinja,
                    eos_token_ids: files.eos_token_ids,
                })
            }
            TokenizerSource::Gguf { path, spec } => {
                pb::tokenizer_response::Source::Gguf(gguf_to_wire(&path, spec))
            }
        };
        Self {
            source: Some(source),
        }
    }
}

impl TryFrom<pb::TokenizerResponse> for TokenizerSource {
    type Error = MissingTokenizerSource;

    fn try_from(response: pb::TokenizerResponse) -> Result<Self, Self::Error> {
        Ok(match response.source.ok_or(MissingTokenizerSource)? {
            pb::tokenizer_response::Source::HfFiles(files) => {
                TokenizerSource::HfFiles(HfTokenizerFiles {
                    dir: PathBuf::from(files.dir),
                    tokenizer_json: files.tokenizer_json,
                    tokenizer_config_json: files.tokenizer_config_json,
                    chat_template_jinja: files.chat_template_jinja,
                    eos_token_ids: files.eos_token_ids,
                })
            }
            pb::tokenizer_response::Source::Gguf(gguf) => gguf_from_wire(gguf),
        })
    }
}

fn gguf_to_wire(path: &std::path::Path, spec: GgufTokenizerSpec) -> pb::GgufTokenizer {
    pb::GgufTokenizer {
        path: path.to_string_lossy().into_owned(),
        model: spec.model,
        pre: spec.pre,
        tokens: spec.tokens,
        token_types: spec.token_types.map(|values| pb::Int32List { values }),
        scores: spec.scores.map(|values| pb::FloatList { values }),
        merges: spec.merges.map(|values| pb::StringList { values }),
        bos_id: spec.bos_id,
        eos_id: spec.eos_id,
        unk_id: spec.unk_id,
        pad_id: spec.pad_id,
        add_bos: spec.add_bos,
        add_eos: spec.add_eos,
        add_space_prefix: spec.add_space_prefix,
        chat_template: spec.chat_template,
    }
}

fn gguf_from_wire(gguf: pb::GgufTokenizer) -> TokenizerSource {
    TokenizerSource::Gguf {
        path: PathBuf::from(gguf.path),
        spec: GgufTokenizerSpec {
            model: gguf.model,
            pre: gguf.pre,
            tokens: gguf.tokens,
            token_types: gguf.token_types.map(|list| list.values),
            scores: gguf.scores.map(|list| list.values),
            merges: gguf.merges.map(|list| list.values),
            bos_id: gguf.bos_id,
            eos_id: gguf.eos_id,
            unk_id: gguf.unk_id,
            pad_id: gguf.pad_id,
            add_bos: gguf.add_bos,
            add_eos: gguf.add_eos,
            add_space_prefix: gguf.add_space_prefix,
            chat_template: gguf.chat_template,
        },
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// `source` encoded to bytes as the shard sends it, and decoded as the router reads it.
    fn over_the_wire(source: TokenizerSource) -> TokenizerSource {
        let bytes = pb::TokenizerResponse::from(source).encode_to_vec();
        let response = pb::TokenizerResponse::decode(bytes.as_slice()).unwrap();
        TokenizerSource::try_from(response).unwrap()
    }

    fn hf_files(optional: Option<&str>) -> TokenizerSource {
        TokenizerSource::HfFiles(HfTokenizerFiles {
            dir: PathBuf::from("/models/tiny"),
            tokenizer_json: r#"{"version": "1.0"}"#.into(),
            tokenizer_config_json: optional.map(str::to_owned),
            chat_template_jinja: optional.map(|t| format!("{t} jinja")),
            eos_token_ids: vec![7, 2],
        })
    }

    fn gguf(lists: Option<usize>) -> TokenizerSource {
        let list = |f: fn(usize) -> String| lists.map(|n| (0..n).map(f).collect::<Vec<_>>());
        TokenizerSource::Gguf {
            path: PathBuf::from("/models/tiny.gguf"),
            spec: GgufTokenizerSpec {
                model: "llama".into(),
                pre: lists.map(|_| "smollm".into()),
                tokens: vec!["<s>".into(), "a".into(), "b".into()],
                token_types: lists.map(|n| vec![1; n]),
                scores: lists.map(|n| vec![-0.5; n]),
                merges: list(|i| format!("a{i} b")),
                bos_id: lists.map(|_| 0),
                eos_id: lists.map(|_| 2),
                unk_id: lists.map(|_| 1),
                pad_id: lists.map(|_| 0),
                add_bos: lists.map(|_| true),
                add_eos: lists.map(|_| false),
                add_space_prefix: lists.map(|_| false),
                chat_template: lists.map(|_| "{{ bos_token }}".into()),
            },
        }
    }

    #[test]
    fn hf_files_cross_unchanged() {
        for source in [hf_files(None), hf_files(Some("")), hf_files(Some("{}"))] {
            assert_eq!(over_the_wire(source.clone()), source);
        }
    }

    #[test]
    fn gguf_metadata_crosses_unchanged_and_absent_lists_stay_absent() {
        for source in [gguf(None), gguf(Some(0)), gguf(Some(3))] {
            assert_eq!(over_the_wire(source.clone()), source);
        }
    }

    #[test]
    fn a_response_without_a_source_is_an_error() {
        let empty = pb::TokenizerResponse { source: None };
        assert_eq!(
            TokenizerSource::try_from(empty),
            Err(MissingTokenizerSource)
        );
    }
}
