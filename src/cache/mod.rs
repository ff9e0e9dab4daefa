//! Local copies of stored files: the per-UDF temporary cache (`cache = false`)
//! and the shared persistent cache (`cache = true`), whose entries a prefetch
//! window pins for its rows ([`WindowPins`]).
pub mod shared;
pub mod source;
pub mod temp;
pub use shared::{CacheUsage, Pin, SharedCache, WindowPins};
pub use source::{LocalCopies, StoreSource};
pub use temp::TempCache;
