//! The client's view of one job on the cluster: [`JobExec`] wraps the plan
//! Ballista's client planner returns (a `DistributedQueryExec`) and adds what
//! Ballista 55's client lacks:
//!
//! - **Cancel on drop**: a stream dropped before its end (its last row or an
//!   error) spawns a task that asks the scheduler to cancel the job (at most
//!   [`CANCEL_TIMEOUT`]); executors then stop its udfchain operators (see
//!   [`job_watch`](super::job_watch)). Best effort: an unreachable scheduler
//!   leaves the job to run out, and so does a stream dropped before the
//!   scheduler accepted its job (the client has no job id yet).
//!   [`cancels_sent`] waits for the cancels still on their way (a CLI
//!   interrupted by Ctrl-C).
//! - **Readable task errors**: Ballista reports a failed task as nested
//!   `Debug` text (`Job .. failed: .. DataFusionError(Execution("..."))`);
//!   the client gets [`Error::ClusterTask`] whose message is the executor's
//!   one line (which UDF, which file, the cause), with Ballista's text as its
//!   source.
//! - **No silent wait for an executor**: until its first row, the stream asks
//!   the scheduler every [`EXECUTOR_CHECK`] whether an executor is registered
//!   (its `/readyz`, each check at most [`CHECK_TIMEOUT`]). While none is, the
//!   gauge `waiting_for_executor` is 1 (the progress display says "waiting
//!   for an executor"); once none has been for `cluster_executor_timeout`
//!   (a setting, default 60 s), the stream ends with [`Error::Cluster`]
//!   saying so and asks the scheduler to cancel the job (as a dropped stream
//!   does). A scheduler without `/readyz` is
//!   never taken for one without executors; Ballista bounds its own calls
//!   (submission, status polls) by its gRPC client timeouts.
//! - **Remote metrics**: once the stream ends, the client fetches the job's
//!   stage metrics from the scheduler (at most [`METRICS_TIMEOUT`]) and shows
//!   them as its own, named `<operator>.<metric>` (`PrefetchExec.files_fetched`,
//!   `MapExec.output_rows`, ...): counts summed over stages, tasks and
//!   executors, gauges (`peak_in_flight`) as their largest value. Times are
//!   left out. `Chain::explain_analyze` shows them (SQL `EXPLAIN ANALYZE`
//!   prints Ballista's per-stage plans with their metrics instead).
//!
//! The job id is known during the run only when the client polls the job's
//! status (`ballista.client.pull = true`, set by the client session).

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ballista_core::execution_plans::DistributedQueryExec;
use ballista_core::serde::protobuf::operator_metric::Metric as Remote;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::{CancelJobParams, GetJobMetricsParams, GetJobMetricsResult};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, Gauge, MetricBuilder};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion_proto::protobuf::LogicalPlanNode;
use futures::{Future, Stream};
use tokio::task::JoinHandle;

use crate::error::Error;
use crate::util::exec_boilerplate::exec_boilerplate;
use crate::util::lock::lock;

/// How long a dropped stream's cancel may take to reach the scheduler.
pub const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long fetching a finished job's metrics may take (then it has none).
pub const METRICS_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a job without rows yet checks that its scheduler has an executor.
pub const EXECUTOR_CHECK: Duration = Duration::from_millis(500);
/// How long one such check may take (then it says nothing).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Cancels spawned by dropped streams, not yet done, with their schedulers'
/// `http://host:port`.
static PENDING: Mutex<Vec<(JoinHandle<()>, String)>> = Mutex::new(Vec::new());

/// Waits (at most `timeout`) for the cancels of dropped streams to reach
/// their schedulers; returns those schedulers (`df://host:port`), none when
/// no job was running on a cluster.
pub async fn cancels_sent(timeout: Duration) -> Vec<String> {
    let pending: Vec<_> = std::mem::take(&mut *lock(&PENDING));
    let (tasks, mut schedulers): (Vec<_>, Vec<_>) = pending.into_iter().unzip();
    let _ = tokio::time::timeout(timeout, futures::future::join_all(tasks)).await;
    schedulers.dedup();
    schedulers
        .into_iter()
        .map(|http| http.replacen("http://", "df://", 1))
        .collect()
}

/// One job on the cluster, seen from the client (see the module header).
#[derive(Debug)]
pub struct JobExec {
    input: Arc<dyn ExecutionPlan>,
    /// The input's, unchanged.
    properties: Arc<PlanProperties>,
    /// The scheduler's `http://host:port`.
    scheduler: String,
    /// How long the job may wait while the scheduler has no executor.
    executor_timeout: Duration,
    /// The job's operator metrics, once it ended.
    metrics: ExecutionPlanMetricsSet,
    /// 1 while the scheduler has no executor to run the job.
    waiting: Gauge,
}

impl JobExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        scheduler: String,
        executor_timeout: Duration,
    ) -> Self {
        let metrics = ExecutionPlanMetricsSet::new();
        let waiting = MetricBuilder::new(&metrics).global_gauge("waiting_for_executor");
        Self {
            properties: Arc::clone(input.properties()),
            input,
            scheduler,
            executor_timeout,
            metrics,
            waiting,
        }
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(input, self.scheduler.clone(), self.executor_timeout)
    }
}

/// Whether the scheduler at `http` has an executor registered, from its
/// `/readyz` (200 or 503); `None` when it does not say.
async fn has_executor(client: &reqwest::Client, http: &str) -> Option<bool> {
    let response = client.get(format!("{http}/readyz")).send().await.ok()?;
    match response.status() {
        reqwest::StatusCode::OK => Some(true),
        reqwest::StatusCode::SERVICE_UNAVAILABLE => Some(false),
        _ => None,
    }
}

/// Checks every [`EXECUTOR_CHECK`] whether the scheduler at `http` has an
/// executor, keeping `waiting` at 1 while it has none; resolves to the error
/// once it has had none for `timeout` (see the module header).
async fn no_executor(http: String, timeout: Duration, waiting: Gauge) -> DataFusionError {
    let url = http.replacen("http://", "df://", 1);
    let addr = url.trim_start_matches("df://").to_string();
    let client = match reqwest::Client::builder().timeout(CHECK_TIMEOUT).build() {
        Ok(c) => c,
        // No HTTP client: no check, and nothing to report.
        Err(_) => return std::future::pending().await,
    };
    let mut since: Option<Instant> = None;
    loop {
        if has_executor(&client, &http).await == Some(false) {
            waiting.set(1);
            let start = *since.get_or_insert_with(Instant::now);
            if start.elapsed() >= timeout {
                return Error::Cluster {
                    url,
                    reason: format!(
                        "no executor registered at the scheduler for {timeout:?} \
                         (cluster_executor_timeout); start one with \
                         `udfchain cluster executor --scheduler {addr}`"
                    ),
                }
                .into_df();
            }
        } else {
            waiting.set(0);
            since = None;
        }
        tokio::time::sleep(EXECUTOR_CHECK).await;
    }
}

/// The job id of the run of `plan` (a `DistributedQueryExec`, or a plan
/// above one such as Ballista's `EXPLAIN ANALYZE`), once the scheduler
/// accepted the job.
fn job_id(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    if let Some(q) = plan.downcast_ref::<DistributedQueryExec<LogicalPlanNode>>() {
        return q.job_id().map(|id| id.as_str().to_string());
    }
    plan.children().into_iter().find_map(job_id)
}

/// The job's stage metrics from the scheduler, or `None`.
async fn fetch_metrics(scheduler: String, job_id: String) -> Option<GetJobMetricsResult> {
    let fetch = async {
        let mut client = SchedulerGrpcClient::connect(scheduler).await.ok()?;
        let r = client
            .get_job_metrics(GetJobMetricsParams { job_id })
            .await
            .ok()?;
        Some(r.into_inner())
    };
    tokio::time::timeout(METRICS_TIMEOUT, fetch).await.ok()?
}

/// Adds `job`'s operator metrics to `metrics` (see the module header).
fn record(metrics: &ExecutionPlanMetricsSet, job: &GetJobMetricsResult) {
    use std::collections::BTreeMap;
    let (mut counts, mut gauges) = (BTreeMap::new(), BTreeMap::new());
    for op in job.stages.iter().flat_map(|s| &s.operators) {
        for m in op.metrics.iter().filter_map(|m| m.metric.as_ref()) {
            let key = |name: &str| format!("{}.{name}", op.operator_type);
            match m {
                Remote::OutputRows(n) => {
                    *counts.entry(key("output_rows")).or_insert(0) += n;
                }
                Remote::Count(c) => *counts.entry(key(&c.name)).or_insert(0) += c.value,
                Remote::Gauge(g) => {
                    let peak = gauges.entry(key(&g.name)).or_insert(0);
                    *peak = g.value.max(*peak);
                }
                _ => {}
            }
        }
    }
    let n = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    for (name, v) in counts {
        MetricBuilder::new(metrics).global_counter(name).add(n(v));
    }
    for (name, v) in gauges {
        MetricBuilder::new(metrics).global_gauge(name).set_max(n(v));
    }
}

impl DisplayAs for JobExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "JobExec: scheduler={}", self.scheduler)
    }
}

impl ExecutionPlan for JobExec {
    exec_boilerplate!("JobExec", one_input, metrics);

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let check = no_executor(
            self.scheduler.clone(),
            self.executor_timeout,
            self.waiting.clone(),
        );
        Ok(Box::pin(JobStream {
            inner: self.input.execute(partition, ctx)?,
            input: Arc::clone(&self.input),
            scheduler: self.scheduler.clone(),
            ended: false,
            metrics: self.metrics.clone(),
            fetch: None,
            executors: Some(Box::pin(check)),
            waiting: self.waiting.clone(),
        }))
    }
}

struct JobStream {
    inner: SendableRecordBatchStream,
    input: Arc<dyn ExecutionPlan>,
    scheduler: String,
    /// The stream gave its last row or an error: nothing to cancel.
    ended: bool,
    metrics: ExecutionPlanMetricsSet,
    /// After the last row: fetching the job's metrics.
    fetch: Option<Pin<Box<dyn Future<Output = Option<GetJobMetricsResult>> + Send>>>,
    /// Until the first row: the check that an executor is registered.
    executors: Option<Pin<Box<dyn Future<Output = DataFusionError> + Send>>>,
    waiting: Gauge,
}

impl JobStream {
    /// The job's rows started, or it ended: no executor check any more.
    fn stop_checking(&mut self) {
        self.executors = None;
        self.waiting.set(0);
    }

    /// Asks the scheduler (in a spawned task, at most [`CANCEL_TIMEOUT`]) to
    /// cancel the job, when its id is known.
    fn cancel(&self) {
        // The job id comes from the run this stream ends: it is there now or
        // never (a stream dropped before the scheduler accepted its job).
        let (Some(job_id), Ok(runtime)) =
            (job_id(&self.input), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let scheduler = self.scheduler.clone();
        let named = scheduler.clone();
        let task = runtime.spawn(async move {
            let cancel = async {
                let mut client = SchedulerGrpcClient::connect(scheduler).await.ok()?;
                client.cancel_job(CancelJobParams { job_id }).await.ok()
            };
            // Best effort: an unreachable scheduler leaves the job to run out.
            let _ = tokio::time::timeout(CANCEL_TIMEOUT, cancel).await;
        });
        let mut pending = lock(&PENDING);
        pending.retain(|(t, _)| !t.is_finished());
        pending.push((task, named));
    }
}

impl Stream for JobStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(fetch) = self.fetch.as_mut() {
            let Poll::Ready(job) = fetch.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            self.fetch = None;
            if let Some(job) = job {
                record(&self.metrics, &job);
            }
            return Poll::Ready(None);
        }
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(check) = self.executors.as_mut()
            && let Poll::Ready(e) = check.as_mut().poll(cx)
        {
            self.stop_checking();
            self.cancel();
            self.ended = true;
            return Poll::Ready(Some(Err(e)));
        }
        let next = self.inner.as_mut().poll_next(cx);
        if next.is_ready() {
            self.stop_checking();
        }
        match next {
            Poll::Ready(None) => {
                self.ended = true;
                let Some(job) = job_id(&self.input) else {
                    return Poll::Ready(None);
                };
                self.fetch = Some(Box::pin(fetch_metrics(self.scheduler.clone(), job)));
                self.poll_next(cx)
            }
            Poll::Ready(Some(Err(e))) => {
                self.ended = true;
                let job = job_id(&self.input).unwrap_or_else(|| "?".into());
                Poll::Ready(Some(Err(task_error(&self.scheduler, &job, e))))
            }
            other => other,
        }
    }
}

impl RecordBatchStream for JobStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

impl Drop for JobStream {
    fn drop(&mut self) {
        if !self.ended {
            self.cancel();
        }
    }
}

/// A job's error as the client sees it: the executor's one line when a task
/// failed (Ballista's full text as the source), else `e` as it is.
fn task_error(scheduler: &str, job: &str, e: DataFusionError) -> DataFusionError {
    let raw = match &e {
        DataFusionError::Execution(raw) if raw.starts_with("Job ") => raw.clone(),
        _ => return e,
    };
    let url = scheduler.replacen("http://", "df://", 1);
    Error::ClusterTask {
        url,
        job: job.to_string(),
        reason: readable(&raw),
        source: Arc::new(e),
    }
    .into_df()
}

/// The innermost message of Ballista's nested `Debug` text, on one line.
fn readable(raw: &str) -> String {
    let mut s = raw.to_string();
    // Each `{:?}` level escapes quotes and backslashes once more.
    for _ in 0..4 {
        if !s.contains("\\\"") && !s.contains("\\\\") {
            break;
        }
        s = unescape(&s);
    }
    // `Wrapper(Other("message"))`: the first `("` opens the innermost text.
    let message = match (s.find("(\""), s.rfind("\")")) {
        (Some(start), Some(end)) if end > start => &s[start + 2..end],
        _ => s.rsplit_once("error: ").map_or(s.as_str(), |(_, m)| m),
    };
    let line = message.replace("\\n", " ").replace('\n', " ");
    line.trim().to_string()
}

/// One level of Rust `Debug` string escaping undone.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_error_is_its_innermost_message() {
        let raw = "Job abc failed: Job failed due to stage 1 failed: Task failed due to \
                   runtime execution error: DataFusionError(Execution(\"UDF boom failed on \
                   s3://b/data/f1.bin: \\\"bad\\\" input\"))\n";
        assert_eq!(
            readable(raw),
            "UDF boom failed on s3://b/data/f1.bin: \"bad\" input"
        );
        let twice = format!(
            "Job x failed: reason: {:?}",
            "DataFusionError(Execution(\"a \\\"b\\\"\"))"
        );
        assert_eq!(readable(&twice), "a \"b\"");
    }
}
