//! The waiver rule of the GPU tests (`tests/common/waiver.rs`), on any machine: a missing GPU is
//! a waiver unless `RINGREDUCE_REQUIRE_GPUS` says the run was meant to have it, and the waiver
//! line starts as the GPU scripts count it.

use common::waiver::{required_from, verdict, waiver_line, Verdict};
use common::SHARED_NOTE;

mod common;

#[test]
fn a_missing_gpu_fails_only_where_the_run_was_meant_to_have_it() {
    // (needs, found, required) → verdict
    let cases = [
        // Enough GPUs: every test runs, whatever the run was meant to have.
        ((1, 1, 0), Verdict::Run),
        ((2, 2, 2), Verdict::Run),
        ((2, 8, 1), Verdict::Run),
        // Unset (0): every missing GPU is a waiver.
        ((1, 0, 0), Verdict::Waive),
        ((2, 1, 0), Verdict::Waive),
        // Meant to have one GPU: a test of one GPU fails without it, a test of two still waives.
        ((1, 0, 1), Verdict::Fail),
        ((2, 1, 1), Verdict::Waive),
        ((2, 0, 1), Verdict::Waive),
        // Meant to have two: one found fails the tests of one or two; a test of three waives.
        ((2, 1, 2), Verdict::Fail),
        ((1, 0, 2), Verdict::Fail),
        ((3, 2, 2), Verdict::Waive),
    ];
    for ((needs, found, required), want) in cases {
        assert_eq!(
            verdict(needs, found, required),
            want,
            "needs {needs}, found {found}, required {required}"
        );
    }
}

#[test]
fn the_variable_is_a_number_of_gpus_or_unset() {
    assert_eq!(required_from(None), 0);
    assert_eq!(required_from(Some("")), 0);
    assert_eq!(required_from(Some("2")), 2);
    assert_eq!(required_from(Some(" 8\n")), 8);
}

#[test]
#[should_panic(expected = "expected a number of GPUs")]
fn a_variable_that_is_not_a_number_is_refused() {
    required_from(Some("two"));
}

#[test]
fn the_waiver_line_says_what_needs_the_gpus() {
    assert_eq!(
        waiver_line(2, 1, "peer access between two devices"),
        "waived: needs ≥ 2 GPUs (found 1): peer access between two devices"
    );
    assert_eq!(
        waiver_line(1, 0, "a GPU"),
        "waived: needs ≥ 1 GPU (found 0): a GPU"
    );
}

/// `scripts/gpu-counts.sh`'s `test_counts` on a libtest log (`--nocapture`) written as the GPU
/// tests write theirs: a test that printed [`SHARED_NOTE`] counts as shared, one that printed a
/// waiver line as waived, the others as passed or failed. (Its match once lagged the note's
/// wording, and shared-GPU runs were counted as passes.)
#[test]
fn the_gpu_scripts_count_shared_and_waived_tests_apart() {
    let log = format!(
        "\nrunning 4 tests\n\
         test plain ... ok\n\
         test on_one_gpu ... {SHARED_NOTE}\nrank 0: ok\nok\n\
         test no_gpu ... {}\nok\n\
         test broken ... {SHARED_NOTE}\nFAILED\n\n\
         test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n",
        waiver_line(1, 0, "a GPU")
    );
    let dir = std::env::temp_dir().join(format!("ringreduce-counts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("test.log");
    std::fs::write(&file, log).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu-counts.sh");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source '{script}' && test_counts '{}'",
            file.display()
        ))
        .output()
        .expect("bash runs");
    std::fs::remove_dir_all(&dir).ok();
    let counts = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{counts} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        counts.starts_with("passed=1 failed=1 waived=1 shared=1"),
        "counts: {counts}"
    );
}
