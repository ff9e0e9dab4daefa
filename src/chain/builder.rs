//! [`ChainBuilder`]: the start of a chain whose settings and session come before
//! its source, as the design writes it:
//! `Chain::new().settings(Settings::new().prefetch(8)).from_storage(uri).map(..)`.
//!
//! Each `from_*` gives the same [`Chain`] (plan and rows) as the associated
//! function of the same name followed by `.settings(..)`: the session's
//! settings, then the builder's on top, so UDFs added after the source see them.
//! A builder has no `collect`: a chain without a source cannot run, and saying
//! so is the compiler's job.
//!
//! ```compile_fail,E0599
//! // No source: there is nothing to collect.
//! # async fn f() {
//! let rows = udfchain::Chain::new().collect().await;
//! # }
//! ```
//!
//! The same with a source compiles (so the failure above is the missing source):
//!
//! ```no_run
//! # async fn f() {
//! let rows = udfchain::Chain::new().from_values(&[1u32]).collect().await;
//! # }
//! ```

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Chain, Source};
use crate::session::Session;
use crate::settings::Settings;

/// A chain without a source yet: settings and a session, then a `from_*` call.
#[derive(Debug, Default, Clone)]
#[must_use = "a chain builder does nothing until given a source (from_storage, from_values, ...)"]
pub struct ChainBuilder {
    session: Option<Arc<Session>>,
    settings: Settings,
}

impl ChainBuilder {
    /// Settings for every UDF of the chain (merged over the session's; a later
    /// call overrides the fields it sets).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = self.settings.merge(&settings);
        self
    }

    /// Runs the chain in `session` (its stores and settings) instead of
    /// [`Session::global`].
    pub fn in_session(mut self, session: Arc<Session>) -> Self {
        self.session = Some(session);
        self
    }

    fn start(self, source: Source) -> Chain {
        let session = self.session.unwrap_or_else(Session::global);
        Chain::with_source(session, source).settings(self.settings)
    }

    /// The objects under `uri` (recursive), as [`Chain::from_storage`].
    pub fn from_storage(self, uri: &str) -> Chain {
        self.start(Source::Storage {
            uri: uri.to_string(),
            recursive: true,
            glob: None,
            delta: None,
        })
    }

    /// Rows from Rust values, as [`Chain::from_values`].
    pub fn from_values<T: Serialize + DeserializeOwned>(self, values: &[T]) -> Chain {
        let settings = self.settings.clone();
        let session = self.session.unwrap_or_else(Session::global);
        Chain::from_values_in(session, values).settings(settings)
    }

    /// Rows of Parquet file(s), as [`Chain::from_parquet`].
    pub fn from_parquet(self, uri: &str) -> Chain {
        self.start(Source::Parquet(uri.to_string()))
    }

    /// Rows of CSV file(s) with a header row, as [`Chain::from_csv`].
    pub fn from_csv(self, uri: &str) -> Chain {
        self.start(Source::Csv(uri.to_string()))
    }

    /// Rows of newline-delimited JSON file(s), as [`Chain::from_json`].
    pub fn from_json(self, uri: &str) -> Chain {
        self.start(Source::Json(uri.to_string()))
    }

    /// The latest version of dataset `name`, as [`Chain::from_dataset`].
    pub fn from_dataset(self, name: &str) -> Chain {
        self.start(Source::Dataset {
            name: name.to_string(),
            version: None,
        })
    }

    /// Version `version` of dataset `name`, as [`Chain::from_dataset_version`].
    pub fn from_dataset_version(self, name: &str, version: u32) -> Chain {
        self.start(Source::Dataset {
            name: name.to_string(),
            version: Some(version),
        })
    }

    /// A chain over a DataFusion logical plan, as [`Chain::from_plan`].
    pub fn from_plan(self, plan: datafusion::logical_expr::LogicalPlan) -> Chain {
        self.start(Source::Plan(plan))
    }
}
