//! [`Executor`]: a Ballista executor that runs udfchain stages (`udfchain
//! cluster executor`), built with udfchain's operators, object stores and
//! codecs, and the UDFs of its [`UdfRegistry`] (the built-ins, plus any a Rust
//! user registers: `Executor::builder().register_map("name", f)...run()`).
//!
//! Guarantees: per-UDF temp caches (and the shared cache, `cache = true`) live
//! under `<work dir>/udfchain`, not under the client's root; prefetch dirs left
//! there by a killed executor are swept when an executor starts on the same
//! work dir, before it takes any task. A task naming a UDF this executor does
//! not have fails while its plan is decoded with an error naming the UDF and
//! this executor (`executor <id> at <host>:<port>`). Its udfchain operators
//! stop when their job is cancelled or fails ([`JobWatch`]). Reaching the scheduler
//! is tried for at most [`SCHEDULER_WAIT`], then startup fails.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use serde::Serialize;
use serde::de::DeserializeOwned;
use udfchain_udfs::BoxError;

use super::client::{reachable, scheduler_url};
use super::codec::{LogicalCodec, PhysicalCodec};
use super::job_watch::JobWatch;
use super::registry::UdfRegistry;
use crate::error::{Error, Result};
use crate::plan::Udf;

/// How long a starting executor waits for its scheduler to accept connections.
pub const SCHEDULER_WAIT: Duration = Duration::from_secs(10);
/// How often an executor tells the scheduler it is alive (besides its polls).
pub const HEARTBEAT: Duration = Duration::from_secs(2);

/// Starts a udfchain executor: `Executor::builder().scheduler("host:port")...run()`.
#[derive(Debug)]
pub struct Executor;

impl Executor {
    /// An executor with the built-in UDFs, one slot per core, polling the
    /// scheduler at `127.0.0.1:50050`.
    pub fn builder() -> ExecutorBuilder {
        ExecutorBuilder {
            registry: UdfRegistry::with_builtins(),
            scheduler: "127.0.0.1:50050".into(),
            slots: crate::runtime::cores(),
            work_dir: None,
            bind_host: "127.0.0.1".into(),
            port: 0,
        }
    }
}

/// Configures an [`Executor`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ExecutorBuilder {
    registry: UdfRegistry,
    scheduler: String,
    slots: usize,
    work_dir: Option<PathBuf>,
    bind_host: String,
    port: u16,
}

impl ExecutorBuilder {
    /// The scheduler's `host:port` (or `df://host:port`).
    pub fn scheduler(mut self, addr: &str) -> Self {
        self.scheduler = addr.to_string();
        self
    }

    /// Tasks run at once (default: the number of cores).
    pub fn slots(mut self, n: usize) -> Self {
        self.slots = n.max(1);
        self
    }

    /// Shuffle files, temp caches and the shared cache go here (default
    /// `<root>/executor`, the root being `$UDFCHAIN_ROOT` or `./.udfchain`).
    pub fn work_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.work_dir = Some(dir.into());
        self
    }

    /// The address other nodes reach this executor at (default `127.0.0.1`).
    pub fn bind_host(mut self, host: &str) -> Self {
        self.bind_host = host.to_string();
        self
    }

    /// The Arrow Flight port results are fetched from (default: a free one).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Replaces the registry (e.g. one without the built-ins).
    pub fn registry(mut self, registry: UdfRegistry) -> Self {
        self.registry = registry;
        self
    }

    /// Registers `f` as map UDF `name` (see [`UdfRegistry::register_map`]).
    pub fn register_map<I, O, E, F, Fut>(mut self, name: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, E>> + Send + 'static,
    {
        self.registry = self.registry.register_map(name, f);
        self
    }

    /// Registers `f` as gen UDF `name`.
    pub fn register_gen<I, O, E, F, S>(mut self, name: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + Send + 'static,
        F: Fn(I) -> S + Send + Sync + 'static,
        S: futures::Stream<Item = Result<O, E>> + Send + 'static,
    {
        self.registry = self.registry.register_gen(name, f);
        self
    }

    /// Registers `f` as batch_map UDF `name`.
    pub fn register_batch_map<I, O, E, F, Fut>(mut self, name: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, E>> + Send + 'static,
    {
        self.registry = self.registry.register_batch_map(name, f);
        self
    }

    /// Registers `f` as agg UDF `name`.
    pub fn register_agg<I, O, E, F, Fut>(mut self, name: &str, f: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        E: Into<BoxError> + 'static,
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, E>> + Send + 'static,
    {
        self.registry = self.registry.register_agg(name, f);
        self
    }

    /// Registers a UDF object under its own name.
    pub fn register(mut self, udf: Udf) -> Self {
        self.registry = self.registry.register(udf);
        self
    }

    /// Registers with the scheduler and runs tasks until the process ends
    /// (or the scheduler stops it); an error if it cannot start.
    ///
    /// # Cancel safety
    /// Dropping the future stops the executor's loops; its running tasks end
    /// with the runtime.
    pub async fn run(self) -> Result<()> {
        let (_, addr) = scheduler_url(&self.scheduler)?;
        let url = format!("df://{addr}");
        let fail = |reason: String| Error::Cluster {
            url: url.clone(),
            reason,
        };
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
            .ok_or_else(|| fail("expected HOST:PORT".into()))?;
        let work_dir = self
            .work_dir
            .clone()
            .unwrap_or_else(|| crate::settings::Settings::new().get_root().join("executor"));
        std::fs::create_dir_all(&work_dir).map_err(|e| Error::io(work_dir.display(), e))?;
        let root = work_dir.join("udfchain");
        // Prefetch dirs left by a killed executor on this work dir go now.
        let tmp = root.join("tmp");
        crate::runtime::blocking(move || {
            crate::cache::temp::sweep_orphans(&tmp);
            Ok(())
        })
        .await?;
        let flight_port = match self.port {
            0 => free_port(&self.bind_host).map_err(|e| Error::io(&self.bind_host, e))?,
            p => p,
        };
        let grpc_port = free_port(&self.bind_host).map_err(|e| Error::io(&self.bind_host, e))?;
        reachable(&url, &addr, SCHEDULER_WAIT).await?;
        let mut config = ExecutorProcessConfig {
            bind_host: self.bind_host.clone(),
            external_host: Some(self.bind_host.clone()),
            port: flight_port,
            grpc_port,
            scheduler_host: host,
            scheduler_port: port,
            scheduler_connect_timeout_seconds: 0,
            vcores: self.slots,
            task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
            work_dir: Some(work_dir.display().to_string()),
            print_thread_info: false,
            executor_heartbeat_interval_seconds: HEARTBEAT.as_secs(),
            override_logical_codec: Some(Arc::new(LogicalCodec::new())),
            ..ExecutorProcessConfig::default()
        };
        let node = format!(
            "executor {} at {}:{flight_port}",
            config.executor_id, self.bind_host
        );
        let watch = Arc::new(JobWatch::new(format!("http://{addr}")));
        config.override_physical_codec = Some(Arc::new(
            PhysicalCodec::executor(Arc::new(self.registry), &node, Some(root))
                .with_job_watch(watch),
        ));
        eprintln!(
            "udfchain: {node}, scheduler {addr}, work dir {}",
            work_dir.display()
        );
        start_executor_process(Arc::new(config))
            .await
            .map_err(|e| fail(e.to_string()))
    }
}

/// A port free on `host` now (the OS's choice).
fn free_port(host: &str) -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((host, 0))?.local_addr()?.port())
}
