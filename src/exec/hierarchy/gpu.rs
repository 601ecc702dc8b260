//! A GPU rank of a job on several hosts.
