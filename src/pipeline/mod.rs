//! Pipelines (Modyn's design on udfchain): a supervisor reads new samples from
//! storage in timestamp order, informs a trigger policy and a selection
//! strategy of them batch by batch, and at each trigger has the strategy build
//! a training set, saved as dataset `<pipeline>-trigger-<id>` (columns `key`,
//! `path`, `index`, `timestamp`, `label`, `weight`, `partition`, and a `file`
//! column for the `single_sample` format, so the loader can read the bytes),
//! then runs a training hook.
//!
//! - `config` the YAML config; `storage` samples from storage; `state` the
//!   pipeline's tables in its state db; `supervisor` the loop; `hook` the
//!   training hook; `inspect` a pipeline's recorded state, read without
//!   running it (`udfchain pipeline ls|show|keys`).
//! - `sample`, `trigger/`, `selector/`: the sample type, the trigger policies
//!   and the selection strategies, written against one contract.
//!
//! All state (the pipeline's, the trigger's, the strategy's) lives in one
//! SQLite db per pipeline, `<root>/pipelines/<name>/state.db`, so that a run
//! killed at any point continues, when run again, from the last finished
//! trigger with no trigger repeated or lost.
//!
//! ```no_run
//! use udfchain::pipeline::{Pipeline, PipelineConfig};
//!
//! # async fn run() -> udfchain::Result<()> {
//! let config = PipelineConfig::from_file("pipeline.yaml".as_ref())?;
//! let done = Pipeline::new(config)
//!     .on_trigger(|t| {
//!         println!("train on {:?}", t.dataset);
//!         Ok(())
//!     })
//!     .replay(None, None)
//!     .await?;
//! # Ok(()) }
//! ```

pub(crate) mod config;
pub(crate) mod hook;
pub mod inspect;
pub(crate) mod sample;
pub(crate) mod samples;
pub(crate) mod selector;
pub(crate) mod state;
pub(crate) mod supervisor;
pub(crate) mod trigger;

use std::collections::HashMap;
use std::sync::Arc;

pub use config::{
    BinaryFormat, ByteOrder, CsvFormat, DataConfig, Format, PipelineConfig, SingleSampleFormat,
    TimestampSource, TrainingConfig, parse_duration,
};
pub use sample::Sample;
pub use selector::{
    CoresetSampling, LimitReset, Presampling, PresamplingKind, ScoreFn, SelectionConfig,
    StrategyKind, TriggerInfo,
};
pub use state::TriggerRecord;
pub use supervisor::{FileRow, KeyRow, Range, StopHandle, dataset_name};
pub use trigger::{DriftConfig, DriftMetric, FeatureSource, TriggerConfig};

use crate::error::Result;
use crate::pipeline::hook::{CompletedCallback, Hook};
use crate::pipeline::samples::FeatureFn;
use crate::pipeline::supervisor::Supervisor;
use crate::session::Session;

/// A pipeline to run: a config, the session whose root and stores it uses,
/// and its hooks. Cheap to build; nothing runs until [`replay`](Self::replay)
/// or [`run_live`](Self::run_live).
#[must_use]
#[derive(Clone)]
pub struct Pipeline {
    config: PipelineConfig,
    yaml: Option<String>,
    session: Arc<Session>,
    hook: Hook,
    scores: Option<Arc<dyn ScoreFn>>,
    feature_fns: HashMap<String, FeatureFn>,
    on_completed: Option<CompletedCallback>,
    max_triggers: Option<u64>,
}

impl Pipeline {
    /// A pipeline from a parsed config, in the global session.
    pub fn new(config: PipelineConfig) -> Self {
        let hook = Hook {
            command: config.training.as_ref().and_then(|t| t.command.clone()),
            flight_addr: config.training.as_ref().and_then(|t| t.flight_addr.clone()),
            ..Hook::default()
        };
        Self {
            config,
            yaml: None,
            session: Session::global(),
            hook,
            scores: None,
            feature_fns: HashMap::new(),
            on_completed: None,
            max_triggers: None,
        }
    }

    /// A pipeline from YAML text (kept in its state, shown by `pipeline show`).
    pub fn from_yaml(text: &str) -> Result<Self> {
        let mut p = Self::new(PipelineConfig::from_yaml(text, "config")?);
        p.yaml = Some(text.to_string());
        Ok(p)
    }

    /// A pipeline from a YAML file.
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| crate::error::Error::io(path.display(), e))?;
        let mut p = Self::new(PipelineConfig::from_yaml(
            &text,
            &path.display().to_string(),
        )?);
        p.yaml = Some(text);
        Ok(p)
    }

    /// The pipeline's config.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// Runs in `session` (its root holds the state and the datasets; its
    /// stores and storage options read the data).
    pub fn session(mut self, session: Arc<Session>) -> Self {
        self.session = session;
        self
    }

    /// A Rust training callback, run at each trigger whose set is not empty
    /// (before the config's command, if any); an error stops the pipeline.
    pub fn on_trigger(
        mut self,
        f: impl Fn(&TriggerRecord) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.hook.callback = Some(Arc::new(f));
        self
    }

    /// Called with each trigger once it is finished (recorded done or skipped).
    pub fn on_completed(mut self, f: impl Fn(&TriggerRecord) + Send + Sync + 'static) -> Self {
        self.on_completed = Some(Arc::new(f));
        self
    }

    /// The scoring function of the `coreset` strategy.
    pub fn score_fn(mut self, f: Arc<dyn ScoreFn>) -> Self {
        self.scores = Some(f);
        self
    }

    /// The embedding UDF a drift trigger names with `feature: {udf: "name"}`:
    /// it gets each sample's bytes (the file for single_sample, the record
    /// after its label for binary, the row's fields joined by the separator
    /// for csv) and returns its features, computed once when the sample is
    /// ingested and kept in the pipeline's state.
    pub fn feature_fn(
        mut self,
        name: &str,
        f: impl Fn(&[u8]) -> std::result::Result<Vec<f32>, String> + Send + Sync + 'static,
    ) -> Self {
        self.feature_fns.insert(name.to_string(), Arc::new(f));
        self
    }

    /// The Flight address given to the training command (`UDFCHAIN_FLIGHT_ADDR`).
    pub fn flight_addr(mut self, addr: impl Into<String>) -> Self {
        self.hook.flight_addr = Some(addr.into());
        self
    }

    /// How often a live run lists storage, over the config's
    /// `data.poll_interval`; zero is taken as one millisecond.
    pub fn poll_interval(mut self, every: std::time::Duration) -> Self {
        let ms = every.as_millis().max(1);
        self.config.data.poll_interval = Some(format!("{ms}ms"));
        self
    }

    /// Stops after `n` triggers finished by this run.
    pub fn max_triggers(mut self, n: u64) -> Self {
        self.max_triggers = Some(n);
        self
    }

    /// Opens the supervisor (its state db, the trigger's and the strategy's
    /// tables) on tokio's blocking pool.
    async fn open(&self) -> Result<Supervisor> {
        let p = self.clone();
        crate::runtime::blocking(move || {
            let sup = Supervisor::open(
                p.config.clone(),
                Arc::clone(&p.session),
                p.hook.clone(),
                p.scores.clone(),
                &p.feature_fns,
                p.on_completed.clone(),
            )?;
            if let Some(y) = &p.yaml {
                sup.remember_config(y)?;
            }
            Ok(sup)
        })
        .await
    }

    /// Replays the samples with timestamps in `[from, to]` (inclusive, seconds
    /// since the epoch; `None`: unbounded) and returns the triggers finished.
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing committed; a trigger being saved or
    /// trained stays pending and is finished by the next run.
    pub async fn replay(&self, from: Option<i64>, to: Option<i64>) -> Result<Vec<TriggerRecord>> {
        self.replay_until(from, to, &StopHandle::new()).await
    }

    /// [`replay`](Self::replay) that also stops when `stop` is called.
    pub async fn replay_until(
        &self,
        from: Option<i64>,
        to: Option<i64>,
        stop: &StopHandle,
    ) -> Result<Vec<TriggerRecord>> {
        let mut sup = self.open().await?;
        sup.replay(Range { from, to }, self.max_triggers, stop)
            .await
    }

    /// Watches storage (every `data.poll_interval`, default 10 s) and runs the
    /// same loop until `stop` is called (or `max_triggers`).
    ///
    /// # Cancel safety
    /// As [`replay`](Self::replay).
    pub async fn run_live(&self, stop: StopHandle) -> Result<Vec<TriggerRecord>> {
        let mut sup = self.open().await?;
        sup.run_live(self.max_triggers, &stop).await
    }
}
