//! The library side of the `ringreduce` command: what its subcommands and the root crate's
//! criterion benchmarks share. Today that is the NCCL baseline ([`baseline`]), which the
//! `ringreduce` library itself does not depend on.

pub mod baseline;
