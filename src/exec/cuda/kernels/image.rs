//! Which compiled code a context loads: nvcc's fatbin, the CUDA 12 image or NVRTC's code
//! (the choice is explained in the parent module's doc), how each is read and described, and
//! when a driver's refusal sends a context to NVRTC.
//!
//! Invariant: an image the build lacks is never chosen ([`kernel_choice`] refuses to force it),
//! and a context gets NVRTC's code only where it was chosen or the driver refused the image
//! ([`driver_refused_image`]); any other load failure is the caller's error.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};
#[cfg(any(ringreduce_fatbin, ringreduce_cuda12))]
use cudarc::nvrtc::Ptx;

use super::nvrtc;
use crate::device;
use crate::error::{Error, Result};

/// The kernels compiled by nvcc at build time.
#[cfg(ringreduce_fatbin)]
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/reduce.fatbin"));

// The CUDA 12 image: `CUDA12_CODE` (its pieces, deflate-compressed) and `CUDA12_NVRTC_RELEASE`.
#[cfg(ringreduce_cuda12)]
include!(concat!(env!("OUT_DIR"), "/cuda12_code.rs"));

/// Where the loaded kernels came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSource {
    /// The fatbin nvcc built and the build embedded (what a CUDA 13 driver loads).
    EmbeddedFatbin,
    /// The CUDA 12 image NVRTC 12 built and the build embedded (what a CUDA 12 driver loads).
    EmbeddedCuda12,
    /// The kernel source (`cuda/`, joined by `build.rs`) compiled by the host's NVRTC when the
    /// [`KernelModule`](super::KernelModule) was made: the build had no image for this driver, or
    /// `RINGREDUCE_KERNELS=nvrtc`.
    Nvrtc,
    /// NVRTC's, because the driver refused the embedded image it was given
    /// ([`driver_refused_image`]).
    NvrtcAfterEmbedded,
}

impl fmt::Display for KernelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelSource::EmbeddedFatbin => "embedded fatbin (nvcc)",
            KernelSource::EmbeddedCuda12 => "embedded CUDA 12 image (NVRTC 12)",
            KernelSource::Nvrtc => "NVRTC",
            KernelSource::NvrtcAfterEmbedded => "NVRTC (the driver refused the embedded image)",
        })
    }
}

/// Whether the build embeds nvcc's fatbin.
pub const HAS_FATBIN: bool = cfg!(ringreduce_fatbin);
/// Whether the build embeds the CUDA 12 image.
pub const HAS_CUDA12: bool = cfg!(ringreduce_cuda12);

/// Which kernels [`KernelModule::new`](super::KernelModule::new) loads first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelChoice {
    /// nvcc's fatbin.
    Fatbin,
    /// The CUDA 12 image.
    Cuda12,
    /// NVRTC on this host.
    Nvrtc,
}

/// The kernels to load for a driver of CUDA major version `driver_major`, given what the build
/// embeds and `RINGREDUCE_KERNELS` (`forced`): `auto` or unset picks nvcc's fatbin on a CUDA 13
/// (or later) driver, the CUDA 12 image on a CUDA 12 driver (or where there is no fatbin),
/// else whichever image there is, else NVRTC; `fatbin`, `cuda12` and `nvrtc` force one (so
/// each can be tested on any driver that takes it). Forcing an image the build lacks, or an
/// unknown value, is an error that says what there is.
pub fn kernel_choice(
    forced: Option<&str>,
    driver_major: u32,
    has_fatbin: bool,
    has_cuda12: bool,
) -> Result<KernelChoice> {
    let lacking = |what: &str, how: &str| {
        Error::InvalidArgument(format!(
            "RINGREDUCE_KERNELS={what}, but this build has no {what} image ({how}); the choices \
             are auto, fatbin, cuda12 and nvrtc"
        ))
    };
    match forced.map(str::trim) {
        None | Some("") | Some("auto") => Ok(match (has_fatbin, has_cuda12) {
            (true, _) if driver_major >= 13 => KernelChoice::Fatbin,
            (_, true) => KernelChoice::Cuda12,
            (true, false) => KernelChoice::Fatbin,
            (false, false) => KernelChoice::Nvrtc,
        }),
        Some("fatbin") if has_fatbin => Ok(KernelChoice::Fatbin),
        Some("fatbin") => Err(lacking("fatbin", "built without nvcc")),
        Some("cuda12") if has_cuda12 => Ok(KernelChoice::Cuda12),
        Some("cuda12") => Err(lacking("cuda12", "built without NVRTC_CUDA12")),
        Some("nvrtc") => Ok(KernelChoice::Nvrtc),
        Some(other) => Err(Error::InvalidArgument(format!(
            "RINGREDUCE_KERNELS={other:?} is not one of auto, fatbin, cuda12, nvrtc"
        ))),
    }
}

/// The piece of the CUDA 12 image (`entries`) a GPU of compute capability `(major, minor)` runs:
/// SASS for `sm_XY` runs on GPUs of major X and minor ≥ Y (the highest such wins), else PTX for
/// `compute_XY` on any GPU of capability ≥ X.Y (the driver compiles it); `None` where neither
/// fits (a GPU older than the image's lowest architecture).
pub fn cuda12_code_for(capability: (i32, i32), entries: &[CodeEntry]) -> Option<CodeEntry> {
    let split = |arch: u32| (arch as i32 / 10, arch as i32 % 10);
    let best = |fits: &dyn Fn(u32) -> bool, ptx: bool| {
        entries
            .iter()
            .filter(|e| matches!(e, CodeEntry::Ptx(_)) == ptx)
            .filter(|e| {
                let (CodeEntry::Sass(arch) | CodeEntry::Ptx(arch)) = **e;
                fits(arch)
            })
            .max_by_key(|e| {
                let (CodeEntry::Sass(arch) | CodeEntry::Ptx(arch)) = **e;
                arch
            })
            .copied()
    };
    let sass = |arch: u32| {
        let (major, minor) = split(arch);
        capability.0 == major && capability.1 >= minor
    };
    let ptx = |arch: u32| capability >= split(arch);
    best(&sass, false).or_else(|| best(&ptx, true))
}

/// Which kernel images this build has, for `ringreduce info` and reports: each embedded image's
/// code (nvcc's read from the fatbin itself, [`fatbin_entries`]) and its compiler, and the
/// driver each is for.
pub fn build_kind() -> String {
    let images: Vec<String> = [fatbin_kind(), cuda12_kind()]
        .into_iter()
        .flatten()
        .collect();
    if images.is_empty() {
        "NVRTC at first use (built without nvcc or NVRTC 12; needs libnvrtc on the GPU host)".into()
    } else {
        format!("embedded {}", images.join("; "))
    }
}

/// nvcc's fatbin as `build_kind` names it; `None` where the build has none.
fn fatbin_kind() -> Option<String> {
    #[cfg(ringreduce_fatbin)]
    {
        let entries = fatbin_entries(FATBIN)
            .map(|e| describe_entries(&e))
            .unwrap_or_else(|| "unreadable".into());
        Some(format!(
            "nvcc {} fatbin ({entries}) for CUDA 13 drivers",
            env!("RINGREDUCE_NVCC_RELEASE")
        ))
    }
    #[cfg(not(ringreduce_fatbin))]
    None
}

/// The CUDA 12 image as `build_kind` names it; `None` where the build has none.
fn cuda12_kind() -> Option<String> {
    #[cfg(ringreduce_cuda12)]
    {
        let entries: Vec<CodeEntry> = CUDA12_CODE.iter().map(|(e, _)| *e).collect();
        Some(format!(
            "NVRTC {CUDA12_NVRTC_RELEASE} image ({}) for CUDA 12 drivers",
            describe_entries(&entries)
        ))
    }
    #[cfg(not(ringreduce_cuda12))]
    None
}

/// One code image of a fatbin: machine code (SASS) for one GPU architecture, or PTX for a
/// virtual one (which a driver compiles for its GPU: newer GPUs run it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeEntry {
    /// SASS for `sm_<arch>` (e.g. 90).
    Sass(u32),
    /// PTX for `compute_<arch>`.
    Ptx(u32),
}

/// The code images of a fatbin (the container nvcc's `--fatbin` writes): a 16-byte header
/// (magic `0xBA55ED50`, version, header size, size of what follows), then entries, each a
/// header (kind at byte 0: 1 PTX, 2 ELF/SASS; its header size at byte 4; its payload size at
/// byte 8; the architecture at byte 28) and its payload. `None` for anything else. The layout
/// is nvcc's, read off the fatbins it writes (`cuobjdump --list-elf/--list-ptx` lists the
/// same); a test reads the embedded one.
pub fn fatbin_entries(image: &[u8]) -> Option<Vec<CodeEntry>> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(image.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(image.get(at..at + 8)?.try_into().ok()?));
    if u32_at(0)? != 0xBA55_ED50 {
        return None;
    }
    let header = usize::from(u16_at(6)?);
    let end = header.checked_add(usize::try_from(u64_at(8)?).ok()?)?;
    if end > image.len() {
        return None;
    }
    let mut entries = Vec::new();
    let mut at = header;
    while at < end {
        let kind = u16_at(at)?;
        let size = usize::try_from(u32_at(at + 4)?).ok()?;
        let payload = usize::try_from(u64_at(at + 8)?).ok()?;
        let arch = u32_at(at + 28)?;
        entries.push(match kind {
            1 => CodeEntry::Ptx(arch),
            2 => CodeEntry::Sass(arch),
            _ => return None,
        });
        at = at.checked_add(size)?.checked_add(payload)?;
        if size == 0 {
            return None;
        }
    }
    Some(entries)
}

/// "sm_80 + sm_90 SASS, compute_90 PTX".
#[cfg_attr(not(any(ringreduce_fatbin, ringreduce_cuda12)), allow(dead_code))]
fn describe_entries(entries: &[CodeEntry]) -> String {
    let list = |ptx: bool, prefix: &str| -> Vec<String> {
        entries
            .iter()
            .filter_map(|e| match (e, ptx) {
                (CodeEntry::Sass(a), false) | (CodeEntry::Ptx(a), true) => {
                    Some(format!("{prefix}_{a}"))
                }
                _ => None,
            })
            .collect()
    };
    let (sass, ptx) = (list(false, "sm"), list(true, "compute"));
    match (sass.is_empty(), ptx.is_empty()) {
        (false, false) => format!("{} SASS, {} PTX", sass.join(" + "), ptx.join(" + ")),
        (false, true) => format!("{} SASS", sass.join(" + ")),
        (true, false) => format!("{} PTX", ptx.join(" + ")),
        (true, true) => "no code".into(),
    }
}

/// Whether `code`, the driver's answer to loading the embedded fatbin, says this driver cannot
/// run the image (too old for the nvcc that built it, or no code for this GPU) rather than that
/// something else failed: then NVRTC compiles the source for this driver and GPU.
pub fn driver_refused_image(code: &str) -> bool {
    [
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "CUDA_ERROR_INVALID_IMAGE",
        "CUDA_ERROR_INVALID_PTX",
        "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
    ]
    .iter()
    .any(|c| code.contains(c))
}

/// The kernels loaded into `ctx` and where they came from: the embedded image
/// [`kernel_choice`] picks for this driver, else (or where the driver refuses it) NVRTC's code
/// for the device (module doc).
pub(super) fn load_kernels(ctx: &Arc<CudaContext>) -> Result<(Arc<CudaModule>, KernelSource)> {
    let (driver_major, _) = device::driver_version()?;
    let forced = std::env::var("RINGREDUCE_KERNELS").ok();
    let embedded = match kernel_choice(forced.as_deref(), driver_major, HAS_FATBIN, HAS_CUDA12)? {
        KernelChoice::Nvrtc => return Ok((nvrtc::load(ctx)?, KernelSource::Nvrtc)),
        KernelChoice::Fatbin => load_fatbin(ctx).map(|m| (m, KernelSource::EmbeddedFatbin)),
        KernelChoice::Cuda12 => load_cuda12(ctx).map(|m| (m, KernelSource::EmbeddedCuda12)),
    };
    match embedded {
        Err(Error::Cuda { code, .. }) if driver_refused_image(&code) => {
            Ok((nvrtc::load(ctx)?, KernelSource::NvrtcAfterEmbedded))
        }
        other => other,
    }
}

/// nvcc's fatbin, loaded into `ctx`.
fn load_fatbin(ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>> {
    #[cfg(ringreduce_fatbin)]
    {
        // cuModuleLoadData reads the fatbin in place; the copy lives in a heap block, which the
        // system allocator aligns to 16 bytes (the image's header wants 8).
        device::load_module(ctx, Ptx::from_binary(FATBIN.to_vec()))
    }
    #[cfg(not(ringreduce_fatbin))]
    {
        let _ = ctx;
        unreachable!("kernel_choice picks the fatbin only where the build has one")
    }
}

/// The CUDA 12 image's piece for `ctx`'s GPU ([`cuda12_code_for`]), decompressed and loaded; a
/// GPU it has no piece for gets the driver's own "no binary for this GPU".
fn load_cuda12(ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>> {
    #[cfg(ringreduce_cuda12)]
    {
        let capability = device::compute_capability(ctx)?;
        let entries: Vec<CodeEntry> = CUDA12_CODE.iter().map(|(e, _)| *e).collect();
        let no_code = || Error::Cuda {
            call: "cuModuleLoadData",
            code: "CUDA_ERROR_NO_BINARY_FOR_GPU".into(),
            message: format!(
                "the CUDA 12 image ({}) has no code for sm_{}{}",
                describe_entries(&entries),
                capability.0,
                capability.1
            ),
        };
        let entry = cuda12_code_for(capability, &entries).ok_or_else(no_code)?;
        let (_, compressed) = CUDA12_CODE
            .iter()
            .find(|(e, _)| *e == entry)
            .expect("cuda12_code_for picks one of the entries");
        let code =
            miniz_oxide::inflate::decompress_to_vec(compressed).map_err(|e| Error::Resource {
                what: format!("the embedded CUDA 12 image's {entry:?} is damaged: {e:?}"),
            })?;
        let image = match entry {
            CodeEntry::Sass(_) => Ptx::from_binary(code),
            CodeEntry::Ptx(_) => Ptx::from_src(String::from_utf8_lossy(&code).into_owned()),
        };
        device::load_module(ctx, image)
    }
    #[cfg(not(ringreduce_cuda12))]
    {
        let _ = ctx;
        unreachable!("kernel_choice picks the CUDA 12 image only where the build has one")
    }
}

#[cfg(test)]
mod tests;
