//! Local copies of stored files: the per-UDF temporary cache (`cache = false`)
//! and the shared persistent cache (`cache = true`), whose entries a prefetch
//! window pins for its rows; and [`StoreSource`], the `FileSource` UDFs read
//! through, which prefers those local copies.
pub mod disk_budget;
pub mod shared;
pub mod store_source;
pub mod temp;
pub use disk_budget::{DiskBudget, DiskReservation};
pub use shared::{CacheUsage, PinnedEntry, SharedCache};
pub use store_source::{LocalCopies, Reach, StoreSource};
pub use temp::TempCache;

use udfchain_udfs::File;

/// The in-process identity of a stored object: its source and path. Local
/// copies are kept whole, so a virtual file (a tar member) has its parent's key.
pub(crate) fn file_key(file: &File) -> String {
    format!("{}\u{0}{}", file.source, file.path)
}
