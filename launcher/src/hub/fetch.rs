//! Making a Hub model's files local: list the revision, pick the files, reuse the cached ones,
//! download the others (verified), or, offline or with the Hub unreachable, take the cache's
//! copy of the revision as it is.

use std::fs;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use nix::fcntl::{Flock, FlockArg};
use serde::Deserialize;

use super::select::{self, Selection};
use super::{HubError, HubModel, HubSettings};
use crate::sha256::sha256_file;

/// A revision's files as the Hub lists them (`/api/models/{repo}/revision/{rev}?blobs=true`).
#[derive(Debug, Deserialize)]
struct Listing {
    sha: String,
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<Lfs>,
}

#[derive(Debug, Deserialize)]
struct Lfs {
    sha256: String,
    size: u64,
}

/// The model's files, local: a checkpoint's snapshot folder or the GGUF file's path. Waits
/// while another launcher fetches the same repository.
pub(crate) fn resolve(
    model: &HubModel,
    revision: Option<&str>,
    settings: &HubSettings,
) -> Result<PathBuf, HubError> {
    let revision = revision.unwrap_or("main");
    let cached = CachedRepo::new(&settings.cache, &model.repo);
    let _lock = cached.lock()?;
    if settings.offline {
        return from_cache(model, revision, &cached).map_err(|detail| HubError::NotCachedOffline {
            repo: model.repo.clone(),
            cache: settings.cache.clone(),
            detail,
        });
    }
    let api = ApiBuilder::from_cache(Cache::new(settings.cache.clone()))
        .with_endpoint(settings.endpoint.clone())
        .with_token(settings.token.clone())
        .with_progress(std::io::stderr().is_terminal())
        .build()
        .map_err(|e| HubError::Transfer {
            repo: model.repo.clone(),
            what: "nothing (the HTTP client did not start)".into(),
            endpoint: settings.endpoint.clone(),
            message: e.to_string(),
        })?;
    let listing = match list(&api, model, revision, settings) {
        Ok(listing) => listing,
        Err(Listed::Unreachable(message)) => {
            return match from_cache(model, revision, &cached) {
                Ok(path) => {
                    tracing::warn!(
                        repo = %model.repo,
                        endpoint = %settings.endpoint,
                        error = %message,
                        "the Hub is unreachable: serving the cached copy of the revision"
                    );
                    Ok(path)
                }
                Err(_) => Err(HubError::Unreachable {
                    repo: model.repo.clone(),
                    endpoint: settings.endpoint.clone(),
                    cache: settings.cache.clone(),
                    message,
                }),
            };
        }
        Err(Listed::Failed(e)) => return Err(e),
    };
    let names: Vec<String> = listing
        .siblings
        .iter()
        .map(|s| s.rfilename.clone())
        .collect();
    let selection = select::select(&model.repo, &names, model.quant.as_deref())?;
    let fetcher = Fetcher {
        api: &api,
        model,
        listing: &listing,
        cached: &cached,
        endpoint: &settings.endpoint,
    };
    let path = match &selection {
        Selection::Gguf(parts) => {
            for part in parts {
                fetcher.file(part)?;
            }
            cached.snapshot(&listing.sha).join(&parts[0])
        }
        Selection::Checkpoint { files, indexed } => {
            for file in files {
                fetcher.file(file)?;
            }
            if *indexed {
                let index = fetcher.file("model.safetensors.index.json")?;
                let text = fs::read_to_string(&index).map_err(io_err("cannot read", &index))?;
                let weights =
                    select::weights_of_index(&text).map_err(|message| HubError::Transfer {
                        repo: model.repo.clone(),
                        what: "model.safetensors.index.json".into(),
                        endpoint: settings.endpoint.clone(),
                        message,
                    })?;
                for file in &weights {
                    fetcher.file(file)?;
                }
            }
            cached.snapshot(&listing.sha)
        }
    };
    if revision != listing.sha {
        cached.set_ref(revision, &listing.sha)?;
    }
    Ok(path)
}

/// Why a listing was not had.
enum Listed {
    /// No connection: the cache may still serve.
    Unreachable(String),
    /// The Hub answered, with a refusal.
    Failed(HubError),
}

fn list(
    api: &Api,
    model: &HubModel,
    revision: &str,
    settings: &HubSettings,
) -> Result<Listing, Listed> {
    let repo = api.repo(Repo::with_revision(
        model.repo.clone(),
        RepoType::Model,
        revision.to_string(),
    ));
    let failed = |message: String| {
        Listed::Failed(HubError::Transfer {
            repo: model.repo.clone(),
            what: "the file listing".into(),
            endpoint: settings.endpoint.clone(),
            message,
        })
    };
    match repo.info_request().query("blobs", "true").call() {
        Ok(response) => response
            .into_json::<Listing>()
            .map_err(|e| failed(format!("unexpected answer: {e}"))),
        Err(ureq::Error::Status(status, response)) => {
            let code = response.header("x-error-code").unwrap_or_default();
            let missing = status == 404 || matches!(code, "RepoNotFound" | "RevisionNotFound");
            Err(Listed::Failed(if missing {
                HubError::NoSuchRepo {
                    repo: model.repo.clone(),
                    revision: revision.into(),
                    endpoint: settings.endpoint.clone(),
                }
            } else if matches!(status, 401 | 403) {
                HubError::Unauthorized {
                    repo: model.repo.clone(),
                    endpoint: settings.endpoint.clone(),
                    status,
                }
            } else {
                return Err(failed(format!("HTTP {status}")));
            }))
        }
        Err(ureq::Error::Transport(t)) => Err(Listed::Unreachable(t.to_string())),
    }
}

/// Fetches the files of one listed revision.
struct Fetcher<'a> {
    api: &'a Api,
    model: &'a HubModel,
    listing: &'a Listing,
    cached: &'a CachedRepo,
    endpoint: &'a str,
}

impl Fetcher<'_> {
    /// `name`'s local path: the cached copy, or a verified download.
    fn file(&self, name: &str) -> Result<PathBuf, HubError> {
        let local = self.cached.snapshot(&self.listing.sha).join(name);
        if local.exists() {
            return Ok(local);
        }
        let sibling = self.listing.siblings.iter().find(|s| s.rfilename == name);
        let size = sibling.and_then(|s| s.lfs.as_ref().map(|l| l.size).or(s.size));
        tracing::info!(
            repo = %self.model.repo,
            file = name,
            bytes = size,
            endpoint = self.endpoint,
            "downloading"
        );
        let repo = self.api.repo(Repo::with_revision(
            self.model.repo.clone(),
            RepoType::Model,
            self.listing.sha.clone(),
        ));
        let path = repo
            .download(name)
            .map_err(|e| self.transfer_error(name, e))?;
        if let Some(sibling) = sibling {
            self.verify(name, &path, sibling)?;
        }
        Ok(if local.exists() { local } else { path })
    }

    /// The file has the listed size and, for a large (LFS) file, the listed SHA-256; else it
    /// and its blob are removed.
    fn verify(&self, name: &str, path: &Path, sibling: &Sibling) -> Result<(), HubError> {
        let corrupt = |what, expected: String, actual: String| {
            if let Ok(blob) = fs::canonicalize(path) {
                let _ = fs::remove_file(blob);
            }
            let _ = fs::remove_file(path);
            HubError::Corrupt {
                repo: self.model.repo.clone(),
                file: name.into(),
                what,
                expected,
                actual,
            }
        };
        let actual = fs::metadata(path)
            .map_err(io_err("cannot read", path))?
            .len();
        let expected = sibling.lfs.as_ref().map(|l| l.size).or(sibling.size);
        if let Some(expected) = expected.filter(|&e| e != actual) {
            return Err(corrupt("size", expected.to_string(), actual.to_string()));
        }
        if let Some(lfs) = &sibling.lfs {
            let actual = sha256_file(path).map_err(io_err("cannot read", path))?;
            if !actual.eq_ignore_ascii_case(&lfs.sha256) {
                return Err(corrupt("SHA-256", lfs.sha256.clone(), actual));
            }
        }
        Ok(())
    }

    fn transfer_error(&self, name: &str, error: ApiError) -> HubError {
        let error = match error {
            ApiError::TooManyRetries(inner) => *inner,
            other => other,
        };
        if let ApiError::RequestError(e) = &error
            && let ureq::Error::Status(status @ (401 | 403), _) = **e
        {
            return HubError::Unauthorized {
                repo: self.model.repo.clone(),
                endpoint: self.endpoint.into(),
                status,
            };
        }
        HubError::Transfer {
            repo: self.model.repo.clone(),
            what: name.into(),
            endpoint: self.endpoint.into(),
            message: format!("{error}; starting again resumes the download"),
        }
    }
}

/// The path of the cache's copy of `revision`, if it holds everything serving needs; else
/// what is missing.
fn from_cache(model: &HubModel, revision: &str, cached: &CachedRepo) -> Result<PathBuf, String> {
    let commit = cached
        .commit_of(revision)
        .ok_or_else(|| format!(" (no copy of revision {revision})"))?;
    let snapshot = cached.snapshot(&commit);
    let mut names = Vec::new();
    files_under(&snapshot, "", &mut names);
    names.sort();
    let selection = select::select(&model.repo, &names, model.quant.as_deref())
        .map_err(|e| format!(" (the cached copy: {e})"))?;
    let have = |name: &str| snapshot.join(name).exists();
    match selection {
        Selection::Gguf(parts) => match parts.iter().find(|f| !have(f)) {
            Some(missing) => Err(format!(" ({missing} is missing from the cached copy)")),
            None => Ok(snapshot.join(&parts[0])),
        },
        Selection::Checkpoint { files, indexed } => {
            let mut needed = files;
            if indexed {
                let text = fs::read_to_string(snapshot.join("model.safetensors.index.json"))
                    .map_err(|e| format!(" (its safetensors index: {e})"))?;
                needed.extend(select::weights_of_index(&text)?);
            }
            match needed.iter().find(|f| !have(f)) {
                Some(missing) => Err(format!(" ({missing} is missing from the cached copy)")),
                None => Ok(snapshot),
            }
        }
    }
}

/// The files under `dir`, as paths relative to the snapshot (`prefix` joined with `/`).
fn files_under(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, &relative, out);
        } else if path.exists() {
            out.push(relative);
        }
    }
}

/// One repository in the cache (`models--ORG--NAME`: `refs/`, `snapshots/`, `blobs/`).
struct CachedRepo {
    root: PathBuf,
}

impl CachedRepo {
    fn new(cache: &Path, repo: &str) -> Self {
        Self {
            root: cache.join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    fn snapshot(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    /// The commit `revision` names in the cache: itself when it is one, else its ref.
    fn commit_of(&self, revision: &str) -> Option<String> {
        if !revision.contains('/') && self.snapshot(revision).is_dir() {
            return Some(revision.into());
        }
        let commit = fs::read_to_string(self.root.join("refs").join(revision)).ok()?;
        Some(commit.trim().to_string()).filter(|c| !c.is_empty())
    }

    fn set_ref(&self, revision: &str, commit: &str) -> Result<(), HubError> {
        let path = self.root.join("refs").join(revision);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
        }
        let tmp = path.with_extension("tessera-tmp");
        fs::write(&tmp, commit).map_err(io_err("cannot write", &tmp))?;
        fs::rename(&tmp, &path).map_err(io_err("cannot write", &path))
    }

    /// An exclusive lock on the repository, held while its files are fetched; in the cache's
    /// `.locks/` folder, where `huggingface_hub` keeps its own per-file locks.
    fn lock(&self) -> Result<Flock<fs::File>, HubError> {
        let (Some(cache), Some(folder)) = (self.root.parent(), self.root.file_name()) else {
            return Err(io_err("cannot lock", &self.root)(
                std::io::ErrorKind::InvalidInput.into(),
            ));
        };
        let dir = cache.join(".locks").join(folder);
        fs::create_dir_all(&dir).map_err(io_err("cannot create", &dir))?;
        let path = dir.join("tessera.lock");
        let file = fs::File::create(&path).map_err(io_err("cannot create", &path))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| io_err("cannot lock", &path)(errno.into()))
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> HubError + 'a {
    move |source| HubError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}
