//! `--model-id ORG/NAME[:QUANT]` against a Hub-shaped server on 127.0.0.1 (`hub/fake_hub.rs`)
//! serving fixture files: a sharded safetensors checkpoint and a GGUF repository download what
//! serving needs and nothing else, into the `huggingface_hub` cache layout, and serve the
//! goldens, as does a split GGUF, and an embedding model embeds with the pooling it declares; a second start with the Hub gone serves from the cache, and so does
//! `HF_HUB_OFFLINE=1`; offline with an empty cache, a gated repository without a token, an
//! unknown one and a corrupt download each stop the launcher with a message that says what
//! to do.

mod fake_hub;

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use fake_hub::{FakeHub, HubFile, HubRepo};
use tessera_e2e::{Server, fixture, fixture_json, golden, u64s, within};

const TEST_LIMIT: Duration = Duration::from_secs(300);

/// A repository of fixture `name`'s files and those of its folders (its goldens and a README
/// too, which serving must not fetch), under `id`.
fn fixture_repo(id: &str, name: &str) -> HubRepo {
    let root = fixture(name);
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    for entry in std::fs::read_dir(&root).expect("fixture folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            let inner = std::fs::read_dir(&path).expect("fixture subfolder");
            paths.extend(
                inner
                    .map(|e| e.expect("entry").path())
                    .filter(|p| p.is_file()),
            );
        } else {
            paths.push(path);
        }
    }
    let mut files: Vec<HubFile> = paths
        .into_iter()
        .filter(|p| p.extension().is_none_or(|e| e != "gguf"))
        .map(|p| {
            let name = p.strip_prefix(&root).expect("inside the fixture");
            let name = name.to_string_lossy().into_owned();
            HubFile::new(&name, std::fs::read(&p).expect("read fixture"))
        })
        .collect();
    files.push(HubFile::new("README.md", b"# a tiny test model\n".to_vec()));
    HubRepo::new(id, files)
}

/// A GGUF repository: fixture `name`'s `model.gguf` under two quantizations' names, and a
/// multimodal projector.
fn gguf_repo(id: &str, name: &str) -> HubRepo {
    let gguf = std::fs::read(fixture(name).join("model.gguf")).expect("read gguf");
    HubRepo::new(
        id,
        vec![
            HubFile::new("README.md", b"# GGUF\n".to_vec()),
            HubFile::new(&format!("{name}-Q4_K_M.gguf"), gguf.clone()),
            HubFile::new(&format!("{name}-Q8_0.gguf"), gguf),
            HubFile::new("mmproj-f16.gguf", b"not a language model".to_vec()),
        ],
    )
}

/// A GGUF repository whose Q8_0 is fixture `tiny-qwen3`'s split GGUF, in a folder as large
/// repositories keep split quantizations.
fn split_gguf_repo(id: &str) -> HubRepo {
    let dir = fixture("tiny-qwen3").join("split");
    let files = (1..=4)
        .map(|i| {
            let bytes = std::fs::read(dir.join(format!("model-{i:05}-of-00004.gguf")))
                .expect("read split part");
            HubFile::new(&format!("Q8_0/tiny-qwen3-Q8_0-{i:05}-of-00004.gguf"), bytes)
        })
        .collect();
    HubRepo::new(id, files)
}

async fn start(model_id: &str, env: &[(&str, &str)]) -> Result<Server, String> {
    Server::try_start_with(OsStr::new(model_id), env, &[]).await
}

/// The golden greedy tokens of fixture `name`'s first prompts, through HTTP.
async fn assert_serves_goldens(server: &Server, name: &str) {
    let golden = golden(name);
    for p in golden["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .take(2)
    {
        let want = u64s(&p["greedy_ids"]);
        let text = p["text"].as_str().expect("text");
        let got = server.greedy_ids(text, want.len() as u32).await;
        assert_eq!(got, want, "{name}: {text:?}");
    }
}

fn snapshot_files(hf_home: &Path, repo: &str) -> Vec<String> {
    let snapshots = hf_home
        .join("hub")
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("snapshots");
    let mut files = Vec::new();
    for commit in std::fs::read_dir(&snapshots).expect("snapshots").flatten() {
        for f in std::fs::read_dir(commit.path())
            .expect("snapshot")
            .flatten()
        {
            files.push(f.file_name().to_string_lossy().into_owned());
        }
    }
    files.sort();
    files
}

#[tokio::test]
async fn models_by_hub_id_download_once_and_serve_from_the_cache() {
    within("hub", TEST_LIMIT, async {
        let mut gated = gguf_repo("tessera-test/gated-GGUF", "tiny-qwen3");
        gated.token = Some("hf_test_token".into());
        let mut corrupt = gguf_repo("tessera-test/corrupt-GGUF", "tiny-qwen3");
        corrupt.wrong_hash = true;
        let hub = FakeHub::start(vec![
            fixture_repo("tessera-test/tiny-qwen2", "tiny-qwen2"),
            fixture_repo("tessera-test/tiny-qwen3-embedding", "tiny-qwen3-embedding"),
            gguf_repo("tessera-test/tiny-qwen3-GGUF", "tiny-qwen3"),
            gated,
            corrupt,
            split_gguf_repo("tessera-test/tiny-qwen3-split-GGUF"),
        ])
        .await;
        let endpoint = hub.endpoint();
        let home = tempfile::tempdir().expect("tempdir");
        let hf_home = home.path().to_str().expect("utf-8 path");
        let online = [("HF_HOME", hf_home), ("HF_ENDPOINT", endpoint.as_str())];

        // A sharded checkpoint: its config, tokenizer, template and the three shards the
        // index names; not the goldens or the README.
        let server = start("tessera-test/tiny-qwen2", &online)
            .await
            .expect("start");
        let (_, models) = server.get("/v1/models").await;
        assert_eq!(
            models["data"][0]["id"], "tessera-test/tiny-qwen2",
            "{models}"
        );
        assert_serves_goldens(&server, "tiny-qwen2").await;
        drop(server);
        let mut fetched = hub.downloads();
        fetched.sort();
        let expected_files = snapshot_files(home.path(), "tessera-test/tiny-qwen2");
        assert!(
            !expected_files
                .iter()
                .any(|f| f == "golden.json" || f == "README.md"),
            "{expected_files:?}"
        );
        assert_eq!(
            fetched.len(),
            expected_files.len(),
            "each file once: {fetched:?}"
        );
        assert!(
            expected_files
                .iter()
                .filter(|f| f.ends_with(".safetensors"))
                .count()
                == 3
        );

        // The same repository as its own draft model: from the cache, nothing downloaded.
        let before = hub.downloads().len();
        let draft = [
            "--speculator",
            "draft",
            "--draft-model-id",
            "tessera-test/tiny-qwen2",
            "--speculate",
            "2",
        ];
        let server = Server::try_start_with(OsStr::new("tessera-test/tiny-qwen2"), &online, &draft)
            .await
            .expect("start with a Hub draft model");
        assert_serves_goldens(&server, "tiny-qwen2").await;
        drop(server);
        assert_eq!(hub.downloads().len(), before, "{:?}", hub.downloads());

        // A GGUF repository: the quantization named, nothing else.
        let before = hub.downloads().len();
        let server = start("tessera-test/tiny-qwen3-GGUF:Q8_0", &online)
            .await
            .expect("start GGUF");
        assert_serves_goldens(&server, "tiny-qwen3").await;
        drop(server);
        assert_eq!(
            hub.downloads()[before..],
            ["tessera-test/tiny-qwen3-GGUF/tiny-qwen3-Q8_0.gguf".to_string()]
        );

        // A split quantization: every part, opened from the first.
        let server = start("tessera-test/tiny-qwen3-split-GGUF:Q8_0", &online)
            .await
            .expect("start split GGUF");
        assert_serves_goldens(&server, "tiny-qwen3").await;
        drop(server);

        // A sentence-transformers model: its pooling config comes along, and it embeds.
        let server = start("tessera-test/tiny-qwen3-embedding", &online)
            .await
            .expect("an embedding model by Hub id");
        let golden = fixture_json("tiny-qwen3-embedding", "golden_embeddings.json");
        let first = &golden["inputs"][0];
        let (status, body) = server
            .post(
                "/v1/embeddings",
                &serde_json::json!({"input": first["text"]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let got = body["data"][0]["embedding"].as_array().expect("a vector");
        let want = first["embedding"].as_array().expect("golden vector");
        let diff = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a.as_f64().unwrap_or(f64::NAN) - b.as_f64().unwrap_or(0.0)).abs())
            .fold(0.0, f64::max);
        assert!(got.len() == want.len() && diff < 1e-4, "max diff {diff}");
        drop(server);

        // Refusals that say what to do.
        let err = start("tessera-test/gated-GGUF", &online)
            .await
            .expect_err("gated");
        assert!(err.contains("HF_TOKEN"), "{err}");
        let err = start("tessera-test/no-such-model", &online)
            .await
            .expect_err("unknown");
        assert!(err.contains("no model tessera-test/no-such-model"), "{err}");
        let err = start("tessera-test/corrupt-GGUF", &online)
            .await
            .expect_err("corrupt");
        assert!(
            err.contains("SHA-256") && err.contains("start again"),
            "{err}"
        );
        let err = start("tessera-test/tiny-qwen3-GGUF:Q2_K", &online)
            .await
            .expect_err("quant");
        assert!(
            err.contains("Q4_K_M.gguf") && err.contains("Q8_0.gguf"),
            "{err}"
        );

        // With the token, the gated repository's default quantization (Q4_K_M).
        let with_token = [
            ("HF_HOME", hf_home),
            ("HF_ENDPOINT", endpoint.as_str()),
            ("HF_TOKEN", "hf_test_token"),
        ];
        let server = start("tessera-test/gated-GGUF", &with_token)
            .await
            .expect("token");
        drop(server);
        assert!(
            hub.downloads()
                .contains(&"tessera-test/gated-GGUF/tiny-qwen3-Q4_K_M.gguf".to_string())
        );

        // The Hub gone: the cached copy serves, online or offline.
        drop(hub);
        let server = start("tessera-test/tiny-qwen2", &online)
            .await
            .expect("unreachable");
        assert_serves_goldens(&server, "tiny-qwen2").await;
        drop(server);
        let offline = [("HF_HOME", hf_home), ("HF_HUB_OFFLINE", "1")];
        let server = start("tessera-test/tiny-qwen3-GGUF:Q8_0", &offline)
            .await
            .expect("offline");
        drop(server);

        // Offline with nothing cached.
        let empty = tempfile::tempdir().expect("tempdir");
        let empty_home = empty.path().to_str().expect("utf-8 path");
        let err = start(
            "tessera-test/tiny-qwen2",
            &[("HF_HOME", empty_home), ("HF_HUB_OFFLINE", "1")],
        )
        .await
        .expect_err("offline, empty cache");
        assert!(
            err.contains("HF_HUB_OFFLINE") && err.contains("not in the local cache"),
            "{err}"
        );
    })
    .await;
}
