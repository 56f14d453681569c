//! `--model-id` values that name a Hugging Face Hub repository: `ORG/NAME`, `NAME`, and for a
//! GGUF repository `ORG/NAME:QUANT` (one file of it, as llama.cpp's `-hf` picks it).

/// A model named by its Hub id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HubModel {
    /// `ORG/NAME` (or `NAME`).
    pub(crate) repo: String,
    /// The quantization named after `:`, which picks one GGUF file of the repository.
    pub(crate) quant: Option<String>,
}

/// The Hub id `spec` names, if it is shaped like one (the Hub's own rules: one or two
/// segments of letters, digits, `-`, `_` and `.`, not starting or ending with `-` or `.`, no
/// `--` or `..`, at most 96 characters).
pub(crate) fn parse(spec: &str) -> Option<HubModel> {
    let (repo, quant) = match spec.split_once(':') {
        Some((repo, quant)) => (repo, Some(quant)),
        None => (spec, None),
    };
    let segments: Vec<&str> = repo.split('/').collect();
    if segments.len() > 2 || repo.len() > 96 || !segments.iter().all(|s| valid_segment(s)) {
        return None;
    }
    let quant = match quant {
        Some(q) if !q.is_empty() && q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
            Some(q.to_string())
        }
        Some(_) => return None,
        None => None,
    };
    Some(HubModel {
        repo: repo.to_string(),
        quant,
    })
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
        && !s.contains("--")
        && !s.contains("..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_and_quants() {
        let m = parse("Qwen/Qwen3-0.6B").unwrap();
        assert_eq!((m.repo.as_str(), m.quant), ("Qwen/Qwen3-0.6B", None));
        let m = parse("ggml-org/gemma-3-1b-it-GGUF:Q4_K_M").unwrap();
        assert_eq!(m.repo, "ggml-org/gemma-3-1b-it-GGUF");
        assert_eq!(m.quant.as_deref(), Some("Q4_K_M"));
        assert_eq!(parse("gpt2").unwrap().repo, "gpt2");
    }

    #[test]
    fn paths_are_not_hub_ids() {
        for spec in [
            "/models/x.gguf",
            "./model",
            "a/b/c",
            "../x",
            "org/.hidden",
            "org/name:",
            "org/name:Q4 K",
            "org--x/name",
            "",
        ] {
            assert_eq!(parse(spec), None, "{spec}");
        }
    }
}
