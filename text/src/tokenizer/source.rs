//! What a tokenizer is built from, as plain data: the text files of a Hugging Face model
//! directory, or a GGUF file's tokenizer metadata. The process that has the model's files
//! reads it; whoever builds the tokenizer needs nothing else (the router receives it from a
//! shard).

use std::path::{Path, PathBuf};

use super::GgufTokenizerSpec;
use super::hf::{eos_ids, parse_json};
use crate::TokenizerLoadError;

/// The sources of a model's tokenizer.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizerSource {
    /// The tokenizer files of a Hugging Face model directory.
    HfFiles(HfTokenizerFiles),
    /// A GGUF file's tokenizer metadata.
    Gguf {
        /// The GGUF file, which errors name.
        path: PathBuf,
        /// Its `tokenizer.*` metadata.
        spec: GgufTokenizerSpec,
    },
}

/// The contents of a Hugging Face model directory's tokenizer files.
#[derive(Debug, Clone, PartialEq)]
pub struct HfTokenizerFiles {
    /// The directory, whose files errors name.
    pub dir: PathBuf,
    /// `tokenizer.json`.
    pub tokenizer_json: String,
    /// `tokenizer_config.json`, if the directory has one.
    pub tokenizer_config_json: Option<String>,
    /// `chat_template.jinja`, if the directory has one.
    pub chat_template_jinja: Option<String>,
    /// Ids that end generation besides the tokenizer's own end-of-sequence token (those of
    /// `config.json` and `generation_config.json`), each once.
    pub eos_token_ids: Vec<u32>,
}

impl HfTokenizerFiles {
    /// Reads the tokenizer files of `dir`: `tokenizer.json` (required),
    /// `tokenizer_config.json` and `chat_template.jinja` (optional; where neither has a
    /// template, a processor's `chat_template.json` stands in), and the `eos_token_id`
    /// of `generation_config.json` (optional) after `generation_eos` (e.g. the ids of the
    /// `config.json` the caller already read).
    pub fn read(dir: &Path, generation_eos: &[u32]) -> Result<Self, TokenizerLoadError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer_json =
            read_optional(&tokenizer_path)?.ok_or_else(|| TokenizerLoadError::Missing {
                path: tokenizer_path,
                hint: "the model directory needs a tokenizers-format tokenizer.json \
                       (save it with a fast tokenizer's save_pretrained)"
                    .to_string(),
            })?;
        let mut eos_token_ids = Vec::new();
        for &id in generation_eos {
            super::push_unique(&mut eos_token_ids, id);
        }
        let generation_path = dir.join("generation_config.json");
        if let Some(text) = read_optional(&generation_path)? {
            let generation = parse_json(&text, &generation_path)?;
            for id in eos_ids(generation.get("eos_token_id")) {
                super::push_unique(&mut eos_token_ids, id);
            }
        }
        let tokenizer_config_json = read_optional(&dir.join("tokenizer_config.json"))?;
        let chat_template_jinja = match read_optional(&dir.join("chat_template.jinja"))? {
            Some(text) => Some(text),
            None if !has_template(tokenizer_config_json.as_deref()) => {
                processor_template(&dir.join("chat_template.json"))?
            }
            None => None,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            tokenizer_json,
            tokenizer_config_json,
            chat_template_jinja,
            eos_token_ids,
        })
    }
}

/// Whether a `tokenizer_config.json` carries a chat template.
fn has_template(tokenizer_config: Option<&str>) -> bool {
    tokenizer_config
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        .is_some_and(|c| c.get("chat_template").is_some_and(|t| !t.is_null()))
}

/// The template of a processor's `chat_template.json` (`{"chat_template": "…"}`), which
/// multimodal checkpoints (Gemma 3, Mistral 3) carry where the tokenizer's config has none.
fn processor_template(path: &Path) -> Result<Option<String>, TokenizerLoadError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let value = parse_json(&text, path)?;
    match value.get("chat_template") {
        Some(serde_json::Value::String(template)) => Ok(Some(template.clone())),
        _ => Err(TokenizerLoadError::invalid(
            path,
            "chat_template.json must hold {\"chat_template\": \"…\"}",
        )),
    }
}

/// The text of `path`, or `None` if there is no such file.
fn read_optional(path: &Path) -> Result<Option<String>, TokenizerLoadError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TokenizerLoadError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatMessage, ModelTokenizer};

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures")
            .join(name)
    }

    #[test]
    fn a_source_builds_the_same_tokenizer_without_its_files() {
        let original = fixture("tiny-qwen2");
        let copy = tempfile::tempdir().unwrap();
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "generation_config.json",
        ] {
            std::fs::copy(original.join(name), copy.path().join(name)).unwrap();
        }
        let source = TokenizerSource::HfFiles(HfTokenizerFiles::read(copy.path(), &[]).unwrap());
        drop(copy);

        let built = ModelTokenizer::from_source(&source).unwrap();
        let direct = ModelTokenizer::from_hf_dir(&original, &[]).unwrap();
        assert_eq!(
            built.tokenizer.to_string(false).unwrap(),
            direct.tokenizer.to_string(false).unwrap()
        );
        assert_eq!(built.eos_token_ids, direct.eos_token_ids);
        assert_eq!(
            (&built.bos_token, built.add_bos),
            (&direct.bos_token, direct.add_bos)
        );
        let chat = [ChatMessage::new("user", "Hi <|im_end|> there")];
        let render = |t: &ModelTokenizer| t.chat_template.as_ref().unwrap().render(&chat, true);
        assert_eq!(render(&built).unwrap(), render(&direct).unwrap());
    }

    #[test]
    fn generation_config_ids_follow_the_callers_once_each() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": [5, 3, 5]}"#,
        )
        .unwrap();
        let files = HfTokenizerFiles::read(dir.path(), &[3, 9]).unwrap();
        assert_eq!(files.eos_token_ids, vec![3, 9, 5]);
        assert_eq!(files.tokenizer_json, "{}");
        assert_eq!(files.tokenizer_config_json, None);
        assert_eq!(files.chat_template_jinja, None);
    }

    #[test]
    fn a_processors_chat_template_stands_in_for_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
        std::fs::write(
            dir.path().join("chat_template.json"),
            r#"{"chat_template": "{{ messages[0]['content'] }}"}"#,
        )
        .unwrap();
        let read = || HfTokenizerFiles::read(dir.path(), &[]).unwrap();
        assert_eq!(
            read().chat_template_jinja.as_deref(),
            Some("{{ messages[0]['content'] }}")
        );
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"chat_template": "tokenizer's"}"#,
        )
        .unwrap();
        assert_eq!(
            read().chat_template_jinja,
            None,
            "the tokenizer's own template wins"
        );
        std::fs::write(dir.path().join("chat_template.jinja"), "jinja").unwrap();
        assert_eq!(read().chat_template_jinja.as_deref(), Some("jinja"));
    }

    #[test]
    fn errors_name_the_file_the_bad_content_came_from() {
        let good = HfTokenizerFiles::read(&fixture("tiny-llama"), &[]).unwrap();
        let dir = PathBuf::from("/models/m");
        let build = |files: HfTokenizerFiles| {
            let source = TokenizerSource::HfFiles(HfTokenizerFiles {
                dir: dir.clone(),
                ..files
            });
            ModelTokenizer::from_source(&source)
                .unwrap_err()
                .to_string()
        };
        let bad_tokenizer = build(HfTokenizerFiles {
            tokenizer_json: "{".into(),
            ..good.clone()
        });
        assert!(
            bad_tokenizer.starts_with("/models/m/tokenizer.json: not a valid tokenizer.json"),
            "{bad_tokenizer}"
        );
        let bad_config = build(HfTokenizerFiles {
            tokenizer_config_json: Some("[".into()),
            ..good.clone()
        });
        assert!(
            bad_config.starts_with("/models/m/tokenizer_config.json: not valid JSON"),
            "{bad_config}"
        );
        let bad_template = build(HfTokenizerFiles {
            chat_template_jinja: Some("{% if %}".into()),
            ..good
        });
        assert!(
            bad_template.starts_with("/models/m/chat_template.jinja: chat template"),
            "{bad_template}"
        );
    }
}
