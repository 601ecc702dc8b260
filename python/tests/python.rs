//! The Python package as `import ringreduce` meets it, in `cargo test`: the extension module
//! cargo built (`lib_native.so`, beside this test's executable or one folder up) is linked as
//! `ringreduce/_native.abi3.so` into a fresh folder beside a copy of the package's Python
//! sources, and each Python test module (`tests/test_*.py`, plain unittest) runs in `python3`
//! (or `$PYTHON`) with that folder on `PYTHONPATH` — no maturin, no pip, no NumPy needed.
//!
//! A machine without python3 waives these tests (`waived: needs python3`). A Python test that
//! needs what the machine lacks (NumPy) skips itself with a reason starting `waived:`, printed
//! here too.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one Python test module may run before it is killed and fails.
const LIMIT: Duration = Duration::from_secs(100);

/// The folder cargo put this package's extension module in.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("the test's folder").to_path_buf();
    [
        deps.clone(),
        deps.parent().expect("the profile folder").to_path_buf(),
    ]
    .into_iter()
    .map(|dir| dir.join("lib_native.so"))
    .find(|lib| lib.is_file())
    .expect("cargo builds lib_native.so (this package's cdylib) before the tests")
}

/// The interpreter the tests run in: `$PYTHON`, or `python3`; `None` where it does not run.
fn python() -> Option<String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let runs = Command::new(&python)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    runs.then_some(python)
}

/// A fresh folder (named after `test`) holding the package `ringreduce`: a copy of
/// `ringreduce/*.py` and a link `_native.abi3.so` to the built module.
fn package(test: &str) -> PathBuf {
    let root =
        std::env::temp_dir().join(format!("ringreduce-python-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("ringreduce");
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("ringreduce");
    for entry in std::fs::read_dir(&sources).expect("python/ringreduce") {
        let path = entry.expect("a source file").path();
        if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, dir.join(path.file_name().expect("a name"))).expect("copied");
        }
    }
    std::os::unix::fs::symlink(library(), dir.join("_native.abi3.so")).expect("linked");
    root
}

/// Runs the Python test module `module` (tests/`module`.py) against the built package; fails
/// with its output when a test fails, or when it runs past [`LIMIT`].
fn run_python_tests(module: &str) {
    let Some(python) = python() else {
        println!("waived: needs python3 (or $PYTHON) to run the Python tests of {module}");
        return;
    };
    let root = package(module);
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut child = Command::new(python)
        .args(["-m", "unittest", "-v", module])
        .current_dir(&tests)
        .env("PYTHONPATH", &root)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("RINGREDUCE_PYTHON_PACKAGE", root.join("ringreduce"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python runs");
    let started = Instant::now();
    let status = loop {
        match child.try_wait().expect("waiting for python") {
            Some(status) => break Some(status),
            None if started.elapsed() > LIMIT => {
                let _ = child.kill();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let ran = child.wait_with_output().expect("python's output");
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    let _ = std::fs::remove_dir_all(&root);
    match status {
        Some(status) if status.success() => {}
        Some(status) => panic!("{module}: python exited with {status}\n{output}"),
        None => panic!("{module}: still running after {LIMIT:?}, killed\n{output}"),
    }
    // unittest's verbose lines for skipped tests: "... skipped 'waived: ...'".
    for line in output.lines().filter(|l| l.contains("skipped 'waived:")) {
        println!("{line}");
    }
    assert!(
        output.contains("\nOK"),
        "{module}: no OK from unittest\n{output}"
    );
}

#[test]
fn python_package_api() {
    run_python_tests("test_api");
}

#[test]
fn python_host_ranks_in_processes() {
    run_python_tests("test_ranks");
}

#[test]
fn python_torch_layer_on_a_stand_in() {
    run_python_tests("test_torch_layer");
}

#[test]
fn python_torch_on_host_ranks() {
    run_python_tests("test_torch_cpu");
}
