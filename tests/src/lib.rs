//! Support for Tessera's end-to-end tests: they start the real `tessera-launcher` (which
//! starts `tessera-shard` and `tessera-router`) on a free port of 127.0.0.1 and talk HTTP to
//! it.
//!
//! - [`Server`] starts a launcher, waits for `/health`, and kills everything it started when
//!   dropped (also when the test panics). The launcher also gets a parent-death signal, so
//!   it cannot outlive the test thread that started it.
//! - [`binary`] finds the binaries next to the test executable (`target/<profile>/`) and
//!   fails clearly when one is missing or older than its sources.
//! - [`Sse`] reads server-sent events; [`within`] bounds every wait; [`Checks`] runs several
//!   independent checks against one server and reports every failure.

use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use futures::{FutureExt, StreamExt};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::Value;

/// Timeout of every HTTP request a test sends (unless it sets its own).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a launcher may take to become healthy.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);

/// The workspace root (the parent of this crate's folder).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives in the workspace")
        .to_path_buf()
}

/// A test model folder under `fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    let path = workspace_root().join("fixtures").join(name);
    assert!(path.is_dir(), "fixture {} is missing", path.display());
    path
}

/// A fixture's `golden.json`.
pub fn golden(name: &str) -> Value {
    let path = fixture(name).join("golden.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad {}: {e}", path.display()))
}

/// `target/<profile>/`: the folder of the test executable, or its parent when the
/// executable is in `deps/`.
pub fn binary_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("cannot locate the test executable");
    let dir = exe.parent().expect("the test executable has a folder");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("deps/ has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// Source folders (relative to the workspace root) each binary is built from.
fn sources_of(name: &str) -> &'static [&'static str] {
    match name {
        "tessera-launcher" => &["launcher/src"],
        "tessera-router" => &["router/src", "formats/src", "proto"],
        "tessera-shard" => &["shard/src", "kernels/src", "formats/src", "proto"],
        _ => &[],
    }
}

/// The newest modification time of the `.rs` and `.proto` files under `dir`, with the file.
fn newest_source(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "proto")
                && let Ok(modified) = meta.modified()
                && newest.as_ref().is_none_or(|(t, _)| modified > *t)
            {
                newest = Some((modified, path));
            }
        }
    }
    newest
}

/// The path of a workspace binary (`tessera-launcher`, `tessera-shard`, `tessera-router`)
/// next to the test executable. Panics with instructions when it is missing or older than
/// one of its source files (`cargo test` builds only the binaries of packages that have
/// integration tests, so a stale launcher would otherwise be tested silently);
/// `TESSERA_E2E_ALLOW_STALE=1` turns the staleness failure into a warning.
pub fn binary(name: &str) -> PathBuf {
    let path = binary_dir().join(name);
    let meta = std::fs::metadata(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing: build the binaries first with `cargo build --workspace --bins` \
             (same profile as the tests), then rerun the end-to-end tests",
            path.display()
        )
    });
    let built = meta.modified().expect("binary mtime");
    let root = workspace_root();
    for dir in sources_of(name) {
        if let Some((changed, file)) = newest_source(&root.join(dir))
            && changed > built
        {
            let message = format!(
                "{} is older than {}: rebuild it with `cargo build --workspace --bins` (same \
                 profile as the tests) before running the end-to-end tests, or set \
                 TESSERA_E2E_ALLOW_STALE=1 to test the old binary anyway",
                path.display(),
                file.display()
            );
            if std::env::var_os("TESSERA_E2E_ALLOW_STALE").is_some_and(|v| v != "0") {
                eprintln!("warning: {message}");
            } else {
                panic!("{message}");
            }
        }
    }
    path
}

/// A TCP port of 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// An HTTP client for the tests: no proxy, [`REQUEST_TIMEOUT`] per request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("reqwest client")
}

/// Awaits `fut` for at most `limit`; panics naming `what` when it takes longer.
pub async fn within<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Sends `sig` to `pid` (ignores a process that is already gone).
pub fn signal(pid: i32, sig: Signal) {
    let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `T`, `Z`, ...), or `None` when the
/// process does not exist.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`; comm may contain spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    proc_state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

/// The process name (`/proc/<pid>/comm`).
pub fn comm(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Direct children of `pid` (from `/proc/<pid>/task/*/children`).
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// All descendants of `pid`, depth first.
pub fn descendants_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for child in children_of(pid) {
        out.push(child);
        out.extend(descendants_of(child));
    }
    out
}

/// Waits until none of `pids` is alive; panics after `limit` naming the survivors.
pub async fn wait_all_dead(pids: &[i32], limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let alive: Vec<_> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            let names: Vec<_> = alive
                .iter()
                .map(|&p| format!("{p} ({})", comm(p).unwrap_or_default()))
                .collect();
            panic!("still running after {limit:?}: {}", names.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asks the kernel to SIGKILL the launcher when the thread that spawned it exits (test
/// over, test process killed), so a launcher cannot outlive its test.
#[allow(unsafe_code)]
fn kill_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs between fork and exec and only makes the async-signal-safe
    // system calls prctl(2) and getppid(2); it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL)).map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other(
                    "test exited while starting the launcher",
                ));
            }
            Ok(())
        });
    }
}

/// Environment variables the launcher's children may need; everything else is cleared so
/// the launcher's flags (which all read environment variables too) come only from the test.
const KEPT_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "RUST_BACKTRACE",
    "TESSERA_CACHE",
];

/// Flags [`Server::start`] adds unless the test gives them.
const DEFAULT_ARGS: [(&str, &str); 2] = [
    ("--kv-cache-memory", "64M"),
    ("--shutdown-grace-period", "5"),
];

/// A running `tessera-launcher` with its shard(s) and router, on 127.0.0.1.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    log: PathBuf,
    client: reqwest::Client,
    /// Every process seen under the launcher, so Drop can kill them even after the
    /// launcher is gone.
    seen: std::sync::Mutex<Vec<i32>>,
}

impl Server {
    /// Starts `tessera-launcher --model-id fixtures/<model>` with `args` appended (plus
    /// `--kv-cache-memory 64M --shutdown-grace-period 5` unless `args` sets them) and waits until `/health`
    /// answers 200. Retries on another port if the port was taken meanwhile.
    pub async fn start(model: &str, args: &[&str]) -> Server {
        let mut last_error = String::new();
        for _attempt in 0..3 {
            match Self::try_start(model, args).await {
                Ok(server) => return server,
                Err(e) if e.contains("in use") => last_error = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("could not start the launcher: {last_error}");
    }

    async fn try_start(model: &str, args: &[&str]) -> Result<Server, String> {
        let launcher = binary("tessera-launcher");
        binary("tessera-shard");
        binary("tessera-router");
        let dir = tempfile::Builder::new()
            .prefix("tessera-e2e-")
            .tempdir()
            .expect("tempdir");
        let log = dir.path().join("launcher.log");
        let port = free_port();
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut command = Command::new(&launcher);
        command.env_clear();
        for key in KEPT_ENV {
            if let Some(v) = std::env::var_os(key) {
                command.env(key, v);
            }
        }
        command
            .env("RUST_LOG", "info")
            .arg("--model-id")
            .arg(fixture(model))
            .args(["--hostname", "127.0.0.1", "--port", &port.to_string()])
            .arg("--shard-uds-path")
            .arg(dir.path().join("shard"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (flag, value) in DEFAULT_ARGS {
            if !args.contains(&flag) {
                command.args([flag, value]);
            }
        }
        kill_with_parent(&mut command);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", launcher.display()));
        let mut server = Server {
            child: Some(child),
            port,
            dir,
            log,
            client: client(),
            seen: std::sync::Mutex::new(Vec::new()),
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = server.try_wait() {
                let tail = server.log_tail(40);
                return Err(format!(
                    "the launcher exited with {status} before becoming healthy; last output:\n{tail}"
                ));
            }
            server.remember_processes();
            let health = server
                .client
                .get(server.url("/health"))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if health.is_ok_and(|r| r.status() == 200) {
                server.remember_processes();
                return Ok(server);
            }
            if Instant::now() >= deadline {
                let tail = server.log_tail(40);
                panic!(
                    "the launcher was not healthy after {STARTUP_TIMEOUT:?}; last output:\n{tail}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A client for this server (created for the server; tests on other runtimes should
    /// make their own with [`client`]).
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// The launcher's PID.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// The shards' socket prefix (`{prefix}-{rank}`).
    pub fn uds_prefix(&self) -> PathBuf {
        self.dir.path().join("shard")
    }

    /// Files in the server's temporary folder whose name starts with `shard` (the sockets).
    pub fn socket_files(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("shard"))
            })
            .collect();
        out.sort();
        out
    }

    fn remember_processes(&self) {
        let pid = self.pid();
        if pid == 0 {
            return;
        }
        let mut seen = self.seen.lock().expect("seen lock");
        for p in descendants_of(pid) {
            if !seen.contains(&p) {
                seen.push(p);
            }
        }
    }

    /// The launcher's live children as `(pid, name)`.
    pub fn children(&self) -> Vec<(i32, String)> {
        self.remember_processes();
        children_of(self.pid())
            .into_iter()
            .filter(|&p| alive(p))
            .map(|p| (p, comm(p).unwrap_or_default()))
            .collect()
    }

    /// PIDs of the launcher's live children named `name` (`tessera-shard`,
    /// `tessera-router`).
    pub fn child_pids(&self, name: &str) -> Vec<i32> {
        self.children()
            .into_iter()
            .filter(|(_, n)| n == name)
            .map(|(p, _)| p)
            .collect()
    }

    /// The PID of the only child named `name`; panics if there is not exactly one.
    pub fn child_pid(&self, name: &str) -> i32 {
        let pids = self.child_pids(name);
        assert_eq!(
            pids.len(),
            1,
            "expected one {name} child of the launcher, found {:?}",
            self.children()
        );
        pids[0]
    }

    /// Sends `sig` to the launcher.
    pub fn signal(&self, sig: Signal) {
        signal(self.pid(), sig);
    }

    /// The launcher's exit status if it has exited (reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().expect("try_wait")
    }

    /// Waits up to `limit` for the launcher to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The last `lines` lines of the launcher's output (its children's included).
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// `GET /metrics` as text.
    pub async fn metrics_text(&self) -> String {
        let r = self
            .client
            .get(self.url("/metrics"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .expect("GET /metrics");
        assert_eq!(r.status(), 200, "GET /metrics");
        r.text().await.expect("metrics body")
    }

    /// The value of one series of `/metrics` (`name` or `name{labels}` exactly as printed);
    /// 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics_text().await, series).unwrap_or(0.0)
    }

    /// Polls `series` until `ok(value)` or `limit` passes; returns the last value and
    /// whether it satisfied `ok`.
    pub async fn wait_metric(
        &self,
        series: &str,
        limit: Duration,
        ok: impl Fn(f64) -> bool,
    ) -> (f64, bool) {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.metric(series).await;
            if ok(v) {
                return (v, true);
            }
            if Instant::now() >= deadline {
                return (v, false);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// POSTs `body` as JSON to `path`; returns the status and the body parsed as JSON
    /// (`Value::String` of the raw text when it is not JSON).
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        read_json(r).await
    }

    /// GETs `path`; returns the status and the JSON body.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        read_json(r).await
    }

    /// POSTs `body` to a streaming route and returns the SSE reader (panics unless 200).
    pub async fn stream(&self, path: &str, body: &Value) -> Sse {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status();
        if status != 200 {
            let text = r.text().await.unwrap_or_default();
            panic!("POST {path} answered {status}: {text}");
        }
        Sse::new(r)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.remember_processes();
        if let Some(mut child) = self.child.take() {
            if std::thread::panicking() {
                eprintln!(
                    "---- launcher output (last 60 lines) ----\n{}\n----",
                    self.log_tail(60)
                );
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // The children die with the launcher (parent-death signal); kill them anyway in
        // case that failed. PIDs are only signalled while they still run one of our binaries.
        for &pid in self
            .seen
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
            .iter()
        {
            if alive(pid) && comm(pid).is_some_and(|c| c.starts_with("tessera-")) {
                signal(pid, Signal::SIGKILL);
            }
        }
    }
}

/// Reads a response as `(status, JSON body)`; a body that is not JSON becomes a
/// `Value::String` of its text.
pub async fn read_json(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

/// The value of one series in Prometheus text (`series` is everything before the value).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// A server-sent events reader over a streaming response.
pub struct Sse {
    body: futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Sse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sse")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

/// One thing read from an SSE stream.
#[derive(Debug, Clone, PartialEq)]
pub enum SseItem {
    /// The `data` of one event (lines joined with `\n`).
    Data(String),
    /// The stream ended cleanly.
    End,
    /// Reading failed (connection reset, ...).
    Error(String),
}

impl Sse {
    /// Reads `response`'s body as SSE.
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            body: response
                .bytes_stream()
                .map(|chunk| chunk.map(|b| b.to_vec()))
                .boxed(),
            buf: Vec::new(),
        }
    }

    fn take_event(&mut self) -> Option<Option<String>> {
        let end = self.buf.windows(2).position(|w| w == b"\n\n")?;
        let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
        let text = String::from_utf8_lossy(&raw).replace("\r\n", "\n");
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        // Comment-only events (keep-alives) have no data.
        Some((!data.is_empty()).then(|| data.join("\n")))
    }

    /// The next event's data, skipping keep-alive comments; waits at most `limit`
    /// (panics after that).
    pub async fn next_item(&mut self, limit: Duration) -> SseItem {
        within("the next SSE event", limit, async {
            loop {
                match self.take_event() {
                    Some(Some(data)) => return SseItem::Data(data),
                    Some(None) => continue,
                    None => {}
                }
                match self.body.next().await {
                    Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                    Some(Err(e)) => return SseItem::Error(e.to_string()),
                    None => return SseItem::End,
                }
            }
        })
        .await
    }

    /// The next event's data as JSON (`None` at the end of the stream or for `[DONE]`);
    /// panics on a transport error or on data that is not JSON.
    pub async fn next_json(&mut self) -> Option<Value> {
        match self.next_item(REQUEST_TIMEOUT).await {
            SseItem::Data(d) if d == "[DONE]" => None,
            SseItem::Data(d) => {
                Some(serde_json::from_str(&d).unwrap_or_else(|e| panic!("SSE data {d:?}: {e}")))
            }
            SseItem::End => None,
            SseItem::Error(e) => panic!("SSE stream failed: {e}"),
        }
    }

    /// Every remaining event's data until the end of the stream (`[DONE]` included);
    /// panics on a transport error or when it takes longer than [`REQUEST_TIMEOUT`].
    pub async fn collect_data(mut self) -> Vec<String> {
        within("the whole SSE stream", REQUEST_TIMEOUT, async {
            let mut out = Vec::new();
            loop {
                match self.next_item(REQUEST_TIMEOUT).await {
                    SseItem::Data(d) => out.push(d),
                    SseItem::End => return out,
                    SseItem::Error(e) => panic!("SSE stream failed after {out:?}: {e}"),
                }
            }
        })
        .await
    }

    /// Every remaining event parsed as JSON, `[DONE]` left out; also returns whether
    /// `[DONE]` was the last event.
    pub async fn collect_json(self) -> (Vec<Value>, bool) {
        let data = self.collect_data().await;
        let done = data.last().is_some_and(|d| d == "[DONE]");
        let events = data
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("SSE data {d:?}: {e}")))
            .collect();
        (events, done)
    }
}

/// Runs independent checks against one server and reports every failure at the end,
/// so one broken route does not hide the others.
#[derive(Debug, Default)]
pub struct Checks {
    failures: Vec<String>,
    passed: Vec<String>,
}

impl Checks {
    /// No checks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `check` (at most `limit`), catching its panic as a failure named `name`.
    pub async fn run(&mut self, name: &str, limit: Duration, check: impl Future<Output = ()>) {
        let started = Instant::now();
        let outcome = std::panic::AssertUnwindSafe(tokio::time::timeout(limit, check))
            .catch_unwind()
            .await;
        let elapsed = started.elapsed();
        match outcome {
            Ok(Ok(())) => {
                eprintln!("check {name}: ok ({elapsed:.2?})");
                self.passed.push(name.to_owned());
            }
            Ok(Err(_)) => {
                eprintln!("check {name}: TIMED OUT after {limit:?}");
                self.failures
                    .push(format!("{name}: timed out after {limit:?}"));
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panicked".to_owned());
                eprintln!("check {name}: FAILED ({elapsed:.2?})");
                self.failures.push(format!("{name}: {message}"));
            }
        }
    }

    /// Panics listing every failed check.
    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} of {} checks failed:\n\n{}",
            self.failures.len(),
            self.failures.len() + self.passed.len(),
            self.failures.join("\n\n")
        );
    }
}

/// A process stopped with SIGSTOP until this guard is dropped (SIGCONT), so a test that
/// panics never leaves it frozen. Used to hold requests in flight deterministically: the
/// tiny models generate a token in about a millisecond.
#[derive(Debug)]
pub struct Paused(i32);

impl Paused {
    /// Stops `pid`.
    pub fn new(pid: i32) -> Self {
        signal(pid, Signal::SIGSTOP);
        Paused(pid)
    }

    /// Continues it now.
    pub fn resume(self) {}
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(self.0, Signal::SIGCONT);
    }
}

/// The token ids of a `/generate` answer with `details`.
pub fn detail_ids(body: &Value) -> Vec<u64> {
    body["details"]["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no details.tokens in {body}"))
        .iter()
        .map(|t| t["id"].as_u64().expect("token id"))
        .collect()
}

/// A JSON array of integers.
pub fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("not an integer: {x}")))
        .collect()
}

impl Server {
    /// `/tokenize`'s ids for `text`.
    pub async fn tokenize(&self, text: &str) -> Vec<u64> {
        let (status, body) = self
            .post("/tokenize", &serde_json::json!({ "inputs": text }))
            .await;
        assert_eq!(status, 200, "POST /tokenize: {body}");
        body.as_array()
            .unwrap_or_else(|| panic!("/tokenize answered {body}"))
            .iter()
            .map(|t| t["id"].as_u64().expect("token id"))
            .collect()
    }

    /// `POST /generate` with `body`; panics unless it answers 200. Returns the body.
    pub async fn generate(&self, body: &Value) -> Value {
        let (status, answer) = self.post("/generate", body).await;
        assert_eq!(status, 200, "POST /generate {body}: {answer}");
        answer
    }

    /// Greedy `/generate` with details, EOS ignored: the generated token ids.
    pub async fn greedy_ids(&self, text: &str, max_new_tokens: u32) -> Vec<u64> {
        let body = self
            .generate(&serde_json::json!({
                "inputs": text,
                "parameters": {"max_new_tokens": max_new_tokens, "details": true, "ignore_eos": true}
            }))
            .await;
        detail_ids(&body)
    }
}

/// An independent decoder for the fixtures' byte-level BPE tokenizer (GPT-2 byte table),
/// to check the router's detokenization against: the bytes of every token, joined, decoded
/// as UTF-8 with replacement characters (what `tokenizers`' ByteLevel decoder does).
#[derive(Debug)]
pub struct ByteLevelDecoder {
    /// Bytes of each token id; `None` for special tokens.
    tokens: Vec<Option<Vec<u8>>>,
}

impl ByteLevelDecoder {
    /// Reads `fixtures/<model>/tokenizer.json`.
    pub fn for_fixture(model: &str) -> Self {
        let path = fixture(model).join("tokenizer.json");
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
            .expect("tokenizer.json");
        // GPT-2's bytes_to_unicode, inverted.
        let mut printable: Vec<u32> = (u32::from('!')..=u32::from('~'))
            .chain(u32::from('¡')..=u32::from('¬'))
            .chain(u32::from('®')..=u32::from('ÿ'))
            .collect();
        let mut chars = printable.clone();
        let mut n = 0;
        for b in 0..256u32 {
            if !printable.contains(&b) {
                printable.push(b);
                chars.push(256 + n);
                n += 1;
            }
        }
        let byte_of: std::collections::HashMap<char, u8> = chars
            .iter()
            .zip(&printable)
            .map(|(&c, &b)| (char::from_u32(c).expect("char"), b as u8))
            .collect();
        let vocab = json["model"]["vocab"].as_object().expect("model.vocab");
        let mut tokens = vec![None; vocab.len()];
        for (text, id) in vocab {
            let id = id.as_u64().expect("id") as usize;
            if id >= tokens.len() {
                tokens.resize(id + 1, None);
            }
            let bytes = text
                .chars()
                .map(|c| {
                    *byte_of
                        .get(&c)
                        .unwrap_or_else(|| panic!("char {c:?} of {text:?}"))
                })
                .collect();
            tokens[id] = Some(bytes);
        }
        for added in json["added_tokens"].as_array().expect("added_tokens") {
            let id = added["id"].as_u64().expect("id") as usize;
            if id >= tokens.len() {
                tokens.resize(id + 1, None);
            }
            tokens[id] = if added["special"] == true {
                None
            } else {
                Some(
                    added["content"]
                        .as_str()
                        .expect("content")
                        .as_bytes()
                        .to_vec(),
                )
            };
        }
        Self { tokens }
    }

    /// The text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u64]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .filter_map(|&id| self.tokens.get(id as usize).cloned().flatten())
            .flatten()
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The resident set size of `pid` in KiB (`VmRSS` of `/proc/<pid>/status`), or `None` when
/// the process is gone.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A small deterministic random generator (xorshift64*) for tests that want reproducible
/// variety without a dependency.
#[derive(Debug, Clone)]
pub struct TestRng(u64);

impl TestRng {
    /// A generator from `seed` (0 is replaced by a fixed non-zero value).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
