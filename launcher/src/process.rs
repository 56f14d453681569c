//! Spawning child processes, forwarding their output, and signalling them.
//!
//! # How children are kept from outliving the launcher
//!
//! Two mechanisms, both Linux:
//!
//! * Every child gets `PR_SET_PDEATHSIG = SIGKILL` (set with `prctl` between `fork` and `exec`),
//!   so the kernel kills it when the launcher dies for any reason, `SIGKILL` included. The
//!   signal fires when the *thread* that forked the child exits, so children are spawned only
//!   from the launcher's main thread (the launcher runs a current-thread tokio runtime).
//! * Every child is the leader of its own process group. A Ctrl-C in the terminal then reaches
//!   only the launcher, which shuts children down in order (router first, then shards), and the
//!   launcher signals whole groups, so helpers a child started go down with it.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// How many of a child's last output lines are kept for error reports.
pub(crate) const TAIL_LINES: usize = 50;

/// Which child a message is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildId {
    /// The shard of this rank.
    Shard(usize),
    /// The router.
    Router,
}

impl fmt::Display for ChildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildId::Shard(rank) => write!(f, "shard {rank}"),
            ChildId::Router => f.write_str("router"),
        }
    }
}

/// A program with its arguments and environment changes; `Debug` hides secret values.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct CommandSpec {
    /// The executable.
    pub(crate) program: PathBuf,
    /// Arguments after the program name.
    pub(crate) args: Vec<OsString>,
    /// Variables set on top of the launcher's environment (which children inherit).
    pub(crate) env: Vec<(OsString, OsString)>,
    /// Variables set like `env` whose values must never be printed.
    pub(crate) secret_env: Vec<(OsString, OsString)>,
    /// Variables removed from the inherited environment.
    pub(crate) env_remove: Vec<OsString>,
}

impl CommandSpec {
    /// A command running `program` with no arguments and the launcher's environment.
    pub(crate) fn new(program: impl Into<PathBuf>) -> Self {
        CommandSpec {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            secret_env: Vec::new(),
            env_remove: Vec::new(),
        }
    }

    /// Appends one argument.
    pub(crate) fn arg(&mut self, arg: impl Into<OsString>) -> &mut Self {
        self.args.push(arg.into());
        self
    }

    /// Appends `--flag value`.
    pub(crate) fn flag(&mut self, flag: &str, value: impl Into<OsString>) -> &mut Self {
        self.arg(flag).arg(value)
    }

    /// Appends `--flag value` when `value` is set.
    pub(crate) fn opt_flag<T: Into<OsString>>(
        &mut self,
        flag: &str,
        value: Option<T>,
    ) -> &mut Self {
        if let Some(value) = value {
            self.flag(flag, value);
        }
        self
    }

    /// Sets an environment variable for the child.
    pub(crate) fn env(
        &mut self,
        key: impl Into<OsString>,
        value: impl Into<OsString>,
    ) -> &mut Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The arguments as UTF-8 strings (lossy), for tests.
    #[cfg(test)]
    pub(crate) fn args_lossy(&self) -> Vec<String> {
        self.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// The command line as one string, for logs. Contains no secret.
    pub(crate) fn display_line(&self) -> String {
        let mut line = self.program.display().to_string();
        for arg in &self.args {
            line.push(' ');
            line.push_str(&arg.to_string_lossy());
        }
        line
    }

    /// The tokio command: piped output, own process group, parent-death signal, killed on drop.
    fn to_command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        for key in &self.env_remove {
            command.env_remove(key);
        }
        for (key, value) in MALLOC_DEFAULTS {
            if std::env::var_os(key).is_none() {
                command.env(key, value);
            }
        }
        for (key, value) in self.env.iter().chain(&self.secret_env) {
            command.env(key, value);
        }
        kill_when_parent_dies(&mut command);
        command
    }
}

/// glibc's malloc settings for the children, read when a process starts; a user's own setting
/// of one wins.
/// - Arenas: glibc gives threads that contend an arena of their own (up to eight per core); a
///   server's threads then spread freed memory over them and RSS creeps up under load. Two
///   arenas keep the allocator's own keep small.
/// - The mmap threshold: glibc raises it each time a large mapped block is freed (up to
///   32 MiB), so a rare large buffer (a long prompt's logits) later lands in the heap and stays
///   resident after it is freed. Fixed, blocks over 4 MiB stay mapped and go back when freed.
const MALLOC_DEFAULTS: [(&str, &str); 2] = [
    ("MALLOC_ARENA_MAX", "2"),
    ("MALLOC_MMAP_THRESHOLD_", "4194304"),
];

impl fmt::Debug for CommandSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret_keys: Vec<_> = self.secret_env.iter().map(|(k, _)| k).collect();
        f.debug_struct("CommandSpec")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &self.env)
            .field("secret_env_keys", &secret_keys)
            .field("env_remove", &self.env_remove)
            .finish()
    }
}

/// Asks the kernel to SIGKILL the child when the launcher's spawning thread dies.
///
/// This is the only `unsafe` in the launcher: `pre_exec` is unsafe because the closure runs
/// in the forked child before `exec`, where only async-signal-safe calls are allowed.
#[allow(unsafe_code)]
fn kill_when_parent_dies(command: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure only calls `prctl(2)` and `getppid(2)`, which are async-signal-safe
    // system calls; it allocates nothing and touches no lock or state shared with the parent.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL)).map_err(io::Error::from)?;
            // The launcher may have died between fork and prctl; then no signal will come.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::other("launcher exited while starting the child"));
            }
            Ok(())
        });
    }
}

/// How children's output lines are written to the launcher's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputMode {
    /// Each line prefixed with `[shard i]` or `[router]`.
    Prefixed,
    /// JSON lines: a child's JSON object gets a `source` field; other text is wrapped as
    /// `{"source": ..., "message": ...}`.
    Json,
}

impl OutputMode {
    /// One output line of `child`, formatted for the launcher's output.
    pub(crate) fn format(self, child: ChildId, line: &str) -> String {
        match self {
            OutputMode::Prefixed => format!("[{child}] {line}"),
            OutputMode::Json => {
                let source = match child {
                    ChildId::Shard(rank) => format!("shard-{rank}"),
                    ChildId::Router => "router".to_owned(),
                };
                let object = match serde_json::from_str::<serde_json::Value>(line) {
                    Ok(serde_json::Value::Object(mut map)) => {
                        map.insert("source".to_owned(), source.into());
                        map
                    }
                    _ => {
                        let mut map = serde_json::Map::new();
                        map.insert("source".to_owned(), source.into());
                        map.insert("message".to_owned(), line.into());
                        map
                    }
                };
                serde_json::Value::Object(object).to_string()
            }
        }
    }
}

/// The last [`TAIL_LINES`] lines a child wrote (stdout and stderr interleaved), shared with the
/// tasks that forward its output.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutputTail(Arc<Mutex<VecDeque<String>>>);

impl OutputTail {
    /// Records one line, dropping the oldest beyond [`TAIL_LINES`].
    pub(crate) fn push(&self, line: String) {
        let mut lines = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// A copy of the recorded lines, oldest first.
    pub(crate) fn lines(&self) -> Vec<String> {
        let lines = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        lines.iter().cloned().collect()
    }
}

/// A started child: its process, pid, output tail and the tasks forwarding its output.
#[derive(Debug)]
pub(crate) struct Spawned {
    /// The process, to be awaited by a watcher task.
    pub(crate) child: Child,
    /// Its pid, which is also its process group id.
    pub(crate) pid: Pid,
    /// Its last output lines.
    pub(crate) tail: OutputTail,
    /// The two output-forwarding tasks; they end when the child's pipes close.
    pub(crate) forwarders: Vec<JoinHandle<()>>,
}

/// Starts `spec` as child `id` and forwards its stdout to the launcher's stdout and its stderr
/// to the launcher's stderr, line by line. Must be called from the launcher's main thread (see
/// the module docs).
pub(crate) fn spawn(id: ChildId, spec: &CommandSpec, mode: OutputMode) -> io::Result<Spawned> {
    let mut child = spec.to_command().spawn()?;
    let raw_pid = child
        .id()
        .ok_or_else(|| io::Error::other("child exited before its pid was read"))?;
    let pid = Pid::from_raw(
        i32::try_from(raw_pid)
            .map_err(|_| io::Error::other(format!("pid {raw_pid} out of range")))?,
    );
    let tail = OutputTail::default();
    let mut forwarders = Vec::with_capacity(2);
    if let Some(stdout) = child.stdout.take() {
        forwarders.push(tokio::spawn(forward(
            stdout,
            id,
            mode,
            tail.clone(),
            Stream::Stdout,
        )));
    }
    if let Some(stderr) = child.stderr.take() {
        forwarders.push(tokio::spawn(forward(
            stderr,
            id,
            mode,
            tail.clone(),
            Stream::Stderr,
        )));
    }
    Ok(Spawned {
        child,
        pid,
        tail,
        forwarders,
    })
}

/// Which of the launcher's streams a line goes to.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Stdout,
    Stderr,
}

/// Copies `reader` line by line to the launcher's `stream`, recording lines in `tail`.
/// Invalid UTF-8 is replaced rather than ending the forwarding.
async fn forward(
    reader: impl AsyncRead + Unpin,
    id: ChildId,
    mode: OutputMode,
    tail: OutputTail,
    stream: Stream,
) {
    let mut reader = BufReader::new(reader);
    let mut buffer = Vec::new();
    loop {
        buffer.clear();
        match reader.read_until(b'\n', &mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&buffer);
        let line = text.trim_end_matches(['\n', '\r']);
        let formatted = mode.format(id, line);
        // A closed launcher stdout/stderr must not stop the child: ignore write errors.
        let _ = match stream {
            Stream::Stdout => writeln!(io::stdout().lock(), "{formatted}"),
            Stream::Stderr => writeln!(io::stderr().lock(), "{formatted}"),
        };
        tail.push(line.to_owned());
    }
}

/// Sends `signal` to the process group led by `pid`. A group that no longer exists is not an
/// error.
pub(crate) fn signal_group(pid: Pid, signal: Signal) -> io::Result<()> {
    match killpg(pid, signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(errno) => Err(io::Error::from(errno)),
    }
}

/// A child's exit status as the supervisor saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExitState(pub(crate) Option<ExitStatus>);

impl fmt::Display for ExitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("an unknown status (waiting for it failed)"),
            Some(status) => match (status.code(), status.signal()) {
                (Some(code), _) => write!(f, "exit code {code}"),
                (None, Some(signal)) => match Signal::try_from(signal) {
                    Ok(name) => write!(f, "signal {signal} ({})", name.as_str()),
                    Err(_) => write!(f, "signal {signal}"),
                },
                (None, None) => write!(f, "{status}"),
            },
        }
    }
}

/// Finds a sibling binary: next to the running launcher first, then on `PATH`.
pub(crate) fn find_binary(name: &str) -> Result<PathBuf, BinaryNotFound> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let path = std::env::var_os("PATH");
    find_binary_in(name, beside.as_deref(), path.as_deref())
}

/// [`find_binary`] with the launcher's directory and `PATH` given explicitly.
fn find_binary_in(
    name: &str,
    beside: Option<&Path>,
    path: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, BinaryNotFound> {
    let candidates = beside.into_iter().map(Path::to_path_buf).chain(
        path.map(|p| std::env::split_paths(p).collect::<Vec<_>>())
            .unwrap_or_default(),
    );
    for dir in candidates {
        let candidate = dir.join(name);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    Err(BinaryNotFound {
        name: name.to_owned(),
        beside: beside.map(Path::to_path_buf),
    })
}

/// Whether `path` is a regular file with an execute bit.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// A child binary was found neither next to the launcher nor on `PATH`.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot find the `{name}` binary: looked next to the launcher{} and on PATH. Build it \
     (`cargo build --release -p {name}`) or put it on PATH",
    .beside.as_ref().map(|d| format!(" (in {})", d.display())).unwrap_or_default()
)]
pub(crate) struct BinaryNotFound {
    /// The binary's file name.
    name: String,
    /// The launcher's directory, when known.
    beside: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_get_the_malloc_settings_unless_the_user_says() {
        let command = CommandSpec::new("/bin/true").to_command();
        for (key, value) in MALLOC_DEFAULTS {
            let set = command
                .as_std()
                .get_envs()
                .find(|(k, _)| *k == key)
                .and_then(|(_, v)| v);
            match std::env::var_os(key) {
                None => assert_eq!(set, Some(std::ffi::OsStr::new(value)), "{key}"),
                Some(_) => assert_eq!(set, None, "{key} inherited as the user set it"),
            }
        }
    }

    #[test]
    fn prefixed_and_json_output() {
        assert_eq!(
            OutputMode::Prefixed.format(ChildId::Shard(2), "hello"),
            "[shard 2] hello"
        );
        assert_eq!(
            OutputMode::Prefixed.format(ChildId::Router, "hi"),
            "[router] hi"
        );
        let json = OutputMode::Json.format(ChildId::Shard(1), r#"{"level":"INFO","msg":"x"}"#);
        let value: serde_json::Value = serde_json::from_str(&json).expect("valid json");
        assert_eq!(value["source"], "shard-1");
        assert_eq!(value["msg"], "x");
        let json = OutputMode::Json.format(ChildId::Router, "thread 'main' panicked");
        let value: serde_json::Value = serde_json::from_str(&json).expect("valid json");
        assert_eq!(value["source"], "router");
        assert_eq!(value["message"], "thread 'main' panicked");
    }

    #[test]
    fn tail_keeps_last_lines() {
        let tail = OutputTail::default();
        for i in 0..(TAIL_LINES + 7) {
            tail.push(format!("line {i}"));
        }
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines[0], "line 7");
        assert_eq!(lines[TAIL_LINES - 1], format!("line {}", TAIL_LINES + 6));
    }

    #[test]
    fn secret_env_is_not_in_debug_output() {
        let mut spec = CommandSpec::new("/bin/true");
        spec.secret_env
            .push(("TESSERA_API_KEY".into(), "hunter2".into()));
        let debug = format!("{spec:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("TESSERA_API_KEY"));
        assert!(!spec.display_line().contains("hunter2"));
    }

    #[test]
    fn exit_state_display() {
        assert_eq!(
            ExitState(Some(ExitStatus::from_raw(3 << 8))).to_string(),
            "exit code 3"
        );
        assert_eq!(
            ExitState(Some(ExitStatus::from_raw(9))).to_string(),
            "signal 9 (SIGKILL)"
        );
        assert_eq!(
            ExitState(None).to_string(),
            "an unknown status (waiting for it failed)"
        );
    }

    #[test]
    fn binary_lookup_prefers_launcher_dir_then_path() {
        use std::os::unix::fs::PermissionsExt;
        let beside = tempfile::tempdir().expect("tempdir");
        let on_path = tempfile::tempdir().expect("tempdir");
        let make = |dir: &Path| {
            let file = dir.join("tessera-fake");
            std::fs::write(&file, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            file
        };
        let path_var = std::env::join_paths([on_path.path()]).expect("join");

        let err = find_binary_in("tessera-fake", Some(beside.path()), Some(&path_var))
            .expect_err("missing everywhere");
        let message = err.to_string();
        assert!(
            message.contains("tessera-fake") && message.contains("PATH"),
            "{message}"
        );

        let from_path = make(on_path.path());
        assert_eq!(
            find_binary_in("tessera-fake", Some(beside.path()), Some(&path_var)).ok(),
            Some(from_path)
        );
        let from_beside = make(beside.path());
        assert_eq!(
            find_binary_in("tessera-fake", Some(beside.path()), Some(&path_var)).ok(),
            Some(from_beside)
        );
    }

    /// Whether `pid` is gone or a zombie (killed but not reaped).
    fn dead(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            // Format: `pid (comm) state ...`; comm may contain spaces, so split after ')'.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        }
    }

    #[test]
    fn child_dies_with_its_spawning_thread() {
        // The parent-death signal fires when the thread that spawned the child exits. Spawn from
        // a short-lived thread, leak the handle (so kill_on_drop plays no part), end the thread.
        let pid = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let spawned = runtime.block_on(async {
                let mut spec = CommandSpec::new("/bin/sh");
                spec.arg("-c").arg("exec sleep 600");
                spawn(ChildId::Shard(0), &spec, OutputMode::Prefixed).expect("spawn")
            });
            let pid = spawned.child.id().expect("pid");
            std::mem::forget(spawned.child);
            pid
        })
        .join()
        .expect("thread");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !dead(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(dead(pid), "child {pid} outlived its parent thread");
        // Reap it.
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid as i32), None);
    }

    #[test]
    fn non_executable_file_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("tessera-fake"), "data").expect("write");
        assert!(find_binary_in("tessera-fake", Some(dir.path()), None).is_err());
    }
}
