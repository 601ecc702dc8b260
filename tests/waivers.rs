//! The waiver rule of the GPU tests (`tests/common/waiver.rs`), on any machine: a missing GPU is
//! a waiver unless `RINGREDUCE_REQUIRE_GPUS` says the run was meant to have it, and the waiver
//! line starts as the GPU scripts count it.

use common::waiver::{required_from, verdict, waiver_line, Verdict};

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
