//! [`Scheduler`]: a Ballista scheduler that plans udfchain jobs (`udfchain
//! cluster scheduler`). It decodes clients' plans with [`LogicalCodec`], plans
//! them with udfchain's planner and [`Spread`](super::spread::Spread), and
//! sends stages to executors with [`PhysicalCodec`]. It runs no UDF, so it
//! needs no registry: custom UDFs are registered on executors only.
//!
//! Failure bounds (see docs/cluster.md, "Failures"): an executor that stops
//! polling for [`EXECUTOR_TIMEOUT`] is declared dead (checked every
//! [`EXPIRE_CHECK`]) and its tasks run again elsewhere; a task that fails
//! [`TASK_MAX_FAILURES`] times fails its job with the task's error.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;

use super::client::planning_state;
use super::codec::{LogicalCodec, PhysicalCodec};
use crate::error::{Error, Result};

/// An executor silent for this long is dead: its tasks are run again.
pub const EXECUTOR_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the scheduler looks for dead executors.
pub const EXPIRE_CHECK: Duration = Duration::from_secs(2);
/// Attempts of one task before its job fails.
pub const TASK_MAX_FAILURES: usize = 4;

/// Starts a udfchain scheduler: `Scheduler::builder().bind(addr).run()`.
#[derive(Debug)]
pub struct Scheduler;

impl Scheduler {
    /// A builder for a scheduler (default address `127.0.0.1:50050`).
    pub fn builder() -> SchedulerBuilder {
        SchedulerBuilder {
            bind: "127.0.0.1:50050".into(),
        }
    }
}

/// Configures a [`Scheduler`].
#[derive(Debug, Clone)]
#[must_use]
pub struct SchedulerBuilder {
    bind: String,
}

impl SchedulerBuilder {
    /// The `host:port` to listen on (default `127.0.0.1:50050`).
    pub fn bind(mut self, addr: &str) -> Self {
        self.bind = addr.to_string();
        self
    }

    /// Serves until the process ends; an error if it cannot start (a bad
    /// or busy address).
    ///
    /// # Cancel safety
    /// Dropping the future stops serving.
    pub async fn run(self) -> Result<()> {
        let fail = |reason: String| Error::Cluster {
            url: format!("df://{}", self.bind),
            reason,
        };
        let addr: SocketAddr = tokio::net::lookup_host(&self.bind)
            .await
            .map_err(|e| fail(format!("cannot resolve the bind address: {e}")))?
            .next()
            .ok_or_else(|| fail("the bind address resolves to nothing".into()))?;
        let config = SchedulerConfig {
            bind_host: addr.ip().to_string(),
            external_host: addr.ip().to_string(),
            bind_port: addr.port(),
            scheduling_policy: TaskSchedulingPolicy::PullStaged,
            executor_timeout_seconds: EXECUTOR_TIMEOUT.as_secs(),
            expire_dead_executor_interval_seconds: EXPIRE_CHECK.as_secs(),
            no_executors_grace_period_seconds: EXECUTOR_TIMEOUT.as_secs(),
            task_max_failures: TASK_MAX_FAILURES,
            override_session_builder: Some(Arc::new(planning_state)),
            override_logical_codec: Some(Arc::new(LogicalCodec::new())),
            override_physical_codec: Some(Arc::new(PhysicalCodec::planner())),
            ..SchedulerConfig::default()
        };
        let cluster = BallistaCluster::new_from_config(&config)
            .await
            .map_err(|e| fail(e.to_string()))?;
        ballista_scheduler::scheduler_process::start_server(cluster, addr, Arc::new(config))
            .await
            .map_err(|e| fail(e.to_string()))
    }
}
