//! A Hugging Face Hub for the tests, on 127.0.0.1: the listing route
//! (`/api/models/{org}/{name}/revision/{rev}`) and the resolve route
//! (`/{org}/{name}/resolve/{rev}/{file}`, with ranges, `x-repo-commit`, ETags and LFS hashes)
//! over files the test gives it, answering as the Hub does (gated repositories, unknown ones).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// One file of a repository.
pub(super) struct HubFile {
    pub(super) name: String,
    pub(super) bytes: Vec<u8>,
}

impl HubFile {
    pub(super) fn new(name: &str, bytes: Vec<u8>) -> Self {
        Self {
            name: name.into(),
            bytes,
        }
    }

    /// Large files live in LFS on the Hub: listed with their SHA-256, which is their ETag.
    fn lfs(&self) -> bool {
        self.name.ends_with(".safetensors") || self.name.ends_with(".gguf")
    }

    fn sha256(&self) -> String {
        Sha256::digest(&self.bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// One repository at one commit.
pub(super) struct HubRepo {
    pub(super) id: String,
    pub(super) sha: String,
    pub(super) files: Vec<HubFile>,
    /// Downloads need `Authorization: Bearer <token>` (a gated repository).
    pub(super) token: Option<String>,
    /// The listing gives this SHA-256 for every LFS file instead of theirs.
    pub(super) wrong_hash: bool,
}

impl HubRepo {
    pub(super) fn new(id: &str, files: Vec<HubFile>) -> Self {
        Self {
            id: id.into(),
            sha: format!("{:0>40}", id.len() * 7919),
            files,
            token: None,
            wrong_hash: false,
        }
    }
}

#[derive(Clone)]
struct Hub {
    repos: Arc<HashMap<String, HubRepo>>,
    downloads: Arc<Mutex<Vec<String>>>,
}

/// The running Hub; it stops when dropped.
pub(super) struct FakeHub {
    addr: SocketAddr,
    downloads: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeHub {
    pub(super) async fn start(repos: Vec<HubRepo>) -> FakeHub {
        let hub = Hub {
            repos: Arc::new(repos.into_iter().map(|r| (r.id.clone(), r)).collect()),
            downloads: Arc::default(),
        };
        let downloads = hub.downloads.clone();
        let app = Router::new()
            .route("/api/models/{org}/{name}/revision/{rev}", get(listing))
            .route("/{org}/{name}/resolve/{rev}/{*file}", get(resolve))
            .with_state(hub);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake hub");
        });
        FakeHub {
            addr,
            downloads,
            task,
        }
    }

    /// The value for `HF_ENDPOINT`.
    pub(super) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `repo/file` of each whole-file download so far (not the one-byte probes).
    pub(super) fn downloads(&self) -> Vec<String> {
        self.downloads.lock().expect("downloads").clone()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn error(status: StatusCode, code: &str) -> Response {
    let mut r = (status, Json(json!({ "error": code }))).into_response();
    r.headers_mut()
        .insert("x-error-code", HeaderValue::from_str(code).expect("header"));
    r
}

use axum::Json;

async fn listing(
    State(hub): State<Hub>,
    Path((org, name, rev)): Path<(String, String, String)>,
) -> Response {
    let Some(repo) = hub.repos.get(&format!("{org}/{name}")) else {
        // The Hub does not tell unknown repositories from private ones to strangers.
        return error(StatusCode::UNAUTHORIZED, "RepoNotFound");
    };
    if rev != "main" && rev != repo.sha {
        return error(StatusCode::NOT_FOUND, "RevisionNotFound");
    }
    let siblings: Vec<Value> = repo
        .files
        .iter()
        .map(|f| {
            let size = f.bytes.len();
            if f.lfs() {
                let sha = if repo.wrong_hash {
                    "0".repeat(64)
                } else {
                    f.sha256()
                };
                json!({"rfilename": f.name, "size": size,
                       "lfs": {"sha256": sha, "size": size, "pointerSize": 134}})
            } else {
                json!({"rfilename": f.name, "size": size})
            }
        })
        .collect();
    Json(json!({"id": repo.id, "sha": repo.sha, "siblings": siblings})).into_response()
}

async fn resolve(
    State(hub): State<Hub>,
    Path((org, name, rev, file)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(repo) = hub.repos.get(&format!("{org}/{name}")) else {
        return error(StatusCode::UNAUTHORIZED, "RepoNotFound");
    };
    if let Some(token) = &repo.token {
        let sent = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if sent != Some(&format!("Bearer {token}")) {
            return error(StatusCode::UNAUTHORIZED, "GatedRepo");
        }
    }
    if rev != "main" && rev != repo.sha {
        return error(StatusCode::NOT_FOUND, "RevisionNotFound");
    }
    let Some(f) = repo.files.iter().find(|f| f.name == file) else {
        return error(StatusCode::NOT_FOUND, "EntryNotFound");
    };
    let total = f.bytes.len();
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .map(|(a, b)| {
            let start: usize = a.parse().unwrap_or(0);
            let end: usize = b
                .parse()
                .map_or(total.saturating_sub(1), |e: usize| e.min(total - 1));
            (start, end)
        });
    if range != Some((0, 0)) {
        hub.downloads
            .lock()
            .expect("downloads")
            .push(format!("{}/{}", repo.id, f.name));
    }
    let etag = format!("\"{}\"", f.sha256());
    let mut response = match range {
        Some((start, end)) if start <= end && start < total => {
            let mut r =
                (StatusCode::PARTIAL_CONTENT, f.bytes[start..=end].to_vec()).into_response();
            r.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes {start}-{end}/{total}")).expect("header"),
            );
            r
        }
        _ => (StatusCode::OK, f.bytes.clone()).into_response(),
    };
    let h = response.headers_mut();
    h.insert(
        "x-repo-commit",
        HeaderValue::from_str(&repo.sha).expect("header"),
    );
    h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("header"));
    if f.lfs() {
        h.insert(
            "x-linked-etag",
            HeaderValue::from_str(&etag).expect("header"),
        );
    }
    response
}
