//! [`Session`]: a DataFusion `SessionContext` set up with udfchain's planner,
//! the stores it has opened, the `file_from_url` and `row_hash` functions, and the default
//! [`Settings`] of its chains. Stores are opened on demand, per scheme and
//! host, with the session's storage options, when a `File` of a new store
//! (listed, or named by URL) is first read.
//! (Its chain and catalog constructors live in `chain/`, the layer above.)

mod row_hash;

pub(crate) use row_hash::RowHash;

use std::sync::{Arc, OnceLock};

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::object_store::ObjectStore;
use datafusion::prelude::{SessionConfig, SessionContext};
use object_store::memory::InMemory;
use url::Url;

use crate::error::Result;
use crate::plan::UdfQueryPlanner;
use crate::settings::Settings;
use crate::storage::{Location, open_store};

/// Holds the DataFusion context every chain of this session plans and runs in.
pub struct Session {
    ctx: SessionContext,
    settings: Settings,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.ctx.session_id())
            .field("settings", &self.settings)
            .finish()
    }
}

/// Registers udfchain's scalar functions in `ctx`: every session's, and a
/// cluster client's again (its Ballista state does not keep them).
pub(crate) fn register_functions(ctx: &SessionContext) {
    // `file_from_url(url)` in SQL and in chain expressions.
    ctx.register_udf(udfchain_udfs::FileFromUrl::udf());
    for f in udfchain_udfs::builtins::image::functions() {
        ctx.register_udf(f);
    }
    // `row_hash(seed, ...)`: shuffle, sample and chunk in SQL.
    ctx.register_udf(RowHash::udf());
}

impl Session {
    /// A new session with default settings and an empty `memory://` store.
    pub fn new() -> Arc<Self> {
        Self::with_settings(Settings::new())
    }

    /// A new session whose chains start from `settings`.
    pub fn with_settings(settings: Settings) -> Arc<Self> {
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_target_partitions(settings.get_parallel());
        let mut runtime = RuntimeEnvBuilder::new();
        if let Some(limit) = settings.get_memory_limit() {
            runtime = runtime.with_memory_limit(limit, 1.0);
        }
        let mut builder = SessionStateBuilder::new();
        if let Ok(env) = runtime.build_arc() {
            builder = builder.with_runtime_env(env);
        }
        let state = builder
            .with_default_features()
            .with_config(config)
            .with_query_planner(Arc::new(UdfQueryPlanner))
            .build();
        let ctx = SessionContext::new_with_state(state);
        register_functions(&ctx);
        if let Ok(url) = Url::parse("memory:///") {
            ctx.register_object_store(&url, Arc::new(InMemory::new()));
        }
        Arc::new(Self { ctx, settings })
    }

    /// A session over `ctx` (set up by the caller, e.g. for a cluster), whose
    /// chains start from `settings`.
    pub fn from_context(ctx: SessionContext, settings: Settings) -> Arc<Self> {
        Arc::new(Self { ctx, settings })
    }

    /// The process-wide session used by `Chain::from_*`.
    pub fn global() -> Arc<Self> {
        static GLOBAL: OnceLock<Arc<Session>> = OnceLock::new();
        Arc::clone(GLOBAL.get_or_init(Session::new))
    }

    /// The DataFusion context (register tables, run SQL).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The settings chains of this session start from.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Serves `uri`'s scheme and host (`s3://bucket`, `memory://`) from `store`.
    pub fn register_store(&self, uri: &str, store: Arc<dyn ObjectStore>) -> Result<()> {
        let loc = Location::parse(uri)?;
        self.ctx.register_object_store(&loc.store_url, store);
        Ok(())
    }

    /// The store serving `uri`, opened from the environment and the session's
    /// storage options if it is not registered yet.
    pub fn store(&self, uri: &str) -> Result<Arc<dyn ObjectStore>> {
        let loc = Location::parse(uri)?;
        open_store(
            self.ctx.runtime_env().as_ref(),
            &loc,
            self.settings.get_storage_options(),
        )
    }

    pub(crate) fn state(&self) -> datafusion::execution::SessionState {
        self.ctx.state()
    }
}
