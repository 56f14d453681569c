//! How a model turns its final hidden states into one vector per input, as the model says:
//! sentence-transformers' `modules.json` (a `Pooling` module's `config.json`, a `Normalize`
//! module after it) in a Hugging Face directory, `{arch}.pooling_type` in a GGUF file.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::FormatError;
use crate::gguf::GgufFile;

/// Which final hidden states make an input's vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The last token's (Qwen3-Embedding and most decoder embedders).
    LastToken,
    /// The mean of every token's.
    Mean,
    /// The first token's.
    Cls,
}

impl Pooling {
    /// The name the logs use.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::LastToken => "last",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
        }
    }
}

/// An embedding model's pooling, and whether its vectors are L2-normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pooler {
    /// Which hidden states.
    pub pooling: Pooling,
    /// Whether the pooled vector is scaled to unit length.
    pub normalize: bool,
}

#[derive(Deserialize)]
struct Module {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// The pooler a sentence-transformers directory declares (`None`: it has no `modules.json`).
pub(crate) fn from_hf_dir(dir: &Path) -> Result<Option<Pooler>, FormatError> {
    let path = dir.join("modules.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FormatError::io(&path, e)),
    };
    let modules: Vec<Module> = serde_json::from_str(&text)
        .map_err(|e| FormatError::invalid(&path, format!("invalid modules.json: {e}")))?;
    let mut pooling = None;
    let mut normalize = false;
    for m in &modules {
        // `sentence_transformers.models.Pooling`, or its newer module path.
        let kind = m.kind.rsplit('.').next().unwrap_or_default();
        match kind {
            "Transformer" => {}
            "Pooling" if pooling.is_none() && !normalize => {
                pooling = Some(pooling_module(&dir.join(&m.path))?)
            }
            "Normalize" if pooling.is_some() => normalize = true,
            _ => {
                return Err(FormatError::invalid(
                    &path,
                    format!(
                        "the sentence-transformers module {} ({}) is not served; Tessera serves \
                         a Transformer followed by a Pooling and an optional Normalize module",
                        m.kind, m.path
                    ),
                ));
            }
        }
    }
    let pooling = pooling.ok_or_else(|| {
        FormatError::invalid(&path, "modules.json has no Pooling module".to_string())
    })?;
    Ok(Some(Pooler { pooling, normalize }))
}

/// The mode a `Pooling` module's `config.json` turns on (exactly one of those served).
fn pooling_module(dir: &Path) -> Result<Pooling, FormatError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| FormatError::io(&path, e))?;
    let config: Value = serde_json::from_str(&text)
        .map_err(|e| FormatError::invalid(&path, format!("invalid JSON: {e}")))?;
    let on = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
    if config.get("include_prompt").and_then(Value::as_bool) == Some(false) {
        return Err(FormatError::invalid(
            &path,
            "pooling that leaves out the prompt (include_prompt: false) is not served",
        ));
    }
    // sentence-transformers 6 names the mode; earlier versions switch modes on and off.
    if let Some(mode) = config.get("pooling_mode").and_then(Value::as_str) {
        return match mode {
            "lasttoken" | "last_token" | "last" => Ok(Pooling::LastToken),
            "mean" | "mean_tokens" => Ok(Pooling::Mean),
            "cls" | "cls_token" => Ok(Pooling::Cls),
            other => Err(FormatError::invalid(
                &path,
                format!(
                    "pooling_mode {other:?} is not served; Tessera pools by last token, mean or CLS"
                ),
            )),
        };
    }
    let served = [
        ("pooling_mode_lasttoken", Pooling::LastToken),
        ("pooling_mode_mean_tokens", Pooling::Mean),
        ("pooling_mode_cls_token", Pooling::Cls),
    ];
    let unserved = [
        "pooling_mode_max_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        "pooling_mode_weightedmean_tokens",
    ];
    let chosen: Vec<Pooling> = served
        .iter()
        .filter(|(key, _)| on(key))
        .map(|&(_, p)| p)
        .collect();
    match (chosen.as_slice(), unserved.iter().find(|k| on(k))) {
        ([p], None) => Ok(*p),
        (_, Some(key)) => Err(FormatError::invalid(
            &path,
            format!("{key} is not served; Tessera pools by last token, mean or CLS"),
        )),
        _ => Err(FormatError::invalid(
            &path,
            "exactly one of pooling_mode_lasttoken, pooling_mode_mean_tokens and \
             pooling_mode_cls_token must be true",
        )),
    }
}

/// The pooler a GGUF file declares (`{arch}.pooling_type`; llama.cpp normalises such
/// models' vectors by default). `None`: no pooling, or none declared.
pub(crate) fn from_gguf(gguf: &GgufFile) -> Result<Option<Pooler>, FormatError> {
    let arch = gguf.architecture()?;
    let Some(value) = gguf.metadata(&format!("{arch}.pooling_type")) else {
        return Ok(None);
    };
    let pooling = match value.as_u64() {
        Some(0) => return Ok(None),
        Some(1) => Pooling::Mean,
        Some(2) => Pooling::Cls,
        Some(3) => Pooling::LastToken,
        other => {
            let given = other.map_or_else(|| value.type_name().to_string(), |n| n.to_string());
            return Err(FormatError::invalid(
                gguf.path(),
                format!(
                    "{arch}.pooling_type {given} is not served (4 is a reranker's); Tessera \
                     pools by mean (1), CLS (2) or last token (3)"
                ),
            ));
        }
    };
    Ok(Some(Pooler {
        pooling,
        normalize: true,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, modules: &str, pooling: &str) {
        std::fs::write(dir.join("modules.json"), modules).unwrap();
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        std::fs::write(dir.join("1_Pooling/config.json"), pooling).unwrap();
    }

    const MODULES: &str = r#"[
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    ]"#;

    #[test]
    fn reads_pooling_and_normalize() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(from_hf_dir(dir.path()).unwrap(), None);
        write(
            dir.path(),
            MODULES,
            r#"{"pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": false, "include_prompt": true}"#,
        );
        let p = from_hf_dir(dir.path()).unwrap().unwrap();
        assert_eq!(p.pooling, Pooling::LastToken);
        assert!(p.normalize);
        let two = MODULES.replace(
            r#",
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}"#,
            "",
        );
        write(dir.path(), &two, r#"{"pooling_mode_mean_tokens": true}"#);
        let p = from_hf_dir(dir.path()).unwrap().unwrap();
        assert_eq!((p.pooling, p.normalize), (Pooling::Mean, false));
        write(
            dir.path(),
            &two,
            r#"{"pooling_mode": "cls", "embedding_dimension": 8}"#,
        );
        assert_eq!(
            from_hf_dir(dir.path()).unwrap().unwrap().pooling,
            Pooling::Cls
        );
        write(dir.path(), &two, r#"{"pooling_mode": "max"}"#);
        let e = from_hf_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("\"max\""), "{e}");
    }

    #[test]
    fn refuses_what_it_does_not_serve() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), MODULES, r#"{"pooling_mode_max_tokens": true}"#);
        let e = from_hf_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("pooling_mode_max_tokens"), "{e}");
        write(
            dir.path(),
            MODULES,
            r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}"#,
        );
        let e = from_hf_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("exactly one"), "{e}");
        let dense = MODULES.replace("Normalize\"}", "Normalize\"}, {\"path\": \"3_Dense\", \"type\": \"sentence_transformers.models.Dense\"}");
        write(dir.path(), &dense, r#"{"pooling_mode_cls_token": true}"#);
        let e = from_hf_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("Dense"), "{e}");
    }
}
