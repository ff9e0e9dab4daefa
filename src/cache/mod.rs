//! Local copies of stored files: the per-UDF temporary cache (`cache = false`)
//! and the shared persistent cache (`cache = true`), whose entries a prefetch
//! window pins for its rows; and [`StoreSource`], the `FileSource` UDFs read
//! through, which prefers those local copies.
pub mod shared;
pub mod source;
pub mod temp;
pub use shared::{CacheUsage, Pin, SharedCache};
pub use source::{LocalCopies, StoreSource};
pub use temp::TempCache;
