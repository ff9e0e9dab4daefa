//! Local copies of stored files: the per-UDF temporary cache (`cache = false`)
//! and the shared persistent cache (`cache = true`).
pub mod shared;
pub mod temp;
pub use shared::{CacheUsage, SharedCache};
pub use temp::TempCache;
