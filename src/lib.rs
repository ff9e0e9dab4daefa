//! udfchain: chains of user functions over files in object storage, planned and
//! executed by Apache DataFusion.
//!
//! ```no_run
//! use udfchain::{Chain, File, Settings, col, lit};
//!
//! # async fn run() -> udfchain::Result<()> {
//! let rows = Chain::from_storage("data/")
//!     .settings(Settings::new().prefetch(16).parallel(4))
//!     .filter(col("file.size").gt(lit(0u64)))
//!     .map("length", |f: File| async move { f.read().await.map(|b| b.len() as u64) })
//!     .collect()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Layout, in layers whose imports point down only (see the README's
//! architecture section): `chain/` the builder and `dataset/` the catalog;
//! `session/` the DataFusion context; `plan/` the logical UDF node, its planner
//! and one physical operator per file; `progress/` a running plan's progress read
//! from its metrics (display, summary, callback); `cache/` local copies of stored files (the
//! per-UDF temporary cache and the shared persistent cache); `storage/` stores,
//! listing and downloads; at the bottom `runtime/` (the UDF pool), `settings`,
//! `error` and `util/`. The UDF contract itself lives in the `udfchain-udfs` crate.

pub mod cache;
pub mod chain;
pub mod cluster;
pub mod dataset;
pub mod error;
pub mod loader;
pub mod pipeline;
pub mod plan;
pub mod progress;
pub mod runtime;
pub mod script;
pub mod serve;
pub mod session;
pub mod settings;
pub mod storage;
pub mod util;

pub use chain::{Chain, ChainBuilder, OnError, Prefetch, Settings, col};
pub use dataset::{Catalog, DatasetInfo};
pub use error::{Error, Result};
pub use plan::{OperatorReport, RunReport};
pub use progress::Progress;
pub use script::{Output, ScriptRunner};
pub use session::Session;
pub use udfchain_udfs as udfs;
pub use udfchain_udfs::{File, FileReader, FileSource};

pub use datafusion;

/// The README's Rust examples, compiled as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
/// The Rust examples of docs/api.md, compiled as doctests.
#[doc = include_str!("../docs/api.md")]
#[cfg(doctest)]
pub struct ApiDocDoctests;
/// The Rust examples of docs/sql.md, compiled as doctests.
#[doc = include_str!("../docs/sql.md")]
#[cfg(doctest)]
pub struct SqlDocDoctests;
/// The Rust examples of docs/caching.md, compiled as doctests.
#[doc = include_str!("../docs/caching.md")]
#[cfg(doctest)]
pub struct CachingDocDoctests;
/// The Rust examples of docs/training.md, compiled as doctests.
#[doc = include_str!("../docs/training.md")]
#[cfg(doctest)]
pub struct TrainingDocDoctests;
/// The Rust examples of docs/pipelines.md, compiled as doctests.
#[doc = include_str!("../docs/pipelines.md")]
#[cfg(doctest)]
pub struct PipelinesDocDoctests;
/// The Rust examples of docs/cluster.md, compiled as doctests.
#[doc = include_str!("../docs/cluster.md")]
#[cfg(doctest)]
pub struct ClusterDocDoctests;
pub use datafusion::common::JoinType;
pub use datafusion::prelude::lit;
