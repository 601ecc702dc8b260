//! What the C-facing tests share: where cargo put the library, and this package's sources.

use std::path::PathBuf;

/// The folder cargo put this package's cdylib in (beside the test's executable, or one up).
pub fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("the test's folder").to_path_buf();
    [
        deps.clone(),
        deps.parent().expect("the profile folder").to_path_buf(),
    ]
    .into_iter()
    .find(|dir| dir.join("libringreduce_nccl.so").is_file())
    .expect("cargo builds libringreduce_nccl.so before the tests")
}

/// This package's folder: where it was built, or `RINGREDUCE_NCCL_SOURCES` (a test executable
/// carried to another machine).
pub fn sources() -> PathBuf {
    std::env::var_os("RINGREDUCE_NCCL_SOURCES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
