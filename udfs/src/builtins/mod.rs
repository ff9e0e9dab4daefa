//! Built-in UDFs: plain typed async functions usable with `Chain::map` /
//! `Chain::r#gen`, and by name in scripts.

mod file;
pub mod image;
mod parquet;
mod tar;
mod webdataset;

pub use file::{file_size, line_count, md5, read_text, sha256};
pub use image::{Image, ImageSize, image_decode, image_size, image_thumbnail};
pub use parquet::{ParquetRows, parquet_file_schema, parquet_schema};
pub use tar::{MAX_EXTENSION, TarEntry, TarError, tar_entries, tar_members};
pub use webdataset::{DuplicateSuffix, Grouper, Sample, key_and_suffix, webdataset_samples};
