//! The kernels compiled by NVRTC on the GPU host: what a build without nvcc loads, and what a
//! driver that refuses the embedded fatbin gets.
//!
//! The kernel source is large (254 functions; NVRTC 13.0 writes 35 MB of PTX for it), so one
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

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{result, sys, Ptx};

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
    let version = version().ok_or_else(library_missing)?;
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

/// The version of the libnvrtc this host would compile with (`nvrtcVersion`), or `None` where
/// none can be loaded. Never panics.
pub fn version() -> Option<(i32, i32)> {
    // SAFETY: only probes whether libnvrtc can be loaded; cudarc panics on first use otherwise.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints; both are live locals.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (status == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
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
    let fail = |call: &'static str, e: result::NvrtcError, log: String| Error::Cuda {
        call,
        code: format!("{:?}", e.0),
        message: if log.is_empty() {
            "NVRTC failed outside compilation".into()
        } else {
            format!("compiling the kernel source (cuda/*.cuh, joined) with {options:?}:\n{log}")
        },
    };
    let source = std::ffi::CString::new(SOURCE).expect("the kernel source has no NUL");
    let name = c"ringreduce_kernels.cu";
    let program = result::create_program(&source, Some(name))
        .map_err(|e| fail("nvrtcCreateProgram", e, String::new()))?;
    // SAFETY: `program` was created above and is destroyed once, below, on every path.
    let image = unsafe {
        let compiled = result::compile_program(program, &options).map_err(|e| {
            let log = result::get_program_log(program)
                .map(|log| {
                    let bytes: Vec<u8> = log.iter().map(|&c| c as u8).collect();
                    String::from_utf8_lossy(&bytes)
                        .trim_end_matches('\0')
                        .to_string()
                })
                .unwrap_or_default();
            fail("nvrtcCompileProgram", e, log)
        });
        let image = compiled.and_then(|()| {
            let mut size = 0usize;
            sys::nvrtcGetCUBINSize(program, &mut size)
                .result()
                .map_err(|e| fail("nvrtcGetCUBINSize", e, String::new()))?;
            let mut image = vec![0u8; size];
            sys::nvrtcGetCUBIN(program, image.as_mut_ptr().cast())
                .result()
                .map_err(|e| fail("nvrtcGetCUBIN", e, String::new()))?;
            Ok(image)
        });
        let _ = result::destroy_program(program);
        image
    };
    image
}

/// The error for a host where no libnvrtc can be loaded.
fn library_missing() -> Error {
    Error::Cuda {
        call: "nvrtcCreateProgram",
        code: "NVRTC_LIBRARY_NOT_FOUND".to_string(),
        message: "libnvrtc could not be loaded, and the embedded kernels (if any) could not be \
                  used: install CUDA's NVRTC (libnvrtc.so) for this driver, or build with nvcc \
                  (set NVCC, see .ci/install-nvcc.sh)"
            .to_string(),
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
