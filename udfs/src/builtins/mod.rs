//! Built-in UDFs.

mod tar;

pub use tar::tar_members;
