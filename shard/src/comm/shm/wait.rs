//! Waiting on a peer: futex sleeps on its arrival word, and whether its process still exists.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// How often a waiter re-checks that its peer is alive.
pub(super) const LIVENESS_EVERY: Duration = Duration::from_millis(20);
/// Longest single futex sleep.
pub(super) const SLEEP_SLICE: Duration = Duration::from_millis(5);

/// Whether process `pid` exists and is not a zombie.
pub(super) fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X') | None
        ),
        Err(_) => false,
    }
}

/// Sleeps until `word` may differ from `expected` (or `timeout` passes, or a spurious wake).
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 behind `word` (valid for the call) and sleeps
    // while it equals `expected`; `ts` outlives the call. The futex is not private because
    // the word lives in a mapping shared between processes. Errors (EAGAIN, ETIMEDOUT,
    // EINTR) all mean "look again", which the caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of the aligned word as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Whether arrival `seen` has reached epoch `target` (wrapping).
pub(super) fn reached(seen: u32, target: u32) -> bool {
    seen.wrapping_sub(target) as i32 >= 0
}
