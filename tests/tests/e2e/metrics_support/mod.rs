//! Helpers shared by the `metrics_*` tests: an in-process shard on a unix socket, a
//! Prometheus text parser, and the metric table of `deploy/README.md`.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_model_files::ModelFiles;
use tessera_proto::v1::text_generation_service_server::TextGenerationServiceServer;
use tessera_shard::service::{ShardInfo, ShardService};
use tessera_shard::{Engine, Model};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The tiny Llama fixture.
pub fn fixture() -> PathBuf {
    root().join("fixtures/tiny-llama")
}

/// Serves the tiny Llama fixture as shard 0 of 1 on `{prefix}-0`, in this process (with
/// `trace_fn` as the gRPC span maker when given). Returns the socket path.
pub async fn start_shard(
    prefix: &Path,
    trace_fn: Option<fn(&tonic::codegen::http::Request<()>) -> tracing::Span>,
) -> String {
    let socket = format!("{}-0", prefix.display());
    let files = ModelFiles::open(&fixture()).expect("fixture model");
    let model = Model::load(&files).expect("load fixture");
    let tokenizer = files.tokenizer_source().map_err(|e| e.to_string());
    let engine = Engine::new(model, 2, 16).expect("a two-block cache");
    let info = ShardInfo {
        dtype: "float32".into(),
        rank: 0,
        world_size: 1,
        pooler: None,
        socket_paths: vec![socket.clone()],
    };
    let service = ShardService::new(engine, info, 64 << 20).with_tokenizer_source(tokenizer);
    let listener = UnixListener::bind(&socket).expect("bind shard socket");
    let mut server = tonic::transport::Server::builder();
    if let Some(f) = trace_fn {
        server = server.trace_fn(f);
    }
    let router = server.add_service(TextGenerationServiceServer::new(service));
    tokio::spawn(router.serve_with_incoming(UnixListenerStream::new(listener)));
    socket
}

/// One sample of Prometheus text.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Series name (`foo_bucket`, `foo_sum`, ...).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// Parsed Prometheus text exposition.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Every sample.
    pub samples: Vec<Sample>,
    /// `# TYPE` of each metric family.
    pub types: BTreeMap<String, String>,
}

impl Scrape {
    /// Parses the text format (no escapes in label values are needed here).
    pub fn parse(text: &str) -> Self {
        let mut scrape = Scrape::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split_whitespace();
                if let (Some(n), Some(t)) = (it.next(), it.next()) {
                    scrape.types.insert(n.into(), t.into());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("sample line");
            let value: f64 = value.parse().expect("sample value");
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("label");
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            scrape.samples.push(Sample {
                name: name.into(),
                labels,
                value,
            });
        }
        scrape
    }

    /// Sum of every sample named `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// Every sample named `name`.
    pub fn series(&self, name: &str) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.name == name).collect()
    }

    /// Whether any sample is named `name` with `labels` among its labels.
    pub fn matching_any(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.matching(name, labels).next().is_some()
    }

    /// Whether any sample is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

/// A row of the metric table in `deploy/README.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Documented {
    /// Metric name.
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: String,
    /// Its label, if any.
    pub label: Option<String>,
}

/// The metric table of `deploy/README.md`.
pub fn documented() -> Vec<Documented> {
    let text = std::fs::read_to_string(root().join("deploy/README.md")).expect("deploy/README.md");
    text.lines()
        .filter(|l| l.starts_with("| `tessera_"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let label = cells[3].trim_matches('`');
            Documented {
                name: cells[1].trim_matches('`').to_string(),
                kind: cells[2].to_string(),
                label: (label != "—" && !label.is_empty()).then(|| label.to_string()),
            }
        })
        .collect()
}

/// A row of the vLLM-name table in `deploy/README.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentedTwin {
    /// The vLLM name, its kind and label.
    pub metric: Documented,
    /// Its `tessera_*` twin, if any.
    pub twin: Option<String>,
}

/// The vLLM-name table of `deploy/README.md`.
pub fn documented_vllm() -> Vec<DocumentedTwin> {
    let text = std::fs::read_to_string(root().join("deploy/README.md")).expect("deploy/README.md");
    text.lines()
        .filter(|l| l.starts_with("| `vllm:"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let label = cells[3].trim_matches('`');
            let twin = cells[4]
                .strip_prefix('`')
                .and_then(|t| t.split('`').next())
                .map(String::from);
            DocumentedTwin {
                metric: Documented {
                    name: cells[1].trim_matches('`').to_string(),
                    kind: cells[2].to_string(),
                    label: (label != "—" && !label.is_empty()).then(|| label.to_string()),
                },
                twin,
            }
        })
        .collect()
}

/// The router's vLLM-name list, as `DocumentedTwin` rows.
pub fn exported_vllm() -> Vec<DocumentedTwin> {
    use tessera_router::vllm_metric_names::{ALL, TWINS};
    ALL.iter()
        .map(|&(name, kind, label)| DocumentedTwin {
            metric: Documented {
                name: name.into(),
                kind: kind_name(kind).into(),
                label: label.map(Into::into),
            },
            twin: TWINS.iter().find(|t| t.0 == name).map(|t| t.1.into()),
        })
        .collect()
}

fn kind_name(kind: tessera_router::metric_names::Kind) -> &'static str {
    use tessera_router::metric_names::Kind;
    match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
    }
}

/// The router's own list, as `Documented` rows.
pub fn exported() -> Vec<Documented> {
    use tessera_router::metric_names::ALL;
    ALL.iter()
        .map(|&(name, kind, label)| Documented {
            name: name.into(),
            kind: kind_name(kind).into(),
            label: label.map(Into::into),
        })
        .collect()
}
