//! The kernels compiled by NVRTC on the GPU host: what a build without nvcc loads, and what a
//! driver that refuses the embedded fatbin gets.
//!
//! The kernel source is large (266 functions; NVRTC 13.0 writes 35 MB of PTX for it), so one
//! compilation takes minutes of one CPU core: 78 s to PTX and 146 s to sm_90 machine code on
//! the 2-core development machine, on top of which a driver given PTX compiles it again at
//! every load (the optimiser's work is spread over the host's cores where NVRTC can). So the
//! compiled image is kept twice:
//! - **in the process**, per compute capability: every context of the process (every rank,
//!   every communicator) loads the one image; ranks that ask at once wait for the first;
//! - **on disk**, as machine code for the device (CUBIN, so the driver has nothing left to
//!   compile), under the kernel cache folder ([`cache_dir`]), named after the compute
//!   capability, the NVRTC version and a hash of the source and options: a later process on
//!   the host loads it in milliseconds, and a changed source or NVRTC never meets a stale file.
//!   A file is written whole and renamed into place, so a reader sees a whole image or none;
//!   one that is not an ELF image, or that the driver refuses, is compiled anew and replaced.
//!   The cache is the user's, like the driver's own JIT cache (`~/.nv/ComputeCache`): its files
//!   run as kernels, so the folder must be writable by the user alone.

// build.rs compiles PTX with it too (`Output::Ptx`); the library only machine code.
#[allow(dead_code)]
pub(crate) mod library;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::Ptx;

use self::library::{Nvrtc, Output, NVRTC_NAMES};

use super::SOURCE;
use crate::device;
use crate::error::{Error, Result};

/// Images compiled (or read) by this process, per compute capability.
static IMAGES: Mutex<Vec<(Capability, Vec<u8>)>> = Mutex::new(Vec::new());

/// A GPU's compute capability, (major, minor).
type Capability = (i32, i32);

/// The first bytes of an ELF file, which a CUBIN is.
const ELF_MAGIC: &[u8] = b"\x7fELF";

/// The kernels compiled by NVRTC, loaded into `ctx`: from this process's image, else the disk
/// cache's, else compiled now (module doc).
pub(super) fn load(ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>> {
    let capability = device::compute_capability(ctx)?;
    let version = library().map_err(library_missing)?.version;
    // Held while compiling: ranks of this process that need the same image wait for it.
    let mut images = IMAGES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, image)) = images.iter().find(|(c, _)| *c == capability) {
        return device::load_module(ctx, Ptx::from_binary(image.clone()));
    }
    let file = cache_dir().map(|dir| dir.join(file_name(capability, version)));
    let load = |image: Vec<u8>| {
        device::load_module(ctx, Ptx::from_binary(image.clone())).map(|m| (m, image))
    };
    let image = match cached(file.as_deref(), || compile(capability))? {
        Cached::Compiled(image) => load(image),
        // A file the driver refuses (damaged, or from another driver's era): compile anew.
        Cached::Read(image) => load(image).or_else(|_| {
            let image = compile(capability)?;
            if let Some(file) = &file {
                store(file, &image);
            }
            load(image)
        }),
    };
    let (module, image) = image?;
    images.push((capability, image));
    Ok(module)
}

/// The libnvrtc this process compiles with, opened on first use: the file `RINGREDUCE_NVRTC`
/// names, else the first of [`NVRTC_NAMES`] the dynamic loader finds (CUDA 13's, then 12's).
/// `Err` says what was tried and why each failed.
pub(crate) fn library() -> std::result::Result<&'static Nvrtc, &'static str> {
    static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| match std::env::var("RINGREDUCE_NVRTC") {
            Ok(path) if !path.is_empty() => Nvrtc::open(&path),
            _ => Nvrtc::open_first(NVRTC_NAMES),
        })
        .as_ref()
        .map_err(String::as_str)
}

/// Where the libnvrtc this host would compile with was found and its version, or what was tried.
pub fn found() -> std::result::Result<(&'static Path, (i32, i32)), &'static str> {
    library().map(|nvrtc| (nvrtc.path.as_path(), nvrtc.version))
}

/// The version of the libnvrtc this host would compile with (`nvrtcVersion`), or `None` where
/// none can be loaded. Never panics.
pub fn version() -> Option<(i32, i32)> {
    library().ok().map(|nvrtc| nvrtc.version)
}

/// The folder of the disk cache: `RINGREDUCE_KERNEL_CACHE` (`off` turns the disk cache off),
/// else `$XDG_CACHE_HOME/ringreduce`, else `$HOME/.cache/ringreduce`; `None` when off or when
/// none of these is set.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("RINGREDUCE_KERNEL_CACHE") {
        return (dir != "off").then(|| PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("ringreduce"));
    }
    var("HOME").map(|home| PathBuf::from(home).join(".cache").join("ringreduce"))
}

/// NVRTC's options for a device of compute capability `major.minor`: machine code for exactly
/// that GPU, the same IEEE behaviour as nvcc's build (see build.rs) and the host executor, no
/// include paths (the source needs none).
fn options((major, minor): (i32, i32)) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{major}{minor}"),
        "--ftz=false".into(),
        "--prec-div=true".into(),
        "--fmad=false".into(),
    ]
}

/// The cache file's name: compute capability, NVRTC version, and the 64-bit FNV-1a hash of the
/// source and the options (a stable hash: the same on every build of the library).
fn file_name(capability: (i32, i32), (major, minor): (i32, i32)) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let options = options(capability).join(" ");
    for byte in SOURCE.bytes().chain([0]).chain(options.bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!(
        "kernels-sm{}{}-nvrtc{major}.{minor}-{hash:016x}.cubin",
        capability.0, capability.1
    )
}

/// An image from the disk cache, or one compiled because the cache had none.
#[derive(Debug, PartialEq)]
enum Cached {
    Read(Vec<u8>),
    Compiled(Vec<u8>),
}

/// `file`'s image where it holds one (an ELF image), else `compile`'s, stored in `file` for the
/// next process. `None`: no disk cache.
fn cached(file: Option<&Path>, compile: impl FnOnce() -> Result<Vec<u8>>) -> Result<Cached> {
    if let Some(image) = file
        .and_then(|f| std::fs::read(f).ok())
        .filter(|i| i.starts_with(ELF_MAGIC))
    {
        return Ok(Cached::Read(image));
    }
    let image = compile()?;
    if let Some(file) = file {
        store(file, &image);
    }
    Ok(Cached::Compiled(image))
}

/// Writes `image` to `file` through a temporary file of this process renamed into place.
/// Best effort: a cache that cannot be written costs the next process a compilation, nothing
/// else, so failures are ignored.
fn store(file: &Path, image: &[u8]) {
    let Some(dir) = file.parent() else { return };
    let temporary = file.with_extension(format!("tmp{}", std::process::id()));
    // The folder is the user's alone: its files run as kernels.
    let written = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|()| std::fs::write(&temporary, image))
        .and_then(|()| std::fs::rename(&temporary, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
}

/// NVRTC's CUBIN of the kernel source for a device of compute capability `capability`, its
/// optimisation spread over every core (`--split-compile=0`: 146 s → 123 s on 2 cores), or on
/// one where this NVRTC does not know the option.
fn compile(capability: (i32, i32)) -> Result<Vec<u8>> {
    let mut split = options(capability);
    split.push("--split-compile=0".into());
    match compile_with(split) {
        Err(Error::Cuda { code, .. }) if code.contains("INVALID_OPTION") => {
            compile_with(options(capability))
        }
        other => other,
    }
}

/// NVRTC's CUBIN of the kernel source, compiled with `options`.
fn compile_with(options: Vec<String>) -> Result<Vec<u8>> {
    let nvrtc = library().map_err(library_missing)?;
    nvrtc
        .compile(SOURCE, "ringreduce_kernels.cu", &options, Output::Cubin)
        .map_err(|failure| Error::Cuda {
            call: failure.call,
            code: failure.code,
            message: if failure.log.is_empty() {
                format!("NVRTC {} failed outside compilation", nvrtc.path.display())
            } else {
                format!(
                    "compiling the kernel source (cuda/*.cuh, joined) with {options:?} (NVRTC {}):\n{}",
                    nvrtc.path.display(),
                    failure.log
                )
            },
        })
}

/// The error for a host where no libnvrtc can be loaded: what was tried, and why.
fn library_missing(tried: &str) -> Error {
    Error::Cuda {
        call: "nvrtcCreateProgram",
        code: "NVRTC_LIBRARY_NOT_FOUND".to_string(),
        message: format!(
            "libnvrtc could not be loaded ({tried}), and the embedded kernels (if any) could \
             not be used: install CUDA's NVRTC for this driver (libnvrtc.so.13 or .so.12 on the \
             library path, or RINGREDUCE_NVRTC=<file>), or build with nvcc (set NVCC, see \
             .ci/install-nvcc.sh)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ringreduce-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn an_image_is_compiled_once_then_read_from_the_cache() {
        let dir = folder("kernel-cache");
        let file = dir.join(file_name((9, 0), (13, 0)));
        let image = b"\x7fELF machine code".to_vec();
        let first = cached(Some(&file), || Ok(image.clone())).unwrap();
        assert_eq!(first, Cached::Compiled(image.clone()));
        let again = cached(Some(&file), || panic!("compiled although cached")).unwrap();
        assert_eq!(again, Cached::Read(image));
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_is_no_image_is_compiled_anew_and_replaced() {
        let dir = folder("kernel-cache-bad");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(file_name((9, 0), (13, 0)));
        std::fs::write(&file, b"half a fi").unwrap();
        let image = b"\x7fELF machine code".to_vec();
        assert_eq!(
            cached(Some(&file), || Ok(image.clone())).unwrap(),
            Cached::Compiled(image.clone())
        );
        assert_eq!(std::fs::read(&file).unwrap(), image);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_compilation_stores_nothing_and_is_returned() {
        let dir = folder("kernel-cache-fail");
        let file = dir.join(file_name((9, 0), (13, 0)));
        let failure = || {
            Err(Error::Cuda {
                call: "nvrtcCompileProgram",
                code: "NVRTC_ERROR_COMPILATION".into(),
                message: "log".into(),
            })
        };
        assert!(matches!(
            cached(Some(&file), failure),
            Err(Error::Cuda {
                call: "nvrtcCompileProgram",
                ..
            })
        ));
        assert!(!file.exists());
        // Without a disk cache, every call compiles.
        let image = b"\x7fELF".to_vec();
        assert_eq!(
            cached(None, || Ok(image.clone())).unwrap(),
            Cached::Compiled(image)
        );
    }

    /// The loader end to end, on the CPU (NVRTC needs no GPU): the NVRTC 12 that CI installs
    /// (`NVRTC_CUDA12`) opens, says its version, compiles a kernel into machine code for sm_90
    /// and into PTX, and a broken kernel comes back as NVRTC's compilation error with the
    /// compiler's log. Waived where `NVRTC_CUDA12` is not set.
    #[test]
    fn an_nvrtc_named_by_path_compiles_and_reports_errors_with_its_log() {
        let Some(path) = std::env::var("NVRTC_CUDA12").ok().filter(|p| !p.is_empty()) else {
            println!("waived: needs NVRTC_CUDA12 (a libnvrtc.so.12; .ci/install-nvcc.sh)");
            return;
        };
        let nvrtc = Nvrtc::open(&path).unwrap();
        assert_eq!(nvrtc.version.0, 12, "{:?}", nvrtc.version);
        let source = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }";
        let arch = |a: &str| vec![format!("--gpu-architecture={a}")];
        let cubin = nvrtc
            .compile(source, "t.cu", &arch("sm_90"), Output::Cubin)
            .unwrap();
        assert!(cubin.starts_with(ELF_MAGIC));
        let ptx = nvrtc
            .compile(source, "t.cu", &arch("compute_80"), Output::Ptx)
            .unwrap();
        let ptx = String::from_utf8_lossy(&ptx);
        assert!(ptx.contains(".entry twice"), "{ptx}");
        let broken = nvrtc
            .compile(
                "__global__ void k() { undeclared(); }",
                "t.cu",
                &arch("sm_90"),
                Output::Cubin,
            )
            .unwrap_err();
        assert_eq!(broken.call, "nvrtcCompileProgram");
        assert_eq!(broken.code, "NVRTC_ERROR_COMPILATION");
        assert!(broken.log.contains("undeclared"), "{}", broken.log);
        // A file that is no NVRTC is refused by name, and a missing one says so.
        assert!(Nvrtc::open("/nonexistent/libnvrtc.so.12").is_err());
        let err = Nvrtc::open_first(["/nonexistent/a.so", "/nonexistent/b.so"])
            .err()
            .unwrap();
        assert!(err.contains("a.so") && err.contains("b.so"), "{err}");
    }

    #[test]
    fn the_file_name_changes_with_the_gpu_and_the_nvrtc() {
        let names = [
            file_name((9, 0), (13, 0)),
            file_name((8, 0), (13, 0)),
            file_name((9, 0), (12, 9)),
        ];
        assert_eq!(names[0], file_name((9, 0), (13, 0)), "a stable name");
        assert!(names[0].starts_with("kernels-sm90-nvrtc13.0-"));
        assert_ne!(names[0], names[1]);
        assert_ne!(names[0], names[2]);
    }
}
