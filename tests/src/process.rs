//! Processes seen through `/proc`: state, names, children, memory, and signals.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

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

/// A process stopped with SIGSTOP until this guard is dropped (SIGCONT), so a test that
/// panics never leaves it frozen. Used to hold requests in flight deterministically: the
/// tiny models generate tokens too fast to catch a request mid-flight otherwise.
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

/// The resident set size of `pid` in KiB (`VmRSS` of `/proc/<pid>/status`), or `None` when
/// the process is gone.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}
