//! Object stores from URIs, listing (`read_storage`), and downloads pinned to the
//! listed version. (The [`FileSource`] UDFs read through, which prefers local
//! copies, is `cache::StoreSource`, one layer up.)
//!
//! One concept per file: [`Location`] (`location.rs`, URIs and local paths),
//! opening stores (`open.rs`: the registry, building from the environment and
//! the chain's `storage_option`s), S3 and its credential probing (`s3.rs`),
//! what a store error means ([`explain`], `error_hints.rs`), listing
//! (`listing.rs`), downloads (`download.rs`) and reads of small local files
//! in the calling thread (`local_file.rs`).
//!
//! First-run mistakes fail at once with one line saying what to do: S3 without
//! credentials ([`NoCredentials`]), a bucket that does not exist ([`explain_at`]:
//! at which endpoint), credentials the server rejects (which settings to
//! check), a local path that does not exist (relative to which directory, and
//! the closest existing name), an access key id without its secret (or the
//! reverse) and an unknown storage option (the closest known one).
//!
//! [`FileSource`]: udfchain_udfs::FileSource

mod download;
mod error_hints;
mod listing;
mod local_file;
mod local_listing;
mod location;
mod open;
mod plain_http;
mod s3;

pub use download::{
    Body, Downloaded, VersionPin, download_bytes, download_first, download_to, stat,
};
pub use error_hints::{explain, explain_at};
pub use listing::{ListingExec, StorageTable, file_schema};
pub use local_file::{
    INLINE_READ_MAX, fs_path as local_fs_path, read_pinned as read_local_pinned, warm_pinned,
};
pub use location::{Location, missing_path};
pub use open::{open_source, open_store};
