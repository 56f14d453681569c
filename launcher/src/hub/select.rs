//! Which files of a repository serving needs: for a GGUF repository, the one file of the
//! quantization asked for (llama.cpp's `-hf` picks the same way, Q4_K_M unless told); for a
//! checkpoint, its config, tokenizer and chat template files and the safetensors its index
//! names, nothing else (no other formats, no original/ or onnx/ folders).

use super::HubError;

/// What to fetch of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection {
    /// A Hugging Face checkpoint: these files of the repository's root; the safetensors come
    /// from `model.safetensors.index.json` once it is fetched ([`weights_of_index`]).
    Checkpoint {
        /// Config, tokenizer and template files, and the weights or their index.
        files: Vec<String>,
        /// Whether the weights are sharded (`model.safetensors.index.json`).
        indexed: bool,
    },
    /// One GGUF file, or the parts of a split one, first part first.
    Gguf(Vec<String>),
}

/// The quantization llama.cpp's `-hf` takes when none is named.
const DEFAULT_QUANT: &str = "Q4_K_M";

/// Files a checkpoint is served from beside its weights, when the repository has them.
const CHECKPOINT_FILES: [&str; 9] = [
    "config.json",
    "modules.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
];

/// The files of `repo` (its listing `files`) that serving it needs.
pub(crate) fn select(
    repo: &str,
    files: &[String],
    quant: Option<&str>,
) -> Result<Selection, HubError> {
    let ggufs: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf") && !is_projector(f))
        .collect();
    let has = |name: &str| files.iter().any(|f| f == name);
    if quant.is_none() && has("config.json") {
        let indexed = has("model.safetensors.index.json");
        if !indexed && !has("model.safetensors") {
            return Err(HubError::NothingToServe {
                repo: repo.into(),
                why: "config.json without model.safetensors or model.safetensors.index.json \
                      (Tessera reads safetensors checkpoints and GGUF files)"
                    .into(),
                files: listing(files),
            });
        }
        let mut wanted: Vec<String> = CHECKPOINT_FILES
            .iter()
            .filter(|f| has(f))
            .map(|f| f.to_string())
            .collect();
        wanted.extend(files.iter().filter(|f| is_module_config(f)).cloned());
        if !indexed {
            wanted.push("model.safetensors".into());
        }
        return Ok(Selection::Checkpoint {
            files: wanted,
            indexed,
        });
    }
    if ggufs.is_empty() {
        return Err(HubError::NothingToServe {
            repo: repo.into(),
            why: match quant {
                Some(q) => format!("no GGUF file to pick :{q} from"),
                None => "neither config.json with safetensors nor a GGUF file".into(),
            },
            files: listing(files),
        });
    }
    let named = quant.unwrap_or(DEFAULT_QUANT);
    let matching: Vec<&&String> = ggufs.iter().filter(|f| names_quant(f, named)).collect();
    let chosen: Vec<String> = match (matching.as_slice(), quant) {
        ([], None) if ggufs.len() == 1 => vec![ggufs[0].clone()],
        ([], _) => {
            return Err(HubError::NoSuchQuant {
                repo: repo.into(),
                quant: named.into(),
                ggufs: listing(&ggufs.iter().map(|f| f.to_string()).collect::<Vec<_>>()),
            });
        }
        (several, _) => several.iter().map(|f| f.to_string()).collect(),
    };
    match chosen.as_slice() {
        [one] if split_part(one).is_none() => Ok(Selection::Gguf(chosen)),
        parts => split_set(repo, named, parts).map(Selection::Gguf),
    }
}

/// The parts of one split GGUF in order, if `files` are exactly that (`…-00001-of-0000N`
/// through `…-0000N-of-0000N`).
fn split_set(repo: &str, quant: &str, files: &[String]) -> Result<Vec<String>, HubError> {
    let parts: Option<Vec<(String, usize, usize)>> = files.iter().map(|f| split_part(f)).collect();
    let several = || HubError::NoSuchQuant {
        repo: repo.into(),
        quant: format!("{quant} (several files match)"),
        ggufs: listing(files),
    };
    let parts = parts.ok_or_else(several)?;
    let (prefix, _, count) = parts[0].clone();
    if parts.iter().any(|(p, _, c)| *p != prefix || *c != count) {
        return Err(several());
    }
    let mut ordered: Vec<(usize, &String)> = parts.iter().map(|(_, i, _)| *i).zip(files).collect();
    ordered.sort();
    if ordered.iter().map(|(i, _)| *i).ne(1..=count) {
        return Err(HubError::IncompleteSplit {
            repo: repo.into(),
            file: ordered[0].1.clone(),
            count,
            found: ordered.len(),
        });
    }
    Ok(ordered.into_iter().map(|(_, f)| f.clone()).collect())
}

/// The weight files a safetensors index names, each once, in order.
pub(crate) fn weights_of_index(index_json: &str) -> Result<Vec<String>, String> {
    let index: serde_json::Value =
        serde_json::from_str(index_json).map_err(|e| format!("invalid safetensors index: {e}"))?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("the safetensors index has no weight_map")?;
    let mut files: Vec<String> = Vec::new();
    for file in map.values() {
        let file = file
            .as_str()
            .ok_or("a weight_map value is not a file name")?;
        if file.contains('/') || file.contains("..") || !file.ends_with(".safetensors") {
            return Err(format!(
                "weight_map names {file:?}, not a safetensors file beside it"
            ));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    files.sort();
    Ok(files)
}

/// Whether `file`'s path (its folder or its name) carries `quant` as a whole word (`Q4_K` is
/// not in `Q4_K_M`).
fn names_quant(file: &str, quant: &str) -> bool {
    let path = file.to_ascii_uppercase();
    let quant = quant.to_ascii_uppercase();
    path.match_indices(&quant).any(|(i, _)| {
        let before = path[..i].chars().next_back();
        let after = path[i + quant.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric())
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// `(prefix, part, parts)` of a split GGUF's part (`PREFIX-00002-of-00003.gguf`).
fn split_part(file: &str) -> Option<(String, usize, usize)> {
    let stem = file
        .strip_suffix(".gguf")
        .or_else(|| file.strip_suffix(".GGUF"))?;
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    let number = |s: &str| {
        (s.len() == 5 && s.chars().all(|c| c.is_ascii_digit())).then(|| s.parse().ok())?
    };
    Some((prefix.to_string(), number(index)?, number(total)?))
}

/// Multimodal projectors (`mmproj-*.gguf`) sit beside the language model in GGUF repositories.
/// A sentence-transformers module's `config.json` (`1_Pooling/config.json`): how an
/// embedding model pools.
fn is_module_config(file: &str) -> bool {
    file.strip_suffix("/config.json")
        .and_then(|folder| folder.split_once('_'))
        .is_some_and(|(n, name)| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
                && !name.is_empty()
                && !name.contains('/')
        })
}

fn is_projector(file: &str) -> bool {
    file.rsplit('/')
        .next()
        .is_some_and(|n| n.to_ascii_lowercase().starts_with("mmproj"))
}

fn listing(files: &[String]) -> String {
    const MOST: usize = 40;
    let mut shown: Vec<&str> = files.iter().take(MOST).map(String::as_str).collect();
    if files.len() > MOST {
        shown.push("…");
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_checkpoint_fetches_only_what_serving_reads() {
        let files = names(&[
            ".gitattributes",
            "README.md",
            "config.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "consolidated.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "original/params.json",
            "onnx/model.onnx",
        ]);
        let s = select("org/m", &files, None).unwrap();
        assert_eq!(
            s,
            Selection::Checkpoint {
                files: names(&[
                    "config.json",
                    "generation_config.json",
                    "tokenizer.json",
                    "tokenizer_config.json",
                    "model.safetensors.index.json",
                ]),
                indexed: true,
            }
        );
        let embedder = names(&[
            "config.json",
            "modules.json",
            "1_Pooling/config.json",
            "2_Dense/model.safetensors",
            "onnx/config.json",
            "x_Pooling/config.json",
            "model.safetensors",
            "tokenizer.json",
        ]);
        assert_eq!(
            select("org/e", &embedder, None).unwrap(),
            Selection::Checkpoint {
                files: names(&[
                    "config.json",
                    "modules.json",
                    "tokenizer.json",
                    "1_Pooling/config.json",
                    "model.safetensors",
                ]),
                indexed: false,
            }
        );
        let index = r#"{"weight_map":{"a":"model-00002-of-00002.safetensors",
            "b":"model-00001-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}}"#;
        assert_eq!(
            weights_of_index(index).unwrap(),
            names(&[
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ])
        );
        assert!(weights_of_index(r#"{"weight_map":{"a":"../x.safetensors"}}"#).is_err());
    }

    #[test]
    fn gguf_quant_picked_as_llama_cpp_does() {
        let files = names(&[
            "README.md",
            "gemma-3-4b-it-Q4_K_M.gguf",
            "gemma-3-4b-it-Q4_K_S.gguf",
            "gemma-3-4b-it-Q8_0.gguf",
            "mmproj-model-f16.gguf",
        ]);
        let pick = |q| select("org/m-GGUF", &files, q);
        let one = |f: &str| Selection::Gguf(vec![f.to_string()]);
        assert_eq!(pick(None).unwrap(), one("gemma-3-4b-it-Q4_K_M.gguf"));
        assert_eq!(pick(Some("q8_0")).unwrap(), one("gemma-3-4b-it-Q8_0.gguf"));
        let err = pick(Some("Q4_K")).unwrap_err().to_string();
        assert!(
            err.contains("Q4_K_S.gguf") && err.contains("Q8_0.gguf"),
            "{err}"
        );
        let err = pick(Some("Q2_K")).unwrap_err().to_string();
        assert!(err.contains("Q2_K") && !err.contains("mmproj"), "{err}");
        let f16 = names(&["model-f16.gguf"]);
        assert_eq!(select("o/m", &f16, None).unwrap(), one("model-f16.gguf"));
    }

    #[test]
    fn a_split_quantization_is_every_part_in_order() {
        let files = names(&[
            "Q8_0/m-Q8_0-00002-of-00002.gguf",
            "Q8_0/m-Q8_0-00001-of-00002.gguf",
            "m-Q4_K_M.gguf",
        ]);
        assert_eq!(
            select("o/m", &files, Some("Q8_0")).unwrap(),
            Selection::Gguf(names(&[
                "Q8_0/m-Q8_0-00001-of-00002.gguf",
                "Q8_0/m-Q8_0-00002-of-00002.gguf"
            ]))
        );
        let missing = names(&["m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"]);
        let err = select("o/m", &missing, Some("Q8_0"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("has 2 of its 3 parts"), "{err}");
    }

    #[test]
    fn nothing_to_serve_lists_the_repository() {
        let files = names(&["README.md", "model.onnx"]);
        let err = select("o/m", &files, None).unwrap_err().to_string();
        assert!(
            err.contains("model.onnx") && err.contains("README.md"),
            "{err}"
        );
        let files = names(&["config.json", "pytorch_model.bin"]);
        let err = select("o/m", &files, None).unwrap_err().to_string();
        assert!(
            err.contains("safetensors") && err.contains("pytorch_model.bin"),
            "{err}"
        );
    }
}
