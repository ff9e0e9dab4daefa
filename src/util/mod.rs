//! Small helpers used by several layers; depends on nothing above it.

pub mod redact;
