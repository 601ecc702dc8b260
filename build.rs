//! Joins the kernel source and compiles it into `$OUT_DIR/reduce.fatbin` when nvcc is available;
//! generates the Rust constants of the kernels' error codes.
//!
//! - The kernel source is the parts in `PARTS`, joined in that order into
//!   `$OUT_DIR/ringreduce_kernels.cu`, each part preceded by a `#line 1 "cuda/<part>"` directive
//!   so that compiler messages name the part and its own line. Both compilers read that one
//!   joined file: nvcc here, and NVRTC at run time through `include_str!` in
//!   `src/exec/cuda/kernels/mod.rs` (NVRTC has no file access, so the parts cannot include each
//!   other; `PARTS` is the only list of them).
//! - The error codes are defined once, in the first part, `cuda/error_codes.cuh`: every
//!   `#define RR_<NAME> <value>u` there becomes `pub const <NAME>: u32` in
//!   `$OUT_DIR/error_codes.rs` (included by `src/exec/cuda/kernels/error_codes.rs`), with the
//!   `//` lines above it as its doc, and `ERROR_CODES` lists them all. A code that is zero,
//!   repeated, undocumented or not of that shape fails the build.
//! - nvcc is looked for in `$NVCC`, then `$CUDA_HOME/bin/nvcc`, then on `PATH`.
//! - Found and compiling: the fatbin holds SASS for sm_80 and sm_90 and PTX for compute_90, and
//!   `cfg(ringreduce_fatbin)` tells `src/exec/cuda/kernels/mod.rs` to embed it. A CUDA 13 driver
//!   loads it; a CUDA 12 driver refuses it.
//! - Found but failing: the build fails (a broken kernel must fail CI).
//! - Not found: a warning; the kernels are compiled through NVRTC at first use instead. With
//!   `RINGREDUCE_REQUIRE_NVCC=1` (CI sets it) a missing nvcc fails the build.
//! - The CUDA 12 image, for CUDA 12 drivers (`build/cuda12.rs`): built where `NVRTC_CUDA12` names
//!   an NVRTC 12, announced by `cfg(ringreduce_cuda12)`; `RINGREDUCE_REQUIRE_CUDA12=1` (CI sets
//!   it) fails the build without one. `RINGREDUCE_CUDA12_PTX_ONLY=1` (CI sets it) builds its PTX
//!   piece alone: NVRTC 12 still compiles the whole source (a kernel it refuses fails the build)
//!   and the machine code is left out (ptxas's work, which nvcc's build does for the same
//!   architectures). Such an image loads only on drivers that read its PTX (CUDA 12.9 and
//!   later: `build/cuda12.rs`), not on the older CUDA 12 drivers the machine code serves — a
//!   build for CI, never one to ship (`scripts/gpu-pack.sh` and `scripts/stage.sh` unset it).
//! - Compiling the source takes minutes of CPU (nvcc ~4 min, NVRTC 12 ~6 min on one core), so
//!   the compilations run on threads at once, and every result is kept in a build cache,
//!   `target/ringreduce-kernels/`, keyed by the compiler, its options and the source: the debug
//!   and the release build (`cargo clippy` then `cargo test --release`, as CI runs them) compile
//!   once between them, and a changed source or compiler never meets a stale result.
//!
//! nvcc from the PyPI wheels (`.ci/install-nvcc.sh`) needs no extra flags as long as it is run
//! through its real path: the 13.x wheels unpack into one tree (`nvidia/cu13/{bin,include,nvvm}`)
//! and `bin/nvcc.profile` finds the headers and cicc relative to the directory nvcc is started
//! from. So the path found is canonicalized first (a symlink `~/bin/nvcc` would otherwise make
//! nvcc look for `~/include/cuda_runtime.h`).

#[path = "build/cuda12.rs"]
mod cuda12;
#[path = "src/exec/cuda/kernels/nvrtc/library.rs"]
#[allow(dead_code)] // the library's side of it: its version probe and name list
mod nvrtc_library;

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};
use std::sync::OnceLock;

/// The kernel source's parts, in the order they are joined (each opens with what it holds).
const PARTS: [&str; 10] = [
    ERROR_CODES_PART,
    "cuda/types.cuh",
    "cuda/reduce.cuh",
    "cuda/peer.cuh",
    "cuda/gate.cuh",
    "cuda/peer_kernels.cuh",
    "cuda/ll.cuh",
    "cuda/counters.cuh",
    "cuda/channel.cuh",
    "cuda/instances.cuh",
];
/// The part that defines the kernels' error codes (first in `PARTS`).
const ERROR_CODES_PART: &str = "cuda/error_codes.cuh";
/// The joined source, in `$OUT_DIR`.
const JOINED: &str = "ringreduce_kernels.cu";
/// The CUDA 12 image's table (`build/cuda12.rs`), in `$OUT_DIR`.
const CUDA12_RS: &str = "cuda12_code.rs";
/// The Rust constants generated from `ERROR_CODES_PART`, in `$OUT_DIR`.
const ERROR_CODES_RS: &str = "error_codes.rs";
/// Real code for Ampere (A100) and Hopper (H100/H200), PTX for anything newer to JIT.
const GENCODE: [&str; 4] = [
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=[sm_90,compute_90]",
];

fn main() {
    println!("cargo:rustc-check-cfg=cfg(ringreduce_fatbin)");
    println!("cargo:rustc-check-cfg=cfg(ringreduce_cuda12)");
    for part in PARTS {
        println!("cargo:rerun-if-changed={part}");
    }
    for file in [
        "build.rs",
        "build/cuda12.rs",
        "src/exec/cuda/kernels/nvrtc/library.rs",
    ] {
        println!("cargo:rerun-if-changed={file}");
    }
    for var in [
        "NVCC",
        "CUDA_HOME",
        "PATH",
        "RINGREDUCE_REQUIRE_NVCC",
        "NVRTC_CUDA12",
        "RINGREDUCE_REQUIRE_CUDA12",
        "RINGREDUCE_CUDA12_PTX_ONLY",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let source = out_dir.join(JOINED);
    if let Err(why) = write_joined(&source) {
        fail(&why);
    }
    if let Err(why) = write_error_codes(&out_dir.join(ERROR_CODES_RS)) {
        fail(&why);
    }
    let _ = CACHE_DIR.set(build_cache_dir(&out_dir));
    let text = fs::read_to_string(&source).unwrap_or_else(|e| fail(&e.to_string()));

    let nvrtc12 = match cuda12::find() {
        Ok(Some(nvrtc)) => Some(nvrtc),
        Ok(None) if env::var("RINGREDUCE_REQUIRE_CUDA12").is_ok_and(|v| v == "1") => fail(
            "RINGREDUCE_REQUIRE_CUDA12=1 but NVRTC_CUDA12 does not name an NVRTC 12; run \
             .ci/install-nvcc.sh --export",
        ),
        Ok(None) => None,
        Err(why) => fail(&why),
    };
    // The CUDA 12 image's pieces compile on threads while nvcc runs below.
    std::thread::scope(|scope| {
        let pieces = nvrtc12.as_ref().map(|nvrtc| {
            let handles: Vec<_> = cuda12::pieces()
                .into_iter()
                .map(|piece| {
                    let (text, out_dir) = (&text, &out_dir);
                    scope.spawn(move || cuda12::build_piece(nvrtc, text, piece, out_dir))
                })
                .collect();
            (nvrtc, handles)
        });
        build_fatbin(&source, &text, &out_dir);
        if let Some((nvrtc, handles)) = pieces {
            let files: Vec<PathBuf> = handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| fail("an NVRTC 12 compilation panicked"))
                })
                .collect();
            let table = cuda12::rust_table(nvrtc, &files);
            if let Err(why) = write_if_changed(&out_dir.join(CUDA12_RS), &table) {
                fail(&why);
            }
            println!("cargo:rustc-cfg=ringreduce_cuda12");
        }
    });
}

/// Compiles the joined source (`source`, whose text is `text`) with nvcc into
/// `$OUT_DIR/reduce.fatbin`, where nvcc is found (module doc).
fn build_fatbin(source: &Path, text: &str, out_dir: &Path) {
    let nvcc = match find_nvcc() {
        Ok(Some(nvcc)) => nvcc,
        Ok(None) if env::var("RINGREDUCE_REQUIRE_NVCC").is_ok_and(|v| v == "1") => fail(
            "RINGREDUCE_REQUIRE_NVCC=1 but no nvcc was found (looked at $NVCC, \
             $CUDA_HOME/bin/nvcc and PATH); run .ci/install-nvcc.sh and set NVCC",
        ),
        Ok(None) => {
            println!(
                "cargo:warning=nvcc not found ($NVCC, $CUDA_HOME/bin/nvcc, PATH): the reduce \
                 kernels will be compiled through NVRTC at first use"
            );
            return;
        }
        Err(why) => fail(&why),
    };

    let fatbin = out_dir.join("reduce.fatbin");
    let release = nvcc_release(&nvcc);
    let mut flags = vec![
        "--fatbin",
        "-O3",
        // The same IEEE behaviour as the host executor: no flush to zero, correctly rounded
        // division (1/world), no contraction of a*b+c into one rounding.
        "-ftz=false",
        "-prec-div=true",
        "-fmad=false",
        // One thread per architecture.
        "--threads",
        "2",
    ];
    flags.extend(GENCODE);
    let mut cmd = Command::new(&nvcc);
    cmd.args(&flags).arg("-o").arg(&fatbin).arg(source);
    // Not the output and source paths: they differ between the debug and the release build.
    let identity = format!("nvcc {release} at {} {flags:?}", nvcc.display());
    let code = compile_cached("nvcc", &identity, text, || {
        let output = cmd
            .output()
            .map_err(|e| format!("could not run {}: {e}", nvcc.display()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            return Err(format!(
                "nvcc failed to compile {}, joined from {} in this order (messages name the \
                 part and its line) ({}):\n{:?}\n{}{}",
                source.display(),
                PARTS.join(", "),
                output.status,
                cmd,
                String::from_utf8_lossy(&output.stdout),
                stderr
            ));
        }
        for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
            println!("cargo:warning=nvcc: {line}");
        }
        fs::read(&fatbin).map_err(|e| format!("nvcc wrote no {}: {e}", fatbin.display()))
    })
    .unwrap_or_else(|why| fail(&why));
    if let Err(e) = fs::write(&fatbin, code) {
        fail(&format!("could not write {}: {e}", fatbin.display()));
    }

    println!("cargo:rustc-cfg=ringreduce_fatbin");
    println!("cargo:rustc-env=RINGREDUCE_NVCC_RELEASE={release}");
}

/// The build cache's folder (module doc): `target/ringreduce-kernels` for an `$OUT_DIR` of
/// `target/<profile>/build/<package>/out`, `None` for any other shape (then nothing is cached).
fn build_cache_dir(out_dir: &Path) -> Option<PathBuf> {
    let build = out_dir.ancestors().nth(2)?;
    (build.file_name()? == "build").then_some(())?;
    Some(out_dir.ancestors().nth(4)?.join("ringreduce-kernels"))
}

/// Set once in `main`: `build_cache_dir`'s answer.
static CACHE_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// The output of `compile` for this `source` and compiler `identity` (its version, path and
/// options), from the build cache where it is there, else compiled and stored as
/// `<label>-<hash>` — replacing the other files of that label, so the cache holds one result per
/// label. The hash is FNV-1a over identity and source.
fn compile_cached(
    label: &str,
    identity: &str,
    source: &str,
    compile: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<Vec<u8>, String> {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in identity.bytes().chain([0]).chain(source.bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    let Some(dir) = CACHE_DIR.get().cloned().flatten() else {
        return compile();
    };
    let file = dir.join(format!("{label}-{hash:016x}"));
    if let Ok(code) = fs::read(&file) {
        return Ok(code);
    }
    let code = compile()?;
    // Best effort: a cache that cannot be written costs the next build a compilation.
    let temporary = dir.join(format!("{label}.tmp{}", std::process::id()));
    if fs::create_dir_all(&dir)
        .and_then(|()| fs::write(&temporary, &code))
        .and_then(|()| fs::rename(&temporary, &file))
        .is_ok()
    {
        let stale = fs::read_dir(&dir).into_iter().flatten().flatten();
        for entry in stale.filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&format!("{label}-")) && e.path() != file
        }) {
            let _ = fs::remove_file(entry.path());
        }
    } else {
        let _ = fs::remove_file(&temporary);
    }
    Ok(code)
}

/// Writes the parts of `PARTS`, in order, into `path`, each after a `#line` directive that
/// names it, and only when the text differs from what is there.
fn write_joined(path: &Path) -> Result<(), String> {
    let mut joined = String::new();
    for part in PARTS {
        let text = fs::read_to_string(part).map_err(|e| format!("could not read {part}: {e}"))?;
        joined.push_str(&format!("#line 1 \"{part}\"\n"));
        joined.push_str(&text);
        if !text.ends_with('\n') {
            joined.push('\n');
        }
    }
    write_if_changed(path, &joined)
}

/// Writes the Rust constants of the error codes `ERROR_CODES_PART` defines into `path` (the
/// shape it must have is in the module doc).
fn write_error_codes(path: &Path) -> Result<(), String> {
    let part = ERROR_CODES_PART;
    let text = fs::read_to_string(part).map_err(|e| format!("could not read {part}: {e}"))?;
    let mut doc: Vec<&str> = Vec::new();
    // (name without RR_, value, its digits as written, its doc lines)
    let mut codes: Vec<(&str, u32, &str, Vec<&str>)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let bad = |why: &str| format!("{part}:{}: {why}: {line}", index + 1);
        if let Some(comment) = line.strip_prefix("//") {
            doc.push(comment.strip_prefix(' ').unwrap_or(comment));
            continue;
        }
        let Some(define) = line.strip_prefix("#define ") else {
            if !line.trim().is_empty() {
                return Err(bad(
                    "only comments and `#define RR_<NAME> <value>u` lines belong here",
                ));
            }
            doc.clear();
            continue;
        };
        let (name, value) = define
            .split_once(' ')
            .ok_or_else(|| bad("a define without a value"))?;
        let name = name
            .strip_prefix("RR_")
            .ok_or_else(|| bad("an error code's name starts with RR_"))?;
        let digits = value
            .trim()
            .strip_suffix('u')
            .ok_or_else(|| bad("an error code is unsigned: its value ends in `u`"))?;
        let value = match digits.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => digits.parse(),
        }
        .map_err(|_| bad("not a 32-bit value"))?;
        if doc.is_empty() {
            return Err(bad(
                "an error code has its meaning in `//` lines right above it",
            ));
        }
        if value == 0 {
            return Err(bad("0 is \"no error\""));
        }
        if let Some((other, ..)) = codes.iter().find(|(_, v, ..)| *v == value) {
            return Err(bad(&format!("RR_{other} has this value already")));
        }
        codes.push((name, value, digits, std::mem::take(&mut doc)));
    }
    if codes.is_empty() {
        return Err(format!("{part} defines no error code"));
    }
    let mut rust = format!("// Generated by build.rs from {part}; edit that file, not this one.\n");
    for (name, _, digits, doc) in &codes {
        rust.push('\n');
        for line in doc {
            rust.push_str(format!("/// {line}").trim_end());
            rust.push('\n');
        }
        rust.push_str(&format!("///\n/// `RR_{name}` in `{part}`.\n"));
        rust.push_str(&format!("pub const {name}: u32 = {digits};\n"));
    }
    rust.push_str(&format!(
        "\n/// Every error code `{part}` defines, by name, in its order.\n\
         pub const ERROR_CODES: [(&str, u32); {}] = [\n",
        codes.len()
    ));
    for (name, ..) in &codes {
        rust.push_str(&format!("    (\"{name}\", {name}),\n"));
    }
    rust.push_str("];\n");
    write_if_changed(path, &rust)
}

/// Writes `text` into `path` only when it differs from what is there (an unchanged file keeps
/// its mtime, so nothing that reads it is rebuilt for nothing).
fn write_if_changed(path: &Path, text: &str) -> Result<(), String> {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    fs::write(path, text).map_err(|e| format!("could not write {}: {e}", path.display()))
}

/// Ends the build script with a message cargo shows.
fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    exit(1)
}

/// `Ok(None)` when no nvcc is configured or on PATH; `Err` when `$NVCC` names a missing file
/// (a typo should not silently fall back to NVRTC).
fn find_nvcc() -> Result<Option<PathBuf>, String> {
    if let Some(nvcc) = env::var_os("NVCC").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(&nvcc);
        return match path.canonicalize() {
            Ok(real) if real.is_file() => Ok(Some(real)),
            _ => Err(format!("NVCC={} is not a file", path.display())),
        };
    }
    let from_cuda_home = env::var_os("CUDA_HOME")
        .filter(|v| !v.is_empty())
        .map(|home| PathBuf::from(home).join("bin").join("nvcc"));
    let from_path = env::var_os("PATH")
        .map(|paths| {
            env::split_paths(&paths)
                .map(|dir| dir.join("nvcc"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    Ok(from_cuda_home
        .into_iter()
        .chain(from_path)
        .filter(|p| p.is_file())
        .find_map(|p| p.canonicalize().ok()))
}

/// "13.0, V13.0.88" from nvcc's "Cuda compilation tools, release 13.0, V13.0.88" line.
fn nvcc_release(nvcc: &Path) -> String {
    Command::new(nvcc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.split_once("release ").map(|(_, r)| r.trim().to_string()))
        })
        .unwrap_or_else(|| "unknown version".to_string())
}
