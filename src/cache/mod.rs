//! Local copies of stored files: the per-UDF temporary cache (`cache = false`).
pub mod temp;
pub use temp::TempCache;
