//! `GenerateExec`: one row in, zero or more rows out (the input row's columns
//! repeated, plus the generated value).
//!
//! Guarantees: an expansion is streamed in batches of at most `batch_size` rows
//! and never held whole (each running generator has a channel of two batches);
//! output keeps input order; up to `parallel` rows expand at once on the UDF pool;
//! dropping the stream aborts every running generator.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;
use tokio::sync::mpsc;
use udfchain_udfs::{CallError, Generator};

use super::common::{
    Failure, Partition, UdfCall, UdfOperator, append_column, null_output, repeat_row, slices,
    unary_exec_boilerplate,
};
use super::prefetch::PrefetchLink;
use crate::runtime::PoolTask;
use crate::settings::OnError;

#[derive(Debug)]
pub struct GenerateExec {
    op: UdfOperator<dyn Generator>,
}

impl GenerateExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        udf: Arc<dyn Generator>,
        call: Arc<UdfCall>,
        link: Option<Arc<PrefetchLink>>,
        schema: SchemaRef,
    ) -> Self {
        Self {
            op: UdfOperator::new(input, udf, call, link, schema, false),
        }
    }

    pub(crate) fn call(&self) -> &UdfCall {
        &self.op.call
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            op: self.op.with_input(input),
        }
    }
}

impl DisplayAs for GenerateExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "GenerateExec: udf={}, output={}, parallel={}, batch_size={}",
            self.op.call.name,
            self.op.udf.signature().output.name(),
            self.op.call.parallel,
            self.op.call.batch_size
        )
    }
}

impl ExecutionPlan for GenerateExec {
    unary_exec_boilerplate!("GenerateExec", op);

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let (input, part, baseline) = self.op.start(partition, &ctx)?;
        let state = GenState {
            input,
            part,
            rows: VecDeque::new(),
            jobs: VecDeque::new(),
            input_done: false,
            seen: 0,
        };
        let stream = futures::stream::unfold(state, |mut s| async move {
            let next = s.next().await?;
            Some((next, s))
        })
        .inspect(move |b| {
            if let Ok(b) = b {
                baseline.record_output(b.num_rows());
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.op.schema),
            stream,
        )))
    }
}

/// One input row being expanded by a task on the UDF pool.
struct Job {
    row: RecordBatch,
    row_number: u64,
    outputs: mpsc::Receiver<Result<ArrayRef, CallError>>,
    task: std::pin::Pin<Box<PoolTask<Result<(), Failure>>>>,
    produced: usize,
}

struct GenState {
    input: SendableRecordBatchStream,
    part: Partition<dyn Generator>,
    rows: VecDeque<RecordBatch>,
    jobs: VecDeque<Job>,
    input_done: bool,
    seen: u64,
}

impl GenState {
    async fn next(&mut self) -> Option<DfResult<RecordBatch>> {
        loop {
            if let Err(e) = self.start_jobs().await {
                return Some(Err(e));
            }
            let job = self.jobs.front_mut()?;
            let failure = match job.outputs.recv().await {
                Some(Ok(values)) => {
                    job.produced += values.len();
                    return Some(self.output(values));
                }
                Some(Err(e)) => self.failure(e.source.into()),
                // The channel closed: the generator ended, failed or panicked.
                None => match self.jobs.front_mut()?.task.as_mut().await {
                    Ok(Ok(())) => {
                        if let Some(job) = self.jobs.pop_front() {
                            self.part.call.release(&self.part.local, &job.row);
                        }
                        continue;
                    }
                    Ok(Err(f)) => f,
                    Err(panic) => self.failure(Arc::new(std::io::Error::other(panic))),
                },
            };
            let job = self.jobs.pop_front()?;
            self.part.call.release(&self.part.local, &job.row);
            match self.part.call.on_error {
                OnError::Fail => {
                    return Some(Err(self.part.call.locate(
                        failure,
                        &job.row,
                        job.row_number,
                    )));
                }
                OnError::Null if job.produced == 0 => {
                    return Some(append_column(
                        &self.part.schema,
                        &job.row,
                        null_output(&self.part.schema, 1),
                    ));
                }
                OnError::Skip => self.part.call.record_skip(&job.row, job.row_number),
                OnError::Null => {}
            }
        }
    }

    /// Starts generators until `parallel` run, pulling input as needed.
    async fn start_jobs(&mut self) -> DfResult<()> {
        while self.jobs.len() < self.part.call.parallel {
            if let Some(row) = self.rows.pop_front() {
                let n = self.seen;
                self.seen += 1;
                self.jobs.push_back(self.spawn(row, n)?);
                continue;
            }
            if self.input_done {
                break;
            }
            // Only wait for input when nothing is ready to emit.
            if !self.jobs.is_empty() {
                match futures::FutureExt::now_or_never(self.input.next()) {
                    Some(Some(batch)) => self.rows.extend(slices(&batch?, 1)),
                    Some(None) => self.input_done = true,
                    None => break,
                }
                continue;
            }
            match self.input.next().await {
                Some(batch) => self.rows.extend(slices(&batch?, 1)),
                None => self.input_done = true,
            }
        }
        Ok(())
    }

    fn spawn(&self, row: RecordBatch, row_number: u64) -> DfResult<Job> {
        let params = self.part.call.params_batch(&row)?;
        let (tx, rx) = mpsc::channel(2);
        let (udf, call, source) = (
            Arc::clone(&self.part.udf),
            Arc::clone(&self.part.call),
            Arc::clone(&self.part.source),
        );
        let max_rows = call.batch_size;
        let task = crate::runtime::spawn_on(&tokio::runtime::Handle::current(), async move {
            call.run(source, async move {
                let mut outputs = udf.generate(params, max_rows);
                while let Some(item) = outputs.next().await {
                    if tx.send(item).await.is_err() {
                        break;
                    }
                }
                Ok(())
            })
            .await
        });
        Ok(Job {
            row,
            row_number,
            outputs: rx,
            task: Box::pin(task),
            produced: 0,
        })
    }

    fn output(&self, values: ArrayRef) -> DfResult<RecordBatch> {
        let job = self
            .jobs
            .front()
            .ok_or_else(|| datafusion::error::DataFusionError::Internal("no job".into()))?;
        let repeated =
            RecordBatch::try_new(job.row.schema(), repeat_row(&job.row, 0, values.len())?)?;
        append_column(&self.part.schema, &repeated, values)
    }

    fn failure(&self, source: crate::error::Source) -> Failure {
        Failure {
            row: Some(0),
            error: crate::Error::Udf {
                udf: self.part.call.name.clone(),
                file: None,
                row: None,
                source,
            },
        }
    }
}
