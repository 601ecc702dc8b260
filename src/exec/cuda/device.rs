//! Devices and peer access (placeholder).
