//! A launcher for tests whose ranks are processes: each such test is its own launcher. Run in
//! the test harness, it spawns `world` copies of its test executable running the same test
//! alone, with the variables torchrun sets (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, …
//! and `RINGREDUCE_PORT` on a free port), and checks that every rank exits cleanly; in a rank
//! (`RINGREDUCE_TEST_RANK_PROCESS` set), the same function is one rank of the job.

use ringreduce::LaunchEnv;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "RINGREDUCE_TEST_RANK_PROCESS";

/// The launcher's variables when this process is a rank of a test's job.
pub fn as_rank() -> Option<LaunchEnv> {
    std::env::var(CHILD).ok()?;
    Some(LaunchEnv::from_env().expect("the test launcher sets every variable"))
}

/// A free TCP port on 127.0.0.1 (bound, then released for rank 0 to take).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Starts `world` ranks of `test` (this executable, that test alone), each with `extra`
/// variables of its own (by rank).
pub fn launch(
    test: &str,
    world: usize,
    extra: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<Child> {
    let port = free_port();
    let exe = std::env::current_exe().unwrap();
    (0..world)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", (port - 1).to_string())
                .env("RINGREDUCE_PORT", port.to_string())
                .env("TORCHELASTIC_RUN_ID", format!("{test}-{port}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra(rank) {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect()
}

/// Waits for every rank (at most `within`; stragglers are killed) and fails the test with each
/// failed rank's output.
pub fn expect_success(children: Vec<Child>, within: Duration) {
    let deadline = Instant::now() + within;
    let mut failures = Vec::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        let status = loop {
            match child.try_wait().unwrap() {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => {
                    let _ = child.kill();
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        let out = child.wait_with_output().unwrap();
        // What the rank printed beyond the harness's own lines (shown with --nocapture).
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let harness = line.starts_with("test ") && !line.contains(" ... rank ");
            if !harness && !line.starts_with("running ") && !line.is_empty() {
                println!("rank {rank}: {line}");
            }
        }
        if status.is_none_or(|s| !s.success()) {
            failures.push(format!(
                "rank {rank}: {status:?}\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}
