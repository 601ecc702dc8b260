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

/// A fresh folder for `test` (in this process) holding a link `name` to this library, and a
/// `LD_LIBRARY_PATH` with it first: how a child process finds the library by a loader's name.
pub fn linked_as(test: &str, name: &str) -> (PathBuf, std::ffi::OsString) {
    let dir = std::env::temp_dir().join(format!("ringreduce-nccl-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join(name);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(library_dir().join("libringreduce_nccl.so"), &link).unwrap();
    let mut path = std::ffi::OsString::from(&dir);
    if let Some(rest) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(rest);
    }
    (dir, path)
}
