//! `GenerateExec`: one row in, zero or more rows out (the input row's columns
//! repeated, plus the generated value).
//!
//! Guarantees: an expansion is streamed in batches of at most `batch_size` rows
//! and never held whole (each running generator has a channel of two batches);
//! up to `parallel` rows per partition are expanding, and at most `parallel`
//! generators of the UDF (across its partitions) compute at once on the UDF
//! pool. A generator holds one of those slots only while it produces a batch
//! its channel has room for, never while it waits for its consumer: under
//! `ordered = true` only the head expansion of a partition is drained, so
//! slots held by waiting generators could otherwise all be taken while every
//! partition's head waits for one (a deadlock). Dropping the stream aborts
//! every running generator.
//!
//! Order: with `ordered = true` expansions are emitted whole, one after the
//! other in input order, so the output keeps the input's order and declares it
//! (`maintains_input_order`, the input's orderings projected); with `ordered =
//! false` the batches of all running expansions are emitted as they come (each
//! expansion's own rows stay in order), so a slow row does not hold back the
//! others, and no order is declared.
//!
//! `on_error` (see `on_error.rs`): a failing row (the generator errs, panics or
//! its stream yields an error) ends its expansion. `fail` fails the query
//! naming the row's file and row; `null` emits the input row once with a null
//! output; `skip` lists the row in the skip list. Batches the expansion
//! streamed before it failed stay emitted (an expansion is never held whole).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::task::Poll;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use tokio::sync::mpsc;
use udfchain_udfs::{CallError, Generator};

use crate::plan::exec::on_error::null_output;
use crate::plan::exec::udf_call::{Failure, UdfCall};
use crate::plan::exec::udf_exec::{CallContext, Shape, UdfExec, UdfKind};
use crate::plan::logical::Udf;
use crate::plan::row_slices::{append_column, repeat_row, slices};
use crate::runtime::PoolTask;
use crate::settings::OnError;

/// The gen kind: zero or more rows out per row in.
#[derive(Debug, Clone)]
pub struct Generate;

/// The `GenerateExec` of plans: a UDF operator of the generate kind.
pub type GenerateExec = UdfExec<Generate>;

impl UdfKind for Generate {
    type Udf = dyn Generator;
    const NAME: &'static str = "GenerateExec";

    fn output_name(udf: &dyn Generator) -> &str {
        udf.signature().output.name()
    }

    fn udf(&self, udf: &Arc<dyn Generator>) -> Udf {
        Udf::Gen(Arc::clone(udf))
    }

    fn shape(&self) -> Shape {
        Shape::Expand
    }

    fn fmt_settings(&self, call: &UdfCall, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            ", parallel={}, batch_size={}",
            call.parallel, call.batch_size
        )
    }

    fn execute(
        exec: &GenerateExec,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let (input, part, baseline) = exec.start(partition, &ctx)?;
        let end = part.end();
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
        })
        .chain(end);
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&exec.schema),
            stream,
        )))
    }
}

/// One input row being expanded by a task on the UDF pool.
struct Job {
    row: RecordBatch,
    row_number: u64,
    outputs: mpsc::Receiver<Result<ArrayRef, CallError>>,
    /// The channel is closed: only the task's result is left.
    closed: bool,
    task: std::pin::Pin<Box<PoolTask<Result<(), Failure>>>>,
}

/// What a running generator did next.
enum Event {
    Values(ArrayRef),
    Failed(Failure),
    Ended,
}

struct GenState {
    input: SendableRecordBatchStream,
    part: CallContext<dyn Generator>,
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
            if self.jobs.is_empty() {
                return None;
            }
            let (i, event) = self.event().await;
            let failure = match event {
                Event::Values(values) => return Some(self.output(i, values)),
                Event::Ended => {
                    if let Some(job) = self.jobs.remove(i) {
                        self.part.call.release(&self.part.local, &job.row);
                    }
                    continue;
                }
                Event::Failed(f) => f,
            };
            let job = self.jobs.remove(i)?;
            self.part.call.release(&self.part.local, &job.row);
            match self.part.call.on_error_for(&failure) {
                OnError::Fail => {
                    return Some(Err(self.part.call.locate(
                        failure,
                        &job.row,
                        job.row_number,
                    )));
                }
                OnError::Null => {
                    return Some(append_column(
                        &self.part.schema,
                        &job.row,
                        null_output(&self.part.schema, 1),
                    ));
                }
                OnError::Skip => self.part.skip(&job.row, job.row_number, [0]),
            }
        }
    }

    /// Waits for the next event of the first job (`ordered`) or of any job,
    /// and returns it with the job's index.
    async fn event(&mut self) -> (usize, Event) {
        let ordered = self.part.call.ordered;
        let name = self.part.call.name.clone();
        let jobs = &mut self.jobs;
        std::future::poll_fn(move |cx| {
            let n = if ordered {
                jobs.len().min(1)
            } else {
                jobs.len()
            };
            for (i, job) in jobs.iter_mut().take(n).enumerate() {
                if !job.closed {
                    match job.outputs.poll_recv(cx) {
                        Poll::Ready(Some(Ok(values))) => {
                            return Poll::Ready((i, Event::Values(values)));
                        }
                        Poll::Ready(Some(Err(e))) => {
                            return Poll::Ready((
                                i,
                                Event::Failed(failure(&name, e.source.into())),
                            ));
                        }
                        Poll::Ready(None) => job.closed = true,
                        Poll::Pending => continue,
                    }
                }
                // The channel closed: the generator ended, failed or panicked.
                match job.task.as_mut().poll(cx) {
                    Poll::Ready(Ok(Ok(()))) => return Poll::Ready((i, Event::Ended)),
                    Poll::Ready(Ok(Err(f))) => return Poll::Ready((i, Event::Failed(f))),
                    Poll::Ready(Err(panic)) => {
                        let source = Arc::new(std::io::Error::other(panic));
                        return Poll::Ready((i, Event::Failed(failure(&name, source))));
                    }
                    Poll::Pending => {}
                }
            }
            Poll::Pending
        })
        .await
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
            let slots = Arc::clone(call.slots());
            call.run_stepwise(source, async move {
                let mut outputs = {
                    let _slot = slots.acquire().await;
                    udf.generate(params, max_rows)
                };
                // Room in the channel first, then a slot for the next batch:
                // a generator waiting for its consumer holds no slot.
                while let Ok(room) = tx.reserve().await {
                    let _slot = slots.acquire().await;
                    match outputs.next().await {
                        Some(item) => room.send(item),
                        None => break,
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
            closed: false,
            task: Box::pin(task),
        })
    }

    fn output(&self, job: usize, values: ArrayRef) -> DfResult<RecordBatch> {
        let job = self
            .jobs
            .get(job)
            .ok_or_else(|| datafusion::error::DataFusionError::Internal("no job".into()))?;
        let repeated =
            RecordBatch::try_new(job.row.schema(), repeat_row(&job.row, 0, values.len())?)?;
        append_column(&self.part.schema, &repeated, values)
    }
}

/// A failure of the one-row call of generator `udf`.
fn failure(udf: &str, source: crate::error::Source) -> Failure {
    Failure {
        row: Some(0),
        error: crate::Error::Udf {
            udf: udf.to_string(),
            file: None,
            row: None,
            source,
        },
    }
}
