//! Reduce kernels (placeholder).
