//! Building the tokenizer of a Hugging Face model directory from its files' contents, the way
//! transformers 5 loads it.

use std::path::Path;
use std::str::FromStr;

use serde_json::Value;
use tokenizers::{AddedToken, Tokenizer};

use super::{HfTokenizerFiles, ModelTokenizer, push_unique, set_post_processor};
use crate::TokenizerLoadError;
use crate::chat_template::ChatTemplate;

/// `text`, the content of `path`, as JSON.
pub(super) fn parse_json(text: &str, path: &Path) -> Result<Value, TokenizerLoadError> {
    serde_json::from_str(text)
        .map_err(|e| TokenizerLoadError::invalid(path, format!("not valid JSON: {e}")))
}

/// A special token in `tokenizer_config.json`: a string or an `AddedToken` object.
fn token_text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `eos_token_id` as an int or a list of ints.
pub(super) fn eos_ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .into_iter()
            .collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => Vec::new(),
    }
}

/// The default template of `chat_template` as a string or a list of `{name, template}`.
fn config_template(config: &Value, path: &Path) -> Result<Option<String>, TokenizerLoadError> {
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |name: &str| {
                list.iter().find_map(|entry| {
                    (entry.get("name")?.as_str()? == name)
                        .then(|| entry.get("template")?.as_str().map(str::to_string))
                        .flatten()
                })
            };
            named("default").map(Some).ok_or_else(|| {
                TokenizerLoadError::invalid(
                    path,
                    "chat_template is a list of named templates without one named \"default\"",
                )
            })
        }
        Some(_) => Err(TokenizerLoadError::invalid(
            path,
            "chat_template must be a string or a list of {name, template} objects",
        )),
    }
}

pub(super) fn build(files: &HfTokenizerFiles) -> Result<ModelTokenizer, TokenizerLoadError> {
    let tokenizer_path = files.dir.join("tokenizer.json");
    let mut tokenizer = Tokenizer::from_str(&files.tokenizer_json).map_err(|e| {
        TokenizerLoadError::invalid(&tokenizer_path, format!("not a valid tokenizer.json: {e}"))
    })?;

    let config_path = files.dir.join("tokenizer_config.json");
    let config = match &files.tokenizer_config_json {
        Some(text) => parse_json(text, &config_path)?,
        None => Value::Null,
    };
    let named = |key: &str| token_text(config.get(key));
    let with_id = |text: Option<String>| {
        text.and_then(|t| {
            let id = tokenizer.token_to_id(&t)?;
            Some((t, id))
        })
    };
    let bos_token = with_id(named("bos_token"));
    let eos_token = with_id(named("eos_token"));

    register_special_tokens(&mut tokenizer, &config, &config_path)?;
    apply_add_token_flags(
        &mut tokenizer,
        &config,
        &config_path,
        bos_token.as_ref(),
        eos_token.as_ref(),
    )?;
    let add_bos = match &bos_token {
        Some((_, bos)) => tokenizer
            .encode_fast("", true)
            .map(|enc| enc.get_ids().first() == Some(bos))
            .unwrap_or(false),
        None => false,
    };

    let mut eos_token_ids = files.eos_token_ids.clone();
    if let Some((_, id)) = &eos_token {
        push_unique(&mut eos_token_ids, *id);
    }
    let chat_template = load_chat_template(
        files,
        &config,
        &config_path,
        bos_token.as_ref(),
        eos_token.as_ref(),
    )?;

    Ok(ModelTokenizer {
        tokenizer,
        bos_token,
        eos_token_ids,
        add_bos,
        chat_template,
    })
}

/// Makes the config's named special tokens that are in the vocabulary special added tokens.
fn register_special_tokens(
    tokenizer: &mut Tokenizer,
    config: &Value,
    config_path: &Path,
) -> Result<(), TokenizerLoadError> {
    // transformers 5 makes sure the named special tokens are special added tokens.
    let specials: Vec<AddedToken> = ["bos_token", "eos_token", "unk_token", "pad_token"]
        .iter()
        .filter_map(|key| token_text(config.get(*key)))
        .filter(|t| tokenizer.token_to_id(t).is_some())
        .map(|t| AddedToken::from(t, true).normalized(false))
        .collect();
    tokenizer.add_special_tokens(specials).map_err(|e| {
        TokenizerLoadError::invalid(
            config_path,
            format!("cannot register the special tokens: {e}"),
        )
    })?;
    Ok(())
}

/// Rebuilds the post-processor from `add_bos_token`/`add_eos_token` where transformers would.
fn apply_add_token_flags(
    tokenizer: &mut Tokenizer,
    config: &Value,
    config_path: &Path,
    bos_token: Option<&(String, u32)>,
    eos_token: Option<&(String, u32)>,
) -> Result<(), TokenizerLoadError> {
    // transformers 5 rebuilds the post-processor only when tokenizer.json has none: beside a
    // tokenizer.json it drops the config's add_bos/eos_token, so a post-processor that
    // appends EOS (Qwen3-Embedding's) stays whatever the flags say.
    if tokenizer.get_post_processor().is_none() {
        let flag = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
        set_post_processor(
            tokenizer,
            bos_token,
            flag("add_bos_token"),
            eos_token,
            flag("add_eos_token"),
        )
        .map_err(|e| {
            TokenizerLoadError::invalid(config_path, format!("add_bos_token/add_eos_token: {e}"))
        })?;
    }
    Ok(())
}

/// The chat template from `chat_template.jinja`, else from `tokenizer_config.json`.
fn load_chat_template(
    files: &HfTokenizerFiles,
    config: &Value,
    config_path: &Path,
    bos_token: Option<&(String, u32)>,
    eos_token: Option<&(String, u32)>,
) -> Result<Option<ChatTemplate>, TokenizerLoadError> {
    let (source, source_path) = match &files.chat_template_jinja {
        Some(text) => (Some(text.clone()), files.dir.join("chat_template.jinja")),
        None => (
            config_template(config, config_path)?,
            config_path.to_path_buf(),
        ),
    };
    match source {
        Some(source) => Ok(Some(
            ChatTemplate::new(
                source,
                bos_token.map(|(t, _)| t.clone()),
                eos_token.map(|(t, _)| t.clone()),
            )
            .map_err(|e| {
                TokenizerLoadError::invalid(&source_path, format!("chat template: {e}"))
            })?,
        )),
        None => Ok(None),
    }
}
