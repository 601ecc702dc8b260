//! Helpers shared by integration tests (each test file that needs them says `mod common;`).

use std::time::{Duration, Instant};

/// Threads of this process named `ringreduce-*` (rank threads and stream workers); the kernel
/// keeps the first 15 bytes of a name, enough for the prefix.
pub fn ringreduce_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("ringreduce"))
        .count()
}

/// Waits up to ten seconds for every `ringreduce-*` thread to be gone (a joined thread leaves the
/// kernel's list a moment after `join` returns); returns how many are left.
pub fn settle_threads() -> usize {
    let start = Instant::now();
    while ringreduce_threads() > 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    ringreduce_threads()
}
