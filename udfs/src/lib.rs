//! The udfchain UDF contract and built-in UDFs.
//!
//! A UDF is one of four kinds, each a dyn-safe trait working on Arrow data:
//! [`Mapper`] (one row in, one value out), [`Generator`] (one row in, a stream of
//! rows out), [`BatchMapper`] (many rows in, as many values out) and [`Aggregator`]
//! (one group of rows in, zero or more rows out). Users rarely implement them by
//! hand: [`map_fn`], [`gen_fn`], [`batch_map_fn`] and [`agg_fn`] wrap plain typed
//! async Rust functions, converting Arrow to Rust values once per batch with
//! `serde_arrow`.
//!
//! A UDF reads the bytes of a stored object through its [`File`] value
//! ([`File::read`], [`File::read_range`], [`File::open`]); the engine decides where
//! those bytes come from (a prefetched local copy, the shared cache, or the store)
//! by installing a [`FileSource`] around each call.
//!
//! This crate depends on Arrow and serde, never on the engine.
//!
//! ```
//! use udfchain_udfs::File;
//!
//! let shard = File {
//!     source: "s3://bucket/shards".into(),
//!     path: "s-0001.tar".into(),
//!     size: 10_240,
//!     ..File::default()
//! };
//! assert_eq!(shard.url(), "s3://bucket/shards/s-0001.tar");
//! // A tar member is a virtual file: a byte range of its parent object.
//! let member = File::member_of(&shard, "0001.jpg", 512, 2_000);
//! assert_eq!(member.url(), "s3://bucket/shards/s-0001.tar#0001.jpg");
//! assert_eq!(member.member().map(|m| m.offset), Some(512));
//! assert_eq!(member.parent(), shard);
//! ```

#![warn(missing_docs)]
#![warn(unnameable_types)]

pub mod builtins;
mod codec;
mod error;
mod file;
mod signature;
#[cfg(test)]
mod test_source;
mod udf;
mod url_file;

pub use codec::{decode_column, decode_rows, encode_column};
pub use error::{BoxError, CallError, UdfError};
pub use file::{File, FileReader, FileSource, Member, RemoteReader};
pub use signature::Signature;
pub use udf::{
    Aggregator, BatchMapper, Code, EachRow, Generator, Lifecycle, Mapper, State, Stateful, agg_fn,
    agg_with, batch_map_fn, batch_map_with, gen_fn, gen_with, map_fn, map_with,
};
pub use url_file::FileFromUrl;

/// What the engine needs of this crate beyond the UDF contract: installing
/// the [`FileSource`] of a call, reading it back, a panic's message, checking
/// a param's type and tracing a Rust type's Arrow field. No part of the
/// contract (hidden from the docs, no stability promise); UDF authors never
/// call these.
#[doc(hidden)]
pub mod engine {
    pub use crate::codec::trace_field;
    pub use crate::error::panic_message;
    pub use crate::file::{current_source, with_file_source};
    pub use crate::signature::{check_input_type, is_binary};
}

/// Re-exports so UDF authors use exactly the Arrow and object_store the engine uses.
pub use datafusion::arrow;
pub use datafusion::object_store;
