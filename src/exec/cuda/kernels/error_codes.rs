//! The codes a kernel stores into its error word, defined once: in `cuda/error_codes.cuh`, the
//! first part of the kernel source. `build.rs` turns each of its `#define RR_<NAME> <value>u`
//! into the constant `<NAME>` below (the header's comment above it becoming its doc) and lists
//! them all in [`ERROR_CODES`]; the same part is joined into the source that nvcc and NVRTC
//! compile. So the kernels and the host cannot disagree on a code, and a new code is one line
//! there. The host decodes an error word in `executor/error_words.rs` (`kernel_failure`), whose test
//! holds it to [`ERROR_CODES`].
//!
//! Invariant (`build.rs` refuses the build otherwise): every code is nonzero — 0 is "no error" —
//! and distinct.

include!(concat!(env!("OUT_DIR"), "/error_codes.rs"));

#[cfg(test)]
mod tests {
    use super::super::source_define;
    use super::*;

    #[test]
    fn every_code_is_in_the_kernel_source() {
        for (name, code) in ERROR_CODES {
            assert_eq!(
                source_define(&format!("RR_{name}")),
                u64::from(code),
                "RR_{name}"
            );
        }
    }

    #[test]
    fn codes_are_nonzero_and_distinct() {
        for (i, (name, code)) in ERROR_CODES.iter().enumerate() {
            assert_ne!(*code, 0, "{name}");
            for (other, other_code) in &ERROR_CODES[..i] {
                assert_ne!(code, other_code, "{name} and {other}");
            }
        }
    }
}
