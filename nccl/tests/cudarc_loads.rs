//! cudarc's `nccl` module (what candle's multi-process example uses) on this library, found by
//! its loader path alone: a folder holding a link named as cudarc looks for NCCL
//! (`libnccl.so`, the first of `cudarc::get_lib_name_candidates("nccl")`; its list has no
//! `libnccl.so.2`) is put on `LD_LIBRARY_PATH` of a child process — the dynamic loader reads it
//! when a process starts — which is this test's executable again, running this test's other
//! half.
//!
//! cudarc (`dynamic-loading`) opens the library on its first NCCL call and resolves each symbol
//! on that function's first call, panicking when the library lacks it ("Missing symbol …"). So
//! the child calls every function cudarc's `nccl-02028` bindings declare (41), each on a null
//! communicator or buffer where it needs one — no GPU is needed, and each must answer with an
//! error code, not run — and `ncclGetVersion` through cudarc's `result` layer must report the
//! version of the API the header declares (NCCL's encoding for ≥ 2.9: major·10000 + minor·100 +
//! patch). Then the child checks that the library cudarc loaded is this one.

mod common;
use common::{library_dir, linked_as, sources};
use std::process::Command;

/// Set in the child's environment: run the cudarc half.
const CHILD: &str = "RINGREDUCE_NCCL_CUDARC_CHILD";
/// What the child prints when every check passed.
const PASSED: &str = "cudarc ran on ringreduce-nccl";

/// The version `include/nccl.h` declares, in NCCL's encoding (`NCCL_VERSION_CODE` for ≥ 2.9).
fn header_version() -> i32 {
    let header = std::fs::read_to_string(sources().join("include/nccl.h")).expect("the header");
    let define = |name: &str| -> i32 {
        header
            .lines()
            .find_map(|line| line.strip_prefix(&format!("#define {name} ")))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("the header defines {name}"))
    };
    let (major, minor, patch) = (
        define("NCCL_MAJOR"),
        define("NCCL_MINOR"),
        define("NCCL_PATCH"),
    );
    assert!(
        (major, minor) > (2, 8),
        "the encoding below is NCCL's for 2.9 and later"
    );
    major * 10000 + minor * 100 + patch
}

#[test]
fn cudarc_runs_on_the_library_found_by_its_loader_path() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    // The name cudarc tries first; the library's soname (libnccl.so.2) is not on its list.
    let name = cudarc::get_lib_name_candidates("nccl")
        .into_iter()
        .next()
        .expect("cudarc names NCCL's library");
    assert_eq!(name, "libnccl.so");
    let (dir, path) = linked_as("cudarc", &name);
    let ran = Command::new(std::env::current_exe().unwrap())
        .args([
            "cudarc_runs_on_the_library_found_by_its_loader_path",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", path)
        .env_remove("LD_PRELOAD")
        // No real NCCL to hand calls to, whatever the machine has.
        .env("RINGREDUCE_NCCL_PATH", dir.join("no-such-libnccl.so"))
        .output()
        .expect("the test's executable runs again");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ran.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(PASSED), "{stdout}\n{stderr}");
}

/// The child's half: cudarc's calls, then which library answered them.
fn child() {
    use cudarc::nccl::{result, sys};
    use std::ptr::{null, null_mut};

    // SAFETY: a lookup of the library's names; nothing is called.
    let present = unsafe { sys::is_culib_present() };
    assert!(present, "cudarc finds no NCCL on LD_LIBRARY_PATH");
    let version = result::get_nccl_version().expect("ncclGetVersion through cudarc");
    assert_eq!(version, ringreduce_nccl::abi::VERSION_CODE);
    assert_eq!(
        version,
        header_version(),
        "ncclGetVersion against the header"
    );
    let id = result::get_uniqueid().expect("ncclGetUniqueId through cudarc");
    assert!(id.internal.iter().any(|&b| b != 0), "an empty unique id");

    let f32 = sys::ncclDataType_t::ncclFloat32;
    let sum = sys::ncclRedOp_t::ncclSum;
    let comm: sys::ncclComm_t = null_mut();
    let stream: sys::cudaStream_t = null_mut();
    let mut newcomm: sys::ncclComm_t = null_mut();
    let mut handle = null_mut();
    let mut window: sys::ncclWindow_t = null_mut();
    let mut op = sum;
    let mut count = 0;
    let mut async_error = sys::ncclResult_t::ncclSuccess;
    let mut scalar = 1.0f32;
    let (buf, out) = (null(), null_mut());
    let config = null_mut();
    let succeeds = sys::ncclResult_t::ncclSuccess;

    // Every function cudarc's nccl-02028 bindings declare, each resolved on its first call.
    // SAFETY: each is NCCL's documented function, given null handles and buffers that the
    // library refuses before touching anything (or no arguments at all).
    let calls: Vec<(&str, sys::ncclResult_t)> = unsafe {
        vec![
            ("ncclGetVersion", sys::ncclGetVersion(&mut count)),
            ("ncclGetUniqueId", sys::ncclGetUniqueId(&mut id.clone())),
            (
                "ncclCommInitAll",
                sys::ncclCommInitAll(null_mut(), 1, null()),
            ),
            (
                "ncclCommInitRank",
                sys::ncclCommInitRank(null_mut(), 1, id, 0),
            ),
            (
                "ncclCommInitRankConfig",
                sys::ncclCommInitRankConfig(null_mut(), 1, id, 0, config),
            ),
            (
                "ncclCommInitRankScalable",
                sys::ncclCommInitRankScalable(null_mut(), 1, 0, 0, null_mut(), config),
            ),
            (
                "ncclCommSplit",
                sys::ncclCommSplit(comm, 0, 0, &mut newcomm, config),
            ),
            (
                "ncclCommShrink",
                sys::ncclCommShrink(comm, null_mut(), 0, &mut newcomm, config, 0),
            ),
            ("ncclCommFinalize", sys::ncclCommFinalize(comm)),
            ("ncclCommRevoke", sys::ncclCommRevoke(comm, 0)),
            ("ncclCommAbort", sys::ncclCommAbort(comm)),
            ("ncclCommDestroy", sys::ncclCommDestroy(comm)),
            (
                "ncclCommGetAsyncError",
                sys::ncclCommGetAsyncError(comm, &mut async_error),
            ),
            ("ncclCommCount", sys::ncclCommCount(comm, &mut count)),
            ("ncclCommCuDevice", sys::ncclCommCuDevice(comm, &mut count)),
            ("ncclCommUserRank", sys::ncclCommUserRank(comm, &mut count)),
            (
                "ncclAllReduce",
                sys::ncclAllReduce(buf, out, 4, f32, sum, comm, stream),
            ),
            (
                "ncclBroadcast",
                sys::ncclBroadcast(buf, out, 4, f32, 0, comm, stream),
            ),
            ("ncclBcast", sys::ncclBcast(out, 4, f32, 0, comm, stream)),
            (
                "ncclReduce",
                sys::ncclReduce(buf, out, 4, f32, sum, 0, comm, stream),
            ),
            (
                "ncclAllGather",
                sys::ncclAllGather(buf, out, 4, f32, comm, stream),
            ),
            (
                "ncclReduceScatter",
                sys::ncclReduceScatter(buf, out, 4, f32, sum, comm, stream),
            ),
            (
                "ncclAlltoAll",
                sys::ncclAlltoAll(buf, out, 4, f32, comm, stream),
            ),
            (
                "ncclGather",
                sys::ncclGather(buf, out, 4, f32, 0, comm, stream),
            ),
            (
                "ncclScatter",
                sys::ncclScatter(buf, out, 4, f32, 0, comm, stream),
            ),
            ("ncclSend", sys::ncclSend(buf, 4, f32, 1, comm, stream)),
            ("ncclRecv", sys::ncclRecv(out, 4, f32, 1, comm, stream)),
            ("ncclGroupStart", sys::ncclGroupStart()),
            ("ncclGroupEnd", sys::ncclGroupEnd()),
            (
                "ncclGroupSimulateEnd",
                sys::ncclGroupSimulateEnd(null_mut()),
            ),
            (
                "ncclRedOpCreatePreMulSum",
                sys::ncclRedOpCreatePreMulSum(
                    &mut op,
                    (&mut scalar as *mut f32).cast(),
                    f32,
                    sys::ncclScalarResidence_t::ncclScalarHostImmediate,
                    comm,
                ),
            ),
            ("ncclRedOpDestroy", sys::ncclRedOpDestroy(op, comm)),
            ("ncclMemAlloc", sys::ncclMemAlloc(null_mut(), 16)),
            ("ncclMemFree", sys::ncclMemFree(null_mut())),
            (
                "ncclCommRegister",
                sys::ncclCommRegister(comm, out, 16, &mut handle),
            ),
            ("ncclCommDeregister", sys::ncclCommDeregister(comm, handle)),
            (
                "ncclCommWindowRegister",
                sys::ncclCommWindowRegister(comm, out, 16, &mut window, 0),
            ),
            (
                "ncclCommWindowDeregister",
                sys::ncclCommWindowDeregister(comm, window),
            ),
        ]
    };
    // The three that return no code.
    // SAFETY: static texts, and a call that takes nothing.
    let texts = unsafe {
        sys::ncclResetDebugInit();
        (
            std::ffi::CStr::from_ptr(sys::ncclGetErrorString(succeeds)),
            std::ffi::CStr::from_ptr(sys::ncclGetLastError(comm)),
        )
    };
    assert_eq!(texts.0.to_str(), Ok("no error"));
    assert!(
        texts.1.to_string_lossy().contains("ringreduce-nccl"),
        "the last error is this library's: {:?}",
        texts.1
    );
    assert_eq!(calls.len() + 3, 41, "every function of cudarc's bindings");
    for (name, code) in &calls {
        let want_success = matches!(
            *name,
            "ncclGetVersion" | "ncclGetUniqueId" | "ncclGroupStart" | "ncclGroupEnd"
        );
        assert_eq!(
            *code == succeeds,
            want_success,
            "{name} answered {code:?} through cudarc"
        );
    }

    // The library cudarc loaded is this one: mapped into the process from its own file, and no
    // other library of NCCL's name beside it.
    let ours = std::fs::canonicalize(library_dir().join("libringreduce_nccl.so")).unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        maps.contains(ours.to_str().unwrap()),
        "{} is not mapped:\n{maps}",
        ours.display()
    );
    assert!(
        !maps.contains("/libnccl"),
        "another NCCL is mapped:\n{maps}"
    );
    println!("{PASSED} (NCCL {version}, {} calls)", calls.len() + 3);
}
