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

/// SplitMix64: a small deterministic generator for seeded tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// One of `items`, uniformly.
    #[allow(dead_code)] // not every test file picks
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len() - 1)]
    }
}
