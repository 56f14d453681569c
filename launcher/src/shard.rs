//! Shard processes: their command lines, their sockets, and the events they produce.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Child;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::args::Dtype;
use crate::process::{CommandSpec, ExitState};
use crate::supervisor::Event;

/// How often a starting shard's socket is looked for.
const SOCKET_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Speculative-decoding options, passed through to the shards when set.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Speculation {
    /// Tokens proposed per step (`--speculate`).
    pub(crate) speculate: Option<u32>,
    /// The proposer (`--speculator`).
    pub(crate) speculator: Option<String>,
    /// The draft model, resolved to a local path (`--draft-model-id`).
    pub(crate) draft_model: Option<PathBuf>,
    /// Candidate paths per draft-head tree (`--speculative-tree-width`).
    pub(crate) tree_width: Option<u32>,
}

/// Everything the shards of one launch share; [`ShardConfig::command`] adds the rank.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShardConfig {
    /// The model, resolved to a local directory or `.gguf` file.
    pub(crate) model: PathBuf,
    /// Socket prefix: rank `i` listens on `{uds_path}-{i}`.
    pub(crate) uds_path: PathBuf,
    /// Number of shards.
    pub(crate) world_size: u32,
    /// Rendezvous address of rank 0.
    pub(crate) master_addr: String,
    /// Rendezvous port of rank 0.
    pub(crate) master_port: u16,
    /// Data type; `None` lets the shard choose.
    pub(crate) dtype: Option<Dtype>,
    /// KV-cache bytes on CPU.
    pub(crate) kv_cache_memory: u64,
    /// Fraction of GPU memory to use.
    pub(crate) memory_fraction: f32,
    /// Tokens per KV block.
    pub(crate) block_size: u32,
    /// Log as JSON lines.
    pub(crate) json_output: bool,
    /// OTLP traces endpoint.
    pub(crate) otlp_endpoint: Option<String>,
    /// Speculative decoding.
    pub(crate) speculation: Speculation,
}

impl ShardConfig {
    /// The socket shard `rank` creates when it is ready.
    pub(crate) fn socket_path(&self, rank: u32) -> PathBuf {
        socket_path(&self.uds_path, rank)
    }

    /// The command line and environment of shard `rank`, running `program`.
    pub(crate) fn command(&self, program: &Path, rank: u32) -> CommandSpec {
        let mut spec = CommandSpec::new(program);
        spec.flag("--model-id", &self.model)
            .flag("--uds-path", &self.uds_path)
            .flag("--rank", rank.to_string())
            .flag("--world-size", self.world_size.to_string())
            .flag("--master-addr", &self.master_addr)
            .flag("--master-port", self.master_port.to_string())
            .opt_flag("--dtype", self.dtype.map(Dtype::as_str))
            .flag("--kv-cache-memory", self.kv_cache_memory.to_string())
            .flag("--memory-fraction", self.memory_fraction.to_string())
            .flag("--block-size", self.block_size.to_string());
        if self.json_output {
            spec.arg("--json-output");
        }
        spec.opt_flag("--otlp-endpoint", self.otlp_endpoint.as_deref())
            .opt_flag(
                "--speculate",
                self.speculation.speculate.map(|k| k.to_string()),
            )
            .opt_flag("--speculator", self.speculation.speculator.as_deref())
            .opt_flag("--draft-model-id", self.speculation.draft_model.as_deref())
            .opt_flag(
                "--speculative-tree-width",
                self.speculation.tree_width.map(|w| w.to_string()),
            );
        spec.env("RANK", rank.to_string())
            .env("WORLD_SIZE", self.world_size.to_string())
            .env("MASTER_ADDR", &self.master_addr)
            .env("MASTER_PORT", self.master_port.to_string());
        // Shards never need the API key; keep it out of their environment.
        spec.env_remove
            .extend(["API_KEY".into(), "TESSERA_API_KEY".into()]);
        spec
    }
}

/// `{prefix}-{rank}`.
pub(crate) fn socket_path(prefix: &Path, rank: u32) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!("-{rank}"));
    PathBuf::from(name)
}

/// What a shard's watcher task reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShardEvent {
    /// The shard's socket exists: it is ready to serve.
    Ready(usize),
    /// The shard process exited.
    Exited {
        /// Its rank.
        rank: usize,
        /// How it exited.
        status: ExitState,
    },
}

/// Watches one shard: reports [`ShardEvent::Ready`] once its socket appears, and
/// [`ShardEvent::Exited`] when the process ends (then the task ends).
pub(crate) fn watch(
    rank: usize,
    mut child: Child,
    socket: PathBuf,
    events: mpsc::Sender<Event>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ready = false;
        let mut poll = tokio::time::interval(SOCKET_POLL_INTERVAL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                status = child.wait() => {
                    let status = ExitState(status.ok());
                    // The receiver is gone only when the supervisor has finished.
                    let _ = events.send(Event::Shard(ShardEvent::Exited { rank, status })).await;
                    return;
                }
                _ = poll.tick(), if !ready => {
                    if is_socket(&socket) {
                        ready = true;
                        let _ = events.send(Event::Shard(ShardEvent::Ready(rank))).await;
                    }
                }
            }
        }
    })
}

/// Whether `path` exists and is a unix socket.
fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket())
}

/// A shard socket could not be prepared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketError {
    /// Something accepts connections on the socket: another server is using this prefix.
    #[error(
        "{} is in use by another running server; stop it or choose another --shard-uds-path",
        .0.display()
    )]
    InUse(PathBuf),
    /// Something other than a socket is in the way; the launcher does not delete it.
    #[error(
        "{} exists and is not a socket; remove it or choose another --shard-uds-path",
        .0.display()
    )]
    NotASocket(PathBuf),
    /// The stale file could not be removed.
    #[error("cannot remove stale socket {}: {source}", .path.display())]
    Remove {
        /// The socket path.
        path: PathBuf,
        /// Why removal failed.
        source: io::Error,
    },
}

/// Removes a socket left behind by an earlier run. Refuses when a live server still listens
/// on it.
pub(crate) fn remove_stale_socket(path: &Path) -> Result<(), SocketError> {
    match std::fs::symlink_metadata(path) {
        Err(_) => return Ok(()),
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(SocketError::NotASocket(path.to_path_buf()));
        }
        Ok(_) if UnixStream::connect(path).is_ok() => {
            return Err(SocketError::InUse(path.to_path_buf()));
        }
        Ok(_) => {}
    }
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::debug!(socket = %path.display(), "removed stale socket");
            Ok(())
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SocketError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ShardConfig {
        ShardConfig {
            model: PathBuf::from("/models/smol.gguf"),
            uds_path: PathBuf::from("/tmp/tessera-server"),
            world_size: 2,
            master_addr: "localhost".into(),
            master_port: 29500,
            dtype: None,
            kv_cache_memory: 1 << 30,
            memory_fraction: 0.9,
            block_size: 16,
            json_output: false,
            otlp_endpoint: None,
            speculation: Speculation::default(),
        }
    }

    fn env_of(spec: &CommandSpec) -> Vec<(String, String)> {
        spec.env
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn minimal_command_line() {
        let spec = config().command(Path::new("/bin/tessera-shard"), 1);
        assert_eq!(spec.program, PathBuf::from("/bin/tessera-shard"));
        assert_eq!(
            spec.args_lossy().join(" "),
            "--model-id /models/smol.gguf --uds-path /tmp/tessera-server --rank 1 \
             --world-size 2 --master-addr localhost --master-port 29500 \
             --kv-cache-memory 1073741824 --memory-fraction 0.9 --block-size 16"
        );
        assert_eq!(
            env_of(&spec),
            [
                ("RANK".to_owned(), "1".to_owned()),
                ("WORLD_SIZE".to_owned(), "2".to_owned()),
                ("MASTER_ADDR".to_owned(), "localhost".to_owned()),
                ("MASTER_PORT".to_owned(), "29500".to_owned()),
            ]
        );
        assert!(spec.env_remove.contains(&"API_KEY".into()));
        assert!(spec.secret_env.is_empty());
    }

    #[test]
    fn full_command_line() {
        let mut config = config();
        config.dtype = Some(Dtype::Float32);
        config.json_output = true;
        config.otlp_endpoint = Some("http://otel:4317".into());
        config.speculation = Speculation {
            speculate: Some(3),
            speculator: Some("medusa".into()),
            draft_model: Some(PathBuf::from("/models/heads")),
            tree_width: Some(4),
        };
        let spec = config.command(Path::new("tessera-shard"), 0);
        assert_eq!(
            spec.args_lossy().join(" "),
            "--model-id /models/smol.gguf --uds-path /tmp/tessera-server --rank 0 \
             --world-size 2 --master-addr localhost --master-port 29500 --dtype float32 \
             --kv-cache-memory 1073741824 --memory-fraction 0.9 --block-size 16 --json-output \
             --otlp-endpoint http://otel:4317 --speculate 3 --speculator medusa \
             --draft-model-id /models/heads --speculative-tree-width 4"
        );
    }

    #[test]
    fn socket_paths() {
        assert_eq!(
            config().socket_path(0),
            PathBuf::from("/tmp/tessera-server-0")
        );
        assert_eq!(
            config().socket_path(12),
            PathBuf::from("/tmp/tessera-server-12")
        );
    }

    #[test]
    fn stale_socket_removal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sock-0");
        // Missing: fine.
        remove_stale_socket(&path).expect("missing is fine");
        // A socket nobody listens on any more: removed.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        assert!(is_socket(&path));
        remove_stale_socket(&path).expect("stale removed");
        assert!(!path.exists());
        // A live listener: refused, left alone.
        let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let err = remove_stale_socket(&path).expect_err("in use");
        assert!(err.to_string().contains("in use"), "{err}");
        assert!(path.exists());
        // A regular file: refused, left alone.
        let file = dir.path().join("file-0");
        std::fs::write(&file, "keep me").expect("write");
        let err = remove_stale_socket(&file).expect_err("not a socket");
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert!(file.exists());
    }
}
