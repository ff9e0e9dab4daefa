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
//! # The public API
//!
//! What users touch, one path per type:
//!
//! - the crate root: the builder ([`Chain`], [`ChainBuilder`], [`col`],
//!   [`lit`], [`JoinType`]), its settings ([`Settings`], [`OnError`],
//!   [`Prefetch`]), the context chains run in ([`Session`]), running and
//!   reporting ([`RunReport`], [`OperatorReport`], [`Progress`],
//!   [`UdfProgress`]), scripts ([`ScriptRunner`], [`Output`]), the dataset
//!   catalog ([`Catalog`], [`LineageEntry`], [`DatasetInfo`], [`Staging`]: a
//!   version's files before its commit), the shared cache ([`SharedCache`],
//!   [`PinnedEntry`], [`CacheUsage`]:
//!   what `udfchain cache du|prune|clear` do, for Rust users who manage a
//!   cache dir themselves), the UDF contract's [`File`], [`FileReader`] and
//!   [`FileSource`], and [`Error`] / [`Result`];
//! - the feature modules, each holding its own types: [`loader`] (training
//!   loader), [`serve`] (Arrow Flight), [`pipeline`] (triggers, selection,
//!   training sets), [`cluster`] (Ballista), [`ui`] (the dataset browser);
//! - [`udfs`], the UDF contract crate (`udfchain-udfs`), and [`datafusion`].
//!
//! `#![warn(unnameable_types)]` holds this to account: a type a public
//! signature hands out has a path to name it.
//!
//! Everything else (`runtime`, `util`, `cache`, `plan`, `storage`, `session`,
//! `settings`, `progress`, `script`, `chain`, `dataset`, `error`) is
//! `pub(crate)`: their user-facing types are re-exported at the root and
//! nowhere else. What the binary, the tests, the benches and the Python
//! bindings need beyond that comes through the one `#[doc(hidden)]`
//! [`testing`] module, which is no part of the API.
//!
//! # Layout
//!
//! In layers whose imports point down only (see docs/architecture.md):
//! `chain/` the builder and `dataset/` the catalog;
//! `session/` the DataFusion context; `plan/` the logical UDF node, its planner
//! and one physical operator per file; `progress/` a running plan's progress read
//! from its metrics (display, summary, callback); `cache/` local copies of stored files (the
//! per-UDF temporary cache and the shared persistent cache); `storage/` stores,
//! listing and downloads; at the bottom `runtime/` (the UDF pool), `settings`,
//! `error` and `util/`. The UDF contract itself lives in the `udfchain-udfs` crate.
//! The `udfchain` binary (`src/bin/udfchain/`: its command line) is no part of
//! the library.

#![warn(missing_docs)]
#![warn(unnameable_types)]

pub(crate) mod cache;
pub(crate) mod chain;
pub mod cluster;
pub(crate) mod dataset;
pub(crate) mod error;
pub mod loader;
pub mod pipeline;
pub(crate) mod plan;
pub(crate) mod progress;
pub(crate) mod runtime;
pub(crate) mod script;
pub mod serve;
pub(crate) mod session;
pub(crate) mod settings;
pub(crate) mod storage;
#[doc(hidden)]
pub mod testing;
pub mod ui;
pub(crate) mod util;

pub use cache::{CacheUsage, PinnedEntry, SharedCache};
pub use chain::{
    Chain, ChainBuilder, Diff, ExportSummary, LinkType, Placement, col, file_from_url,
};
pub use datafusion::common::JoinType;
pub use datafusion::prelude::lit;
pub use dataset::checkpoints::RemovedCheckpoint;
pub use dataset::{Catalog, DatasetInfo, LineageEntry, Staging};
pub use error::{Error, Result};
pub use plan::{OperatorReport, RunReport, Udf};
pub use progress::{Progress, UdfProgress};
pub use script::{Output, ScriptRunner};
pub use session::Session;
pub use settings::{OnError, Prefetch, Settings};
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
/// The Rust examples of docs/ui.md, compiled as doctests.
#[doc = include_str!("../docs/ui.md")]
#[cfg(doctest)]
pub struct UiDocDoctests;
/// The Rust examples of docs/cluster.md, compiled as doctests.
#[doc = include_str!("../docs/cluster.md")]
#[cfg(doctest)]
pub struct ClusterDocDoctests;
/// The Rust examples of docs/models.md, compiled as doctests.
#[doc = include_str!("../docs/models.md")]
#[cfg(doctest)]
pub struct ModelsDocDoctests;
/// The Rust examples of docs/images.md, compiled as doctests.
#[doc = include_str!("../docs/images.md")]
#[cfg(doctest)]
pub struct ImagesDocDoctests;
