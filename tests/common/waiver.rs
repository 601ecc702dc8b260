//! The waiver rule of every GPU test, in one place: a test that needs hardware this machine lacks
//! says `waived: needs ≥ N GPUs (found M): <what needs them>` and passes — it never fakes a
//! result — unless the run was meant to have that hardware. `RINGREDUCE_REQUIRE_GPUS=K` says a
//! run was meant to have K GPUs (the GPU scripts set it to the machine's count): a test that
//! needs N ≤ K GPUs and finds fewer then fails instead of waiving, since the missing GPUs are the
//! run's fault, not the test's. A test that needs more than K still waives, and is counted.
//!
//! Included by `tests/common/mod.rs` and by the library's own device tests
//! (`src/device/tests.rs`, through `#[path]`), so it depends on nothing but std: callers pass
//! the GPU count they found. `tests/waivers.rs` checks the rule.

/// The variable that says how many GPUs a run was meant to have.
pub const REQUIRE_GPUS: &str = "RINGREDUCE_REQUIRE_GPUS";

/// What a test that needs some GPUs does on a machine with fewer or enough ([`verdict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The machine has them: the test runs.
    Run,
    /// It lacks them, and the run was not meant to have them: the test waives, and passes.
    Waive,
    /// It lacks them, but the run was meant to have them: the test fails.
    Fail,
}

/// The rule: a test that needs `needs` GPUs, on a machine with `found`, in a run meant to have
/// `required` ([`REQUIRE_GPUS`]; 0 when unset).
pub fn verdict(needs: usize, found: usize, required: usize) -> Verdict {
    if found >= needs {
        Verdict::Run
    } else if required >= needs {
        Verdict::Fail
    } else {
        Verdict::Waive
    }
}

/// [`REQUIRE_GPUS`]'s value read as a number of GPUs: 0 when unset or empty. Panics on anything
/// but a number, so that a typo cannot turn failures back into waivers.
pub fn required_from(value: Option<&str>) -> usize {
    match value.map(str::trim) {
        None | Some("") => 0,
        Some(v) => v.parse().unwrap_or_else(|_| {
            panic!("{REQUIRE_GPUS}={v:?}: expected a number of GPUs (0 to waive freely)")
        }),
    }
}

/// How many GPUs this run was meant to have ([`required_from`] of [`REQUIRE_GPUS`]).
pub fn required_gpus() -> usize {
    required_from(std::env::var(REQUIRE_GPUS).ok().as_deref())
}

/// "1 GPU", "2 GPUs".
fn gpus_noun(n: usize) -> String {
    format!("{n} GPU{}", if n == 1 { "" } else { "s" })
}

/// The line a waived test prints (the GPU scripts count the tests whose output has one).
pub fn waiver_line(needs: usize, found: usize, property: &str) -> String {
    format!(
        "waived: needs ≥ {} (found {found}): {property}",
        gpus_noun(needs)
    )
}

/// Panics where this run was meant to have at least `needs` GPUs ([`REQUIRE_GPUS`]) but the
/// machine has only `found`: `property`, which needs them, would otherwise go untested.
pub fn fail_if_promised(needs: usize, found: usize, property: &str) {
    let required = required_gpus();
    if verdict(needs, found, required) == Verdict::Fail {
        panic!(
            "{REQUIRE_GPUS}={required}: this run was meant to have {}, but found {found}; this \
             test needs {} for {property}, so their absence fails it instead of waiving it",
            gpus_noun(required),
            gpus_noun(needs),
        );
    }
}

/// Whether a test that needs `needs` GPUs for `property` lacks them on a machine with `found`:
/// `false` when it has them; `true` after printing its [`waiver_line`]; a panic where the run
/// was meant to have them ([`fail_if_promised`]).
pub fn lacks_gpus(needs: usize, found: usize, property: &str) -> bool {
    if found >= needs {
        return false;
    }
    fail_if_promised(needs, found, property);
    println!("{}", waiver_line(needs, found, property));
    true
}

/// The waiver of a test whose GPUs are there but lack something else it needs (peer access
/// between them): `waived: <why>`. Not a count of GPUs, so [`REQUIRE_GPUS`] does not fail it.
pub fn waive(why: &str) {
    println!("waived: {why}");
}
