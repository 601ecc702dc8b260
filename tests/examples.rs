//! Runs the guide's numbered examples (`examples/`, `docs/guide/`) and checks what they print, so
//! that CI — which has no GPU — proves every example builds, runs, exits 0 and says plainly what it
//! would show on GPUs.
//!
//! `cargo test` builds the package's examples before it runs its tests; this file runs those
//! executables from `target/<profile>/examples/`, next to the `deps/` folder this test runs from
//! (no nested cargo). `cargo test --test examples` alone does not build examples: build them with
//! `cargo build --examples` (same profile) first, or the test says which one is missing.
//!
//! On a GPU host the examples that would use the GPUs are waived here (run them by hand: they time
//! hardware and are not assertions); 07 and 08 need no GPU and always run.

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

#[test]
fn host_parts_run_and_gpu_parts_say_what_they_would_show() {
    if has_gpu() {
        eprintln!("waived: this host has a GPU; run examples 01–06 and 09 by hand");
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
