//! The real NCCL beside this library: what it does not run, it hands to NCCL, loaded at run
//! time — from `RINGREDUCE_NCCL_PATH` (a file), else a `libnccl.so.2` the process has already
//! loaded by its path (PyTorch's wheels load theirs from `site-packages/nvidia/nccl/lib` even
//! when this library was preloaded), else the first `libnccl.so.2` on `LD_LIBRARY_PATH` or in
//! the usual system folders — never this library itself (which may be installed under that very
//! name). A communicator made through NCCL (`ncclCommInitAll`,
//! `ncclCommSplit` of one, or every communicator with `RINGREDUCE_NCCL_FALLBACK=1`) runs every
//! call there.
//!
//! `RINGREDUCE_NCCL_LOG=1` prints, once per call kind and side, which side ran it
//! (`ringreduce-nccl: ncclAllReduce: ringreduce` or `…: NCCL`), on stderr.
//!
//! Invariant: a symbol of NCCL is only ever called with the handles NCCL itself made.

use std::collections::HashSet;
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The real NCCL, opened.
pub struct Real {
    handle: *mut c_void,
    /// Where it was found.
    pub path: PathBuf,
}

// SAFETY: a `dlopen` handle is valid on every thread, and `dlsym` is thread-safe.
unsafe impl Send for Real {}
// SAFETY: as above.
unsafe impl Sync for Real {}

impl Real {
    /// The real NCCL, opened on first use; `None` when there is none (module doc).
    pub fn get() -> Option<&'static Real> {
        static REAL: OnceLock<Option<Real>> = OnceLock::new();
        REAL.get_or_init(|| find().and_then(|path| open(&path)))
            .as_ref()
    }

    /// NCCL's function `name`, as the function-pointer type `F`.
    ///
    /// # Safety
    /// `F` is the C signature NCCL documents for `name`.
    pub unsafe fn function<F: Copy>(&self, name: &CStr) -> Option<F> {
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: a live handle and a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        // SAFETY: a non-null symbol of that name has the type our caller names.
        (!symbol.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&symbol) })
    }
}

/// Whether NCCL has made a communicator of this process.
pub fn made_any() -> bool {
    MADE.load(std::sync::atomic::Ordering::Acquire)
}

/// NCCL made a communicator of this process ([`made_any`]).
pub fn mark_made() {
    MADE.store(true, std::sync::atomic::Ordering::Release);
}

static MADE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether every communicator is to be made by NCCL (`RINGREDUCE_NCCL_FALLBACK=1`).
pub fn forced() -> bool {
    std::env::var("RINGREDUCE_NCCL_FALLBACK").is_ok_and(|v| v == "1")
}

/// Prints, with `RINGREDUCE_NCCL_LOG=1`, that `side` ran `call` — once per pair.
pub fn log(call: &str, side: &str) {
    static ON: OnceLock<bool> = OnceLock::new();
    if !*ON.get_or_init(|| std::env::var("RINGREDUCE_NCCL_LOG").is_ok_and(|v| v == "1")) {
        return;
    }
    static SEEN: Mutex<Option<HashSet<(String, String)>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert((call.to_string(), side.to_string()))
    {
        eprintln!("ringreduce-nccl: {call}: {side}");
    }
}

/// Where the real NCCL is (module doc).
fn find() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("RINGREDUCE_NCCL_PATH") {
        return Some(PathBuf::from(path));
    }
    let own = ourselves();
    let not_ours = |path: &PathBuf| path.canonicalize().ok() != own;
    loaded_libnccl()
        .into_iter()
        .find(not_ours)
        .or_else(|| ringreduce::device::library_files("libnccl.so.2").find(not_ours))
}

/// The files named `libnccl.so.2` that the process has loaded, in load order.
fn loaded_libnccl() -> Vec<PathBuf> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        found: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `found` pointer.
        let (info, found) = unsafe { (&*info, &mut *found.cast::<Vec<PathBuf>>()) };
        if !info.dlpi_name.is_null() {
            // SAFETY: a NUL-terminated file name (empty for the main program).
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
            let path = PathBuf::from(&*name);
            if path.file_name().is_some_and(|f| f == "libnccl.so.2") {
                found.push(path);
            }
        }
        0
    }
    let mut found: Vec<PathBuf> = Vec::new();
    // SAFETY: `visit` matches the callback type and only reads what the loader passes.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut found as *mut Vec<PathBuf>).cast()) };
    found
}

/// This library's own file.
fn ourselves() -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is a valid value to be overwritten.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = crate::ncclGetVersion as *const c_void;
    // SAFETY: `here` is an address of this library; `info` is writable.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr set a NUL-terminated file name.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Path::new(&*name.to_string_lossy()).canonicalize().ok()
}

/// Opens the library at `path` (its symbols kept to itself).
fn open(path: &Path) -> Option<Real> {
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // DEEPBIND: NCCL's calls of its own functions (its ncclCommInitAll calling ncclGetUniqueId)
    // stay inside NCCL instead of reaching this library's functions of the same names.
    // SAFETY: a NUL-terminated path and valid flags.
    let handle = unsafe {
        libc::dlopen(
            cpath.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
        )
    };
    (!handle.is_null()).then(|| Real {
        handle,
        path: path.to_path_buf(),
    })
}
