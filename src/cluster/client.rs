//! The client side of a cluster run: [`Session::remote`] (a scheduler at
//! `df://host:port`), [`Session::standalone`] (a scheduler and an executor
//! started in this process), and the query planner of such sessions.
//!
//! A chain or script run in a cluster session is planned as locally, then its
//! logical plan goes to the scheduler ([`LogicalCodec`]), which plans it with
//! udfchain's planner and [`Spread`] and sends stages to the executors
//! ([`PhysicalCodec`]); the rows stream back here. Writes are the exception:
//! a `COPY TO` (what `save()` and `to_parquet()` run) computes its rows on the
//! cluster and writes them here, so a saved dataset is written and committed
//! once, atomically, by the client, exactly as locally.
//!
//! Every job is wrapped in a [`JobExec`]: a dropped stream cancels its job on
//! the cluster, and a failed task's error reads as locally.
//!
//! Bounds: connecting to the scheduler gives up after [`CONNECT_TIMEOUT`]
//! with [`Error::Cluster`]; Ballista's own gRPC calls time out after 20 s; a
//! job waits for an executor at most the session's `cluster_executor_timeout`
//! (see [`JobExec`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ballista_core::extension::{SessionConfigExt, SessionStateExt};
use ballista_core::planner::BallistaQueryPlanner;
use datafusion::common::DFSchemaRef;
use datafusion::error::Result as DfResult;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::protobuf::LogicalPlanNode;

use super::codec::{LogicalCodec, PhysicalCodec};
use super::exactly_once::OneFinalTask;
use super::job::JobExec;
use super::job_watch::JobWatch;
use super::registry::UdfRegistry;
use super::spread::Spread;
use crate::error::{Error, Result};
use crate::plan::UdfQueryPlanner;
use crate::session::Session;
use crate::settings::Settings;

/// How long connecting to a scheduler may take before it is an error.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `df://host:port` (or `host:port`) as the scheduler's `http://` URL and
/// its `host:port`.
pub fn scheduler_url(url: &str) -> Result<(String, String)> {
    let bad = |reason: &str| Error::Cluster {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let rest = url
        .strip_prefix("df://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url)
        .trim_end_matches('/');
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| bad("expected df://HOST:PORT"))?;
    if host.is_empty() || rest.contains('/') {
        return Err(bad("expected df://HOST:PORT"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port must be a number from 1 to 65535"))?;
    Ok((format!("http://{host}:{port}"), format!("{host}:{port}")))
}

/// Waits until `addr` accepts a TCP connection (trying again every 100 ms,
/// so a scheduler that is starting is waited for), at most `timeout`.
pub(crate) async fn reachable(url: &str, addr: &str, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("no answer");
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => {}
        }
        if tokio::time::Instant::now() + Duration::from_millis(100) >= deadline {
            return Err(Error::Cluster {
                url: url.to_string(),
                reason: format!(
                    "cannot connect to the scheduler at {addr} within {timeout:?}: {last}"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The state a scheduler plans jobs with: Ballista's defaults for `config`,
/// udfchain's query planner and [`Spread`] (with Ballista's static planner:
/// its adaptive planner replaces the session's physical optimizer rules).
pub(crate) fn planning_state(config: SessionConfig) -> DfResult<SessionState> {
    let config = static_planner(config);
    let state = ballista_core::utils::default_session_builder(config)?;
    Ok(SessionStateBuilder::new_from_existing(state)
        .with_query_planner(Arc::new(UdfQueryPlanner))
        .with_physical_optimizer_rule(Arc::new(Spread))
        .with_physical_optimizer_rule(Arc::new(OneFinalTask))
        .build())
}

impl Session {
    /// The session `settings` ask for: on the cluster of their `cluster`
    /// setting (as [`Session::remote`]), else a local one.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind.
    pub async fn connect(settings: Settings) -> Result<Arc<Session>> {
        match settings.get_cluster().map(str::to_string) {
            Some(url) => Session::remote(&url, settings).await,
            None => Ok(Session::with_settings(settings)),
        }
    }

    /// A session whose chains and scripts run on the Ballista cluster whose
    /// scheduler is at `url` (`df://host:port`), starting from `settings`
    /// (`workers` partitions per UDF). Fails with [`Error::Cluster`] when the
    /// scheduler does not answer within [`CONNECT_TIMEOUT`].
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind.
    pub async fn remote(url: &str, settings: Settings) -> Result<Arc<Session>> {
        let (http, addr) = scheduler_url(url)?;
        reachable(url, &addr, CONNECT_TIMEOUT).await?;
        let config = cluster_config(&settings)
            .with_ballista_physical_extension_codec(Arc::new(PhysicalCodec::planner()));
        client_session(settings, config, http)
    }

    /// A session running its chains on a scheduler and one executor with
    /// `slots` task slots, started in this process and serving `registry`'s
    /// UDFs (what tests and single-machine trials use).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the scheduler and executor tasks running
    /// on the current runtime.
    pub async fn standalone(
        settings: Settings,
        registry: UdfRegistry,
        slots: usize,
    ) -> Result<Arc<Session>> {
        let watch = Arc::new(JobWatch::default());
        let codec = PhysicalCodec::executor(Arc::new(registry), "the standalone executor", None)
            .with_job_watch(Arc::clone(&watch));
        let config = cluster_config(&settings)
            .with_ballista_physical_extension_codec(Arc::new(codec))
            .with_ballista_standalone_parallelism(slots.max(1));
        let base = Session::with_settings(settings.clone());
        let state = SessionStateBuilder::new_from_existing(base.state())
            .with_config(config.clone())
            .with_physical_optimizer_rule(Arc::new(Spread))
            .with_physical_optimizer_rule(Arc::new(OneFinalTask))
            .build();
        let started = |e: ballista_core::error::BallistaError| Error::Cluster {
            url: "standalone".into(),
            reason: e.to_string(),
        };
        let addr = ballista_scheduler::standalone::new_standalone_scheduler_from_state(&state)
            .await
            .map_err(started)?;
        let http = format!("http://localhost:{}", addr.port());
        watch.set_scheduler(http.clone());
        let scheduler = tokio::time::timeout(CONNECT_TIMEOUT, async {
            loop {
                use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
                match SchedulerGrpcClient::connect(http.clone()).await {
                    Ok(s) => break s,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
        .await
        .map_err(|_| Error::Cluster {
            url: http.clone(),
            reason: "the standalone scheduler did not start".into(),
        })?;
        ballista_executor::new_standalone_executor_from_state(scheduler, slots.max(1), &state)
            .await
            .map_err(started)?;
        client_session(settings, config, http)
    }
}

/// `config` with Ballista's adaptive planner off, so that the session's
/// physical optimizer rules ([`Spread`]) apply.
fn static_planner(mut config: SessionConfig) -> SessionConfig {
    // An error means the config has no Ballista options: nothing to turn off.
    let _ = config.options_mut().set(
        ballista_core::config::BALLISTA_ADAPTIVE_PLANNER_ENABLED,
        "false",
    );
    // The client polls the job's status, so it learns the job id as soon as
    // the job is accepted (pushed statuses carry it only at the end):
    // [`JobExec`] needs it to cancel a dropped query.
    let _ = config
        .options_mut()
        .set(ballista_core::config::BALLISTA_CLIENT_PULL, "true");
    config
}

/// The session config of a cluster client: `workers` partitions, our codecs.
fn cluster_config(settings: &Settings) -> SessionConfig {
    static_planner(SessionConfig::new_with_ballista())
        .with_information_schema(true)
        .with_target_partitions(settings.get_workers())
        .with_ballista_logical_extension_codec(Arc::new(LogicalCodec::new()))
}

fn client_session(settings: Settings, config: SessionConfig, http: String) -> Result<Arc<Session>> {
    let base = Session::with_settings(settings.clone());
    let remote = BallistaQueryPlanner::<LogicalPlanNode>::with_extension(
        http.clone(),
        config.ballista_config(),
        config.ballista_logical_extension_codec(),
    );
    let config = config.with_ballista_query_planner(Arc::new(ClientPlanner {
        remote: Arc::new(remote),
        scheduler: http.clone(),
        executor_timeout: settings.get_cluster_executor_timeout(),
    }));
    let state = SessionStateBuilder::new_from_existing(base.state())
        .with_config(config)
        .build()
        .upgrade_for_ballista(http)?;
    let ctx = SessionContext::new_with_state(state);
    crate::session::register_functions(&ctx);
    Ok(Session::from_context(ctx, settings))
}

/// Plans everything on the cluster, except that a `COPY TO` writes here the
/// rows the cluster computes.
struct ClientPlanner {
    remote: Arc<BallistaQueryPlanner<LogicalPlanNode>>,
    /// The scheduler's `http://host:port`.
    scheduler: String,
    /// `cluster_executor_timeout` of the session.
    executor_timeout: Duration,
}

impl fmt::Debug for ClientPlanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientPlanner")
    }
}

#[async_trait]
impl QueryPlanner for ClientPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn datafusion::catalog::Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let LogicalPlan::Copy(copy) = plan else {
            let job = self.remote.create_physical_plan(plan, session).await?;
            return Ok(Arc::new(JobExec::new(
                job,
                self.scheduler.clone(),
                self.executor_timeout,
            )));
        };
        let mut local = copy.clone();
        local.input = Arc::new(LogicalPlan::Extension(Extension {
            node: Arc::new(OnCluster {
                schema: Arc::clone(copy.input.schema()),
                plan: copy.input.as_ref().clone(),
            }),
        }));
        let planner =
            DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(OnClusterPlanner {
                remote: Arc::clone(&self.remote),
                scheduler: self.scheduler.clone(),
                executor_timeout: self.executor_timeout,
            })]);
        planner
            .create_physical_plan(&LogicalPlan::Copy(local), session)
            .await
    }
}

/// A plan computed on the cluster, as a leaf of a plan run here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct OnCluster {
    plan: LogicalPlan,
    schema: DFSchemaRef,
}

impl PartialOrd for OnCluster {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.plan.partial_cmp(&other.plan)
    }
}

impl UserDefinedLogicalNodeCore for OnCluster {
    fn name(&self) -> &str {
        "OnCluster"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "OnCluster")
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        _inputs: Vec<LogicalPlan>,
    ) -> DfResult<Self> {
        Ok(self.clone())
    }
}

struct OnClusterPlanner {
    remote: Arc<BallistaQueryPlanner<LogicalPlanNode>>,
    scheduler: String,
    executor_timeout: Duration,
}

#[async_trait]
impl ExtensionPlanner for OnClusterPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        _physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn datafusion::catalog::Session,
        _ctx: &PhysicalPlanningContext,
    ) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(node) = node.as_any().downcast_ref::<OnCluster>() else {
            return Ok(None);
        };
        let job = self
            .remote
            .create_physical_plan(&node.plan, session)
            .await?;
        Ok(Some(Arc::new(JobExec::new(
            job,
            self.scheduler.clone(),
            self.executor_timeout,
        ))))
    }
}
