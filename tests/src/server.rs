//! [`Server`]: a launcher started for one test, its processes and its output.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::{
    STARTUP_TIMEOUT, alive, binary, children_of, client, comm, descendants_of, fixture, signal,
};

/// A TCP port of 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
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
        Self::start_with_env(model, &[], args).await
    }

    /// [`Self::start`] with `env` set for the launcher (and so its router and shards).
    pub async fn start_with_env(model: &str, env: &[(&str, &str)], args: &[&str]) -> Server {
        let model = fixture(model).into_os_string();
        let mut last_error = String::new();
        for _attempt in 0..3 {
            match Self::try_start_with(&model, env, args).await {
                Ok(server) => return server,
                Err(e) if e.contains("in use") => last_error = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("could not start the launcher: {last_error}");
    }

    /// Starts `tessera-launcher --model-id <model_id>` as given (a Hub id, a path) with `env`
    /// beside the kept environment; `Err` holds the launcher's output when it exits before
    /// becoming healthy.
    pub async fn try_start_with(
        model_id: &std::ffi::OsStr,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Result<Server, String> {
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
        command.envs(env.iter().copied());
        command
            .env("RUST_LOG", "info")
            .arg("--model-id")
            .arg(model_id)
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
