//! Where the Hub is and what the cache is, read from the environment the way `huggingface_hub`
//! reads it, so that a model downloaded by Python is found here and the other way round.

use std::path::{Path, PathBuf};

/// The Hub endpoint, cache folder, token and offline switch.
#[derive(Debug, Clone)]
pub(crate) struct HubSettings {
    /// Base URL (`HF_ENDPOINT`, for mirrors), without a trailing `/`.
    pub(crate) endpoint: String,
    /// The cache's `hub` folder (`HF_HUB_CACHE`, else `$HF_HOME/hub`).
    pub(crate) cache: PathBuf,
    /// Bearer token for gated and private repositories (`HF_TOKEN`, else the token file
    /// `huggingface-cli login` writes).
    pub(crate) token: Option<String>,
    /// `HF_HUB_OFFLINE=1`: the cache only, no request.
    pub(crate) offline: bool,
}

impl HubSettings {
    /// From the process environment.
    pub(crate) fn from_env() -> Option<Self> {
        Self::from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// From the variables `var` gives; `None` when no cache folder can be named (no
    /// `HF_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME` or `HOME`).
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let hf_home = var("HF_HOME").map(PathBuf::from).or_else(|| {
            var("XDG_CACHE_HOME")
                .map(|x| Path::new(&x).join("huggingface"))
                .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache/huggingface")))
        });
        let cache = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))?;
        let token_file = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .or_else(|| hf_home.as_ref().map(|h| h.join("token")));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| std::fs::read_to_string(token_file?).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true")
        });
        Some(Self {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .to_string(),
            cache,
            token,
            offline,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Option<HubSettings> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubSettings::from_vars(|k| vars.get(k).cloned())
    }

    #[test]
    fn cache_folder_as_huggingface_hub_chooses_it() {
        let s = settings(&[("HOME", "/home/u")]).unwrap();
        assert_eq!(s.cache, Path::new("/home/u/.cache/huggingface/hub"));
        assert_eq!(s.endpoint, "https://huggingface.co");
        assert!(!s.offline && s.token.is_none());
        let s = settings(&[("HOME", "/home/u"), ("HF_HOME", "/data/hf")]).unwrap();
        assert_eq!(s.cache, Path::new("/data/hf/hub"));
        let s = settings(&[("HF_HOME", "/data/hf"), ("HF_HUB_CACHE", "/fast/hub")]).unwrap();
        assert_eq!(s.cache, Path::new("/fast/hub"));
        let s = settings(&[("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/u")]).unwrap();
        assert_eq!(s.cache, Path::new("/xdg/huggingface/hub"));
        assert!(settings(&[]).is_none());
    }

    #[test]
    fn token_endpoint_and_offline() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "hf_file\n").unwrap();
        let home = dir.path().to_str().unwrap();
        let s = settings(&[("HF_HOME", home)]).unwrap();
        assert_eq!(s.token.as_deref(), Some("hf_file"));
        let s = settings(&[("HF_HOME", home), ("HF_TOKEN", "hf_env")]).unwrap();
        assert_eq!(s.token.as_deref(), Some("hf_env"));
        let s = settings(&[
            ("HOME", "/h"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_HUB_OFFLINE", "1"),
        ])
        .unwrap();
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert!(s.offline);
    }
}
