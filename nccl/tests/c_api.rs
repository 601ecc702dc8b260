//! The library as C programs meet it: `tests/c/api.c` is compiled with the system C compiler
//! against `include/nccl.h` (its signature table fails the build when a declaration differs
//! from NCCL's documented one), linked to the library under NCCL's name — a folder holding a
//! link `libnccl.so.2` to it, on `LD_LIBRARY_PATH` — and run; and the library's exported `nccl*`
//! symbols are exactly the functions the header declares; and what the library does not run
//! reaches "the real NCCL" — a test double (`tests/c/fake_nccl.c`) — at `RINGREDUCE_NCCL_PATH`.

mod common;
use common::{library_dir, linked_as, sources};
use std::path::PathBuf;
use std::process::Command;

/// A fresh folder (named after `test`) holding a link `libnccl.so.2` to this library: the
/// folder, and the link.
fn as_libnccl(test: &str) -> (PathBuf, PathBuf) {
    let (dir, _) = linked_as(test, "libnccl.so.2");
    let link = dir.join("libnccl.so.2");
    (dir, link)
}

/// The functions `include/nccl.h` declares.
fn declared() -> Vec<String> {
    let header = std::fs::read_to_string(sources().join("include/nccl.h")).expect("the header");
    // Every identifier right before a '(' that starts with "nccl" (macros are NCCL_…).
    let mut names: Vec<String> = header
        .match_indices('(')
        .map(|(at, _)| {
            let before = &header[..at];
            let start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            before[start..].to_string()
        })
        .filter(|name| name.starts_with("nccl"))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn a_c_program_built_against_the_header_runs_on_the_library_as_libnccl() {
    let (dir, link) = as_libnccl("c");
    let exe = dir.join("api");
    let include = sources().join("include");
    cc(&[
        "-std=c11".as_ref(),
        "-I".as_ref(),
        include.as_os_str(),
        sources().join("tests/c/api.c").as_os_str(),
        "-o".as_ref(),
        exe.as_os_str(),
        link.as_os_str(),
    ]);
    let gpu = match ringreduce::driver_available() {
        Ok(()) => "gpu",
        Err(_) => "nogpu",
    };
    passes(
        Command::new(&exe)
            .arg(gpu)
            .env("LD_LIBRARY_PATH", &dir)
            // No real NCCL to hand calls to, whatever the machine has.
            .env("RINGREDUCE_NCCL_PATH", dir.join("no-such-libnccl.so")),
    );
    // It ran on this library, found by NCCL's name.
    let needed = Command::new("readelf").arg("-d").arg(&exe).output();
    if let Ok(needed) = needed {
        let text = String::from_utf8_lossy(&needed.stdout);
        assert!(text.contains("[libnccl.so.2]"), "{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The library's exported `nccl*` symbols (`nm -D --defined-only`), sorted.
fn exported() -> Vec<String> {
    let lib = library_dir().join("libringreduce_nccl.so");
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) runs");
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2))
        .filter(|name| name.starts_with("nccl"))
        .map(str::to_string)
        .collect();
    exported.sort();
    exported
}

#[test]
fn the_library_exports_exactly_what_the_header_declares() {
    assert_eq!(exported(), declared());
}

/// Every `nccl*` symbol PyTorch's `libtorch_cuda.so` imports — 2.11's and the newest wheel's,
/// read with `nm -D` into `tests/imports/` — is exported, so the library loads under it.
#[test]
fn every_nccl_symbol_pytorch_imports_is_exported() {
    let exported = exported();
    let dir = sources().join("tests/imports");
    let mut lists = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "txt") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let imports: Vec<&str> = (text.lines())
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .collect();
        assert!(
            imports.len() > 30,
            "{}: {} symbols",
            path.display(),
            imports.len()
        );
        let missing: Vec<&&str> = (imports.iter())
            .filter(|name| !exported.iter().any(|e| e == *name))
            .collect();
        assert!(missing.is_empty(), "{} imports {missing:?}", path.display());
        lists += 1;
    }
    assert_eq!(lists, 2, "torch 2.11's list and the newest wheel's");
}

/// Runs one of the C test programs: it must exit 0 saying "every check passed". Its stderr.
fn passes(command: &mut Command) -> String {
    let ran = command.output().expect("the test program runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr).into_owned(),
    );
    assert!(ran.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("every check passed"), "{stdout}\n{stderr}");
    stderr
}

/// Compiles `args` with `cc` (warnings are errors); panics with its messages when it fails.
fn cc(args: &[&std::ffi::OsStr]) {
    let built = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror"])
        .args(args)
        .output()
        .expect("the system C compiler (cc) runs");
    assert!(
        built.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
}

#[test]
fn what_the_library_does_not_run_reaches_the_real_nccl() {
    let (dir, link) = as_libnccl("fb");
    let c = sources().join("tests/c");
    let fake = dir.join("libfake_nccl.so");
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        c.join("fake_nccl.c").as_os_str(),
        "-o".as_ref(),
        fake.as_os_str(),
    ]);
    let exe = dir.join("fallback");
    let include = sources().join("include");
    cc(&[
        "-std=c11".as_ref(),
        "-I".as_ref(),
        include.as_os_str(),
        c.join("fallback.c").as_os_str(),
        "-o".as_ref(),
        exe.as_os_str(),
        link.as_os_str(),
        "-ldl".as_ref(),
    ]);
    let stderr = passes(
        Command::new(&exe)
            .arg(&fake)
            .env("LD_LIBRARY_PATH", &dir)
            .env("RINGREDUCE_NCCL_PATH", &fake)
            .env("RINGREDUCE_NCCL_LOG", "1"),
    );
    // The log names the side of each call kind, once.
    assert_eq!(
        stderr
            .matches("ringreduce-nccl: ncclAllReduce: NCCL")
            .count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("ringreduce-nccl: ncclCommInitAll: NCCL"),
        "{stderr}"
    );

    // Without RINGREDUCE_NCCL_PATH, and with no other libnccl.so.2 on the library path: the one
    // the program loaded itself by its path (as PyTorch's wheels load theirs, even when this
    // library was preloaded) is the real NCCL.
    let loaded = dir.join("loaded");
    std::fs::create_dir_all(&loaded).unwrap();
    let loaded = loaded.join("libnccl.so.2");
    std::fs::copy(&fake, &loaded).unwrap();
    passes(
        Command::new(&exe)
            .args([loaded.as_os_str(), "load-first".as_ref()])
            .env("LD_LIBRARY_PATH", &dir)
            .env_remove("RINGREDUCE_NCCL_PATH"),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
