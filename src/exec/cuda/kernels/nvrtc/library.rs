//! NVRTC's C API, opened at run time by file name: the few calls that compile the kernel source
//! into machine code (CUBIN) or PTX.
//!
//! Two users share this file: the library, which compiles the kernels on a GPU host whose driver
//! refuses the embedded images (module `nvrtc`), and `build.rs`, which compiles the embedded
//! CUDA 12 image with NVRTC 12 (it includes this file with `#[path]`, so it uses nothing but
//! `std` and `libc`). It is its own loader rather than cudarc's because cudarc looks only for the
//! NVRTC of the CUDA version its bindings were built for, and a host may have either.
//!
//! **Layers** (as cudarc's): the C signatures NVRTC documents, as function-pointer types looked
//! up by name ([`Nvrtc::function`]); each status to a `Result` in one function
//! ([`Nvrtc::check`], with NVRTC's own name for it); [`Nvrtc::compile`] on top, which creates,
//! compiles, reads and destroys one program.
//!
//! Invariant: a program handle lives inside one `compile` call and is destroyed on every path.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;

/// The library names tried, in order, where no file is named: CUDA 13's, CUDA 12's, then the
/// unversioned name a toolkit's development files add.
pub const NVRTC_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// `nvrtcResult`: 0 is success.
type NvrtcResult = c_int;
/// `nvrtcProgram`: NVRTC's opaque handle.
type Program = *mut c_void;

// The C signatures NVRTC documents, for the calls below.
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult;
type GetErrorString = unsafe extern "C" fn(NvrtcResult) -> *const c_char;
type CreateProgram = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> NvrtcResult;
type CompileProgram = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult;
type GetSize = unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult;
type GetBytes = unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult;
type DestroyProgram = unsafe extern "C" fn(*mut Program) -> NvrtcResult;

/// What a compilation writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Machine code for the `--gpu-architecture=sm_XY` given.
    Cubin,
    /// PTX for the `--gpu-architecture=compute_XY` given.
    Ptx,
}

/// A failed NVRTC call: its name, NVRTC's name for the status, and the compiler's log (empty
/// where the call was not the compilation).
#[derive(Debug)]
pub struct Failure {
    pub call: &'static str,
    pub code: String,
    pub log: String,
}

/// An opened libnvrtc (module doc).
pub struct Nvrtc {
    handle: *mut c_void,
    /// Where it was found: the file named, or the library name the dynamic loader resolved.
    pub path: PathBuf,
    /// `nvrtcVersion`: (major, minor).
    pub version: (i32, i32),
}

// SAFETY: a `dlopen` handle is valid on every thread, `dlsym` is thread-safe, and NVRTC's calls
// on distinct programs may run on several threads at once (NVRTC's documentation).
unsafe impl Send for Nvrtc {}
// SAFETY: as above.
unsafe impl Sync for Nvrtc {}

impl Nvrtc {
    /// Opens `name` (a path, or a library name the dynamic loader looks up) and reads its
    /// version. `Err` says why: not found, or not an NVRTC.
    pub fn open(name: &str) -> Result<Nvrtc, String> {
        let cname = CString::new(name).map_err(|_| format!("{name:?} holds a NUL byte"))?;
        // SAFETY: a NUL-terminated name and valid flags.
        let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(dl_error());
        }
        let mut nvrtc = Nvrtc {
            handle,
            path: PathBuf::from(name),
            version: (0, 0),
        };
        let version: Version = nvrtc.function(c"nvrtcVersion").map_err(|f| f.code)?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: nvrtcVersion writes two ints; both are live locals.
        let status = unsafe { version(&mut major, &mut minor) };
        nvrtc
            .check("nvrtcVersion", status)
            .map_err(|f| format!("{name}: {}", f.code))?;
        nvrtc.version = (major, minor);
        Ok(nvrtc)
    }

    /// The first of `names` that opens, or every reason none did.
    pub fn open_first<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Nvrtc, String> {
        let mut why = Vec::new();
        for name in names {
            match Nvrtc::open(name) {
                Ok(nvrtc) => return Ok(nvrtc),
                Err(e) => why.push(e),
            }
        }
        Err(why.join("; "))
    }

    /// Compiles `source` (named `file_name` in messages) with `options` into `output`.
    pub fn compile(
        &self,
        source: &str,
        file_name: &str,
        options: &[String],
        output: Output,
    ) -> Result<Vec<u8>, Failure> {
        let create: CreateProgram = self.function(c"nvrtcCreateProgram")?;
        let compile: CompileProgram = self.function(c"nvrtcCompileProgram")?;
        let destroy: DestroyProgram = self.function(c"nvrtcDestroyProgram")?;
        let (size_of, bytes_of): (GetSize, GetBytes) = match output {
            Output::Cubin => (
                self.function(c"nvrtcGetCUBINSize")?,
                self.function(c"nvrtcGetCUBIN")?,
            ),
            Output::Ptx => (
                self.function(c"nvrtcGetPTXSize")?,
                self.function(c"nvrtcGetPTX")?,
            ),
        };
        let not_nul = |what: &str| Failure {
            call: "nvrtcCreateProgram",
            code: format!("the {what} holds a NUL byte"),
            log: String::new(),
        };
        let csource = CString::new(source).map_err(|_| not_nul("source"))?;
        let cname = CString::new(file_name).map_err(|_| not_nul("file name"))?;
        let coptions = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| not_nul("options"))?;
        let option_ptrs: Vec<*const c_char> = coptions.iter().map(|o| o.as_ptr()).collect();
        let mut program: Program = std::ptr::null_mut();
        // SAFETY: NUL-terminated source and name that outlive the call; no headers.
        let created = unsafe {
            create(
                &mut program,
                csource.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        self.check("nvrtcCreateProgram", created)?;
        // SAFETY: `program` was created above; the option pointers point into `coptions`,
        // alive here.
        let compiled =
            unsafe { compile(program, option_ptrs.len() as c_int, option_ptrs.as_ptr()) };
        let image = self
            .check("nvrtcCompileProgram", compiled)
            .map_err(|mut failure| {
                failure.log = self.log(program);
                failure
            })
            .and_then(|()| {
                let mut size = 0usize;
                // SAFETY: `program` is compiled; `size` is a live local NVRTC writes once.
                self.check("nvrtcGetSize", unsafe { size_of(program, &mut size) })?;
                let mut image = vec![0u8; size];
                // SAFETY: `image` holds the `size` bytes NVRTC said it writes.
                self.check("nvrtcGetBytes", unsafe {
                    bytes_of(program, image.as_mut_ptr().cast())
                })?;
                Ok(image)
            });
        // SAFETY: created above, destroyed once, on every path.
        unsafe { destroy(&mut program) };
        image
    }

    /// The compiler's log of `program`, or empty where it cannot be read.
    fn log(&self, program: Program) -> String {
        let read = || -> Result<String, Failure> {
            let size_of: GetSize = self.function(c"nvrtcGetProgramLogSize")?;
            let log_of: GetBytes = self.function(c"nvrtcGetProgramLog")?;
            let mut size = 0usize;
            // SAFETY: `program` is live (the caller's); `size` is a live local.
            self.check("nvrtcGetProgramLogSize", unsafe {
                size_of(program, &mut size)
            })?;
            let mut log = vec![0u8; size];
            // SAFETY: `log` holds the `size` bytes NVRTC said it writes.
            self.check("nvrtcGetProgramLog", unsafe {
                log_of(program, log.as_mut_ptr().cast())
            })?;
            Ok(String::from_utf8_lossy(&log)
                .trim_end_matches('\0')
                .to_string())
        };
        read().unwrap_or_default()
    }

    /// The symbol `name` as a function of type `F`.
    ///
    /// `F` must be the C signature NVRTC documents for `name` (the types above).
    fn function<F: Copy>(&self, name: &CStr) -> Result<F, Failure> {
        debug_assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
        // SAFETY: a live handle and a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        if symbol.is_null() {
            return Err(Failure {
                call: "dlsym",
                code: format!(
                    "{} has no {}: not an NVRTC library",
                    self.path.display(),
                    name.to_string_lossy()
                ),
                log: String::new(),
            });
        }
        // SAFETY: `F` is a function-pointer type of the symbol's documented signature (this
        // function's contract), the same size as the pointer.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&symbol) })
    }

    /// Status to `Result`: NVRTC's name for a non-zero status (`NVRTC_ERROR_COMPILATION`).
    fn check(&self, call: &'static str, status: NvrtcResult) -> Result<(), Failure> {
        if status == 0 {
            return Ok(());
        }
        let name = self
            .function::<GetErrorString>(c"nvrtcGetErrorString")
            .ok()
            // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string or null.
            .map(|f| unsafe { f(status) })
            .filter(|p| !p.is_null())
            // SAFETY: non-null, static, NUL-terminated (above).
            .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("nvrtcResult {status}"));
        Err(Failure {
            call,
            code: name,
            log: String::new(),
        })
    }
}

impl Drop for Nvrtc {
    fn drop(&mut self) {
        // SAFETY: opened in `open`, closed once; no function of it is called after this.
        unsafe { libc::dlclose(self.handle) };
    }
}

/// The dynamic loader's last message.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "not found".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    }
}
