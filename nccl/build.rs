//! The shared library answers to NCCL's soname, so that a program linked against `libnccl.so.2`
//! finds it through `LD_LIBRARY_PATH` (a link named `libnccl.so.2` to it) or `LD_PRELOAD`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
