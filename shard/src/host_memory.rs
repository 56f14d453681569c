//! How much memory the host can still give this process: what a KV pool taken whole at
//! start-up must fit in.

use std::path::Path;

/// Bytes available to this process: the kernel's `MemAvailable`, or less where a cgroup v2
/// limit (a container's) leaves less. `None` where neither can be read (not Linux).
pub(crate) fn available_bytes() -> Option<u64> {
    let host = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t));
    let cgroup = cgroup_headroom(Path::new("/sys/fs/cgroup"));
    match (host, cgroup) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `memory.max - memory.current` of the cgroup v2 folder `dir`; `None` without a limit.
fn cgroup_headroom(dir: &Path) -> Option<u64> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?;
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available_and_a_cgroup_limit() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(mem_available(meminfo), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.path().join("memory.current"), "1000\n").unwrap();
        assert_eq!(cgroup_headroom(dir.path()), None, "no limit");
        std::fs::write(dir.path().join("memory.max"), "4096\n").unwrap();
        assert_eq!(cgroup_headroom(dir.path()), Some(3096));
        #[cfg(target_os = "linux")]
        assert!(available_bytes().is_some());
    }
}
