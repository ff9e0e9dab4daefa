//! Executor side of a cancelled job: [`WatchExec`] wraps every UDF operator
//! an executor decodes, and ends its stream with an error as soon
//! as the scheduler reports the task's job failed or cancelled (or no longer
//! knows it). The error makes Ballista's shuffle writer drop the whole stage's
//! streams, and udfchain's operators abort their UDF calls and downloads when
//! dropped: no new UDF call or GET starts once that is seen (a call already
//! running may finish).
//!
//! Why: Ballista 55 cannot stop a running task itself. With pull scheduling
//! the executor has no cancel path at all, and with push scheduling its
//! `cancel_tasks` aborts only the stage's outer future, while the shuffle
//! writer's own detached task keeps pulling the plan to its end.
//!
//! How: [`JobWatch`] (one per executor) polls the scheduler's job status
//! every [`POLL`] for each job that has a running udfchain stream on this
//! executor (one poll per job, shared by its streams) and stops polling when
//! the job's streams are gone. The job comes from the task's identity in its
//! `TaskContext` (`TID <job>/<stage>.<attempt>/<task>.<attempt>`). A
//! scheduler that cannot be reached stops nothing; connecting and each status
//! call give up after [`CALL_TIMEOUT`] (then the next poll reconnects), so a
//! scheduler that accepts but never answers cannot stall the watch.
//!
//! udfchain errors of the wrapped operator leave the executor as a one-line
//! `Execution` error carrying udfchain's own message (which UDF, which file,
//! the cause), which the client turns back into a readable error (see
//! [`job`](super::job)).

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use ballista_core::serde::protobuf::GetJobStatusParams;
use ballista_core::serde::protobuf::job_status::Status;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{Future, Stream};
use tokio::sync::watch;

use crate::error::Error;
use crate::util::exec_boilerplate::exec_boilerplate;
use crate::util::lock::lock;

/// How often a job with running udfchain streams is looked up.
pub const POLL: Duration = Duration::from_millis(200);
/// How long connecting to the scheduler, or one status call, may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

type Jobs = Arc<Mutex<HashMap<String, watch::Sender<Option<String>>>>>;

/// Watches the jobs of one executor's running streams (see the module header).
#[derive(Debug, Default)]
pub struct JobWatch {
    /// The scheduler's `http://host:port` (set once it is known).
    scheduler: OnceLock<String>,
    jobs: Jobs,
}

impl JobWatch {
    /// A watch asking the scheduler at `http` (`http://host:port`).
    pub fn new(http: String) -> Self {
        let watch = Self::default();
        watch.set_scheduler(http);
        watch
    }

    /// Sets the scheduler (for an executor built before its scheduler
    /// started); a second call is ignored.
    pub fn set_scheduler(&self, http: String) {
        let _ = self.scheduler.set(http);
    }

    /// A receiver that turns `Some(reason)` once `job` failed or was
    /// cancelled; `None` when no scheduler is known.
    fn watch(&self, job: &str) -> Option<watch::Receiver<Option<String>>> {
        let scheduler = self.scheduler.get()?.clone();
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut jobs = lock(&self.jobs);
        if let Some(tx) = jobs.get(job) {
            return Some(tx.subscribe());
        }
        let (tx, rx) = watch::channel(None);
        jobs.insert(job.to_string(), tx.clone());
        runtime.spawn(poll_job(
            Arc::clone(&self.jobs),
            scheduler,
            job.to_string(),
            tx,
        ));
        Some(rx)
    }
}

/// Polls `job`'s status until it ended, or until no stream watches it.
async fn poll_job(jobs: Jobs, scheduler: String, job: String, tx: watch::Sender<Option<String>>) {
    let mut client = None;
    loop {
        tokio::time::sleep(POLL).await;
        {
            let mut map = lock(&jobs);
            // Only the map's copy of the sender is left subscribed to: done.
            if tx.receiver_count() == 0 {
                map.remove(&job);
                return;
            }
        }
        if client.is_none() {
            client = connect(&scheduler).await;
        }
        let Some(c) = client.as_mut() else { continue };
        let status = match job_status(c, &job).await {
            Some(status) => status,
            None => {
                // Unreachable for now: try again (and reconnect) next time.
                client = None;
                continue;
            }
        };
        let stop = match status {
            Some(Status::Queued(_) | Status::Running(_)) => None,
            Some(Status::Successful(_)) => Some(None),
            Some(Status::Failed(f)) => Some(Some(f.error)),
            None => Some(Some("the scheduler no longer knows the job".to_string())),
        };
        if let Some(reason) = stop {
            lock(&jobs).remove(&job);
            if let Some(reason) = reason {
                tx.send_replace(Some(reason));
            }
            return;
        }
    }
}

type Client = SchedulerGrpcClient<tonic::transport::Channel>;

/// A client of the scheduler at `http`, or `None` after [`CALL_TIMEOUT`].
async fn connect(http: &str) -> Option<Client> {
    let connect = SchedulerGrpcClient::connect(http.to_string());
    tokio::time::timeout(CALL_TIMEOUT, connect).await.ok()?.ok()
}

/// `job`'s status from the scheduler (`Some(None)`: it has none), or `None`
/// when the call failed or took more than [`CALL_TIMEOUT`].
async fn job_status(client: &mut Client, job: &str) -> Option<Option<Status>> {
    let call = client.get_job_status(GetJobStatusParams {
        job_id: job.to_string(),
    });
    let reply = tokio::time::timeout(CALL_TIMEOUT, call).await.ok()?.ok()?;
    Some(reply.into_inner().status.and_then(|s| s.status))
}

/// The job of a task, from its identity `TID <job>/<stage>.<attempt>/...`.
fn job_of(ctx: &TaskContext) -> Option<String> {
    let id = ctx.task_id()?;
    let job = id.strip_prefix("TID ")?.split('/').next()?;
    (!job.is_empty()).then(|| job.to_string())
}

/// A udfchain operator on an executor, stopped when its job is (see the
/// module header). It reports no metrics of its own.
#[derive(Debug)]
pub struct WatchExec {
    input: Arc<dyn ExecutionPlan>,
    /// The input's, unchanged.
    properties: Arc<PlanProperties>,
    watch: Arc<JobWatch>,
}

impl WatchExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, watch: Arc<JobWatch>) -> Self {
        Self {
            properties: Arc::clone(input.properties()),
            input,
            watch,
        }
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(input, Arc::clone(&self.watch))
    }
}

impl DisplayAs for WatchExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "WatchExec")
    }
}

impl ExecutionPlan for WatchExec {
    exec_boilerplate!("WatchExec", one_input);

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let job = job_of(&ctx);
        let stop: Option<StopFuture> =
            job.as_deref()
                .and_then(|j| self.watch.watch(j))
                .map(|mut rx| {
                    let job = job.clone().unwrap_or_default();
                    Box::pin(async move {
                        let reason = match rx.wait_for(Option::is_some).await {
                            Ok(reason) => reason.clone(),
                            Err(_) => None,
                        };
                        match reason {
                            Some(reason) => format!("job {job} stopped on the cluster: {reason}"),
                            // The poll ended without a stop: never stop.
                            None => std::future::pending().await,
                        }
                    }) as StopFuture
                });
        Ok(Box::pin(WatchStream {
            schema: self.input.schema(),
            inner: Some(self.input.execute(partition, ctx)?),
            stop,
        }))
    }
}

type StopFuture = Pin<Box<dyn Future<Output = String> + Send>>;

struct WatchStream {
    schema: SchemaRef,
    /// `None` once stopped: the operator's work is dropped.
    inner: Option<SendableRecordBatchStream>,
    stop: Option<StopFuture>,
}

impl Stream for WatchStream {
    type Item = DfResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(stop) = self.stop.as_mut()
            && let Poll::Ready(reason) = stop.as_mut().poll(cx)
        {
            self.stop = None;
            self.inner = None;
            return Poll::Ready(Some(Err(DataFusionError::Execution(reason))));
        }
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(readable(e)))),
            other => other,
        }
    }
}

impl RecordBatchStream for WatchStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// A udfchain error as one `Execution` line with udfchain's message (Ballista
/// sends a task's error to the client in `Debug` form). Other errors pass as
/// they are: Ballista reads some (a failed shuffle fetch, I/O) to retry.
fn readable(e: DataFusionError) -> DataFusionError {
    match Error::from(e) {
        Error::DataFusion(e) => Arc::try_unwrap(e).unwrap_or_else(DataFusionError::Shared),
        ours => DataFusionError::Execution(ours.to_string().replace('\n', " ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduler that accepts connections and never answers: connecting
    /// or the status call gives up after `CALL_TIMEOUT` instead of stalling
    /// the watch (the test's own bound fails it if either stalls).
    #[tokio::test]
    async fn a_scheduler_that_never_answers_does_not_stall_the_watch() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let http = format!("http://{addr}");
        let status = tokio::time::timeout(CALL_TIMEOUT * 4, async {
            let mut client = connect(&http).await?;
            job_status(&mut client, "job").await
        })
        .await
        .expect("the watch's calls give up after CALL_TIMEOUT");
        assert!(status.is_none(), "no scheduler answered: {status:?}");
        held.abort();
    }

    #[test]
    fn the_job_comes_from_the_task_identity() {
        let ctx = TaskContext::default().with_task_id("TID abc123/2.0/5.1".into());
        assert_eq!(job_of(&ctx).as_deref(), Some("abc123"));
        let ctx = TaskContext::default().with_task_id("local".into());
        assert_eq!(job_of(&ctx), None);
        assert_eq!(job_of(&TaskContext::default()), None);
    }

    #[test]
    fn udfchain_errors_become_one_line_and_others_pass_as_they_are() {
        let udf = Error::Udf {
            udf: "picky".into(),
            file: Some("s3://b/f1.bin".into()),
            row: None,
            source: Arc::new(std::io::Error::other("odd\nlength")),
        };
        match readable(udf.into_df()) {
            DataFusionError::Execution(m) => {
                assert_eq!(m, "UDF picky failed on s3://b/f1.bin: odd length");
            }
            other => panic!("{other:?}"),
        }
        let io = DataFusionError::IoError(std::io::Error::other("reset"));
        assert!(matches!(readable(io), DataFusionError::IoError(_)));
    }
}
