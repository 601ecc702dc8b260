//! Runs the guide's numbered examples (`examples/`, `docs/guide/`) and checks what they print, so
//! that CI — which has no GPU — proves every example builds, runs, exits 0 and says plainly what it
//! would show on GPUs.
//!
//! `cargo test` builds the package's examples before it runs its tests; this file runs those
//! executables from `target/<profile>/examples/`, next to the `deps/` folder this test runs from
//! (no nested cargo). `cargo test --test examples` alone does not build examples: build them with
//! `cargo build --examples` (same profile) first, or the test says which one is missing.
//!
//! On a GPU host the examples that use the GPUs run here too, and what they compute is checked:
//! every "N wrong" they print is 0, and each says what it ran for the GPUs this host has (one GPU:
//! what needs two says so). Their timings are printed, not asserted. 07 and 08 need no GPU and
//! always run.

use std::path::PathBuf;
use std::process::Command;

/// The example executable `name`, as cargo builds it for this test's profile.
fn executable(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/examples-<hash> → target/<profile>/examples/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test runs from target/<profile>/deps");
    profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// Runs example `name`; asserts it exists and exits 0; returns its stdout.
fn run(name: &str) -> String {
    let path = executable(name);
    assert!(
        path.exists(),
        "example {name} is not built at {}: `cargo test` builds examples; with a target filter \
         (`--test examples`) run `cargo build --examples` (same profile) first",
        path.display()
    );
    let output = Command::new(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "example {name} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    stdout
}

fn has_gpu() -> bool {
    ringreduce::device::driver_available().is_ok()
}

fn assert_contains(name: &str, stdout: &str, needles: &[&str]) {
    for needle in needles {
        assert!(
            stdout.contains(needle),
            "example {name} did not print {needle:?}; it printed:\n{stdout}"
        );
    }
}

#[test]
fn plans_are_built_and_proved_on_the_cpu() {
    let out = run("07_plans");
    assert_contains(
        "07_plans",
        &out,
        &["ring", "one-shot", "two-shot", "proved", "rejected: "],
    );
    assert!(
        !out.contains("REJECTED"),
        "a library plan was rejected:\n{out}"
    );
}

#[test]
fn every_collective_runs_on_host_ranks() {
    let out = run("11_collectives");
    assert_contains(
        "11_collectives",
        &out,
        &[
            "reduce-scatter (rank r gets block r of the sum): [[60, 64], [68, 72], [76, 80], [84, 88]]",
            "all-gather (every rank gets every block): [0, 1, 10, 11, 20, 21, 30, 31]",
            "broadcast from rank 2, in place: [[20, 21, 22], [20, 21, 22], [20, 21, 22], [20, 21, 22]]",
            "reduce (max) into rank 1: [30, 31, 32]",
            "[[0, 10, 20, 30], [1, 11, 21, 31], [2, 12, 22, 32], [3, 13, 23, 33]]",
            "in one call: [[0, 1], [10, 11], [20, 21], [30, 31]]",
            "all-to-all: ",
            "ring form",
            "all-gather: one-shot form, 4 meeting(s) per rank, proved",
            "1009 f32 per rank: 0 wrong",
        ],
    );
    assert!(!out.contains("REJECTED"), "a plan was rejected:\n{out}");
}

#[test]
fn ring_orders_are_chosen_for_synthetic_topologies() {
    let out = run("08_topology");
    assert_contains(
        "08_topology",
        &out,
        &[
            "ring 0→1→0",
            "the ring crosses between them 2 times",
            "ring 0→1→3→2→0",
            "index order instead: ring 0→1→2→3→0",
            "ring 0→2→1→0",
        ],
    );
    if !has_gpu() {
        assert_contains("08_topology", &out, &["no GPU: "]);
    }
}

/// Every count of wrong values `name` printed ("… N wrong", "… N of M wrong") is 0, and it printed
/// at least `at_least` of them.
fn assert_nothing_wrong(name: &str, stdout: &str, at_least: usize) {
    let mut counted = 0;
    for (at, _) in stdout.match_indices(" wrong") {
        let before = &stdout[..at];
        // "N wrong", or "N of M wrong": the count is the number before " of", if there is one.
        let before = match before.rsplit_once(" of ") {
            Some((head, tail)) if tail.chars().all(|c| c.is_ascii_digit()) => head,
            _ => before,
        };
        let digits: String = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if digits.is_empty() {
            continue;
        }
        counted += 1;
        let wrong: usize = digits.chars().rev().collect::<String>().parse().unwrap();
        assert_eq!(wrong, 0, "example {name} computed wrong values:\n{stdout}");
    }
    assert!(
        counted >= at_least,
        "example {name} printed {counted} counts of wrong values, expected at least {at_least}:\n{stdout}"
    );
}

#[test]
fn gpu_parts_run_and_check_their_results_on_a_gpu_host() {
    let n = match ringreduce::device_count() {
        Ok(n) if n > 0 => n,
        _ => {
            eprintln!("waived: no GPU here; the examples' GPU parts run on a GPU host");
            return;
        }
    };
    let one = n < 2;
    let out = run("01_devices");
    assert_contains(
        "01_devices",
        &out,
        &["CUDA driver API ", &format!("{n} device(s)")],
    );
    let out = run("02_peer_access");
    match one {
        true => assert_contains("02_peer_access", &out, &["one GPU: peer access needs two"]),
        false => assert_contains("02_peer_access", &out, &["# peer access", "# 64 MiB"]),
    }
    let out = run("03_peer_copies");
    assert_contains("03_peer_copies", &out, &["local copy on GPU0"]);
    if one {
        assert_contains("03_peer_copies", &out, &["one GPU: the peer rows need two"]);
    }
    let out = run("04_cross_gpu_events");
    assert_contains(
        "04_cross_gpu_events",
        &out,
        &["handoff (record, channel, then wait): 0 read early of"],
    );
    let out = run("05_ring_allreduce");
    assert_contains(
        "05_ring_allreduce",
        &out,
        &[&format!(
            "ring on {n} GPU(s), 64 MiB f32 sum out of place: "
        )],
    );
    assert_nothing_wrong("05_ring_allreduce", &out, 2);
    let out = run("06_one_and_two_shot");
    // Three algorithms × three sizes on GPUs that reach each other; else the host part alone.
    let peers = !one
        && ringreduce::device::peer_matrix(n)
            .unwrap()
            .iter()
            .flatten()
            .all(|&p| p);
    match peers {
        true => assert_contains(
            "06_one_and_two_shot",
            &out,
            &["# ", " GPUs, f32 sum in place"],
        ),
        false => assert_contains(
            "06_one_and_two_shot",
            &out,
            &[&format!(
                "{n} GPU(s) without peer access between every pair"
            )],
        ),
    }
    assert_nothing_wrong("06_one_and_two_shot", &out, if peers { 9 + 3 } else { 3 });
    let out = run("09_host_fallback");
    match one {
        true => assert_contains(
            "09_host_fallback",
            &out,
            &["one GPU: a ring edge needs two"],
        ),
        false => assert_contains("09_host_fallback", &out, &["# transport Staged"]),
    }
    assert_nothing_wrong("09_host_fallback", &out, if one { 2 } else { 4 });
    let out = run("10_cudarc_streams");
    match one {
        true => assert_contains(
            "10_cudarc_streams",
            &out,
            &[&format!("needs 2 GPUs (found {n})")],
        ),
        false => {
            assert_contains("10_cudarc_streams", &out, &["kernel → all-reduce → kernel"]);
            assert_nothing_wrong("10_cudarc_streams", &out, n);
        }
    }
}

#[test]
fn host_parts_run_and_gpu_parts_say_what_they_would_show() {
    if has_gpu() {
        eprintln!("waived: this host has a GPU: gpu_parts_run_and_check_their_results_on_a_gpu_host checks the examples there");
        return;
    }
    let host_parts: [(&str, &[&str]); 3] = [
        ("05_ring_allreduce", &["[111.0, 222.0, 333.0]", "0 wrong"]),
        (
            "06_one_and_two_shot",
            &["OneShot / TwoShot", "TwoShot: 0 wrong"],
        ),
        ("09_host_fallback", &["Staged edges: 0 wrong"]),
    ];
    for (name, needles) in host_parts {
        let out = run(name);
        assert_contains(name, &out, needles);
        assert_contains(name, &out, &["no GPU: ", "docs/PERFORMANCE.md"]);
    }
    for name in [
        "01_devices",
        "02_peer_access",
        "03_peer_copies",
        "04_cross_gpu_events",
    ] {
        let out = run(name);
        assert_contains(name, &out, &["no GPU: ", "On ", "docs/TOUR.md"]);
    }
    let out = run("10_cudarc_streams");
    assert_contains(
        "10_cudarc_streams",
        &out,
        &["needs 2 GPUs", "no host synchronisation"],
    );
}

#[test]
fn a_nonzero_count_of_wrong_values_fails_the_check() {
    assert_nothing_wrong(
        "x",
        "ring: 0 wrong, 1.0 ms\nGPU 0: 0 of 4 wrong\n  8 MiB (0 wrong)",
        3,
    );
    for bad in ["ring: 3 wrong", "GPU 1: 2 of 4 wrong", "  8 MiB (12 wrong)"] {
        let failed = std::panic::catch_unwind(|| assert_nothing_wrong("x", bad, 1)).is_err();
        assert!(failed, "{bad:?} passed the check");
    }
    let too_few = std::panic::catch_unwind(|| assert_nothing_wrong("x", "0 wrong", 2)).is_err();
    assert!(too_few, "one count passed a check that wants two");
}
