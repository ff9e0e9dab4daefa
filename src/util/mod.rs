//! Small helpers shared by several layers (imports point down to here only):
//! fsync of files and dirs before a commit ([`durable`]), owner locks that tell a sweeper whether a dir's owner process is still
//! running ([`owner`]), closest-name suggestions for "did you mean" ([`closest`]),
//! and the masking of credentials in every output ([`redact`]).

pub mod durable;
pub mod owner;
pub mod redact;

mod names;
pub use names::closest;
