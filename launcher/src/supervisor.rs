//! Supervision: start the shards, wait until all are ready, start the router, and tear
//! everything down in order on a signal or when any child dies.
//!
//! The supervisor never sleep-polls children: each child has a watcher task that sends typed
//! [`Event`]s over one channel, and the supervisor selects over that channel, the startup
//! deadline and the shutdown request.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::process::{self, ChildId, CommandSpec, ExitState, OutputMode, OutputTail};
use crate::shard::{self, ShardEvent, SocketError};

/// How long the last stage of shutdown waits for SIGKILLed children to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long to wait for a dead child's remaining output before reporting it.
const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// What the watcher tasks report to the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Something happened to a shard.
    Shard(ShardEvent),
    /// The router process exited.
    RouterExited(ExitState),
}

/// One shard to start.
#[derive(Debug, Clone)]
pub(crate) struct ShardLaunch {
    /// Its command.
    pub(crate) command: CommandSpec,
    /// The socket whose appearance means it is ready.
    pub(crate) socket: PathBuf,
}

/// Everything the supervisor starts, and its timing.
#[derive(Debug, Clone)]
pub(crate) struct LaunchPlan {
    /// The shards, in rank order.
    pub(crate) shards: Vec<ShardLaunch>,
    /// The router, started once every shard is ready.
    pub(crate) router: CommandSpec,
    /// How long all shards together may take to become ready.
    pub(crate) startup_timeout: Duration,
    /// How long each shutdown stage waits before moving on.
    pub(crate) grace_period: Duration,
    /// How children's output is forwarded.
    pub(crate) output: OutputMode,
}

/// Why supervision ended with a failure.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SupervisorError {
    /// A shard socket could not be prepared.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// A child could not be started.
    #[error("cannot start {child} ({}): {source}", .program.display())]
    Spawn {
        /// Which child.
        child: ChildId,
        /// Its program.
        program: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Some shards did not create their socket in time.
    #[error(
        "{} not ready after {}s: {}; raise --shard-startup-timeout if loading the model takes longer",
        if .pending.len() == 1 { "a shard was" } else { "shards were" },
        .timeout.as_secs(),
        describe_pending(.pending)
    )]
    StartupTimeout {
        /// Rank and socket of each shard not ready.
        pending: Vec<(usize, PathBuf)>,
        /// The timeout.
        timeout: Duration,
    },
    /// A child exited while it should have been running.
    #[error("{child} exited unexpectedly with {status}")]
    ChildDied {
        /// Which child.
        child: ChildId,
        /// How it exited.
        status: ExitState,
        /// Its last output lines.
        tail: Vec<String>,
    },
}

/// `shard 1 (socket /tmp/x-1 did not appear), shard 2 (...)`.
fn describe_pending(pending: &[(usize, PathBuf)]) -> String {
    pending
        .iter()
        .map(|(rank, socket)| format!("shard {rank} (socket {} did not appear)", socket.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A started child as the supervisor tracks it.
#[derive(Debug)]
struct Member {
    id: ChildId,
    pid: Pid,
    alive: bool,
    tail: OutputTail,
    forwarders: Vec<JoinHandle<()>>,
    socket: Option<PathBuf>,
}

/// The supervisor's state: the children and the event channel.
struct Supervisor {
    events_tx: mpsc::Sender<Event>,
    events_rx: mpsc::Receiver<Event>,
    members: Vec<Member>,
    grace_period: Duration,
    output: OutputMode,
}

/// Runs the plan until `shutdown` completes (then stops everything; `Ok`) or until a child
/// fails (then stops everything else; `Err`). No child is left running when this returns.
///
/// Must run on the launcher's main thread (see [`crate::process`]).
pub(crate) async fn run(
    plan: LaunchPlan,
    shutdown: impl Future<Output = ()>,
) -> Result<(), SupervisorError> {
    let (events_tx, events_rx) = mpsc::channel(64);
    let mut supervisor = Supervisor {
        events_tx,
        events_rx,
        members: Vec::new(),
        grace_period: plan.grace_period,
        output: plan.output,
    };
    let result = supervisor.start_and_serve(&plan, shutdown).await;
    supervisor.stop_all().await;
    result
}

impl Supervisor {
    /// Starts everything and serves until shutdown or failure. Leaves stopping to the caller.
    async fn start_and_serve(
        &mut self,
        plan: &LaunchPlan,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), SupervisorError> {
        tokio::pin!(shutdown);

        // Check every socket before starting anything, so a refusal leaves nothing behind.
        for launch in &plan.shards {
            shard::remove_stale_socket(&launch.socket)?;
        }
        for (rank, launch) in plan.shards.iter().enumerate() {
            self.start_shard(rank, launch)?;
        }

        let deadline = Instant::now() + plan.startup_timeout;
        let mut ready = vec![false; plan.shards.len()];
        while ready.iter().any(|r| !r) {
            tokio::select! {
                () = &mut shutdown => {
                    tracing::info!("shutdown requested while the shards were starting");
                    return Ok(());
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(self.startup_timeout(plan, &ready));
                }
                Some(event) = self.events_rx.recv() => match event {
                    Event::Shard(ShardEvent::Ready(rank)) => {
                        if let Some(flag) = ready.get_mut(rank) {
                            *flag = true;
                        }
                        tracing::info!("shard {rank} is ready");
                    }
                    Event::Shard(ShardEvent::Exited { rank, status }) => {
                        return Err(self.died(ChildId::Shard(rank), status).await);
                    }
                    Event::RouterExited(status) => {
                        return Err(self.died(ChildId::Router, status).await);
                    }
                },
            }
        }

        tracing::info!(
            "all {} shard(s) ready; starting the router",
            plan.shards.len()
        );
        self.start_router(&plan.router)?;

        loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                Some(event) = self.events_rx.recv() => match event {
                    Event::Shard(ShardEvent::Ready(_)) => {}
                    Event::Shard(ShardEvent::Exited { rank, status }) => {
                        return Err(self.died(ChildId::Shard(rank), status).await);
                    }
                    Event::RouterExited(status) => {
                        return Err(self.died(ChildId::Router, status).await);
                    }
                },
            }
        }
    }

    /// Spawns shard `rank` and its watcher.
    fn start_shard(&mut self, rank: usize, launch: &ShardLaunch) -> Result<(), SupervisorError> {
        let id = ChildId::Shard(rank);
        tracing::info!("starting {id}: {}", launch.command.display_line());
        let spawned = process::spawn(id, &launch.command, self.output).map_err(|source| {
            SupervisorError::Spawn {
                child: id,
                program: launch.command.program.clone(),
                source,
            }
        })?;
        shard::watch(
            rank,
            spawned.child,
            launch.socket.clone(),
            self.events_tx.clone(),
        );
        self.members.push(Member {
            id,
            pid: spawned.pid,
            alive: true,
            tail: spawned.tail,
            forwarders: spawned.forwarders,
            socket: Some(launch.socket.clone()),
        });
        Ok(())
    }

    /// Spawns the router and its watcher.
    fn start_router(&mut self, command: &CommandSpec) -> Result<(), SupervisorError> {
        let id = ChildId::Router;
        tracing::info!("starting {id}: {}", command.display_line());
        let spawned =
            process::spawn(id, command, self.output).map_err(|source| SupervisorError::Spawn {
                child: id,
                program: command.program.clone(),
                source,
            })?;
        let mut child = spawned.child;
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let status = ExitState(child.wait().await.ok());
            // The receiver is gone only when the supervisor has finished.
            let _ = events.send(Event::RouterExited(status)).await;
        });
        self.members.push(Member {
            id,
            pid: spawned.pid,
            alive: true,
            tail: spawned.tail,
            forwarders: spawned.forwarders,
            socket: None,
        });
        Ok(())
    }

    /// Records an unexpected exit, reports it with the child's last output, and returns the
    /// error to end supervision with.
    async fn died(&mut self, id: ChildId, status: ExitState) -> SupervisorError {
        let tail = match self.member_mut(id) {
            Some(member) => {
                member.alive = false;
                // Let the pipes drain so the report includes the child's last words.
                let forwarders = std::mem::take(&mut member.forwarders);
                let tail = member.tail.clone();
                for forwarder in forwarders {
                    let _ = tokio::time::timeout(DRAIN_WAIT, forwarder).await;
                }
                tail.lines()
            }
            None => Vec::new(),
        };
        report(&format!("{id} exited unexpectedly with {status}"), &tail);
        SupervisorError::ChildDied {
            child: id,
            status,
            tail,
        }
    }

    /// Builds the timeout error, after reporting the last output of each shard not ready.
    fn startup_timeout(&self, plan: &LaunchPlan, ready: &[bool]) -> SupervisorError {
        let pending: Vec<(usize, PathBuf)> = ready
            .iter()
            .enumerate()
            .filter(|(_, ready)| !**ready)
            .filter_map(|(rank, _)| plan.shards.get(rank).map(|s| (rank, s.socket.clone())))
            .collect();
        for (rank, socket) in &pending {
            if let Some(member) = self.members.iter().find(|m| m.id == ChildId::Shard(*rank)) {
                report(
                    &format!(
                        "shard {rank} did not create {} within {}s",
                        socket.display(),
                        plan.startup_timeout.as_secs()
                    ),
                    &member.tail.lines(),
                );
            }
        }
        SupervisorError::StartupTimeout {
            pending,
            timeout: plan.startup_timeout,
        }
    }

    fn member_mut(&mut self, id: ChildId) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }

    /// Stops every child still alive: SIGTERM to the router, wait; SIGTERM to the shards,
    /// wait; SIGKILL whatever is left. Then removes the shards' sockets.
    async fn stop_all(&mut self) {
        let router = [ChildId::Router];
        let shards: Vec<ChildId> = self
            .members
            .iter()
            .map(|m| m.id)
            .filter(|id| matches!(id, ChildId::Shard(_)))
            .collect();
        for stage in [&router[..], &shards[..]] {
            if self.signal(stage, Signal::SIGTERM) {
                self.wait_for_exit(stage, self.grace_period).await;
            }
        }
        let everyone: Vec<ChildId> = self.members.iter().map(|m| m.id).collect();
        if self.signal(&everyone, Signal::SIGKILL) {
            self.wait_for_exit(&everyone, KILL_WAIT).await;
        }
        for member in &mut self.members {
            for forwarder in std::mem::take(&mut member.forwarders) {
                let _ = tokio::time::timeout(DRAIN_WAIT, forwarder).await;
            }
            if let Some(socket) = &member.socket {
                let _ = std::fs::remove_file(socket);
            }
        }
    }

    /// Sends `signal` to the process groups of those of `ids` still alive. Returns whether
    /// there was anyone to signal.
    fn signal(&self, ids: &[ChildId], signal: Signal) -> bool {
        let mut any = false;
        for member in self
            .members
            .iter()
            .filter(|m| m.alive && ids.contains(&m.id))
        {
            any = true;
            tracing::info!("sending {} to {}", signal.as_str(), member.id);
            if let Err(err) = process::signal_group(member.pid, signal) {
                tracing::warn!("cannot send {} to {}: {err}", signal.as_str(), member.id);
            }
        }
        any
    }

    /// Waits until all of `ids` have exited or `timeout` passes, recording every exit seen.
    async fn wait_for_exit(&mut self, ids: &[ChildId], timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.members.iter().any(|m| m.alive && ids.contains(&m.id)) {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    let late: Vec<String> = self
                        .members
                        .iter()
                        .filter(|m| m.alive && ids.contains(&m.id))
                        .map(|m| m.id.to_string())
                        .collect();
                    tracing::warn!("still running after {}s: {}", timeout.as_secs(), late.join(", "));
                    return;
                }
                Some(event) = self.events_rx.recv() => {
                    let (id, status) = match event {
                        Event::Shard(ShardEvent::Exited { rank, status }) => (ChildId::Shard(rank), status),
                        Event::RouterExited(status) => (ChildId::Router, status),
                        Event::Shard(ShardEvent::Ready(_)) => continue,
                    };
                    if let Some(member) = self.member_mut(id) {
                        member.alive = false;
                    }
                    tracing::info!("{id} exited with {status}");
                }
            }
        }
    }
}

/// Logs a failure headline and a child's last output lines.
fn report(headline: &str, tail: &[String]) {
    if tail.is_empty() {
        tracing::error!("{headline} (no output)");
        return;
    }
    tracing::error!("{headline}; its last {} output line(s):", tail.len());
    for line in tail {
        tracing::error!("    {line}");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;

    use super::*;

    /// A stand-in child: `sh -c script`.
    fn sh(script: &str) -> CommandSpec {
        let mut spec = CommandSpec::new("/bin/sh");
        spec.arg("-c").arg(script);
        spec
    }

    /// A shard stand-in that binds a real unix socket at `$1` (through python3, when present)
    /// and then runs until signalled. Readiness is the socket's existence, nothing more.
    fn listening_shard(socket: &std::path::Path, extra: &str) -> CommandSpec {
        let mut spec = sh(&format!(
            "python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); \
             s.listen(); import time; time.sleep(600)' \"$0\" & child=$!; \
             trap 'kill $child; exit 0' TERM; {extra} wait $child"
        ));
        spec.arg(socket.as_os_str());
        spec
    }

    fn plan(dir: &std::path::Path, shards: Vec<CommandSpec>, router: CommandSpec) -> LaunchPlan {
        LaunchPlan {
            shards: shards
                .into_iter()
                .enumerate()
                .map(|(rank, command)| ShardLaunch {
                    command,
                    socket: dir.join(format!("sock-{rank}")),
                })
                .collect(),
            router,
            startup_timeout: Duration::from_secs(20),
            grace_period: Duration::from_secs(5),
            output: OutputMode::Prefixed,
        }
    }

    fn python_available() -> bool {
        std::process::Command::new("python3")
            .arg("-c")
            .arg("pass")
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Whether a process is still running (signal 0 probes without signalling).
    fn alive(pid: Pid) -> bool {
        nix::sys::signal::kill(pid, None).is_ok()
    }

    #[tokio::test]
    async fn shard_exit_during_startup_is_reported_with_its_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pid_file = dir.path().join("other.pid");
        let shards = vec![
            sh(&format!("echo $$ > {}; exec sleep 600", pid_file.display())),
            sh("echo loading weights; echo 'error: out of memory' >&2; sleep 0.2; exit 3"),
        ];
        let plan = plan(dir.path(), shards, sh("exit 0"));
        let started = std::time::Instant::now();
        let result = run(plan, std::future::pending()).await;
        let Err(SupervisorError::ChildDied {
            child,
            status,
            tail,
        }) = result
        else {
            panic!("expected ChildDied, got {result:?}");
        };
        assert_eq!(child, ChildId::Shard(1));
        assert_eq!(status.0.and_then(|s| s.code()), Some(3));
        assert!(
            tail.contains(&"error: out of memory".to_owned()),
            "{tail:?}"
        );
        assert!(tail.contains(&"loading weights".to_owned()), "{tail:?}");
        // The other shard was stopped by SIGTERM, well within the grace period.
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid");
        assert!(
            !alive(Pid::from_raw(pid)),
            "shard 0 outlived the supervisor"
        );
    }

    #[tokio::test]
    async fn startup_timeout_names_the_shard_and_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut plan = plan(dir.path(), vec![sh("exec sleep 600")], sh("exit 0"));
        plan.startup_timeout = Duration::from_millis(300);
        let err = run(plan, std::future::pending())
            .await
            .expect_err("must time out");
        let message = err.to_string();
        assert!(message.contains("shard 0"), "{message}");
        assert!(message.contains("sock-0"), "{message}");
        assert!(message.contains("--shard-startup-timeout"), "{message}");
    }

    #[tokio::test]
    async fn missing_binary_is_a_spawn_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = plan(
            dir.path(),
            vec![CommandSpec::new("/nonexistent/tessera-shard")],
            sh("exit 0"),
        );
        let err = run(plan, std::future::pending())
            .await
            .expect_err("spawn fails");
        assert!(
            matches!(
                err,
                SupervisorError::Spawn {
                    child: ChildId::Shard(0),
                    ..
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn router_death_stops_the_shards() {
        if !python_available() {
            eprintln!("skipping: python3 not available to bind a unix socket");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let shards = (0..2)
            .map(|rank| listening_shard(&dir.path().join(format!("sock-{rank}")), ""))
            .collect();
        let plan = plan(
            dir.path(),
            shards,
            sh("echo 'bind: address in use' >&2; exit 1"),
        );
        let err = run(plan, std::future::pending())
            .await
            .expect_err("router died");
        let SupervisorError::ChildDied { child, tail, .. } = &err else {
            panic!("expected ChildDied, got {err:?}");
        };
        assert_eq!(*child, ChildId::Router);
        assert_eq!(tail, &vec!["bind: address in use".to_owned()]);
        // Shards were stopped and their sockets removed.
        assert!(!dir.path().join("sock-0").exists());
        assert!(!dir.path().join("sock-1").exists());
    }

    #[tokio::test]
    async fn signal_shutdown_stops_router_then_shards() {
        if !python_available() {
            eprintln!("skipping: python3 not available to bind a unix socket");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("order.log");
        let log_s = log.display().to_string();
        let shards = vec![listening_shard(
            &dir.path().join("sock-0"),
            &format!("trap 'echo shard >> {log_s}; kill $child; exit 0' TERM;"),
        )];
        let router = sh(&format!(
            "trap 'echo router >> {log_s}; exit 0' TERM; echo $$ > {}/router.pid; \
             while :; do sleep 0.05; done",
            dir.path().display()
        ));
        let plan = plan(dir.path(), shards, router);
        let router_pid = dir.path().join("router.pid");
        // Shut down once the router is up.
        let shutdown = async {
            while !router_pid.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        run(plan, shutdown).await.expect("clean shutdown");
        let order = std::fs::read_to_string(&log).expect("order log");
        assert_eq!(order.lines().collect::<Vec<_>>(), ["router", "shard"]);
        assert!(!dir.path().join("sock-0").exists());
    }

    #[tokio::test]
    async fn stubborn_children_are_killed_after_the_grace_period() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pid_file = dir.path().join("shard.pid");
        // Ignores SIGTERM; creates no socket, so shutdown comes during startup.
        let shards = vec![sh(&format!(
            "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
            pid_file.display()
        ))];
        let mut plan = plan(dir.path(), shards, sh("exit 0"));
        plan.grace_period = Duration::from_millis(300);
        let shutdown = async {
            while !pid_file.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let started = std::time::Instant::now();
        run(plan, shutdown).await.expect("clean shutdown");
        assert!(started.elapsed() < Duration::from_secs(4));
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .expect("pid")
            .trim()
            .parse()
            .expect("pid");
        assert!(!alive(Pid::from_raw(pid)), "stubborn shard survived");
    }

    #[tokio::test]
    async fn in_use_socket_refuses_to_start_anything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("sock-0");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let marker = dir.path().join("started");
        let plan = plan(
            dir.path(),
            vec![sh(&format!("touch {}; sleep 600", marker.display()))],
            sh("exit 0"),
        );
        let err = run(plan, std::future::pending()).await.expect_err("in use");
        assert!(
            matches!(err, SupervisorError::Socket(SocketError::InUse(_))),
            "{err}"
        );
        assert!(!marker.exists(), "a shard was started");
        let meta = std::fs::symlink_metadata(&socket).expect("socket left alone");
        assert!(meta.file_type().is_socket());
    }
}
